//! Nodes joining, renewing their certificates and being revoked: the shell around
//! `crate::pki` (which decides) and the store (which makes each change durable before
//! it is answered).

use gpuctl_proto as pb;
use gpuctl_proto::text::shown;
use prost::Message as _;
use tonic::Status;

use super::{Controller, now_ms, store_status};
use crate::auth::Caller;
use crate::pki::Via;
use gpuctl_core::log::Change;

impl Controller {
    pub fn pki(&self) -> &crate::pki::Pki {
        &self.pki
    }

    /// A single-use join token (admins only).
    pub async fn create_join_token(
        &self,
        caller: &Caller,
        req: &pb::CreateJoinTokenRequest,
    ) -> Result<pb::CreateJoinTokenResponse, Status> {
        caller.require_admin("create join tokens")?;
        let (token, t) =
            self.pki
                .create_token(&req.node, req.ttl_seconds, &caller.user, now_ms())?;
        self.store.put_join_token(&t).map_err(store_status)?;
        self.store.flush().await.map_err(store_status)?;
        tracing::info!(by = %caller.user, node = %t.node, expires_ms = t.expires_ms, "join token created");
        Ok(pb::CreateJoinTokenResponse {
            token,
            ca_fingerprint: self.pki.ca().fingerprint(),
            expires_ms: t.expires_ms,
            node: t.node,
        })
    }

    /// A node joining with its token; durable before it is answered.
    pub async fn join(
        &self,
        via: &Via<'_>,
        req: &pb::JoinRequest,
    ) -> Result<pb::JoinResponse, Status> {
        if let Via::Tcp(peer) = via
            && !peer.tls
        {
            return Err(Status::failed_precondition("a node joins over TLS only"));
        }
        let joined = self.pki.join(req, now_ms()).inspect_err(|e| {
            let why = shown(e.message(), 200);
            REFUSED.note(|n, secs| {
                tracing::warn!("join refused: {why} ({n} in the last {secs} s, this one included)");
            });
        })?;
        self.store
            .joined(joined.used.as_deref(), &joined.identity)
            .map_err(store_status)?;
        self.store.flush().await.map_err(store_status)?;
        tracing::info!(node = %req.node, epoch = joined.identity.epoch, "node joined");
        Ok(joined.answer)
    }

    /// A joined node's next certificate, asked for over its current one.
    pub async fn renew(
        &self,
        via: &Via<'_>,
        meta: &tonic::metadata::MetadataMap,
        req: &pb::RenewRequest,
    ) -> Result<pb::JoinResponse, Status> {
        self.verify_agent(via, meta, "renew", &req.node, &req.encode_to_vec())?;
        let renewed = self.pki.renew(&req.node, &req.csr, now_ms())?;
        self.store
            .joined(None, &renewed.identity)
            .map_err(store_status)?;
        self.store.flush().await.map_err(store_status)?;
        tracing::info!(node = %req.node, "node certificate renewed");
        Ok(renewed.answer)
    }

    /// Revokes a node's certificates and key (admins only): it is refused from now on,
    /// its connection closed and its jobs handled as on a failed node.
    pub async fn revoke_node(
        &self,
        caller: &Caller,
        req: &pb::RevokeNodeRequest,
    ) -> Result<pb::RevokeNodeResponse, Status> {
        caller.require_admin("revoke nodes")?;
        let (identity, certificates) = self.pki.revoke(&req.node, now_ms())?;
        self.store.joined(None, &identity).map_err(store_status)?;
        let ((), out) = self
            .commit(
                |_, _| {
                    let (node, why) = (req.node.clone(), "node revoked".to_string());
                    Ok((Change::FailNode { node, why }, ()))
                },
                |c, (), _| {
                    c.links.remove(&req.node);
                    Ok(())
                },
            )
            .await?;
        self.deliver(out, true).await.map_err(store_status)?;
        tracing::warn!(by = %caller.user, node = %req.node, "node revoked");
        Ok(pb::RevokeNodeResponse {
            node: req.node.clone(),
            certificates,
        })
    }
}

/// Refused joins: anyone can send them, so they are logged a line a period.
static REFUSED: gpuctl_proto::ratelog::RateLog =
    gpuctl_proto::ratelog::RateLog::new(std::time::Duration::from_secs(10));
