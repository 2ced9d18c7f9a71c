//! Why the cluster state refuses a request. The controller's shell turns a refusal into
//! the gRPC status of the same name.

/// The kind of a refusal (named like the gRPC codes it becomes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    InvalidArgument,
    PermissionDenied,
    NotFound,
    FailedPrecondition,
    ResourceExhausted,
    AlreadyExists,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub kind: Kind,
    pub message: String,
}

macro_rules! kinds {
    ($($f:ident => $k:ident),* $(,)?) => {
        impl Refusal {
            $(pub fn $f(message: impl Into<String>) -> Refusal {
                Refusal { kind: Kind::$k, message: message.into() }
            })*
        }
    };
}

kinds! {
    invalid_argument => InvalidArgument,
    permission_denied => PermissionDenied,
    not_found => NotFound,
    failed_precondition => FailedPrecondition,
    resource_exhausted => ResourceExhausted,
    already_exists => AlreadyExists,
}

/// Who asks: the user the controller identified, and whether an admin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub user: String,
    pub admin: bool,
}

impl Actor {
    /// A refusal for lack of permission, naming the user. (The daemon logs denials a
    /// line a period: a user can cause them at will.)
    pub fn deny(&self, why: &str) -> Refusal {
        Refusal::permission_denied(format!("permission denied for user {}: {why}", self.user))
    }
}
