//! Who a node is: the cluster CA, join tokens, and each node's certificates and key.
//!
//! A node joins once with a single-use, expiring token (`gpuctl admin join-token
//! create`): the controller signs a certificate for its name and hands it the key it
//! signs requests with, derived from the cluster key for that name and that join
//! (`ClusterKey::for_node`). From then on every request of the node must come over a
//! connection that presents one of its certificates, and verify under its own key: a
//! node cannot attach, report or take commands as another, and a revoked node (or a
//! name joined again elsewhere) is refused at once. With `--insecure-shared-key` none of
//! this applies: agents sign with the cluster key itself, over plain TCP, as before.

use gpuctl_proto as pb;
use gpuctl_proto::auth::ClusterKey;
use gpuctl_proto::guard::TcpPeer;
use gpuctl_proto::store::{StoredCertificate, StoredJoinToken, StoredNodeIdentity};

use crate::credentials::{Credentials, MAX_JOIN_TOKENS};
use gpuctl_proto::text::shown;
use gpuctl_proto::tls::Ca;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tonic::Status;

/// A join token's life when the admin names none.
pub const DEFAULT_TOKEN_TTL_S: i64 = 3600;
/// The longest a join token may live.
pub const MAX_TOKEN_TTL_S: i64 = 7 * 86_400;
/// How the request arrived, as far as identity goes.
pub enum Via<'a> {
    Tcp(&'a TcpPeer),
    /// The controller's Unix socket, with the peer's uid.
    Unix(Option<u32>),
}

impl<'a> Via<'a> {
    pub fn of(ext: &'a tonic::Extensions) -> Via<'a> {
        if let Some(p) = ext.get::<TcpPeer>() {
            return Via::Tcp(p);
        }
        let uid = ext
            .get::<tonic::transport::server::UdsConnectInfo>()
            .and_then(|i| i.peer_cred)
            .map(|c| c.uid());
        Via::Unix(uid)
    }
}

pub struct Pki {
    ca: Ca,
    cluster: ClusterKey,
    /// `false` with `--insecure-shared-key`.
    secure: bool,
    /// API tokens accepted over plain TCP (`--insecure`).
    clear_tokens: bool,
    /// How long a node certificate is valid (seconds).
    node_lifetime_s: i64,
    /// API tokens, join tokens and node identities.
    state: Mutex<Credentials>,
}

fn token_hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.trim().as_bytes()))
}

fn unauthenticated(node: &str, why: &str) -> Status {
    Status::unauthenticated(format!("node {}: {why}", shown(node, 64)))
}

/// What a join or renewal wrote, for the store.
pub struct Joined {
    pub answer: pb::JoinResponse,
    pub identity: StoredNodeIdentity,
    /// The token used (its hash), to delete.
    pub used: Option<String>,
}

impl Pki {
    pub fn new(
        ca: Ca,
        cluster: ClusterKey,
        secure: bool,
        clear_tokens: bool,
        node_lifetime_s: i64,
        credentials: Credentials,
    ) -> Pki {
        Pki {
            ca,
            cluster,
            secure,
            clear_tokens,
            node_lifetime_s: node_lifetime_s.max(60),
            state: Mutex::new(credentials),
        }
    }

    /// Runs `f` on the credentials, under their lock.
    pub fn with<R>(&self, f: impl FnOnce(&mut Credentials) -> R) -> R {
        f(&mut self.state.lock())
    }

    /// The user an API token's secret belongs to.
    pub fn token_user(&self, secret: &str) -> Option<String> {
        self.state.lock().api.user_of(secret).map(str::to_string)
    }

    pub fn secure(&self) -> bool {
        self.secure
    }

    /// Whether API tokens may come over plain TCP.
    pub fn clear_tokens(&self) -> bool {
        self.clear_tokens
    }

    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// The key `node`'s requests must verify under, once the connection they came on is
    /// known to be `node`'s.
    pub fn key_for(&self, node: &str, via: &Via<'_>) -> Result<ClusterKey, Status> {
        if !self.secure {
            return Ok(self.cluster.clone());
        }
        let st = self.state.lock();
        let id = st.nodes.get(node).ok_or_else(|| {
            unauthenticated(
                node,
                "has not joined: create a join token (`gpuctl admin join-token create --node NAME`) and start gpud with --join",
            )
        })?;
        if id.revoked {
            return Err(unauthenticated(
                node,
                "was revoked (`gpuctl admin node revoke`)",
            ));
        }
        match via {
            Via::Tcp(peer) => {
                let Some(fp) = &peer.certificate else {
                    return Err(unauthenticated(
                        node,
                        "the connection presents no node certificate (agents connect with the one they got when they joined)",
                    ));
                };
                // The handshake checked the certificate's dates when the connection
                // opened; a connection made under the certificate a renewal replaced
                // goes on (the previous one is kept), as TLS connections do.
                let known = id.certificates.iter().any(|c| &c.fingerprint == fp);
                if !known {
                    return Err(unauthenticated(
                        node,
                        "the connection's certificate is not this node's (or has expired)",
                    ));
                }
            }
            // Root on the controller's own host may attach over the socket.
            Via::Unix(Some(0)) => {}
            Via::Unix(_) => {
                return Err(unauthenticated(
                    node,
                    "over the Unix socket only root may act as an agent",
                ));
            }
        }
        Ok(self.cluster.for_node(node, id.epoch))
    }

    /// The key commands to `node` are signed with.
    pub fn command_key(&self, node: &str) -> Option<ClusterKey> {
        if !self.secure {
            return Some(self.cluster.clone());
        }
        let st = self.state.lock();
        let id = st.nodes.get(node).filter(|i| !i.revoked)?;
        Some(self.cluster.for_node(node, id.epoch))
    }

    /// A new join token: its secret (shown once) and its record, to apply.
    pub fn create_token(
        &self,
        node: &str,
        ttl_s: i64,
        by: &str,
        now_ms: i64,
    ) -> Result<(String, StoredJoinToken), Status> {
        if !self.secure {
            return Err(Status::failed_precondition(
                "this controller runs with --insecure-shared-key: agents sign with the cluster key, and join tokens are not used",
            ));
        }
        let ttl = if ttl_s == 0 {
            DEFAULT_TOKEN_TTL_S
        } else {
            ttl_s
        };
        if !(1..=MAX_TOKEN_TTL_S).contains(&ttl) {
            return Err(Status::invalid_argument(format!(
                "a join token lives 1 s to {} days (asked: {ttl_s} s)",
                MAX_TOKEN_TTL_S / 86_400
            )));
        }
        if !node.is_empty() {
            check_node_name(node)?;
        }
        if self.state.lock().live_joins(now_ms) >= MAX_JOIN_TOKENS {
            return Err(Status::resource_exhausted(format!(
                "{MAX_JOIN_TOKENS} join tokens are waiting to be used; use or let some expire first"
            )));
        }
        use rand::RngCore;
        let mut secret = [0u8; 32];
        rand::rng().fill_bytes(&mut secret);
        let secret = format!("gpuctljoin_{}", hex::encode(secret));
        let t = StoredJoinToken {
            hash: token_hash(&secret),
            node: node.to_string(),
            expires_ms: now_ms + ttl * 1000,
            created_ms: now_ms,
            created_by: by.to_string(),
        };
        Ok((secret, t))
    }

    /// A node joining: its certificate signed, its key epoch advanced; applying the
    /// change uses the token up.
    pub fn join(&self, req: &pb::JoinRequest, now_ms: i64) -> Result<Joined, Status> {
        if !self.secure {
            return Err(Status::failed_precondition(
                "this controller runs with --insecure-shared-key: start gpud with --key-file instead of --join",
            ));
        }
        check_node_name(&req.node)?;
        let hash = token_hash(&req.token);
        let st = self.state.lock();
        let t = st.joins.get(&hash).cloned().ok_or_else(|| {
            Status::unauthenticated("unknown or already used join token (create another with `gpuctl admin join-token create`)")
        })?;
        if t.expires_ms <= now_ms {
            return Err(Status::unauthenticated(
                "the join token has expired (create another with `gpuctl admin join-token create`)",
            ));
        }
        let live = st.nodes.get(&req.node).filter(|i| !i.revoked);
        if !t.node.is_empty() && t.node != req.node {
            return Err(Status::permission_denied(format!(
                "this join token is for node {}, not {}",
                shown(&t.node, 64),
                shown(&req.node, 64)
            )));
        }
        if t.node.is_empty() && live.is_some() {
            return Err(Status::already_exists(format!(
                "node {} has already joined: a token for it alone (`--node {}`) joins it again",
                shown(&req.node, 64),
                shown(&req.node, 64)
            )));
        }
        let epoch = st.nodes.get(&req.node).map_or(0, |i| i.epoch) + 1;
        drop(st);
        let (answer, cert) = self.sign(&req.node, &req.csr, epoch, now_ms)?;
        let identity = StoredNodeIdentity {
            node: req.node.clone(),
            epoch,
            certificates: vec![cert],
            revoked: false,
            joined_ms: now_ms,
            revoked_ms: 0,
        };
        Ok(Joined {
            answer,
            identity,
            used: Some(hash),
        })
    }

    /// `node`'s identity, unless it never joined or was revoked.
    fn live_identity(&self, node: &str) -> Option<StoredNodeIdentity> {
        let st = self.state.lock();
        st.nodes.get(node).filter(|i| !i.revoked).cloned()
    }

    /// A new certificate for a joined node (the caller has verified the request came
    /// from it); the one it connected with stays valid until it expires.
    pub fn renew(&self, node: &str, csr: &[u8], now_ms: i64) -> Result<Joined, Status> {
        let id = self.live_identity(node);
        let Some(id) = id else {
            return Err(unauthenticated(node, "has not joined or was revoked"));
        };
        let (answer, cert) = self.sign(node, csr, id.epoch, now_ms)?;
        let mut identity = id;
        // The one in use and the new one.
        let keep = identity.certificates.len().saturating_sub(1);
        identity.certificates.drain(..keep);
        identity.certificates.push(cert);
        Ok(Joined {
            answer,
            identity,
            used: None,
        })
    }

    fn sign(
        &self,
        node: &str,
        csr: &[u8],
        epoch: u64,
        now_ms: i64,
    ) -> Result<(pb::JoinResponse, StoredCertificate), Status> {
        let now_s = now_ms / 1000;
        let not_after = now_s + self.node_lifetime_s;
        let der = self
            .ca
            .sign_node(csr, node, now_s - 300, not_after)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let cert = StoredCertificate {
            fingerprint: gpuctl_proto::tls::fingerprint(&der),
            not_after_ms: not_after * 1000,
        };
        let answer = pb::JoinResponse {
            certificate: gpuctl_proto::tls::cert_pem(&der),
            ca: self.ca.pem(),
            node_key: self.cluster.for_node(node, epoch).to_hex(),
            not_after_ms: cert.not_after_ms,
        };
        Ok((answer, cert))
    }

    /// `node`'s identity with every certificate and its key revoked, to apply; how many
    /// certificates that revokes.
    pub fn revoke(&self, node: &str, now_ms: i64) -> Result<(StoredNodeIdentity, u32), Status> {
        let id = self.live_identity(node);
        let mut id = id.ok_or_else(|| {
            Status::not_found(format!(
                "node {} has no certificate to revoke",
                shown(node, 64)
            ))
        })?;
        let n = id.certificates.len() as u32;
        id.revoked = true;
        id.revoked_ms = now_ms;
        id.certificates.clear();
        Ok((id, n))
    }
}

/// Longest node name an agent may use (a DNS name's length).
pub(crate) const MAX_NODE_NAME: usize = 253;

/// A node name as a join may carry it: the name its certificate will hold.
pub fn check_node_name(node: &str) -> Result<(), Status> {
    if node.is_empty() || node.len() > MAX_NODE_NAME {
        return Err(Status::invalid_argument(format!(
            "a node name is 1 to {MAX_NODE_NAME} bytes (this one has {})",
            node.len()
        )));
    }
    if let Some(c) = node
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
    {
        return Err(Status::invalid_argument(format!(
            "a node name is letters, digits, '.', '-' and '_' ({:?} is not)",
            c
        )));
    }
    Ok(())
}
