//! The agent side of the shell: request signatures, sessions, the command streams, and
//! the watchdog; what they mean for the cluster is `gpuctl_core::agents`.

use std::sync::Arc;
use std::time::Duration;

use gpuctl_proto as pb;
use gpuctl_proto::auth::Signed;
use gpuctl_proto::ratelog::RateLog;
use gpuctl_proto::text::shown;
use tokio::sync::mpsc;
use tonic::Status;

use super::{Controller, Link, now_ms, status, store_status};
use crate::pki::MAX_NODE_NAME;
use gpuctl_core::log::{Applied, Change};

impl Controller {
    /// Encodes and signs the `seq`th command of `session` for the agent of `node`, or
    /// `None` when that session is no longer the node's live one (the node was declared
    /// down, or the agent attached again): what was queued for it is never sent.
    pub fn sign_command(
        &self,
        node: &str,
        generation: u64,
        seq: u64,
        cmd: pb::AgentCommand,
    ) -> Option<pb::SignedCommand> {
        let start = match &cmd.command {
            Some(pb::agent_command::Command::Start(s)) => Some((s.job_id, s.attempt)),
            _ => None,
        };
        let session = self
            .lock()
            .core
            .leader()
            .command_sent(node, generation, seq, start)?;
        let cmd = pb::AgentCommand {
            session,
            seq,
            term: self.term(),
            ..cmd
        };
        Some(self.pki.command_key(node)?.sign_command(node, &cmd))
    }

    /// Checks an agent request's signature; returns the session and number it carries.
    pub fn verify_agent(
        &self,
        via: &crate::pki::Via<'_>,
        meta: &tonic::metadata::MetadataMap,
        method: &str,
        node: &str,
        body: &[u8],
    ) -> Result<Signed, Status> {
        refuse_long_name(node)?;
        let get = |k: &str| meta.get(k).and_then(|v| v.to_str().ok());
        let signed = self
            .agent_key(node, via)?
            .verify_request(method, node, body, get, now_ms())
            .map_err(|e| {
                let why = shown(&e.to_string(), 200);
                let node = shown(node, 64);
                REFUSED.note(|n, secs| {
                    tracing::warn!(%node, method, refused_in_period = n, "agent request refused: {why} ({n} refused in the last {secs} s, this one included)");
                });
                Status::unauthenticated(format!("agent request refused: {why}"))
            })?;
        // An agent of the shared-key mode (no certificate): its signature proved it.
        if let crate::pki::Via::Tcp(peer) = via {
            peer.auth.authenticated();
        }
        Ok(signed)
    }

    /// Checks a heartbeat of the Heartbeats stream (its signature, then its session like
    /// any request's), and answers it as `heartbeat` does.
    pub async fn streamed_heartbeat(
        &self,
        via: &crate::pki::Via<'_>,
        m: &pb::SignedHeartbeat,
    ) -> Result<pb::HeartbeatResponse, Status> {
        refuse_long_name(&m.node)?;
        let key = self.agent_key(&m.node, via)?;
        let (signed, hb) = key.verify_heartbeat(m, now_ms()).map_err(|e| {
            let why = shown(&e.to_string(), 200);
            let node = shown(&m.node, 64);
            REFUSED.note(|n, secs| {
                tracing::warn!(%node, refused_in_period = n, "streamed heartbeat refused: {why} ({n} refused in the last {secs} s, this one included)");
            });
            Status::unauthenticated(format!("agent request refused: {why}"))
        })?;
        self.signed_heartbeat(hb, &signed).await
    }

    /// The key `node`'s requests verify under, once the connection is known to be the
    /// node's (refusals logged a line a period).
    fn agent_key(
        &self,
        node: &str,
        via: &crate::pki::Via<'_>,
    ) -> Result<gpuctl_proto::auth::ClusterKey, Status> {
        self.pki.key_for(node, via).inspect_err(|e| {
            let why = shown(e.message(), 200);
            REFUSED.note(|n, secs| {
                tracing::warn!(refused_in_period = n, "agent request refused: {why} ({n} refused in the last {secs} s, this one included)");
            });
        })
    }

    /// A heartbeat whose signature was verified: it must belong to the node's live
    /// session (not a replay) and carry a well-formed health line; then it is answered.
    pub async fn signed_heartbeat(
        &self,
        hb: pb::HeartbeatRequest,
        signed: &Signed,
    ) -> Result<pb::HeartbeatResponse, Status> {
        self.check_session(&hb.node, signed)?;
        check_health_error(&hb.health_error)?;
        self.heartbeat(hb).await
    }

    /// Checks that a request belongs to the node's live session and was not seen on it
    /// before (a replay), and counts the agent as heard from.
    pub fn check_session(&self, node: &str, signed: &Signed) -> Result<(), Status> {
        (self.lock().core.leader())
            .check_session(node, signed, now_ms())
            .map_err(status)
    }

    /// A fresh nonce for the next Attach of `node` (valid for 30 s, single use).
    pub fn challenge(&self, node: &str) -> pb::ChallengeResponse {
        use rand::RngCore;
        let mut nonce = vec![0u8; 16];
        rand::rng().fill_bytes(&mut nonce);
        let node_timeout_ms = self
            .lock()
            .core
            .leader()
            .challenge(node, nonce.clone(), now_ms());
        pb::ChallengeResponse {
            nonce,
            node_timeout_ms,
            term: self.term(),
        }
    }

    /// Registers an agent (or re-registers it after a disconnect or a controller
    /// restart): the state reconciles what it runs; its command stream is returned.
    pub async fn connect(
        self: &Arc<Self>,
        req: pb::RegisterRequest,
        peer: Option<std::net::SocketAddr>,
    ) -> Result<(mpsc::Receiver<Result<Box<pb::AgentCommand>, Status>>, u64), Status> {
        let batches = req.takes_kill_batches;
        let req = gpuctl_proto::wire::register(req);
        let (tx, rx) = mpsc::channel(1024);
        let (generation, out) = self
            .commit(
                |c, now| {
                    c.core.leader().check_attach(&req, now).map_err(status)?;
                    let node = req.node.clone();
                    Ok((
                        Change::Attach {
                            register: req,
                            peer,
                        },
                        node,
                    ))
                },
                |c, node, answer| {
                    let generation = match answer.map_err(status)? {
                        Applied::Attached(generation) => generation,
                        other => unreachable!("an attach answers its generation, not {other:?}"),
                    };
                    c.link_added(&node, generation, &tx);
                    c.links.insert(
                        node,
                        Link {
                            generation,
                            tx,
                            batches,
                        },
                    );
                    Ok(generation)
                },
            )
            .await?;
        self.deliver(out, true).await.map_err(store_status)?;
        Ok((rx, generation))
    }

    /// Declares failed every node whose agent has been silent for `node_timeout`
    /// (`sweep`: also when none is, to sweep what jobs that ended left behind).
    pub async fn check_nodes(&self, sweep: bool) -> Result<(), Status> {
        if !self.is_leader() {
            return Ok(());
        }
        let ((), out) = self
            .commit(
                |c, now| {
                    let silent = c.silent_nodes(now);
                    if silent.is_empty() && !sweep {
                        return Err(Status::cancelled("nothing to do"));
                    }
                    Ok((Change::CheckNodes { silent }, ()))
                },
                |_, (), _| Ok(()),
            )
            .await?;
        self.deliver(out, false).await.map_err(store_status)
    }

    /// Runs `check_nodes` every second until `shutdown` fires.
    pub async fn watchdog_loop(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut round = 0u64;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => break,
            }
            round += 1;
            let sweep = self.sweep_due(round);
            match self.check_nodes(sweep).await {
                Err(e) if e.code() != tonic::Code::Cancelled => {
                    tracing::error!("node check failed: {}", e.message());
                }
                _ => {}
            }
        }
    }

    /// The agent's command stream closed.
    pub fn disconnected(self: &Arc<Self>, node: &str, generation: u64) {
        let change = Change::Disconnected {
            node: node.to_string(),
            generation,
        };
        let mut c = self.lock();
        if c.links
            .get(node)
            .is_some_and(|l| l.generation == generation)
        {
            c.links.remove(node);
        }
        self.end_session(c, change);
    }

    /// A heartbeat of a live session (checked by `check_session`).
    pub async fn heartbeat(
        &self,
        req: pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse, Status> {
        let hb = gpuctl_proto::wire::heartbeat(req);
        let (resp, out) = self
            .commit(
                |c, _| {
                    let not_run = c.core.leader().starts_not_run(&hb);
                    let heartbeat = hb;
                    Ok((Change::Heartbeat { heartbeat, not_run }, ()))
                },
                |_, (), answer| match answer {
                    Ok(Applied::Heartbeat(resp)) => Ok(resp),
                    other => unreachable!("a heartbeat answers, not {other:?}"),
                },
            )
            .await?;
        self.deliver(out, false).await.map_err(store_status)?;
        Ok(gpuctl_proto::wire::heartbeat_answer(resp))
    }

    /// Applies an agent's report; answers whether a started instance is stale.
    pub async fn report(self: &Arc<Self>, r: pb::JobReport) -> Result<pb::JobReportAck, Status> {
        let mut acks = self.reports(vec![r]).await?;
        Ok(acks.pop().unwrap_or_default())
    }

    /// Applies one node's reports in order under one lock and one write; answers each
    /// one's ack, in order.
    pub async fn reports(
        self: &Arc<Self>,
        reports: Vec<pb::JobReport>,
    ) -> Result<Vec<pb::JobReportAck>, Status> {
        let reports = reports
            .into_iter()
            .map(gpuctl_proto::wire::report)
            .collect::<Result<Vec<_>, Status>>()?;
        let (acks, mut out) = self
            .commit(
                |_, _| Ok((Change::Reports(reports), ())),
                |_, (), answer| match answer {
                    Ok(Applied::Reports(stale)) => Ok(stale
                        .into_iter()
                        .map(|stale| pb::JobReportAck { stale })
                        .collect::<Vec<_>>()),
                    other => unreachable!("reports answer their acks, not {other:?}"),
                },
            )
            .await?;
        // A job's end frees its GPUs: the next start goes out with this answer's flush.
        if out.wake && self.pass_now().await {
            out.wake = false;
        }
        self.deliver(out, true).await.map_err(store_status)?;
        Ok(acks)
    }

    /// Drops every agent connection so that their streams end (for shutdown).
    pub fn close_agent_streams(&self) {
        {
            let mut c = self.lock();
            c.links.clear();
            self.streams_closed(&mut c);
        }
        self.steps.close();
    }
}

/// A heartbeat's `health_error` becomes the node's drain reason: one short printable
/// line.
fn check_health_error(e: &str) -> Result<(), Status> {
    if e.len() > 1000 || e.chars().any(char::is_control) {
        return Err(Status::invalid_argument(
            "health_error must be one line of at most 1000 bytes without control characters",
        ));
    }
    Ok(())
}

/// Refuses (and logs, a line a period) a node name longer than any agent's, before
/// anything is verified.
fn refuse_long_name(node: &str) -> Result<(), Status> {
    if node.len() > MAX_NODE_NAME {
        REFUSED.note(|n, secs| {
            tracing::warn!(
                node = %shown(node, 64),
                "agent request refused: a node name of {} bytes ({n} refused in the last {secs} s, this one included)",
                node.len()
            );
        });
        return Err(Status::invalid_argument(format!(
            "a node name is at most {MAX_NODE_NAME} bytes (this one has {})",
            node.len()
        )));
    }
    Ok(())
}

/// Refused agent requests: anyone can send them, so they are logged a line a period.
static REFUSED: RateLog = RateLog::new(std::time::Duration::from_secs(10));
