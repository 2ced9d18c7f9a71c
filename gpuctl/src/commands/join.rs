//! `gpuctl admin join-token create` and `gpuctl admin node revoke`: how nodes join the
//! cluster, and how one is shut out.

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure};
use crate::format;

#[derive(Serialize)]
pub struct JoinToken {
    token: String,
    ca_fingerprint: String,
    #[serde(skip)]
    expires_ms: i64,
    #[serde(skip)]
    node: String,
}

impl View for JoinToken {
    fn text(&self) -> String {
        let until = format::time_string(self.expires_ms).unwrap_or_default();
        let who = if self.node.is_empty() {
            "any node not yet joined".to_string()
        } else {
            format!("node {}", format::printable(&self.node))
        };
        format!(
            "Join token for {who}, single use, valid until {until}:\n{}\nCA fingerprint: {}\nOn the node, keep the token off the command line (every local user can read it there):\n  (umask 077; gpuctl admin join-token create --node NAME --json > /etc/gpuctl/join.json)  # or paste this token into such a file\n  gpud --controller https://CONTROLLER:7817 --join-file /etc/gpuctl/join.json --ca-fingerprint {}\nor set GPUD_JOIN_TOKEN in the agent's environment (an EnvironmentFile of mode 0600).\n",
            self.token, self.ca_fingerprint, self.ca_fingerprint
        )
    }
}

pub async fn create(
    client: &mut Client,
    ttl: std::time::Duration,
    node: String,
) -> Result<JoinToken, Failure> {
    let t = client
        .create_join_token(pb::CreateJoinTokenRequest {
            ttl_seconds: ttl.as_secs().max(1) as i64,
            node,
        })
        .await?
        .into_inner();
    Ok(JoinToken {
        token: t.token,
        ca_fingerprint: t.ca_fingerprint,
        expires_ms: t.expires_ms,
        node: t.node,
    })
}

#[derive(Serialize)]
pub struct Revoked {
    node: String,
    certificates: u32,
}

impl View for Revoked {
    fn text(&self) -> String {
        format!(
            "Node {} revoked ({} certificate(s)); its jobs are handled as on a failed node. A new join token for it (--node) lets it join again.\n",
            format::printable(&self.node),
            self.certificates
        )
    }
}

pub async fn revoke(client: &mut Client, node: String) -> Result<Revoked, Failure> {
    let r = client
        .revoke_node(pb::RevokeNodeRequest { node })
        .await?
        .into_inner();
    Ok(Revoked {
        node: r.node,
        certificates: r.certificates,
    })
}
