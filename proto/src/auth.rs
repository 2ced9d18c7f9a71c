//! Agent authentication with a shared cluster key, like munge: whoever holds the key is
//! a trusted agent (or the controller).
//!
//! Every `AgentLink` request carries three metadata entries: the node, the time in Unix
//! milliseconds, and an HMAC-SHA256 over `method`, node, time and the SHA-256 of the
//! encoded request. The controller recomputes it over the request it decoded and
//! refuses a wrong MAC, a node that differs from the request's, or a time too far from
//! its clock (replays are bounded by that window; the agent messages are idempotent).
//! Commands going the other way carry a MAC in `AgentCommand.mac`.

use std::io::Write as _;
use std::path::Path;

use hmac::{Hmac, Mac};
use prost::Message;
use sha2::{Digest, Sha256};

use crate::AgentCommand;

pub const NODE_HEADER: &str = "x-gpuctl-node";
pub const TIME_HEADER: &str = "x-gpuctl-time";
pub const MAC_HEADER: &str = "x-gpuctl-mac";

/// How far a request's time may be from the controller's clock.
pub const MAX_SKEW_MS: i64 = 5 * 60 * 1000;

const KEY_BYTES: usize = 32;

type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read cluster key {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write cluster key {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cluster key {path} is not {KEY_BYTES} bytes of hex (64 hex digits); copy it again from the controller's state dir"
    )]
    Malformed { path: String },
    #[error(
        "cluster key {path} can be read by other users (mode {mode:o}); run `chmod 600 {path}`"
    )]
    Exposed { path: String, mode: u32 },
}

/// Why a request was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing {0} metadata: agents must sign requests with the cluster key")]
    Missing(&'static str),
    #[error("metadata {0} is malformed")]
    Malformed(&'static str),
    #[error("request is signed for node {signed:?} but names node {named:?}")]
    NodeMismatch { signed: String, named: String },
    #[error("request time is {skew_s} s from the controller's clock (at most 300 s allowed)")]
    Skew { skew_s: i64 },
    #[error("bad signature: the agent's cluster key differs from the controller's")]
    BadMac,
}

/// The shared secret.
#[derive(Clone)]
pub struct ClusterKey([u8; KEY_BYTES]);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

impl ClusterKey {
    pub fn generate() -> ClusterKey {
        use rand::RngCore;
        let mut k = [0u8; KEY_BYTES];
        rand::rng().fill_bytes(&mut k);
        ClusterKey(k)
    }

    pub fn from_bytes(k: [u8; KEY_BYTES]) -> ClusterKey {
        ClusterKey(k)
    }

    /// Reads a key file (64 hex digits). Refuses a file that group or others can read.
    pub fn load(path: &Path) -> Result<ClusterKey, KeyError> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display().to_string();
        let read = |source| KeyError::Read {
            path: shown.clone(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Exposed { path: shown, mode });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        let mut k = [0u8; KEY_BYTES];
        hex::decode_to_slice(text.trim(), &mut k)
            .map_err(|_| KeyError::Malformed { path: shown })?;
        Ok(ClusterKey(k))
    }

    /// Loads `path`, or creates it (mode 0600) with a new key when it does not exist.
    /// Returns the key and whether it was created.
    pub fn load_or_create(path: &Path) -> Result<(ClusterKey, bool), KeyError> {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(mut f) => {
                let key = ClusterKey::generate();
                f.write_all(format!("{}\n", hex::encode(key.0)).as_bytes())
                    .and_then(|()| f.sync_all())
                    .map_err(|source| KeyError::Write {
                        path: path.display().to_string(),
                        source,
                    })?;
                Ok((key, true))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Ok((ClusterKey::load(path)?, false))
            }
            Err(source) => Err(KeyError::Write {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length")
    }

    fn request_mac(&self, method: &str, node: &str, time_ms: i64, body: &[u8]) -> HmacSha256 {
        let mut m = self.mac();
        m.update(b"gpuctl-agent-v1\n");
        m.update(method.as_bytes());
        m.update(b"\n");
        m.update(node.as_bytes());
        m.update(b"\n");
        m.update(time_ms.to_string().as_bytes());
        m.update(b"\n");
        m.update(&Sha256::digest(body));
        m
    }

    /// The MAC (hex) an agent puts on a request.
    pub fn sign_request(&self, method: &str, node: &str, time_ms: i64, body: &[u8]) -> String {
        hex::encode(
            self.request_mac(method, node, time_ms, body)
                .finalize()
                .into_bytes(),
        )
    }

    /// Checks a request's metadata values against the request body and `now_ms`.
    #[allow(clippy::too_many_arguments)]
    pub fn verify_request(
        &self,
        method: &str,
        named_node: &str,
        body: &[u8],
        node: Option<&str>,
        time: Option<&str>,
        mac: Option<&str>,
        now_ms: i64,
    ) -> Result<(), AuthError> {
        let node = node.ok_or(AuthError::Missing(NODE_HEADER))?;
        let time = time.ok_or(AuthError::Missing(TIME_HEADER))?;
        let mac = mac.ok_or(AuthError::Missing(MAC_HEADER))?;
        let time_ms: i64 = time
            .parse()
            .map_err(|_| AuthError::Malformed(TIME_HEADER))?;
        let mac = hex::decode(mac).map_err(|_| AuthError::Malformed(MAC_HEADER))?;
        // The MAC first, so that an unkeyed caller learns nothing about the rest.
        self.request_mac(method, node, time_ms, body)
            .verify_slice(&mac)
            .map_err(|_| AuthError::BadMac)?;
        if node != named_node {
            return Err(AuthError::NodeMismatch {
                signed: node.to_string(),
                named: named_node.to_string(),
            });
        }
        let skew = (now_ms - time_ms).abs();
        if skew > MAX_SKEW_MS {
            return Err(AuthError::Skew {
                skew_s: skew / 1000,
            });
        }
        Ok(())
    }

    fn command_mac(&self, node: &str, cmd: &AgentCommand) -> HmacSha256 {
        let unsigned = AgentCommand {
            mac: Vec::new(),
            ..cmd.clone()
        };
        let mut m = self.mac();
        m.update(b"gpuctl-command-v1\n");
        m.update(node.as_bytes());
        m.update(b"\n");
        m.update(&unsigned.encode_to_vec());
        m
    }

    /// Sets `cmd.mac` for the agent of `node`.
    pub fn sign_command(&self, node: &str, cmd: &mut AgentCommand) {
        cmd.mac = self.command_mac(node, cmd).finalize().into_bytes().to_vec();
    }

    pub fn verify_command(&self, node: &str, cmd: &AgentCommand) -> Result<(), AuthError> {
        self.command_mac(node, cmd)
            .verify_slice(&cmd.mac)
            .map_err(|_| AuthError::BadMac)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KillJob, agent_command::Command};

    fn key(b: u8) -> ClusterKey {
        ClusterKey::from_bytes([b; KEY_BYTES])
    }

    #[test]
    fn request_roundtrip_and_every_refusal() {
        let k = key(1);
        let body = b"hello";
        let mac = k.sign_request("heartbeat", "n1", 1_000_000, body);
        let check = |k: &ClusterKey, method, named, body: &[u8], node, mac: &str, now| {
            k.verify_request(
                method,
                named,
                body,
                Some(node),
                Some("1000000"),
                Some(mac),
                now,
            )
        };
        assert_eq!(
            check(&k, "heartbeat", "n1", body, "n1", &mac, 1_000_500),
            Ok(())
        );
        assert_eq!(
            check(&key(2), "heartbeat", "n1", body, "n1", &mac, 1_000_000),
            Err(AuthError::BadMac)
        );
        assert_eq!(
            check(&k, "report", "n1", body, "n1", &mac, 1_000_000),
            Err(AuthError::BadMac)
        );
        assert_eq!(
            check(&k, "heartbeat", "n1", b"hellp", "n1", &mac, 1_000_000),
            Err(AuthError::BadMac)
        );
        assert_eq!(
            check(&k, "heartbeat", "n1", body, "n2", &mac, 1_000_000),
            Err(AuthError::BadMac)
        );
        assert!(matches!(
            check(&k, "heartbeat", "n2", body, "n1", &mac, 1_000_000),
            Err(AuthError::NodeMismatch { .. })
        ));
        assert_eq!(
            check(
                &k,
                "heartbeat",
                "n1",
                body,
                "n1",
                &mac,
                1_000_000 + MAX_SKEW_MS + 1000
            ),
            Err(AuthError::Skew { skew_s: 301 })
        );
        assert_eq!(
            k.verify_request("heartbeat", "n1", body, Some("n1"), None, Some(&mac), 0),
            Err(AuthError::Missing(TIME_HEADER))
        );
    }

    #[test]
    fn commands_are_bound_to_their_node_and_content() {
        let k = key(7);
        let mut cmd = AgentCommand {
            command: Some(Command::Kill(KillJob {
                job_id: 4,
                ..KillJob::default()
            })),
            mac: Vec::new(),
        };
        k.sign_command("n1", &mut cmd);
        assert_eq!(k.verify_command("n1", &cmd), Ok(()));
        assert_eq!(k.verify_command("n2", &cmd), Err(AuthError::BadMac));
        assert_eq!(key(8).verify_command("n1", &cmd), Err(AuthError::BadMac));
        let mut changed = cmd.clone();
        if let Some(Command::Kill(k)) = &mut changed.command {
            k.job_id = 5;
        }
        assert_eq!(k.verify_command("n1", &changed), Err(AuthError::BadMac));
    }

    #[test]
    fn key_file_created_0600_reloaded_and_checked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cluster.key");
        let (k1, created) = ClusterKey::load_or_create(&p).unwrap();
        assert!(created);
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (k2, created) = ClusterKey::load_or_create(&p).unwrap();
        assert!(!created);
        assert_eq!(k1.0, k2.0);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            ClusterKey::load(&p),
            Err(KeyError::Exposed { mode: 0o644, .. })
        ));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&p, "zz\n").unwrap();
        assert!(matches!(
            ClusterKey::load(&p),
            Err(KeyError::Malformed { .. })
        ));
    }
}
