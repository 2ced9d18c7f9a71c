//! The agent side of the cluster state: challenges and sessions, attach (with the
//! reconciliation of what the agent runs), heartbeats, reports, and failed nodes.

use crate::record::{JobState, state_name};
use crate::replay::{ReplayWindow, Signed};
use std::collections::BTreeSet;

use crate::error::Refusal;
use crate::event::{Heartbeat, HeartbeatAnswer, Register, Report, ReportKind};
use crate::fleet::Conn;
use crate::jobs::Transition;
use crate::node::Node;
use crate::state::{Cluster, Effects, live_allocs};

impl Cluster {
    /// Hands out `nonce` (random, from the shell) for the next Attach of `node`: valid
    /// for 30 s, single use; a node holds at most 8. Answers the node timeout (ms) the
    /// agent is held to.
    pub(crate) fn challenge(&mut self, node: &str, nonce: Vec<u8>, now: i64) -> u64 {
        let list = self.fleet.challenges.entry(node.to_string()).or_default();
        list.retain(|(_, until)| *until > now);
        // A key holder asking again and again keeps only the newest few.
        if list.len() >= crate::fleet::MAX_CHALLENGES {
            list.remove(0);
        }
        list.push((nonce, now + 30_000));
        self.config.node_timeout.as_millis() as u64
    }

    /// Checks that a request belongs to the node's live session and was not seen on it
    /// before (a replay), and counts the agent as heard from.
    pub(crate) fn check_session(
        &mut self,
        node: &str,
        signed: &Signed,
        now: i64,
    ) -> Result<(), Refusal> {
        let Some(conn) = self.fleet.conns.get_mut(node) else {
            return Err(Refusal::failed_precondition(format!(
                "node {node} has no attached session; the agent must attach again"
            )));
        };
        if conn.session != signed.session {
            tracing::warn!(node, "request of an old or unknown session refused");
            return Err(Refusal::failed_precondition(
                "request of an old or unknown agent session (replayed, or the agent attached again)",
            ));
        }
        if !conn.window.accept(signed.seq) {
            tracing::warn!(node, seq = signed.seq, "replayed agent request refused");
            return Err(Refusal::failed_precondition(format!(
                "request number {} of this session was already seen (a replay)",
                signed.seq
            )));
        }
        self.fleet.last_heard.insert(node.to_string(), now);
        Ok(())
    }

    /// The session of `node`'s connection `generation`, recording the start of
    /// `(job, attempt)` if the command sent as its `seq`th is one; `None` when that
    /// connection is no longer the node's live one.
    pub(crate) fn command_sent(
        &mut self,
        node: &str,
        generation: u64,
        seq: u64,
        start: Option<(u64, u32)>,
    ) -> Option<Vec<u8>> {
        let conn = self
            .fleet
            .conns
            .get_mut(node)
            .filter(|x| x.generation == generation)?;
        if let Some((job, attempt)) = start {
            conn.starts.push((seq, job, attempt));
        }
        Some(conn.session.clone())
    }

    /// Takes the nonce of an Attach: it must have been handed out for this node, unused
    /// and unexpired.
    fn take_nonce(&mut self, node: &str, nonce: &[u8], now: i64) -> Result<(), Refusal> {
        let list = self.fleet.challenges.entry(node.to_string()).or_default();
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
                Err(Refusal::failed_precondition(
                    "attach refused: its challenge nonce is unknown, used or expired (ask for a new one)",
                ))
            }
        }
    }

    /// Refuses an agent that would take over a name another agent holds: attached now,
    /// or heard from within the node timeout, under another identity.
    fn check_identity(&self, req: &Register, now: i64) -> Result<(), Refusal> {
        let c = self;
        if req.agent_id.is_empty() || req.agent_id.len() > 128 {
            return Err(Refusal::invalid_argument(
                "agent_id must be 1 to 128 characters",
            ));
        }
        let timeout = self.config.node_timeout.as_millis() as i64;
        let heard = c.fleet.last_heard.get(&req.node).copied().unwrap_or(0);
        let live = c.fleet.conns.get(&req.node);
        let known = c.fleet.nodes.get(&req.node).map(|n| n.agent_id.as_str());
        let other = match live {
            Some(conn) if conn.agent_id != req.agent_id => {
                Some((conn.agent_id.clone(), conn.peer.clone()))
            }
            None if now - heard <= timeout
                && known.is_some_and(|k| !k.is_empty() && k != req.agent_id) =>
            {
                let addr = c.fleet.nodes.get(&req.node).map(|n| n.address.clone());
                Some((
                    known.unwrap_or_default().to_string(),
                    addr.unwrap_or_default(),
                ))
            }
            _ => None,
        };
        // The same identity attaching while its connection is live and heard from: a
        // copy of this agent's state dir runs elsewhere (or twice here). Taking over
        // would make the two take over from each other without end; the second waits
        // (and takes over once the first has been silent a while, as after a crash
        // whose connection the controller has not seen close).
        // The same agent process coming back names the session it had: its own
        // connection (after a failover, a reconnect) is taken over at once.
        let own = |c: &crate::fleet::Conn| {
            !req.previous_session.is_empty() && c.session == req.previous_session
        };
        if let Some(conn) = live.filter(|c| c.agent_id == req.agent_id && !own(c))
            && now - heard < same_identity_window(timeout)
        {
            return Err(Refusal::failed_precondition(format!(
                "node {:?} is attached now under this agent identity (from {}): is a copy of this agent's state dir (agent-id) running elsewhere? retrying until that agent stops",
                req.node, conn.peer
            )));
        }
        if let Some((id, addr)) = other {
            tracing::warn!(node = %req.node, other = %id, %addr, new = %req.agent_id, "a second agent tried to attach under a live name; refused");
            return Err(Refusal::already_exists(format!(
                "node name {:?} is held by another agent (id {id}, at {addr}); stop that agent or start this one with another --name",
                req.node
            )));
        }
        if known.is_some_and(|k| !k.is_empty() && k != req.agent_id) {
            tracing::warn!(node = %req.node, before = known.unwrap_or_default(), now = %req.agent_id, "node name taken over by a new agent identity (its old agent has been silent)");
        }
        Ok(())
    }

    /// What only the controller an agent attaches to checks: the request's shape, the
    /// challenge nonce it answers (taken: single use), and that no other agent holds
    /// the name. Then `attach_checked` (an `Attach` entry of the log) attaches it.
    pub(crate) fn check_attach(&mut self, req: &Register, now: i64) -> Result<(), Refusal> {
        check_register(req)?;
        self.take_nonce(&req.node, &req.nonce, now)?;
        self.check_identity(req, now)
    }

    /// `attach` once `check_attach` has passed.
    pub(crate) fn attach_checked(
        &mut self,
        req: &Register,
        peer: Option<std::net::SocketAddr>,
        now: i64,
    ) -> Result<(u64, Effects), Refusal> {
        check_register(req)?;
        self.fleet.generation += 1;
        let generation = self.fleet.generation;
        let address = if req.address.is_empty() {
            peer.map(|p| p.ip().to_string()).unwrap_or_default()
        } else {
            req.address.clone()
        };
        let old = self.fleet.nodes.get(&req.node);
        let node = Node {
            name: req.node.clone(),
            gpus: req.gpus.clone(),
            cpus: req.cpus,
            memory_bytes: req.memory_bytes,
            drain_reason: old.and_then(|n| n.drain_reason.clone()),
            gpu_backend: req.gpu_backend.clone(),
            last_seen_ms: now,
            agent_id: req.agent_id.clone(),
            address,
            allow_root_jobs: req.allow_root_jobs,
            drain_automatic: old.is_some_and(|n| n.drain_automatic),
            xid_handled_ms: old.map_or(0, |n| n.xid_handled_ms),
            features: req.features.clone(),
            mig_dynamic: req.mig_dynamic,
        };
        self.fleet.nodes.insert(req.node.clone(), node);
        self.node_changed(&req.node);
        self.mig_attached(&req.node);

        let mut other_kills = Vec::new();
        for r in &req.unacked_reports {
            other_kills.extend(self.apply_report(r, now));
        }
        let running: BTreeSet<(u64, u32)> =
            req.running.iter().map(|r| (r.job_id, r.attempt)).collect();
        self.reconcile_missing(&req.node, &running, now, &mut other_kills);
        let mut effects = Effects::wake();
        // A requeued job whose start is still running here is adopted again.
        for &(id, attempt) in &running {
            let node = req.node.clone();
            if self
                .jobs
                .transition(id, Transition::Readopt { node, attempt }, now)
                .is_ok()
            {
                tracing::info!(job = id, attempt, node = %req.node, "requeued job found still running on its returning node; adopted again");
            }
        }
        // Fencing: an instance is kept only if it is the job's current start here.
        for &(id, attempt) in &running {
            let keep = self.jobs.get(id).is_some_and(|s| {
                let j = &s.job;
                j.attempt == attempt
                    && live_allocs(j).any(|a| a.node == req.node)
                    && !s.cancel_requested
            });
            if !keep {
                tracing::warn!(job = id, attempt, node = %req.node, "agent runs a stale or unknown job instance; killing it");
                let kill =
                    self.kill_cmd(id, attempt, "not running here according to the controller");
                effects.sends.push((req.node.clone(), kill));
            }
        }
        self.fleet.conns.insert(
            req.node.clone(),
            Conn {
                generation,
                session: req.nonce.clone(),
                window: ReplayWindow::default(),
                agent_id: req.agent_id.clone(),
                peer: peer.map(|p| p.to_string()).unwrap_or_default(),
                starts: Vec::new(),
            },
        );
        self.fleet.last_heard.insert(req.node.clone(), now);
        for (node, id) in other_kills {
            if self.fleet.conns.contains_key(&node) {
                let kill = self.kill_cmd(id, 0, "another rank ended");
                effects.sends.push((node, kill));
            }
        }
        tracing::info!(node = %req.node, gpus = req.gpus.len(), running = req.running.len(), "agent connected");
        Ok((generation, effects))
    }

    /// The jobs the controller places on `node` that its agent, attaching, does not
    /// run: a confirmed start was lost (its allocation fails); an unconfirmed one never
    /// arrived (requeued, or CANCELLED if a cancel was asked meanwhile).
    fn reconcile_missing(
        &mut self,
        node: &str,
        running: &BTreeSet<(u64, u32)>,
        now: i64,
        other_kills: &mut Vec<(String, u64)>,
    ) {
        let c = self;
        for id in c.jobs.on_node(node) {
            let Some(stored) = c.jobs.get(id) else {
                continue;
            };
            let j = &stored.job;
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

    /// The nodes whose agent has been silent for `node_timeout`, by when this
    /// controller last heard from them (every signed request counts, so this is the
    /// leader's own knowledge: the watchdog's entry carries its answer).
    pub fn silent_nodes(&self, now: i64) -> Vec<String> {
        let timeout = self.config.node_timeout.as_millis() as i64;
        (self.fleet.nodes.keys())
            .filter(|n| {
                let heard = self.fleet.last_heard.get(*n).copied().unwrap_or(0);
                now - heard > timeout
            })
            .cloned()
            .collect()
    }

    /// The watchdog's round: `silent` nodes (`silent_nodes`) fail; usage and idle
    /// records of jobs gone are swept.
    pub(crate) fn fail_silent(&mut self, silent: &[String], now: i64) -> Effects {
        let mut effects = Effects::default();
        for node in silent {
            let why = format!("agent silent for {:?}", self.config.node_timeout);
            self.fail_node(node, &why, now, &mut effects);
        }
        self.sweep_usage();
        self.sweep_idle();
        effects
    }

    /// `node` failed now (`why`: its agent went silent, or its identity was revoked):
    /// its connection is closed and its jobs end or requeue as on any failed node.
    pub(crate) fn fail_node(&mut self, node: &str, why: &str, now: i64, effects: &mut Effects) {
        if !self.fleet.nodes.contains_key(node) {
            return;
        }
        if self.fleet.conns.remove(node).is_some() {
            tracing::warn!(node, "{why}: node is DOWN");
            effects.closed.push(node.to_string());
        }
        self.fail_jobs_on(node, now, effects);
        // Heard from again only when it re-attaches.
        self.fleet.last_heard.insert(node.to_string(), i64::MAX / 2);
    }

    /// Ends or requeues the jobs running on failed `node`; kills their other ranks.
    fn fail_jobs_on(&mut self, node: &str, now: i64, effects: &mut Effects) {
        let ids = self.jobs.on_node(node);
        for id in ids {
            let j = self.jobs.job(id).expect("an active job");
            let others: Vec<String> = live_allocs(j)
                .filter(|a| a.node != node)
                .map(|a| a.node.clone())
                .collect();
            let asked = self
                .jobs
                .get(id)
                .is_some_and(|s| !s.requeue_requested.is_empty() && !s.cancel_requested);
            let change = if asked || j.spec.requeue {
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
            self.jobs
                .transition(id, change, now)
                .expect("a running job with a live allocation there");
            self.settle_usage(id);
            effects.wake = true;
            for other in others {
                if self.fleet.conns.contains_key(&other) {
                    let kill = self.kill_cmd(id, 0, "another rank's node failed");
                    effects.sends.push((other, kill));
                }
            }
        }
    }

    /// The agent's command stream closed.
    pub(crate) fn disconnected(&mut self, node: &str, generation: u64) {
        let c = self;
        if c.fleet
            .conns
            .get(node)
            .is_some_and(|conn| conn.generation == generation)
        {
            c.fleet.conns.remove(node);
            tracing::warn!(node, "agent disconnected; node is DOWN");
        }
    }

    /// `heartbeat`, the starts the agent handled without running them found
    /// (`starts_not_run`, from what this controller sent on the session).
    pub(crate) fn heartbeat_checked(
        &mut self,
        req: &Heartbeat,
        not_run: &[(u64, u32)],
        now: i64,
    ) -> (HeartbeatAnswer, Effects) {
        let mut changed = self.end_not_run(&req.node, not_run, now);
        changed |= self.check_health(req);
        let resp = self.heartbeat_answer(req, now);
        let mut effects = Effects {
            wake: changed,
            ..Effects::default()
        };
        if resp.known {
            effects.merge(self.check_idle(crate::idle::running_ids(&req.running), now));
            effects.merge(self.check_xids(req, now));
            effects.merge(self.watch_gpus(req, now));
        }
        (resp, effects)
    }

    /// The starts sent on the node's session that its agent, by this heartbeat, has
    /// handled without running them: (job, attempt). Forgets the starts it handled.
    /// The session's commands are the leader's own: a heartbeat's entry carries this.
    pub(crate) fn starts_not_run(&mut self, req: &Heartbeat) -> Vec<(u64, u32)> {
        let Some(conn) = self.fleet.conns.get_mut(&req.node) else {
            return Vec::new();
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
        not_run
    }

    /// Ends the jobs whose starts the agent on `node` handled without running them.
    fn end_not_run(&mut self, node: &str, not_run: &[(u64, u32)], now: i64) -> bool {
        let c = self;
        let mut changed = false;
        for &(id, attempt) in not_run {
            let Some(stored) = c.jobs.get(id) else {
                continue;
            };
            if stored.start_confirmed || stored.job.attempt != attempt {
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
                        "the agent on {node} did not run the start (its command was refused: see that agent's log)"
                    ),
                )
            };
            let end = Transition::EndOn {
                node: node.to_string(),
                state,
                exit_code: None,
                reason: why.clone(),
            };
            if c.jobs.transition(id, end, now).is_ok() {
                tracing::error!(job = id, attempt, node, "{why}");
                changed = true;
            }
        }
        changed
    }

    fn heartbeat_answer(&mut self, req: &Heartbeat, now: i64) -> HeartbeatAnswer {
        let c = self;
        let known = c.fleet.conns.contains_key(&req.node);
        if let Some(n) = c.fleet.nodes.get_mut(&req.node) {
            n.last_seen_ms = now;
            c.fleet.last_heard.insert(req.node.clone(), now);
            if !req.metrics.is_empty() {
                c.fleet
                    .metrics
                    .insert(req.node.clone(), req.metrics.clone());
            }
            c.fold_usage(&req.node, &req.running, &req.metrics, now);
            c.note_host(&req.node, &req.running);
        }
        let stale = req
            .running
            .iter()
            .filter(|r| {
                c.jobs.get(r.job_id).is_none_or(|s| {
                    let j = &s.job;
                    r.attempt < j.attempt || (r.attempt == j.attempt && j.state.is_final())
                })
            })
            .cloned()
            .collect();
        let power_caps = c.power_caps(&req.node, now);
        HeartbeatAnswer {
            known,
            stale,
            power_caps,
        }
    }

    /// Whether `(job, attempt)` runs on `node` as far as the controller knows.
    fn holds(&self, node: &str, job: u64, attempt: u32) -> bool {
        let c = self;
        c.jobs.get(job).is_some_and(|s| {
            let j = &s.job;
            j.attempt == attempt
                && !j.state.is_final()
                && !s.cancel_requested
                && live_allocs(j).any(|a| a.node == node)
        })
    }

    /// Applies an agent's report. For a STARTED report, answers whether the instance is
    /// stale (the cluster no longer holds it as running there): the agent kills it.
    pub(crate) fn report(&mut self, r: &Report, now: i64) -> (bool, Effects) {
        if self.fleet.conns.contains_key(&r.node) {
            self.fleet.last_heard.insert(r.node.clone(), now);
        }
        let others = self.apply_report(r, now);
        let mut stale = false;
        if r.kind == ReportKind::Started && !self.holds(&r.node, r.job_id, r.attempt) {
            tracing::warn!(job = r.job_id, attempt = r.attempt, node = %r.node, "a start the controller no longer holds ran; the agent kills it");
            stale = true;
        }
        let mut effects = Effects::wake();
        for (node, id) in others {
            if self.fleet.conns.contains_key(&node) {
                let kill = self.kill_cmd(id, 0, "another rank failed");
                effects.sends.push((node, kill));
            }
        }
        (stale, effects)
    }

    /// Applies one agent report. Returns (node, job) pairs whose other ranks must be
    /// killed (a rank of a gang job failed).
    fn apply_report(&mut self, r: &Report, now: i64) -> Vec<(String, u64)> {
        let c = self;
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
        let requeue_reason = (!cancel_requested && !stored.requeue_requested.is_empty())
            .then(|| stored.requeue_requested.clone());
        let j = &stored.job;
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
        match r.kind {
            ReportKind::Started => {
                let at = if r.time_ms > 0 { r.time_ms } else { now };
                c.jobs.edit(id, |s| {
                    s.start_confirmed = true;
                    let j = &mut s.job;
                    j.launch_time_ms = j.launch_time_ms.max(at);
                });
            }
            ReportKind::Ended => {
                use gpuctl_sched::job::JobState as Ended;
                let state = match r.state {
                    Ended::Completed => JobState::Completed,
                    Ended::Cancelled => JobState::Cancelled,
                    Ended::Timeout => JobState::Timeout,
                    Ended::Preempted => JobState::Preempted,
                    _ => JobState::Failed,
                };
                let at = if r.time_ms > 0 { r.time_ms } else { now };
                let last_rank = live_allocs(j).all(|a| a.node == r.node);
                let max = j.spec.max_restarts;
                // A failure with restarts left: requeued as `gpuctl requeue` would be
                // (the other ranks are killed below; the last one's end requeues it).
                let restart = (state == JobState::Failed
                    && !r.node_fault
                    && !cancel_requested
                    && requeue_reason.is_none()
                    && j.restarts < max)
                    .then(|| {
                        let exit = r
                            .exit_code
                            .map_or("a signal".into(), |e| format!("exit {e}"));
                        format!(
                            "requeued after a failure ({exit}): restart {} of {max}",
                            j.restarts + 1
                        )
                    });
                if let Some(why) = &restart {
                    c.jobs.edit(id, |s| {
                        s.requeue_requested = why.clone();
                        s.job.restarts += 1;
                    });
                }
                // The node refused the launch for a reason of its own: not the job's
                // failure. Back to the queue, and the node drained until its agent
                // comes back healthy (a restart with fixed options).
                let node_fault = (r.node_fault && !cancel_requested).then(|| {
                    let why = format!("launch refused on {}: {}", r.node, r.reason);
                    if let Some(n) = c.fleet.nodes.get_mut(&r.node)
                        && (n.drain_reason.is_none() || n.drain_automatic)
                    {
                        tracing::warn!(node = %r.node, "draining: {why}");
                        n.drain_reason = Some(why.clone());
                        n.drain_automatic = true;
                    }
                    c.node_changed(&r.node);
                    format!("requeued: {why}")
                });
                let requeue_reason = node_fault.or(requeue_reason).or(restart);
                c.add_host_usage(r);
                if !r.steps.is_empty() {
                    c.jobs.edit(id, |s| {
                        let j = &mut s.job;
                        crate::steps::merge(&mut j.steps, &r.node, &r.steps);
                    });
                }
                if let Some(reason) = requeue_reason.filter(|_| last_rank) {
                    // Asked to requeue (gpuctl requeue, a preemption): back to the queue.
                    let back = Transition::Requeue {
                        reason,
                        keep_for_readopt: false,
                    };
                    c.jobs.transition(id, back, at).expect("a running job");
                    c.jobs.edit(id, |s| s.requeue_requested.clear());
                    c.settle_usage(id);
                    tracing::info!(job = id, "job requeued");
                    return Vec::new();
                }
                let end = Transition::EndOn {
                    node: r.node.clone(),
                    state,
                    exit_code: r.exit_code,
                    reason: r.reason.clone(),
                };
                c.jobs
                    .transition(id, end, at)
                    .expect("a live allocation there");
                c.jobs.edit(id, |s| s.start_confirmed = true);
                c.settle_usage(id);
                let j = c.jobs.job(id).expect("just changed");
                if state != JobState::Completed && !cancel_requested {
                    kill_others = live_allocs(j).map(|a| (a.node.clone(), id)).collect();
                }
                if j.state.is_final() {
                    tracing::info!(job = id, state = state_name(j.state), exit_code = ?j.exit_code, "job ended");
                }
            }
            ReportKind::Warning => {
                tracing::warn!(job = id, node = %r.node, "{}", r.reason);
                c.jobs.edit(id, |s| {
                    let j = &mut s.job;
                    j.reason = r.reason.clone();
                    let w = format!("{}: {}", r.node, r.reason);
                    if !j.warnings.contains(&w) && j.warnings.len() < 20 {
                        j.warnings.push(w);
                    }
                });
            }
        }
        kill_others
    }
}

/// How recently a live connection must have been heard from for an attach under the
/// same identity to be refused: a quarter of the node timeout, at most 15 s.
fn same_identity_window(node_timeout_ms: i64) -> i64 {
    (node_timeout_ms / 4).min(15_000)
}

/// An attach's name and features: what any replica can check.
fn check_register(req: &Register) -> Result<(), Refusal> {
    if req.node.is_empty()
        || req.node.len() > 255
        || req.node.contains('/')
        || req.node.contains(',')
    {
        return Err(Refusal::invalid_argument(
            "node name must be 1 to 255 characters without '/' or ','",
        ));
    }
    gpuctl_sched::features::check_offered(&req.features).map_err(Refusal::invalid_argument)?;
    Ok(())
}
