//! The agent side of the controller: sessions (challenge, attach, the replay window),
//! heartbeats, reports, and failed nodes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use gpuctl_proto::auth::{ReplayWindow, Signed};
use gpuctl_proto::store::StoredNode;
use gpuctl_proto::{self as pb, JobState};
use tokio::sync::mpsc;
use tonic::Status;

use super::{Cluster, Conn, Controller, Transition, job_of, live_allocs, now_ms, store_status};
use crate::store::StoreError;

impl Controller {
    pub(super) fn kill_cmd(&self, job_id: u64, attempt: u32, reason: &str) -> pb::AgentCommand {
        pb::AgentCommand {
            command: Some(pb::agent_command::Command::Kill(pb::KillJob {
                job_id,
                as_state: JobState::Cancelled as i32,
                kill_grace_secs: self.config.kill_grace.as_secs(),
                reason: reason.into(),
                attempt,
            })),
            ..pb::AgentCommand::default()
        }
    }

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
        let session = {
            let mut c = self.lock();
            let conn = c
                .conns
                .get_mut(node)
                .filter(|x| x.generation == generation)?;
            if let Some(pb::agent_command::Command::Start(s)) = &cmd.command {
                conn.starts.push((seq, s.job_id, s.attempt));
            }
            conn.session.clone()
        };
        let cmd = pb::AgentCommand {
            session,
            seq,
            ..cmd
        };
        Some(self.key.sign_command(node, &cmd))
    }

    /// Checks an agent request's signature; returns the session and number it carries.
    pub fn verify_agent(
        &self,
        meta: &tonic::metadata::MetadataMap,
        method: &str,
        node: &str,
        body: &[u8],
    ) -> Result<Signed, Status> {
        let get = |k: &str| meta.get(k).and_then(|v| v.to_str().ok());
        self.key
            .verify_request(method, node, body, get, now_ms())
            .map_err(|e| {
                tracing::warn!(node, method, "agent request refused: {e}");
                Status::unauthenticated(format!("agent request refused: {e}"))
            })
    }

    /// Checks that a request belongs to the node's live session and was not seen on it
    /// before (a replay), and counts the agent as heard from.
    pub fn check_session(&self, node: &str, signed: &Signed) -> Result<(), Status> {
        let mut c = self.lock();
        let Some(conn) = c.conns.get_mut(node) else {
            return Err(Status::failed_precondition(format!(
                "node {node} has no attached session; the agent must attach again"
            )));
        };
        if conn.session != signed.session {
            tracing::warn!(node, "request of an old or unknown session refused");
            return Err(Status::failed_precondition(
                "request of an old or unknown agent session (replayed, or the agent attached again)",
            ));
        }
        if !conn.window.accept(signed.seq) {
            tracing::warn!(node, seq = signed.seq, "replayed agent request refused");
            return Err(Status::failed_precondition(format!(
                "request number {} of this session was already seen (a replay)",
                signed.seq
            )));
        }
        c.last_heard.insert(node.to_string(), now_ms());
        Ok(())
    }

    /// A fresh nonce for the next Attach of `node` (valid for 30 s, single use).
    pub fn challenge(&self, node: &str) -> pb::ChallengeResponse {
        use rand::RngCore;
        let mut nonce = vec![0u8; 16];
        rand::rng().fill_bytes(&mut nonce);
        let now = now_ms();
        let mut c = self.lock();
        let list = c.challenges.entry(node.to_string()).or_default();
        list.retain(|(_, until)| *until > now);
        // A key holder asking again and again keeps only the newest few.
        if list.len() >= 8 {
            list.remove(0);
        }
        list.push((nonce.clone(), now + 30_000));
        pb::ChallengeResponse {
            nonce,
            node_timeout_ms: self.config.node_timeout.as_millis() as u64,
        }
    }

    /// Takes the nonce of an Attach: it must have been handed out for this node, unused
    /// and unexpired.
    fn take_nonce(c: &mut Cluster, node: &str, nonce: &[u8]) -> Result<(), Status> {
        let now = now_ms();
        let list = c.challenges.entry(node.to_string()).or_default();
        let found = list
            .iter()
            .position(|(n, until)| n.as_slice() == nonce && *until > now);
        match found {
            Some(i) => {
                list.remove(i);
                Ok(())
            }
            None => {
                tracing::warn!(
                    node,
                    "attach with an unknown, used or expired nonce refused (a replay?)"
                );
                Err(Status::failed_precondition(
                    "attach refused: its challenge nonce is unknown, used or expired (ask for a new one)",
                ))
            }
        }
    }

    /// Refuses an agent that would take over a name another agent holds: attached now,
    /// or heard from within the node timeout, under another identity.
    fn check_identity(&self, c: &Cluster, req: &pb::RegisterRequest) -> Result<(), Status> {
        if req.agent_id.is_empty() || req.agent_id.len() > 128 {
            return Err(Status::invalid_argument(
                "agent_id must be 1 to 128 characters",
            ));
        }
        let now = now_ms();
        let timeout = self.config.node_timeout.as_millis() as i64;
        let heard = c.last_heard.get(&req.node).copied().unwrap_or(0);
        let live = c.conns.get(&req.node);
        let known = c.nodes.get(&req.node).map(|n| n.agent_id.as_str());
        let other = match live {
            Some(conn) if conn.agent_id != req.agent_id => {
                Some((conn.agent_id.clone(), conn.peer.clone()))
            }
            None if now - heard <= timeout
                && known.is_some_and(|k| !k.is_empty() && k != req.agent_id) =>
            {
                let addr = c.nodes.get(&req.node).map(|n| n.address.clone());
                Some((
                    known.unwrap_or_default().to_string(),
                    addr.unwrap_or_default(),
                ))
            }
            _ => None,
        };
        if let Some((id, addr)) = other {
            tracing::warn!(node = %req.node, other = %id, %addr, new = %req.agent_id, "a second agent tried to attach under a live name; refused");
            return Err(Status::already_exists(format!(
                "node name {:?} is held by another agent (id {id}, at {addr}); stop that agent or start this one with another --name",
                req.node
            )));
        }
        if known.is_some_and(|k| !k.is_empty() && k != req.agent_id) {
            tracing::warn!(node = %req.node, before = known.unwrap_or_default(), now = %req.agent_id, "node name taken over by a new agent identity (its old agent has been silent)");
        }
        Ok(())
    }

    /// Registers an agent (or re-registers after a disconnect or a controller restart)
    /// and reconciles what it runs with what the controller believes.
    pub async fn connect(
        self: &Arc<Self>,
        req: pb::RegisterRequest,
        peer: Option<std::net::SocketAddr>,
    ) -> Result<(mpsc::Receiver<Result<pb::AgentCommand, Status>>, u64), Status> {
        if req.node.is_empty()
            || req.node.len() > 255
            || req.node.contains('/')
            || req.node.contains(',')
        {
            return Err(Status::invalid_argument(
                "node name must be 1 to 255 characters without '/' or ','",
            ));
        }
        let (tx, rx) = mpsc::channel(1024);
        let now = now_ms();
        let mut to_kill = Vec::new();
        let mut other_kills = Vec::new();
        let peer_ip = peer.map(|p| p.ip().to_string()).unwrap_or_default();
        let address = if req.address.is_empty() {
            peer_ip.clone()
        } else {
            req.address.clone()
        };
        let (generation, rank_kills) = {
            let mut c = self.lock();
            Self::take_nonce(&mut c, &req.node, &req.nonce)?;
            self.check_identity(&c, &req)?;
            c.generation += 1;
            let generation = c.generation;
            let drain_reason = c.nodes.get(&req.node).and_then(|n| n.drain_reason.clone());
            let node = StoredNode {
                name: req.node.clone(),
                gpus: req
                    .gpus
                    .iter()
                    .map(|g| pb::Gpu {
                        allocated_to: 0,
                        compute_allocated_milli: 0,
                        memory_allocated_mib: 0,
                        jobs: Vec::new(),
                        ..g.clone()
                    })
                    .collect(),
                cpus: req.cpus,
                memory_bytes: req.memory_bytes,
                drain_reason,
                gpu_backend: req.gpu_backend.clone(),
                last_seen_ms: now,
                agent_id: req.agent_id.clone(),
                address: address.clone(),
                allow_root_jobs: req.allow_root_jobs,
                drain_automatic: c.nodes.get(&req.node).is_some_and(|n| n.drain_automatic),
            };
            self.store.put_node(&node).map_err(store_status)?;
            c.nodes.insert(req.node.clone(), node);

            for r in &req.unacked_reports {
                other_kills.extend(Self::apply_report(&mut c, r, now));
            }
            let running: BTreeSet<(u64, u32)> =
                req.running.iter().map(|r| (r.job_id, r.attempt)).collect();
            Self::reconcile_missing(&mut c, &req.node, &running, now, &mut other_kills);
            // A requeued job whose start is still running here is adopted again.
            for &(id, attempt) in &running {
                let node = req.node.clone();
                if c.jobs
                    .transition(id, Transition::Readopt { node, attempt }, now)
                    .is_ok()
                {
                    tracing::info!(job = id, attempt, node = %req.node, "requeued job found still running on its returning node; adopted again");
                }
            }
            // Fencing: an instance is kept only if it is the job's current start here.
            for &(id, attempt) in &running {
                let keep = c.jobs.get(id).is_some_and(|s| {
                    let j = job_of(s);
                    j.attempt == attempt
                        && live_allocs(j).any(|a| a.node == req.node)
                        && !s.cancel_requested
                });
                if !keep {
                    tracing::warn!(job = id, attempt, node = %req.node, "agent runs a stale or unknown job instance; killing it");
                    to_kill.push(self.kill_cmd(
                        id,
                        attempt,
                        "not running here according to the controller",
                    ));
                }
            }
            self.persist(&mut c).map_err(store_status)?;
            c.conns.insert(
                req.node.clone(),
                Conn {
                    generation,
                    tx: tx.clone(),
                    session: req.nonce.clone(),
                    window: ReplayWindow::default(),
                    agent_id: req.agent_id.clone(),
                    peer: peer.map(|p| p.to_string()).unwrap_or_default(),
                    starts: Vec::new(),
                },
            );
            c.last_heard.insert(req.node.clone(), now);
            let rank_kills: Vec<_> = other_kills
                .into_iter()
                .filter_map(|(node, id)| {
                    c.conns
                        .get(&node)
                        .map(|conn| (conn.tx.clone(), self.kill_cmd(id, 0, "another rank ended")))
                })
                .collect();
            (generation, rank_kills)
        };
        self.store.flush().await.map_err(store_status)?;
        for cmd in to_kill {
            let _ = tx.send(Ok(cmd)).await;
        }
        for (t, cmd) in rank_kills {
            let _ = t.send(Ok(cmd)).await;
        }
        tracing::info!(node = %req.node, gpus = req.gpus.len(), running = req.running.len(), "agent connected");
        self.wake_scheduler();
        Ok((rx, generation))
    }

    /// The jobs the controller places on `node` that its agent, attaching, does not
    /// run: a confirmed start was lost (its allocation fails); an unconfirmed one never
    /// arrived (requeued, or CANCELLED if a cancel was asked meanwhile).
    fn reconcile_missing(
        c: &mut Cluster,
        node: &str,
        running: &BTreeSet<(u64, u32)>,
        now: i64,
        other_kills: &mut Vec<(String, u64)>,
    ) {
        for id in c.jobs.active_ids() {
            let Some(stored) = c.jobs.get(id) else {
                continue;
            };
            let j = job_of(stored);
            let here = live_allocs(j).any(|a| a.node == node);
            if !here || running.contains(&(id, j.attempt)) {
                continue;
            }
            let change = if !stored.start_confirmed && stored.cancel_requested {
                // Cancelled while its start was on the way, which never arrived.
                for a in live_allocs(j).filter(|a| a.node != node) {
                    other_kills.push((a.node.clone(), id));
                }
                Transition::Finish {
                    state: JobState::Cancelled,
                    exit_code: None,
                    reason: "cancelled before its start arrived".into(),
                }
            } else if stored.start_confirmed {
                tracing::warn!(job = id, node = %node, "running job lost by its agent");
                Transition::EndOn {
                    node: node.to_string(),
                    state: JobState::Failed,
                    exit_code: None,
                    reason: "agent restarted without the job (lost)".into(),
                }
            } else {
                // Never confirmed started, and the agent does not run it: safe to requeue.
                for a in j.allocations.iter().filter(|a| a.node != node) {
                    other_kills.push((a.node.clone(), id));
                }
                tracing::info!(job = id, "requeued an undelivered start");
                Transition::Requeue {
                    reason: "requeued: start was not delivered".into(),
                    keep_for_readopt: false,
                }
            };
            c.jobs
                .transition(id, change, now)
                .expect("a running job with a live allocation here");
        }
    }

    /// Declares failed every node whose agent has been silent for `node_timeout`: the node
    /// goes DOWN (its stream is closed, so a live agent re-attaches and is reconciled),
    /// and its jobs end NODE_FAIL, or go back to the queue if their job file asks.
    pub async fn check_nodes(&self) -> Result<(), StoreError> {
        let now = now_ms();
        let timeout = self.config.node_timeout.as_millis() as i64;
        let mut kills = Vec::new();
        let mut changed = false;
        {
            let mut c = self.lock();
            let silent: Vec<String> = c
                .nodes
                .keys()
                .filter(|n| {
                    let heard = c.last_heard.get(*n).copied().unwrap_or(0);
                    now - heard > timeout
                })
                .cloned()
                .collect();
            for node in silent {
                if c.conns.remove(&node).is_some() {
                    tracing::warn!(
                        node,
                        "agent silent for {:?}: node is DOWN",
                        self.config.node_timeout
                    );
                }
                let ids: Vec<u64> = c
                    .jobs
                    .active()
                    .filter(|s| live_allocs(job_of(s)).any(|a| a.node == node))
                    .map(|s| job_of(s).id)
                    .collect();
                for id in ids {
                    let j = c.jobs.job(id).expect("an active job");
                    let others: Vec<String> = live_allocs(j)
                        .filter(|a| a.node != node)
                        .map(|a| a.node.clone())
                        .collect();
                    let change = if j.spec.as_ref().is_some_and(|s| s.requeue) {
                        tracing::warn!(job = id, node, "node failed; job requeued");
                        Transition::Requeue {
                            reason: format!("requeued: node {node} failed"),
                            keep_for_readopt: true,
                        }
                    } else {
                        tracing::warn!(job = id, node, "node failed; job NODE_FAIL");
                        Transition::Finish {
                            state: JobState::NodeFail,
                            exit_code: None,
                            reason: format!("node {node} stopped responding"),
                        }
                    };
                    c.jobs
                        .transition(id, change, now)
                        .expect("a running job with a live allocation there");
                    changed = true;
                    for other in others {
                        if let Some(conn) = c.conns.get(&other) {
                            kills.push((
                                conn.tx.clone(),
                                self.kill_cmd(id, 0, "another rank's node failed"),
                            ));
                        }
                    }
                }
                // Heard from again only when it re-attaches.
                c.last_heard.insert(node, i64::MAX / 2);
            }
            self.persist(&mut c)?;
        }
        if changed {
            self.store.flush().await?;
            self.wake_scheduler();
        }
        for (tx, cmd) in kills {
            let _ = tx.send(Ok(cmd)).await;
        }
        Ok(())
    }

    /// Runs `check_nodes` every second until `shutdown` fires.
    pub async fn watchdog_loop(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => break,
            }
            if let Err(e) = self.check_nodes().await {
                tracing::error!("node check failed: {e}");
            }
        }
    }

    /// The agent's command stream closed.
    pub fn disconnected(&self, node: &str, generation: u64) {
        let mut c = self.lock();
        if c.conns
            .get(node)
            .is_some_and(|conn| conn.generation == generation)
        {
            c.conns.remove(node);
            tracing::warn!(node, "agent disconnected; node is DOWN");
        }
    }

    /// A heartbeat of a live session (checked by `check_session`). Starts the agent has
    /// handled but neither runs nor reports were not run (their command was refused):
    /// those jobs end here with the reason, so that no job waits in RUNNING for a start
    /// that never happened. Answers with the instances the agent runs that the
    /// controller holds as ended or replaced.
    pub async fn heartbeat(
        &self,
        req: &pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse, Status> {
        let (resp, changed) = {
            let mut c = self.lock();
            let mut changed = Self::starts_not_run(&mut c, req);
            changed |= self.check_health(&mut c, req).map_err(store_status)?;
            self.persist(&mut c).map_err(store_status)?;
            (Self::heartbeat_locked(&mut c, req), changed)
        };
        if changed {
            self.store.flush().await.map_err(store_status)?;
            self.wake_scheduler();
        }
        Ok(resp)
    }

    /// Drains a node whose GPU is over `health.max_gpu_temp_c` (a hardware reason,
    /// automatic), and lifts that drain once every GPU is at or below
    /// `health.resume_gpu_temp_c`. An admin's drain is left alone. Returns whether the
    /// node changed.
    fn check_health(
        &self,
        c: &mut Cluster,
        req: &pb::HeartbeatRequest,
    ) -> Result<bool, StoreError> {
        let h = &self.config.health;
        if h.max_gpu_temp_c == 0 || req.metrics.is_empty() {
            return Ok(false);
        }
        let Some(n) = c.nodes.get_mut(&req.node) else {
            return Ok(false);
        };
        let hottest = req
            .metrics
            .iter()
            .max_by_key(|m| m.temp_c)
            .expect("not empty");
        let admin_drain = n.drain_reason.is_some() && !n.drain_automatic;
        if admin_drain {
            return Ok(false);
        }
        if hottest.temp_c > h.max_gpu_temp_c && n.drain_reason.is_none() {
            let why = format!(
                "health (hardware): GPU {} at {} C, over health.max_gpu_temp_c {} C",
                hottest.uuid, hottest.temp_c, h.max_gpu_temp_c
            );
            tracing::warn!(node = %req.node, "draining: {why}");
            n.drain_reason = Some(why);
            n.drain_automatic = true;
        } else if n.drain_automatic && hottest.temp_c <= h.resume_gpu_temp_c {
            tracing::info!(node = %req.node, temp_c = hottest.temp_c, "healthy again: drain lifted");
            n.drain_reason = None;
            n.drain_automatic = false;
        } else {
            return Ok(false);
        }
        self.store.put_node(n)?;
        Ok(true)
    }

    /// Ends the jobs whose starts the agent handled without running them.
    fn starts_not_run(c: &mut Cluster, req: &pb::HeartbeatRequest) -> bool {
        let Some(conn) = c.conns.get_mut(&req.node) else {
            return false;
        };
        let seen = |job: u64, attempt: u32| {
            req.running
                .iter()
                .chain(&req.reporting)
                .any(|r| r.job_id == job && r.attempt == attempt)
        };
        let mut not_run = Vec::new();
        conn.starts.retain(|&(seq, job, attempt)| {
            if seq > req.commands_handled {
                return true;
            }
            if !seen(job, attempt) {
                not_run.push((job, attempt));
            }
            false
        });
        let now = now_ms();
        let mut changed = false;
        for (id, attempt) in not_run {
            let Some(stored) = c.jobs.get(id) else {
                continue;
            };
            if stored.start_confirmed || job_of(stored).attempt != attempt {
                continue;
            }
            let (state, why) = if stored.cancel_requested {
                (
                    JobState::Cancelled,
                    "cancelled before its start ran".to_string(),
                )
            } else {
                (
                    JobState::Failed,
                    format!(
                        "the agent on {} did not run the start (its command was refused: see that agent's log)",
                        req.node
                    ),
                )
            };
            let end = Transition::EndOn {
                node: req.node.clone(),
                state,
                exit_code: None,
                reason: why.clone(),
            };
            if c.jobs.transition(id, end, now).is_ok() {
                tracing::error!(job = id, attempt, node = %req.node, "{why}");
                changed = true;
            }
        }
        changed
    }

    fn heartbeat_locked(c: &mut Cluster, req: &pb::HeartbeatRequest) -> pb::HeartbeatResponse {
        let known = c.conns.contains_key(&req.node);
        let now = now_ms();
        if let Some(n) = c.nodes.get_mut(&req.node) {
            n.last_seen_ms = now;
            c.last_heard.insert(req.node.clone(), now);
            if !req.metrics.is_empty() {
                c.metrics.insert(req.node.clone(), req.metrics.clone());
            }
        }
        let stale = req
            .running
            .iter()
            .filter(|r| {
                c.jobs.get(r.job_id).is_none_or(|s| {
                    let j = job_of(s);
                    r.attempt < j.attempt || (r.attempt == j.attempt && j.state().is_final())
                })
            })
            .cloned()
            .collect();
        pb::HeartbeatResponse { known, stale }
    }

    /// Whether `(job, attempt)` runs on `node` as far as the controller knows.
    fn holds(c: &Cluster, node: &str, job: u64, attempt: u32) -> bool {
        c.jobs.get(job).is_some_and(|s| {
            let j = job_of(s);
            j.attempt == attempt
                && !j.state().is_final()
                && !s.cancel_requested
                && live_allocs(j).any(|a| a.node == node)
        })
    }

    /// Applies an agent's report. For a STARTED report, answers whether the instance is
    /// stale (the controller no longer holds it as running there): the agent kills it.
    pub async fn report(&self, r: &pb::JobReport) -> Result<pb::JobReportAck, Status> {
        let mut stale = false;
        let kills = {
            let mut c = self.lock();
            if c.conns.contains_key(&r.node) {
                c.last_heard.insert(r.node.clone(), now_ms());
            }
            let others = Self::apply_report(&mut c, r, now_ms());
            self.persist(&mut c).map_err(store_status)?;
            if r.kind() == pb::job_report::Kind::Started
                && !Self::holds(&c, &r.node, r.job_id, r.attempt)
            {
                tracing::warn!(job = r.job_id, attempt = r.attempt, node = %r.node, "a start the controller no longer holds ran; the agent kills it");
                stale = true;
            }
            others
                .into_iter()
                .filter_map(|(node, id)| {
                    c.conns
                        .get(&node)
                        .map(|conn| (conn.tx.clone(), self.kill_cmd(id, 0, "another rank failed")))
                })
                .collect::<Vec<_>>()
        };
        self.store.flush().await.map_err(store_status)?;
        for (tx, cmd) in kills {
            let _ = tx.send(Ok(cmd)).await;
        }
        self.wake_scheduler();
        Ok(pb::JobReportAck { stale })
    }

    /// Applies one agent report. Returns (node, job) pairs whose other ranks must be
    /// killed (a rank of a gang job failed).
    fn apply_report(c: &mut Cluster, r: &pb::JobReport, now: i64) -> Vec<(String, u64)> {
        let readopt = Transition::Readopt {
            node: r.node.clone(),
            attempt: r.attempt,
        };
        if c.jobs.transition(r.job_id, readopt, now).is_ok() {
            tracing::info!(job = r.job_id, node = %r.node, "report from a requeued job's returning node; adopted again");
        }
        let Some(stored) = c.jobs.get(r.job_id) else {
            tracing::warn!(job = r.job_id, node = %r.node, "report for an unknown job");
            return Vec::new();
        };
        let cancel_requested = stored.cancel_requested;
        let j = job_of(stored);
        if r.attempt != j.attempt {
            tracing::info!(job = r.job_id, node = %r.node, attempt = r.attempt, current = j.attempt, "report from an earlier start ignored");
            return Vec::new();
        }
        if !live_allocs(j).any(|a| a.node == r.node) {
            tracing::debug!(job = r.job_id, "stale report ignored");
            return Vec::new();
        }
        let id = r.job_id;
        let mut kill_others = Vec::new();
        match r.kind() {
            pb::job_report::Kind::Started => {
                c.jobs.edit(id, |s| s.start_confirmed = true);
            }
            pb::job_report::Kind::Ended => {
                let state = match r.state() {
                    s @ (JobState::Completed
                    | JobState::Failed
                    | JobState::Cancelled
                    | JobState::Timeout) => s,
                    _ => JobState::Failed,
                };
                let end = Transition::EndOn {
                    node: r.node.clone(),
                    state,
                    exit_code: r.exit_code,
                    reason: r.reason.clone(),
                };
                let at = if r.time_ms > 0 { r.time_ms } else { now };
                c.jobs
                    .transition(id, end, at)
                    .expect("a live allocation there");
                c.jobs.edit(id, |s| s.start_confirmed = true);
                let j = c.jobs.job(id).expect("just changed");
                if state != JobState::Completed && !cancel_requested {
                    kill_others = live_allocs(j).map(|a| (a.node.clone(), id)).collect();
                }
                if j.state().is_final() {
                    tracing::info!(job = id, state = j.state().as_str_name(), exit_code = ?j.exit_code, "job ended");
                }
            }
            pb::job_report::Kind::Warning => {
                tracing::warn!(job = id, node = %r.node, "{}", r.reason);
                c.jobs.edit(id, |s| {
                    let j = s.job.as_mut().expect("a job record");
                    j.reason = r.reason.clone();
                    let w = format!("{}: {}", r.node, r.reason);
                    if !j.warnings.contains(&w) && j.warnings.len() < 20 {
                        j.warnings.push(w);
                    }
                });
            }
            pb::job_report::Kind::Unspecified => {}
        }
        kill_others
    }

    /// Drops every agent connection so that their streams end (for shutdown).
    pub fn close_agent_streams(&self) {
        self.lock().conns.clear();
    }
}
