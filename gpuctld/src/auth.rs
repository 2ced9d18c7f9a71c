//! Who a caller is. Users reach the controller over its Unix socket, where the kernel
//! tells us their uid (peer credentials), or over TCP with an API token an admin created
//! (`authorization: Bearer <token>`). Agents sign their requests with the cluster key
//! (`gpuctl_proto::auth`). Nothing a client merely claims is believed.

use std::collections::HashMap;

use gpuctl_proto::store::StoredToken;
use sha2::{Digest, Sha256};
use tonic::Status;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    /// Known for Unix-socket callers.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub admin: bool,
    /// "unix-socket" or "token".
    pub via: &'static str,
}

impl Caller {
    /// Refuses (and logs) unless the caller is an admin.
    pub fn require_admin(&self, action: &str) -> Result<(), Status> {
        if self.admin {
            return Ok(());
        }
        Err(self.deny(&format!("only admins may {action}")))
    }

    /// A PERMISSION_DENIED status, logged.
    /// The caller as the cluster state knows it.
    pub fn actor(&self) -> gpuctl_core::Actor {
        gpuctl_core::Actor {
            user: self.user.clone(),
            admin: self.admin,
        }
    }

    pub fn deny(&self, why: &str) -> Status {
        let why = gpuctl_proto::text::shown(why, 300);
        DENIED.note(|n, secs| {
            tracing::warn!(user = %self.user, via = self.via, "permission denied: {why} ({n} denials in the last {secs} s, this one included)");
        });
        Status::permission_denied(format!("permission denied for user {}: {why}", self.user))
    }
}

/// How long a uid's name is kept, and how long that a uid has none.
const NAME_TTL: std::time::Duration = std::time::Duration::from_secs(60);
const NO_NAME_TTL: std::time::Duration = std::time::Duration::from_secs(5);
/// The most uids kept (all are dropped when it is reached).
const MAX_NAMES: usize = 4096;

/// A uid's name (none: it has none) and when it was looked up.
type NameEntry = (Option<String>, std::time::Instant);

/// Unix-socket callers' names by uid.
static NAMES: std::sync::LazyLock<std::sync::Mutex<HashMap<u32, NameEntry>>> =
    std::sync::LazyLock::new(Default::default);

/// The user name of `uid` on the controller's host: from a cache kept a minute (five
/// seconds for a uid with none), else looked up on the blocking pool. A lookup may go to
/// a directory service (LDAP, SSSD) that can hang; it must never hold an async worker,
/// which heartbeats and every other request share (nscd and Slurm cache the same).
pub async fn user_name(uid: u32) -> Option<String> {
    let now = std::time::Instant::now();
    let fresh = |(name, at): &NameEntry| {
        let ttl = if name.is_some() {
            NAME_TTL
        } else {
            NO_NAME_TTL
        };
        (now.duration_since(*at) < ttl).then(|| name.clone())
    };
    let cached = NAMES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&uid)
        .and_then(fresh);
    if let Some(name) = cached {
        return name;
    }
    let name = tokio::task::spawn_blocking(move || {
        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.name)
    })
    .await
    .ok()
    .flatten();
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    if names.len() >= MAX_NAMES {
        names.clear();
    }
    names.insert(uid, (name.clone(), std::time::Instant::now()));
    name
}

/// SHA-256 of a token secret, hex: what the controller keeps.
pub fn token_hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// A new token: (id, secret). The id is public (lists, revocation); the secret is shown
/// once.
pub fn new_token() -> (String, String) {
    use rand::RngCore;
    let mut id = [0u8; 6];
    let mut secret = [0u8; 32];
    let mut rng = rand::rng();
    rng.fill_bytes(&mut id);
    rng.fill_bytes(&mut secret);
    let id = hex::encode(id);
    (id.clone(), format!("gpuctl_{id}_{}", hex::encode(secret)))
}

/// Tokens by hash.
#[derive(Default)]
pub struct Tokens {
    by_hash: HashMap<String, StoredToken>,
}

impl Tokens {
    pub fn new(tokens: Vec<StoredToken>) -> Tokens {
        Tokens {
            by_hash: tokens.into_iter().map(|t| (t.hash.clone(), t)).collect(),
        }
    }

    pub fn user_of(&self, secret: &str) -> Option<&str> {
        self.by_hash
            .get(&token_hash(secret))
            .map(|t| t.user.as_str())
    }

    pub fn insert(&mut self, t: StoredToken) {
        self.by_hash.insert(t.hash.clone(), t);
    }

    pub fn remove(&mut self, id: &str) -> Option<StoredToken> {
        let hash = self.by_hash.values().find(|t| t.id == id)?.hash.clone();
        self.by_hash.remove(&hash)
    }

    pub fn list(&self) -> Vec<StoredToken> {
        let mut v: Vec<StoredToken> = self.by_hash.values().cloned().collect();
        v.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        v
    }
}

/// A user name a job may run as (core's rule, `gpuctl_core::validate`).
pub use gpuctl_core::validate::valid_user_name;

/// Logs a denial the state decided (its message names the user), a line a period.
pub fn note_denied(message: &str) {
    let message = gpuctl_proto::text::shown(message, 300);
    DENIED.note(|n, secs| {
        tracing::warn!("{message} ({n} denials in the last {secs} s, this one included)");
    });
}

/// Denials: a user can cause them at will, so they are logged a line a period.
static DENIED: gpuctl_proto::ratelog::RateLog =
    gpuctl_proto::ratelog::RateLog::new(std::time::Duration::from_secs(10));

/// Whether `caller` sees the jobs of `user` whole (their own; an admin's, everyone's).
pub fn sees_whole(caller: &Caller, user: &str) -> bool {
    caller.admin || user == caller.user
}

/// What a caller may see of a job: everything of their own (and admins of every job);
/// of other users' jobs the metadata only: their env, script and command arguments may
/// hold secrets.
pub fn redact(caller: &Caller, job: &mut gpuctl_proto::Job) {
    let Some(spec) = job.spec.as_mut() else {
        return;
    };
    if sees_whole(caller, &spec.user) {
        return;
    }
    spec.env.clear();
    if !spec.script.is_empty() {
        spec.script = "(hidden: another user's script)".into();
    }
    spec.command.truncate(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_uids_name_is_looked_up_once_then_kept() {
        assert_eq!(user_name(0).await.as_deref(), Some("root"));
        let at = NAMES.lock().unwrap()[&0].1;
        assert_eq!(user_name(0).await.as_deref(), Some("root"));
        assert_eq!(NAMES.lock().unwrap()[&0].1, at, "answered from the cache");
        // A uid without a name is remembered as such, briefly.
        let nobody = 3_999_999_999;
        assert_eq!(user_name(nobody).await, None);
        assert_eq!(NAMES.lock().unwrap()[&nobody].0, None);
    }

    #[test]
    fn tokens_are_found_by_secret_only() {
        let (id, secret) = new_token();
        assert!(secret.starts_with(&format!("gpuctl_{id}_")));
        let mut t = Tokens::default();
        t.insert(StoredToken {
            id: id.clone(),
            user: "alice".into(),
            hash: token_hash(&secret),
            ..StoredToken::default()
        });
        assert_eq!(t.user_of(&secret), Some("alice"));
        assert_eq!(t.user_of(&id), None);
        assert_eq!(t.user_of(&format!("{secret}x")), None);
        assert!(t.remove(&id).is_some());
        assert_eq!(t.user_of(&secret), None);
    }

    #[test]
    fn user_names() {
        assert!(valid_user_name("alice.b-c_1"));
        assert!(!valid_user_name(""));
        assert!(!valid_user_name("-rf"));
        assert!(!valid_user_name("a b"));
        assert!(!valid_user_name("a/b"));
    }
}
