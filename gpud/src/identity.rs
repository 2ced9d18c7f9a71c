//! The node's identity: a join with a token on first start, the identity an earlier
//! join left in the state dir on later ones, or the shared cluster key of the old mode;
//! and the renewal of the node's certificate before it expires.
//!
//! Files (in `<state-dir>/tls`, 0700, root's): `ca.pem` (the cluster CA, pinned by the
//! fingerprint given to `--ca-fingerprint`), `node.pem` and `node-key.pem` (0600, the
//! node's certificate and key), `node.key` (0600, the key it signs requests with),
//! `node` (the name it joined as) and `not-after` (Unix ms).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use gpuctl_proto as pb;
use gpuctl_proto::agent_link_client::AgentLinkClient;
use gpuctl_proto::auth::{ClusterKey, Signed};
use gpuctl_proto::tls::{self, ClientTls, NodeIdentity, NodeRequest};

use crate::agent::now_ms;

/// How the agent proves who it is.
pub enum How {
    /// The shared cluster key (`--key-file`; a controller run with
    /// `--insecure-shared-key`).
    SharedKey(PathBuf),
    /// Join with a token (from a file or the environment, never the command line),
    /// pinning the CA with the fingerprint given (else the join file's).
    Join {
        token: Token,
        fingerprint: Option<String>,
    },
    /// The identity an earlier join left in the state dir.
    Joined,
}

/// Where the join token comes from. Read only when the node has not joined yet: a
/// restart with the first start's options needs neither the token nor its file.
pub enum Token {
    /// `--join-file` (or GPUD_JOIN_FILE).
    File(PathBuf),
    /// GPUD_JOIN_TOKEN.
    Env(String),
}

impl Token {
    /// The token and the CA fingerprint that came with it, if any.
    fn read(self) -> anyhow::Result<(String, Option<String>)> {
        match self {
            Token::File(path) => read_join_file(&path),
            Token::Env(token) => Ok((token, None)),
        }
    }
}

/// The fingerprint to pin: the one given, else the join file's; both must agree.
fn pinned(given: Option<String>, from_file: Option<String>) -> anyhow::Result<String> {
    match (given, from_file) {
        (Some(given), Some(file)) if given != file => anyhow::bail!(
            "--ca-fingerprint {given} differs from the join file's {file}: which CA to trust is unclear"
        ),
        (Some(f), _) | (None, Some(f)) => Ok(f),
        (None, None) => anyhow::bail!(
            "a join needs the cluster CA's fingerprint: --ca-fingerprint sha256:... (printed with the token), or the JSON of `gpuctl admin join-token create --json` as --join-file"
        ),
    }
}

/// What the agent signs with and dials through.
pub struct Credentials {
    pub key: ClusterKey,
    /// `None` in the shared-key mode.
    pub tls: Option<Tls>,
}

pub struct Tls {
    pub client: ClientTls,
    pub identity: Arc<NodeIdentity>,
    pub not_after_ms: i64,
}

fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("tls")
}

/// `host:port` of an `https://` controller URL.
fn authority(url: &str) -> anyhow::Result<String> {
    let rest = url.strip_prefix("https://").with_context(|| {
        format!("--controller {url:?}: a node joins over TLS, so the URL starts with https://")
    })?;
    let auth = rest.split('/').next().unwrap_or(rest);
    Ok(
        if auth
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            auth.to_string()
        } else {
            format!("{auth}:7817")
        },
    )
}

/// Resolves `how` into credentials (joining first when asked to).
pub async fn credentials(
    state_dir: &Path,
    node: &str,
    url: &str,
    how: How,
) -> anyhow::Result<Credentials> {
    match how {
        How::SharedKey(path) => {
            let key = ClusterKey::load(&path).map_err(|e| {
                anyhow::anyhow!(
                    "{e} (with --key-file, the controller runs with --insecure-shared-key and creates it as <state-dir>/cluster.key)"
                )
            })?;
            Ok(Credentials { key, tls: None })
        }
        How::Join { token, fingerprint } => {
            if has_joined_as(state_dir, node) {
                // A restart with the first start's options (GPUD_OPTS, a unit's
                // Environment=): the token was used then and is not needed now.
                tracing::info!(
                    node,
                    "this node joined before: using the identity in {}; the join token was not needed (remove it from the agent's options)",
                    dir(state_dir).display()
                );
            } else {
                let (token, from_file) = token.read()?;
                let fingerprint = pinned(fingerprint, from_file)?;
                join(state_dir, node, url, &token, &fingerprint).await?;
            }
            joined(state_dir, node)
        }
        How::Joined => joined(state_dir, node),
    }
}

/// Whether the state dir holds the identity of a join as `node`.
fn has_joined_as(state_dir: &Path, node: &str) -> bool {
    let d = dir(state_dir);
    d.join("node.key").exists()
        && std::fs::read_to_string(d.join("node")).is_ok_and(|n| n.trim() == node)
}

/// A join token and the CA fingerprint read from `--join-file`: either the JSON that
/// `gpuctl admin join-token create --json` prints (token and fingerprint) or the bare
/// token. The file must be the agent's own and neither readable nor writable by
/// anyone else: a token other users can read lets them join as this node first.
fn read_join_file(path: &Path) -> anyhow::Result<(String, Option<String>)> {
    use std::os::unix::fs::MetadataExt;
    let shown = path.display();
    let meta = std::fs::metadata(path).with_context(|| format!("--join-file {shown}"))?;
    if !meta.is_file() {
        anyhow::bail!("--join-file {shown}: not a regular file");
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        anyhow::bail!(
            "--join-file {shown} belongs to uid {}, not to this agent's uid {me}: a token in someone else's file may have been read or replaced",
            meta.uid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        anyhow::bail!(
            "--join-file {shown} has mode {:04o}: others can read the join token and join as this node first; chmod 600 {shown} (or write it with umask 077)",
            meta.mode() & 0o7777
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("--join-file {shown}"))?;
    let text = text.trim();
    if text.starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(text).with_context(|| {
            format!("--join-file {shown}: not the JSON of `gpuctl admin join-token create --json`")
        })?;
        let token = v["token"]
            .as_str()
            .with_context(|| format!("--join-file {shown}: no \"token\" in the JSON"))?;
        let fp = v["ca_fingerprint"].as_str().map(str::to_string);
        return Ok((token.to_string(), fp));
    }
    if text.is_empty() || text.contains(char::is_whitespace) {
        anyhow::bail!(
            "--join-file {shown}: expected one token (or the JSON of `gpuctl admin join-token create --json`)"
        );
    }
    Ok((text.to_string(), None))
}

/// The identity kept in the state dir.
fn joined(state_dir: &Path, node: &str) -> anyhow::Result<Credentials> {
    let d = dir(state_dir);
    if !d.join("node.key").exists() {
        anyhow::bail!(
            "this node has not joined the cluster: on the controller run `gpuctl admin join-token create --node {node}`, save its JSON (umask 077) and start gpud with --join-file FILE, or pass the token in GPUD_JOIN_TOKEN with --ca-fingerprint FINGERPRINT (or, for a controller run with --insecure-shared-key, --key-file)"
        );
    }
    let joined_as = std::fs::read_to_string(d.join("node")).unwrap_or_default();
    if joined_as.trim() != node {
        anyhow::bail!(
            "{} holds the identity of node {:?}, not {node:?}: start gpud with --name {} or join again with a token for {node}",
            state_dir.display(),
            joined_as.trim(),
            joined_as.trim()
        );
    }
    let key = ClusterKey::load(&d.join("node.key"))?;
    let ca = std::fs::read_to_string(d.join("ca.pem")).context("cannot read the cluster CA")?;
    let cert =
        std::fs::read_to_string(d.join("node.pem")).context("cannot read the node certificate")?;
    let node_key = tls::read_private(&d.join("node-key.pem"), "the node's private key")?;
    let not_after_ms = std::fs::read_to_string(d.join("not-after"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let identity = NodeIdentity::from_pem(&cert, &node_key)?;
    let client = ClientTls::new(&ca, Some(identity.clone()))?;
    Ok(Credentials {
        key,
        tls: Some(Tls {
            client,
            identity,
            not_after_ms,
        }),
    })
}

fn endpoint(url: &str) -> anyhow::Result<tonic::transport::Endpoint> {
    Ok(tonic::transport::Endpoint::from_shared(url.to_string())
        .with_context(|| format!("bad --controller URL {url:?}"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30)))
}

/// How long a join goes on trying a list of controllers none of which leads yet.
const JOIN_PATIENCE: Duration = Duration::from_secs(60);

/// Joins at the controller that leads among `urls` (a comma-separated list): one that
/// cannot be reached, or answers that it does not lead, passes the join to the next;
/// any other refusal ends it.
async fn join(
    state_dir: &Path,
    node: &str,
    urls: &str,
    token: &str,
    fingerprint: &str,
) -> anyhow::Result<()> {
    let urls: Vec<&str> = urls.split(',').map(str::trim).collect();
    let until = std::time::Instant::now() + JOIN_PATIENCE;
    loop {
        let mut last = None;
        for url in &urls {
            match join_at(state_dir, node, url, token, fingerprint).await {
                Ok(()) => return Ok(()),
                Err(Failed::Elsewhere(e)) => last = Some(e.context(format!("at {url}"))),
                Err(Failed::Refused(e)) => return Err(e),
            }
        }
        let last = last.expect("at least one controller");
        if urls.len() == 1 || std::time::Instant::now() > until {
            return Err(last);
        }
        tracing::warn!("no controller took the join yet: {last:#}; trying again");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

enum Failed {
    /// Not here: unreachable, or not the leader.
    Elsewhere(anyhow::Error),
    Refused(anyhow::Error),
}

/// Joins at `url`: the CA fetched against its fingerprint, a certificate request for a
/// new key, the token sent over a connection that verifies the controller under that CA.
async fn join_at(
    state_dir: &Path,
    node: &str,
    url: &str,
    token: &str,
    fingerprint: &str,
) -> Result<(), Failed> {
    let ca = tls::fetch_ca(&authority(url).map_err(Failed::Refused)?, fingerprint)
        .await
        .map_err(|e| Failed::Elsewhere(e.into()))?;
    let refused = |e: anyhow::Error| Failed::Refused(e);
    let req = NodeRequest::new(node).map_err(|e| refused(e.into()))?;
    let client = ClientTls::new(&ca, None).map_err(|e| refused(e.into()))?;
    let channel = client
        .connect(endpoint(url).map_err(refused)?)
        .await
        .context("cannot reach the controller")
        .map_err(Failed::Elsewhere)?;
    let answer = AgentLinkClient::new(channel)
        .join(pb::JoinRequest {
            token: token.trim().to_string(),
            node: node.to_string(),
            csr: req.csr_der,
        })
        .await
        .map_err(|s| {
            let e = anyhow::anyhow!("the controller refused to join this node: {}", s.message());
            if s.code() == tonic::Code::Unavailable {
                Failed::Elsewhere(e)
            } else {
                Failed::Refused(e)
            }
        })?
        .into_inner();
    save(state_dir, node, &answer, &req.key_pem).map_err(refused)?;
    tracing::info!(
        node,
        not_after_ms = answer.not_after_ms,
        "joined the cluster"
    );
    Ok(())
}

/// Writes what a join or renewal answered.
fn save(
    state_dir: &Path,
    node: &str,
    answer: &pb::JoinResponse,
    key_pem: &str,
) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let d = dir(state_dir);
    std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))?;
    let key = ClusterKey::from_hex(&answer.node_key)
        .context("the controller sent a malformed node key")?;
    tls::write_file(
        &d.join("ca.pem"),
        answer.ca.as_bytes(),
        0o644,
        "the cluster CA",
    )?;
    tls::write_file(
        &d.join("node-key.pem"),
        key_pem.as_bytes(),
        0o600,
        "the node's private key",
    )?;
    tls::write_file(
        &d.join("node.pem"),
        answer.certificate.as_bytes(),
        0o644,
        "the node certificate",
    )?;
    tls::write_file(
        &d.join("not-after"),
        answer.not_after_ms.to_string().as_bytes(),
        0o644,
        "the certificate's end",
    )?;
    key.save(&d.join("node.key"))?;
    tls::write_file(&d.join("node"), node.as_bytes(), 0o644, "the node's name")?;
    Ok(())
}

/// Renews the node's certificate whenever a third of its life is left (its life
/// counted from this start, or from the last renewal), until the process ends, at
/// whichever controller of the list leads. A renewed certificate is used from the next
/// connection on.
pub async fn renew_loop(
    state_dir: PathBuf,
    node: String,
    key: ClusterKey,
    tls: Tls,
    controllers: Vec<(String, tonic::transport::Channel)>,
) {
    let mut not_after = tls.not_after_ms;
    let mut since = now_ms();
    loop {
        let left = not_after - since;
        let at = since + left * 2 / 3;
        let wait = (at - now_ms()).max(1_000);
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        let mut renewed = Err(anyhow::anyhow!("no controller"));
        for (url, channel) in &controllers {
            renewed = renew(&state_dir, &node, &key, &tls, channel.clone())
                .await
                .with_context(|| format!("at {url}"));
            if renewed.is_ok() {
                break;
            }
        }
        match renewed {
            Ok(n) => {
                tracing::info!(node, not_after_ms = n, "node certificate renewed");
                not_after = n;
                since = now_ms();
            }
            Err(e) => {
                tracing::warn!(
                    node,
                    "cannot renew the node certificate (trying again in a minute): {e:#}"
                );
                since = now_ms();
                not_after = since + 90_000;
            }
        }
    }
}

async fn renew(
    state_dir: &Path,
    node: &str,
    key: &ClusterKey,
    tls: &Tls,
    channel: tonic::transport::Channel,
) -> anyhow::Result<i64> {
    let req = NodeRequest::new(node)?;
    let msg = pb::RenewRequest {
        node: node.to_string(),
        csr: req.csr_der,
    };
    let signed = key.signed_request(
        "renew",
        node,
        now_ms(),
        &Signed {
            session: vec![],
            seq: 0,
        },
        msg,
    )?;
    let answer = AgentLinkClient::new(channel)
        .renew(signed)
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner();
    save(state_dir, node, &answer, &req.key_pem)?;
    tls.identity.replace(&answer.certificate, &req.key_pem)?;
    Ok(answer.not_after_ms)
}
