//! Agent authentication with a shared cluster key, like munge: whoever holds the key is
//! a trusted agent (or the controller).
//!
//! Every `AgentLink` request carries five metadata entries: the node, the time in Unix
//! milliseconds, the session (hex; empty before Attach), a sequence number, and an
//! HMAC-SHA256 over `method`, node, time, session, sequence and the SHA-256 of the
//! encoded request. The controller recomputes it over the request it decoded and
//! refuses a wrong MAC, a node that differs from the request's, or a time too far from
//! its clock.
//!
//! Replays: the MAC alone does not stop a captured request from being sent again. So an
//! agent's connection is a session: `Challenge` hands out a fresh single-use nonce,
//! `Attach` must carry it (a replayed Attach carries a used one and is refused), and
//! every later request names that session with a sequence number that must grow (a
//! replayed heartbeat or report is refused). Commands going the other way are
//! `SignedCommand`s: a MAC over exactly the bytes sent (never a re-encoding, whose map
//! order differs between processes), and inside them the session and a growing number,
//! so that an agent runs no command of an old session and none twice.

use std::io::Write as _;
use std::path::Path;

use hmac::{Hmac, Mac};
use prost::Message;
use sha2::{Digest, Sha256};

use crate::{AgentCommand, SignedCommand};

pub const NODE_HEADER: &str = "x-gpuctl-node";
pub const TIME_HEADER: &str = "x-gpuctl-time";
pub const MAC_HEADER: &str = "x-gpuctl-mac";
pub const SESSION_HEADER: &str = "x-gpuctl-session";
pub const SEQ_HEADER: &str = "x-gpuctl-seq";

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
    #[error("the command does not decode after its signature verified: {0}")]
    Undecodable(String),
}

pub use gpuctl_base::replay::{ReplayWindow, Signed};

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

    /// The key of one node's `epoch`th join, derived from this (the cluster's) key: the
    /// node signs with it and cannot sign as any other node, nor as itself once it has
    /// joined again or been revoked.
    pub fn for_node(&self, node: &str, epoch: u64) -> ClusterKey {
        let mut m = self.mac();
        m.update(b"gpuctl-node-key-v1\n");
        m.update(node.as_bytes());
        m.update(b"\n");
        m.update(epoch.to_string().as_bytes());
        ClusterKey(m.finalize().into_bytes().into())
    }

    /// The key as the 64 hex digits of its file.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Writes the key to a new file only its owner can read (replacing one there).
    pub fn save(&self, path: &Path) -> Result<(), KeyError> {
        let text = format!("{}\n", self.to_hex());
        crate::statedir::write_whole(path, text.as_bytes(), 0o600).map_err(|source| {
            KeyError::Write {
                path: path.display().to_string(),
                source,
            }
        })
    }

    /// Parses 64 hex digits.
    pub fn from_hex(text: &str) -> Option<ClusterKey> {
        let mut k = [0u8; KEY_BYTES];
        hex::decode_to_slice(text.trim(), &mut k).ok()?;
        Some(ClusterKey(k))
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length")
    }

    /// The MAC of a message between controllers (`RaftMessage`): the method and the body.
    pub fn peer_mac(&self, method: &str, body: &[u8]) -> Vec<u8> {
        let mut m = self.mac();
        m.update(b"gpuctl-raft-v1\n");
        m.update(method.as_bytes());
        m.update(b"\n");
        m.update(body);
        m.finalize().into_bytes().to_vec()
    }

    /// Checks `peer_mac` in constant time.
    pub fn verify_peer(&self, method: &str, body: &[u8], mac: &[u8]) -> bool {
        let mut m = self.mac();
        m.update(b"gpuctl-raft-v1\n");
        m.update(method.as_bytes());
        m.update(b"\n");
        m.update(body);
        m.verify_slice(mac).is_ok()
    }

    fn request_mac(
        &self,
        method: &str,
        node: &str,
        time_ms: i64,
        signed: &Signed,
        body: &[u8],
    ) -> HmacSha256 {
        let mut m = self.mac();
        m.update(b"gpuctl-agent-v2\n");
        m.update(method.as_bytes());
        m.update(b"\n");
        m.update(node.as_bytes());
        m.update(b"\n");
        m.update(time_ms.to_string().as_bytes());
        m.update(b"\n");
        m.update(hex::encode(&signed.session).as_bytes());
        m.update(b"\n");
        m.update(signed.seq.to_string().as_bytes());
        m.update(b"\n");
        m.update(&Sha256::digest(body));
        m
    }

    /// The MAC (hex) an agent puts on a request.
    pub fn sign_request(
        &self,
        method: &str,
        node: &str,
        time_ms: i64,
        signed: &Signed,
        body: &[u8],
    ) -> String {
        hex::encode(
            self.request_mac(method, node, time_ms, signed, body)
                .finalize()
                .into_bytes(),
        )
    }

    /// `msg` as an agent sends it: in a request whose metadata carries the node, the
    /// time, the session, the sequence number and the MAC the controller checks.
    #[cfg(feature = "rpc")]
    pub fn signed_request<T: Message>(
        &self,
        method: &str,
        node: &str,
        time_ms: i64,
        signed: &Signed,
        msg: T,
    ) -> Result<tonic::Request<T>, AuthError> {
        let body = msg.encode_to_vec();
        self.signed_stream(method, node, time_ms, signed, &body, msg)
    }

    /// A streaming request signed like a unary one, over `first` (the encoding of the
    /// stream's first message, which the controller checks against it).
    #[cfg(feature = "rpc")]
    pub fn signed_stream<S>(
        &self,
        method: &str,
        node: &str,
        time_ms: i64,
        signed: &Signed,
        first: &[u8],
        stream: S,
    ) -> Result<tonic::Request<S>, AuthError> {
        let mac = self.sign_request(method, node, time_ms, signed, first);
        let mut req = tonic::Request::new(stream);
        let meta = req.metadata_mut();
        let bad = |_| AuthError::Malformed(NODE_HEADER);
        meta.insert(NODE_HEADER, node.parse().map_err(bad)?);
        meta.insert(TIME_HEADER, time_ms.into());
        meta.insert(
            SESSION_HEADER,
            hex::encode(&signed.session).parse().expect("hex is ASCII"),
        );
        meta.insert(SEQ_HEADER, signed.seq.into());
        meta.insert(MAC_HEADER, mac.parse().expect("hex is ASCII"));
        Ok(req)
    }

    /// Checks a request's metadata (looked up by `get`) against the request body and
    /// `now_ms`; returns the session and sequence number it was signed with (the caller
    /// checks them against the live session).
    pub fn verify_request<'a>(
        &self,
        method: &str,
        named_node: &str,
        body: &[u8],
        get: impl Fn(&str) -> Option<&'a str>,
        now_ms: i64,
    ) -> Result<Signed, AuthError> {
        let node = get(NODE_HEADER).ok_or(AuthError::Missing(NODE_HEADER))?;
        let time = get(TIME_HEADER).ok_or(AuthError::Missing(TIME_HEADER))?;
        let mac = get(MAC_HEADER).ok_or(AuthError::Missing(MAC_HEADER))?;
        let session = get(SESSION_HEADER).ok_or(AuthError::Missing(SESSION_HEADER))?;
        let seq = get(SEQ_HEADER).ok_or(AuthError::Missing(SEQ_HEADER))?;
        let time_ms: i64 = time
            .parse()
            .map_err(|_| AuthError::Malformed(TIME_HEADER))?;
        let signed = Signed {
            session: hex::decode(session).map_err(|_| AuthError::Malformed(SESSION_HEADER))?,
            seq: seq.parse().map_err(|_| AuthError::Malformed(SEQ_HEADER))?,
        };
        let mac = hex::decode(mac).map_err(|_| AuthError::Malformed(MAC_HEADER))?;
        // The MAC first, so that an unkeyed caller learns nothing about the rest.
        self.request_mac(method, node, time_ms, &signed, body)
            .verify_slice(&mac)
            .map_err(|_| AuthError::BadMac)?;
        node_and_clock(node, named_node, time_ms, now_ms)?;
        Ok(signed)
    }

    /// A heartbeat for the Heartbeats stream: signed like a unary `heartbeat` request,
    /// with the signature in the message.
    pub fn sign_heartbeat(
        &self,
        node: &str,
        time_ms: i64,
        signed: &Signed,
        hb: &crate::HeartbeatRequest,
    ) -> crate::SignedHeartbeat {
        let heartbeat = hb.encode_to_vec();
        let mac = self
            .request_mac("heartbeat", node, time_ms, signed, &heartbeat)
            .finalize()
            .into_bytes()
            .to_vec();
        crate::SignedHeartbeat {
            heartbeat,
            node: node.to_string(),
            time_ms,
            session: signed.session.clone(),
            seq: signed.seq,
            mac,
        }
    }

    /// Checks a streamed heartbeat (MAC over its bytes first, then the node it names
    /// and the clock), then decodes it.
    pub fn verify_heartbeat(
        &self,
        m: &crate::SignedHeartbeat,
        now_ms: i64,
    ) -> Result<(Signed, crate::HeartbeatRequest), AuthError> {
        let signed = Signed {
            session: m.session.clone(),
            seq: m.seq,
        };
        self.request_mac("heartbeat", &m.node, m.time_ms, &signed, &m.heartbeat)
            .verify_slice(&m.mac)
            .map_err(|_| AuthError::BadMac)?;
        let hb = <crate::HeartbeatRequest as Message>::decode(m.heartbeat.as_slice())
            .map_err(|e| AuthError::Undecodable(e.to_string()))?;
        node_and_clock(&m.node, &hb.node, m.time_ms, now_ms)?;
        Ok((signed, hb))
    }

    fn command_mac(&self, node: &str, bytes: &[u8]) -> HmacSha256 {
        let mut m = self.mac();
        m.update(b"gpuctl-command-v2\n");
        m.update(node.as_bytes());
        m.update(b"\n");
        m.update(bytes);
        m
    }

    /// Encodes `cmd` once and signs those bytes for the agent of `node`.
    pub fn sign_command(&self, node: &str, cmd: &AgentCommand) -> SignedCommand {
        let command = cmd.encode_to_vec();
        let mac = self
            .command_mac(node, &command)
            .finalize()
            .into_bytes()
            .to_vec();
        SignedCommand { command, mac }
    }

    /// Verifies the bytes received, then decodes them.
    pub fn verify_command(
        &self,
        node: &str,
        signed: &SignedCommand,
    ) -> Result<AgentCommand, AuthError> {
        self.command_mac(node, &signed.command)
            .verify_slice(&signed.mac)
            .map_err(|_| AuthError::BadMac)?;
        AgentCommand::decode(signed.command.as_slice())
            .map_err(|e| AuthError::Undecodable(e.to_string()))
    }
}

/// After a good MAC: the node signed for must be the node the request names, and the
/// signing time within `MAX_SKEW_MS` of `now_ms`.
fn node_and_clock(signed: &str, named: &str, time_ms: i64, now_ms: i64) -> Result<(), AuthError> {
    if signed != named {
        return Err(AuthError::NodeMismatch {
            signed: signed.to_string(),
            named: named.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KillJob, agent_command::Command};

    fn key(b: u8) -> ClusterKey {
        ClusterKey::from_bytes([b; KEY_BYTES])
    }

    #[test]
    fn node_keys_are_the_nodes_own() {
        let k = key(1);
        let (a, b) = (k.for_node("n1", 1), k.for_node("n2", 1));
        let signed = Signed {
            session: vec![],
            seq: 1,
        };
        let mac = a.sign_request("attach", "n1", 1_000, &signed, b"x");
        let get = |h: &str| match h {
            NODE_HEADER => Some("n1"),
            TIME_HEADER => Some("1000"),
            SESSION_HEADER => Some(""),
            SEQ_HEADER => Some("1"),
            MAC_HEADER => Some(mac.as_str()),
            _ => None,
        };
        assert!(a.verify_request("attach", "n1", b"x", get, 1_000).is_ok());
        // Another node's key, the next epoch's, and the cluster key itself all refuse it.
        for other in [b, k.for_node("n1", 2), key(1)] {
            assert_eq!(
                other.verify_request("attach", "n1", b"x", get, 1_000),
                Err(AuthError::BadMac)
            );
        }
        assert_eq!(
            ClusterKey::from_hex(&a.to_hex()).unwrap().to_hex(),
            a.to_hex()
        );
    }

    #[test]
    fn streamed_heartbeats_verify_and_every_refusal() {
        let k = key(1);
        let signed = Signed {
            session: vec![1, 2, 3],
            seq: 9,
        };
        let hb = crate::HeartbeatRequest {
            node: "n1".into(),
            commands_handled: 4,
            ..Default::default()
        };
        let m = k.sign_heartbeat("n1", 1_000_000, &signed, &hb);
        assert_eq!(
            k.verify_heartbeat(&m, 1_000_100),
            Ok((signed.clone(), hb.clone()))
        );
        // Another key; renumbered, re-sessioned, re-timed or altered: the MAC fails.
        assert_eq!(
            key(2).verify_heartbeat(&m, 1_000_100),
            Err(AuthError::BadMac)
        );
        for tamper in [
            |m: &mut crate::SignedHeartbeat| m.seq += 1,
            |m: &mut crate::SignedHeartbeat| m.session.push(0),
            |m: &mut crate::SignedHeartbeat| m.time_ms += 1,
            |m: &mut crate::SignedHeartbeat| m.node = "n2".into(),
            |m: &mut crate::SignedHeartbeat| m.heartbeat.push(0),
        ] {
            let mut bad = m.clone();
            tamper(&mut bad);
            assert_eq!(k.verify_heartbeat(&bad, 1_000_100), Err(AuthError::BadMac));
        }
        // Signed for one node, naming another inside.
        let other = crate::HeartbeatRequest {
            node: "n2".into(),
            ..Default::default()
        };
        let m2 = k.sign_heartbeat("n1", 1_000_000, &signed, &other);
        assert!(matches!(
            k.verify_heartbeat(&m2, 1_000_100),
            Err(AuthError::NodeMismatch { .. })
        ));
        // Too old.
        assert!(matches!(
            k.verify_heartbeat(&m, 1_000_000 + MAX_SKEW_MS + 1),
            Err(AuthError::Skew { .. })
        ));
        // Bytes that are not a heartbeat, signed correctly, are refused, not decoded.
        let mut junk = m.clone();
        junk.heartbeat = vec![0xff; 3];
        junk.mac = k
            .request_mac("heartbeat", "n1", 1_000_000, &signed, &junk.heartbeat)
            .finalize()
            .into_bytes()
            .to_vec();
        assert!(matches!(
            k.verify_heartbeat(&junk, 1_000_100),
            Err(AuthError::Undecodable(_))
        ));
    }

    #[test]
    fn request_roundtrip_and_every_refusal() {
        let k = key(1);
        let body = b"hello";
        let signed = Signed {
            session: vec![0xab, 0xcd],
            seq: 7,
        };
        let mac = k.sign_request("heartbeat", "n1", 1_000_000, &signed, body);
        let meta = |node: &'static str, mac: String, session: &'static str, seq: &'static str| {
            move |h: &str| -> Option<String> {
                match h {
                    NODE_HEADER => Some(node.to_string()),
                    TIME_HEADER => Some("1000000".to_string()),
                    MAC_HEADER => Some(mac.clone()),
                    SESSION_HEADER => Some(session.to_string()),
                    SEQ_HEADER => Some(seq.to_string()),
                    _ => None,
                }
            }
        };
        let verify = |k: &ClusterKey,
                      method: &str,
                      named: &str,
                      body: &[u8],
                      m: &dyn Fn(&str) -> Option<String>,
                      now: i64| {
            let values: Vec<(String, String)> = [
                NODE_HEADER,
                TIME_HEADER,
                MAC_HEADER,
                SESSION_HEADER,
                SEQ_HEADER,
            ]
            .iter()
            .filter_map(|h| m(h).map(|v| (h.to_string(), v)))
            .collect();
            k.verify_request(
                method,
                named,
                body,
                |h| values.iter().find(|(k, _)| k == h).map(|(_, v)| v.as_str()),
                now,
            )
        };
        let check = |k: &ClusterKey, method, named, body: &[u8], node, mac: &str, now| {
            verify(
                k,
                method,
                named,
                body,
                &meta(node, mac.to_string(), "abcd", "7"),
                now,
            )
        };
        assert_eq!(
            check(&k, "heartbeat", "n1", body, "n1", &mac, 1_000_500),
            Ok(signed.clone())
        );
        // The session and the sequence number are signed: a replay cannot renumber.
        assert_eq!(
            verify(
                &k,
                "heartbeat",
                "n1",
                body,
                &meta("n1", mac.clone(), "abcd", "8"),
                1_000_000
            ),
            Err(AuthError::BadMac)
        );
        assert_eq!(
            verify(
                &k,
                "heartbeat",
                "n1",
                body,
                &meta("n1", mac.clone(), "abce", "7"),
                1_000_000
            ),
            Err(AuthError::BadMac)
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
        let no_time = |h: &str| (h != TIME_HEADER).then_some("x");
        assert_eq!(
            k.verify_request("heartbeat", "n1", body, no_time, 0),
            Err(AuthError::Missing(TIME_HEADER))
        );
    }

    #[test]
    fn commands_are_bound_to_their_node_and_content() {
        let k = key(7);
        let cmd = AgentCommand {
            term: 0,
            command: Some(Command::Kill(KillJob {
                job_id: 4,
                ..KillJob::default()
            })),
            session: vec![1, 2, 3],
            seq: 1,
        };
        let signed = k.sign_command("n1", &cmd);
        assert_eq!(k.verify_command("n1", &signed), Ok(cmd.clone()));
        assert_eq!(k.verify_command("n2", &signed), Err(AuthError::BadMac));
        assert_eq!(key(8).verify_command("n1", &signed), Err(AuthError::BadMac));
        let mut changed = signed.clone();
        let last = changed.command.len() - 1;
        changed.command[last] ^= 1;
        assert_eq!(k.verify_command("n1", &changed), Err(AuthError::BadMac));
    }

    /// The MAC covers the bytes sent: a start with many env entries verifies, however
    /// the receiving process would order the map if it encoded the command again.
    #[test]
    fn commands_with_maps_verify_as_sent() {
        use crate::{JobSpec, StartJob};
        let k = key(9);
        for n in 0..40 {
            let env = (0..n).map(|i| (format!("K{i}"), format!("v{i}"))).collect();
            let cmd = AgentCommand {
                term: 0,
                command: Some(Command::Start(StartJob {
                    job_id: n,
                    spec: Some(JobSpec {
                        env,
                        ..JobSpec::default()
                    }),
                    ..StartJob::default()
                })),
                session: vec![9],
                seq: n,
            };
            let signed = k.sign_command("n1", &cmd);
            let wire = signed.encode_to_vec();
            let received = SignedCommand::decode(wire.as_slice()).unwrap();
            assert_eq!(k.verify_command("n1", &received), Ok(cmd));
        }
    }

    #[test]
    fn replay_window_accepts_each_number_once() {
        let mut w = ReplayWindow::default();
        assert!(!w.accept(0));
        assert!(w.accept(1));
        assert!(!w.accept(1));
        assert!(w.accept(3));
        // Out of order, but new: accepted once.
        assert!(w.accept(2));
        assert!(!w.accept(2));
        assert!(w.accept(100));
        assert!(!w.accept(3), "too old to tell: refused");
        assert!(w.accept(37));
        assert!(!w.accept(36));
        assert!(!w.accept(100));
        assert!(w.accept(u64::MAX));
        assert!(!w.accept(u64::MAX));
    }

    proptest::proptest! {
        /// Whatever order numbers come in, none is accepted twice, and every number
        /// above everything seen so far is accepted.
        #[test]
        fn replay_window_never_accepts_twice(seqs in proptest::collection::vec(1u64..300, 0..200)) {
            let mut w = ReplayWindow::default();
            let mut accepted = std::collections::HashSet::new();
            let mut top = 0;
            for s in seqs {
                let ok = w.accept(s);
                if ok {
                    proptest::prop_assert!(accepted.insert(s), "{} accepted twice", s);
                }
                if s > top {
                    proptest::prop_assert!(ok);
                    top = s;
                }
            }
        }
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
