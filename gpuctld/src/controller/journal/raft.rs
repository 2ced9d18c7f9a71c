//! The controller on Raft (issue 40, `gpuctld --id N --peers ...`): what changes the
//! cluster is proposed to the log instead of applied here, and applied on every member
//! once a quorum holds it (`raft::Machine`, into this controller's `Shared`). Only the
//! leader decides; a follower answers users and agents with where the leader is.
//!
//! One controller (no `--peers`) never reaches this file: its changes apply at once
//! under the lock, as before Raft.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use gpuctl_core::log::{Applied, Change, Entry, Wait};
use gpuctl_core::ops::Admission;
use gpuctl_core::policy::GpuRoom;
use gpuctl_core::{Cluster, Effects, Refusal};
use gpuctl_proto as pb;
use openraft::error::ClientWriteError;
use openraft::{BasicNode, Raft, ServerState};
use prost::Message as _;
use tonic::Status;

use crate::controller::{Controller, Out, now_ms};
use crate::raft::{Machine, Proposal, Target, TypeConfig};

/// How long a proposal may wait for a quorum before the caller is told it was not
/// acknowledged (it may still commit: a submit's request id makes its retry safe).
const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// A proposal on its way: what openraft answers once it applied (or could not).
pub(crate) type Pending =
    tokio::sync::oneshot::Receiver<openraft::raft::ClientWriteResult<TypeConfig>>;

/// A change's answer and effects, as applying it answered.
pub type Answer = (Result<Applied, Refusal>, Effects);

/// This controller's part in a replicated cluster.
pub struct Repl {
    pub me: u64,
    pub raft: Raft<TypeConfig>,
    pub machine: Machine,
    /// When a quorum last confirmed this controller's leadership (Unix ms;
    /// `confirm_loop`): a leader cut off from the others stops answering as one within
    /// `lease_ms`, before the majority has elected another.
    pub confirmed_ms: std::sync::atomic::AtomicI64,
    pub lease_ms: i64,
    /// The proposals waiting to go to the log together (`batch_loop`).
    pub proposals: super::batching::Proposals,
    /// While a single controller's state is being adopted (the first entry of a new
    /// cluster, `adopt`): this member does not serve as leader before it applied.
    pub importing: std::sync::atomic::AtomicBool,
}

/// The controller's shell as the state machine's `Target`: committed entries apply to
/// `Shared::core` under the controller's lock.
pub struct Shell(pub Weak<Controller>);

impl Target for Shell {
    fn with_cluster(&self, f: &mut dyn FnMut(&mut Cluster)) {
        let ctl = self.0.upgrade().expect("the controller outlives its Raft");
        let mut c = ctl.lock();
        f(&mut c.core);
    }

    fn with_credentials(&self, f: &mut dyn FnMut(&mut crate::credentials::Credentials)) {
        let ctl = self.0.upgrade().expect("the controller outlives its Raft");
        ctl.pki.with(f);
    }
}

impl Controller {
    /// This controller's whole state in its stored form (a snapshot's), for a new
    /// replicated cluster to adopt.
    pub fn state_to_adopt(&self) -> Vec<u8> {
        let mut pb = gpuctl_proto::wire::snapshot_pb(&self.lock().core, now_ms());
        pb.credentials = Some(self.pki.with(|c| c.records()));
        pb.encode_to_vec()
    }

    /// Proposes `state` (`state_to_adopt`) as a new cluster's first entry once this
    /// member leads, and serves as leader once it applied.
    pub async fn adopt(self: Arc<Self>, state: Vec<u8>) {
        let Some(r) = self.raft() else { return };
        let snapshot = match gpuctl_proto::store::Snapshot::decode(state.as_slice()) {
            Ok(s) => s,
            Err(e) => return tracing::error!("the state to adopt does not decode: {e}"),
        };
        let entry = gpuctl_proto::store::LogEntry {
            at: snapshot.at,
            change: Some(gpuctl_proto::store::log_entry::Change::Import(snapshot)),
        }
        .encode_to_vec();
        loop {
            let mut metrics = r.raft.metrics();
            while metrics.borrow().current_leader != Some(r.me) {
                if metrics.changed().await.is_err() {
                    return;
                }
            }
            let proposal = Proposal {
                from: r.me,
                entry: entry.clone(),
            };
            match r.raft.client_write(proposal).await {
                Ok(_) => {
                    r.importing
                        .store(false, std::sync::atomic::Ordering::SeqCst);
                    let jobs = self.lock().jobs().len();
                    tracing::info!(
                        jobs,
                        "adopted the single controller's state: every member holds it"
                    );
                    self.wake_scheduler();
                    return;
                }
                Err(e) => {
                    tracing::warn!(
                        "adopting the single controller's state: {e}; again once this member leads"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Whether the state holds no job, no node and no credential (a replicated
    /// controller starts from its log, never from a single controller's records).
    pub fn jobs_loaded_empty(&self) -> bool {
        let empty = {
            let c = self.lock();
            c.jobs().is_empty() && c.fleet().nodes().is_empty()
        };
        empty && self.pki.with(|c| c.is_empty())
    }

    /// Whether this controller decides: always with one controller; on Raft, while it
    /// is the leader.
    pub fn is_leader(&self) -> bool {
        self.raft().is_none_or(|r| {
            let leads = {
                let m = r.raft.metrics();
                let m = m.borrow();
                m.current_leader == Some(r.me) && m.state == ServerState::Leader
            };
            let confirmed = r.confirmed_ms.load(std::sync::atomic::Ordering::SeqCst);
            let importing = r.importing.load(std::sync::atomic::Ordering::SeqCst);
            leads && !importing && now_ms() - confirmed < r.lease_ms
        })
    }

    /// The current term (0: one controller).
    pub fn term(&self) -> u64 {
        self.raft()
            .map_or(0, |r| r.raft.metrics().borrow().current_term)
    }

    /// Refuses a request a follower must not answer: UNAVAILABLE, naming the leader
    /// (clients and agents try the next controller of their list).
    pub fn require_leader(&self) -> Result<(), Status> {
        let Some(r) = self.raft() else {
            return Ok(());
        };
        if self.is_leader() {
            return Ok(());
        }
        let m = r.raft.metrics().borrow().clone();
        Err(not_leader(r.me, m.current_leader, &m))
    }

    /// Hands `change` to the log without waiting for it: proposals sent one after the
    /// other apply in that order.
    pub(crate) async fn send_proposal(&self, now: i64, change: Change) -> Result<Pending, Status> {
        let r = self.raft().expect("propose is for replicated controllers");
        let entry = gpuctl_proto::wire::entry_pb(&Entry::new(now, change)).encode_to_vec();
        r.raft
            .client_write_ff(Proposal { from: r.me, entry })
            .await
            .map_err(|e| Status::unavailable(format!("this controller's Raft stopped: {e}")))
    }

    /// Sets the metrics' Raft figures as this controller sees them now.
    pub(crate) fn raft_metrics(&self) {
        let Some(r) = self.raft() else { return };
        let m = r.raft.metrics().borrow().clone();
        self.metrics.raft.leader.set(i64::from(self.is_leader()));
        self.metrics.raft.term.set(m.current_term as i64);
        let applied = m.last_applied.map_or(0, |l| l.index);
        self.metrics.raft.applied.set(applied as i64);
        self.metrics.raft.lag.clear();
        for (id, matched) in m.replication.iter().flatten() {
            if *id == r.me {
                continue;
            }
            let lag = matched.map_or(-1, |l| applied.saturating_sub(l.index) as i64);
            let member = crate::metrics::MemberLabel {
                member: id.to_string(),
            };
            self.metrics.raft.lag.get_or_create(&member).set(lag);
        }
    }

    /// Waits for a proposal sent with `client_write_ff` to apply: its answer.
    pub(crate) async fn answer_of(&self, rx: Pending) -> Result<Answer, Status> {
        let answer = self.answers_of(rx, 1).await?.pop();
        Ok(answer.expect("one answer for an entry alone"))
    }

    /// Waits for an entry of `parts` parts, sent with `client_write_ff`, to apply: its
    /// parts' answers, in order.
    pub(crate) async fn answers_of(
        &self,
        rx: Pending,
        parts: usize,
    ) -> Result<Vec<Answer>, Status> {
        let r = self.raft().expect("answers are for replicated controllers");
        let done = match tokio::time::timeout(COMMIT_TIMEOUT, rx).await {
            Err(_) => {
                return Err(Status::unavailable(format!(
                    "controller {} heard from no quorum within {COMMIT_TIMEOUT:?}: the change was not acknowledged (it may still apply; a submit's request id makes a retry safe)",
                    r.me
                )));
            }
            Ok(Err(_)) => {
                return Err(Status::unavailable(
                    "this controller's Raft stopped; nothing was acknowledged",
                ));
            }
            Ok(Ok(Err(e))) => return Err(write_failed(r.me, e)),
            Ok(Ok(Ok(done))) => done,
        };
        let replica = r.machine.replica();
        let mut replica = replica.lock();
        (0..parts)
            .map(|part| {
                replica.take_answer(done.log_id.index, part).ok_or_else(|| {
                    Status::unavailable(
                        "the change applied, but a snapshot replaced its answer here: retry (a submit's request id makes it safe)",
                    )
                })
            })
            .collect()
    }

    /// A submit's admission on Raft: the records built here (ids past the submits still
    /// in the log), acknowledged once they applied. `Err(id)`: a repeated request's job.
    pub(crate) async fn admit_replicated(
        &self,
        actor: &gpuctl_core::Actor,
        spec: gpuctl_core::record::JobSpec,
        request_id: &str,
        hold: bool,
        defer: &mut bool,
    ) -> Result<Result<(u64, Vec<String>), u64>, Status> {
        let (now, records, first, notes) = {
            let mut c = self.lock();
            let now = now_ms();
            let from = c.next_id;
            let admitted = c.admit_from(actor, spec, request_id, now, from);
            let mut records = match admitted.map_err(crate::controller::status)? {
                Admission::Repeat(id) => return Ok(Err(id)),
                Admission::New(stored) => vec![*stored],
                Admission::Array(tasks) => tasks,
            };
            if hold {
                records
                    .iter_mut()
                    .for_each(gpuctl_core::holds::held_at_submit);
            }
            let (Some(head), Some(last)) = (records.first(), records.last()) else {
                return Err(Status::invalid_argument("an array of no tasks"));
            };
            let (first, next) = (head.job.id, last.job.id + 1);
            let notes = head.job.warnings.clone();
            *defer = c.defers(&head.job);
            c.next_id = c.next_id.max(next);
            (now, records, first, notes)
        };
        let (answer, effects) = self.propose(now, Change::Submit(records)).await?;
        answer.map_err(crate::controller::status)?;
        self.send_effects(effects).await?;
        Ok(Ok((first, notes)))
    }

    /// One scheduling pass on Raft (the leader's): its start through the log, a plan
    /// from the state it left, and the plan's entries proposed one after the other and
    /// waited for together (they apply in that order; the starts are checked again as
    /// they apply, as with one controller).
    pub(crate) async fn replicated_pass(self: &Arc<Self>) -> Result<(), Status> {
        if !self.is_leader() {
            return Ok(());
        }
        let now = now_ms();
        let (small, cursor) = {
            let mut c = self.lock();
            c.room.pass_started();
            // Before the start: the next pass reads again what changes from here on.
            let small = c.jobs().active_len() < crate::controller::INLINE_JOBS;
            (small, c.jobs().cursor())
        };
        if small {
            return self.whole_pass(now).await;
        }
        let (answer, lent) = self.propose(now, Change::Prepare).await?;
        let waiting = match answer {
            Ok(Applied::Prepared(waiting)) => waiting,
            other => unreachable!("a pass's start answers its waiting jobs, not {other:?}"),
        };
        // The lend pass's starts and yields (`gpuctl_core::opportunistic`).
        self.send_effects(lent).await?;
        let ctl = self.clone();
        let (read, cfg) =
            tokio::task::spawn_blocking(move || ctl.pass_read(&waiting, cursor, now, false))
                .await
                .map_err(|e| Status::internal(format!("a pass's input panicked: {e}")))?;
        let started = std::time::Instant::now();
        let ctl = self.clone();
        let planned = tokio::task::spawn_blocking(move || ctl.plan_carried(read, &cfg, now))
            .await
            .map_err(|e| Status::internal(format!("a pass panicked: {e}")))?;
        let (plan, room) = match planned {
            Ok(planned) => planned,
            Err(unplanned) => {
                self.settle_unplanned(unplanned, now, true);
                return Ok(());
            }
        };
        self.metrics
            .pass_seconds
            .observe(started.elapsed().as_secs_f64());
        let mut pending = Vec::new();
        for part in plan.starts.chunks(crate::controller::START_PART) {
            pending.push(
                self.send_proposal(now, Change::Starts(part.to_vec()))
                    .await?,
            );
        }
        for part in Wait::parts_of(&plan, crate::controller::PART) {
            let waiting = Change::Waiting(part);
            pending.push(self.send_proposal(now, waiting).await?);
        }
        let candidates = gpuctl_core::policy::preempt_candidates(&plan);
        pending.push(self.send_proposal(now, Change::Preempt(candidates)).await?);
        let mut effects = Effects::default();
        for rx in pending {
            effects.merge(self.answer_of(rx).await?.1);
        }
        self.passed(!plan.waiting.is_empty(), room, effects, now)
            .await
    }

    /// An applied entry's effects on Raft: the scheduler woken, its commands sent
    /// (what it wrote is durable in the log already).
    async fn send_effects(&self, effects: Effects) -> Result<(), Status> {
        let (sends, wake) = self.lock().route(effects);
        let out = Out {
            sends,
            wake,
            wrote: false,
        };
        self.deliver(out, false)
            .await
            .map_err(crate::controller::store_status)
    }

    /// After a pass on Raft: the room it left settled, its commands sent.
    async fn passed(
        &self,
        waiting: bool,
        room: GpuRoom,
        effects: Effects,
        now: i64,
    ) -> Result<(), Status> {
        let out = {
            let mut c = self.lock();
            let wake = self.settle_room(&mut c, waiting, room, now);
            let (sends, woken) = c.route(effects);
            Out {
                sends,
                wake: wake || woken,
                wrote: false,
            }
        };
        self.deliver(out, false)
            .await
            .map_err(crate::controller::store_status)
    }

    /// A small pass as one entry that every member runs (`Change::Pass`): one round
    /// trip between a submit's entry and its start's.
    async fn whole_pass(self: &Arc<Self>, now: i64) -> Result<(), Status> {
        let started = std::time::Instant::now();
        let (answer, effects) = self.propose(now, Change::Pass).await?;
        let passed = match answer {
            Ok(Applied::Passed(passed)) => passed,
            other => unreachable!("a pass answers what it left, not {other:?}"),
        };
        self.metrics
            .pass_seconds
            .observe(started.elapsed().as_secs_f64());
        self.passed(passed.waiting, passed.room, effects, now).await
    }

    /// A credential change on Raft: proposed alone (not batched: it is rare) and
    /// answered once it applied here; a follower refuses, naming the leader.
    pub(super) async fn record_replicated(
        &self,
        now: i64,
        change: gpuctl_proto::store::log_credential::Change,
    ) -> Result<(), Status> {
        let r = self.raft().expect("a replicated controller's credential");
        self.require_leader()?;
        let change = gpuctl_proto::store::LogCredential {
            change: Some(change),
        };
        let entry = gpuctl_proto::store::LogEntry {
            at: now,
            change: Some(gpuctl_proto::store::log_entry::Change::Credential(change)),
        }
        .encode_to_vec();
        let proposal = Proposal { from: r.me, entry };
        let pending = (r.raft.client_write_ff(proposal).await)
            .map_err(|e| Status::unavailable(format!("this controller's Raft stopped: {e}")))?;
        let (answer, _) = self.answer_of(pending).await?;
        answer.map(|_| ()).map_err(crate::controller::status)
    }

    /// Adds or removes a member (`gpuctl admin controllers add|remove`), at the leader:
    /// a new member first catches up as a learner (the log, or a snapshot), then votes.
    pub async fn change_controllers(
        &self,
        req: pb::ChangeControllersRequest,
    ) -> Result<pb::ControllersResponse, Status> {
        let Some(r) = self.raft() else {
            return Err(Status::failed_precondition(
                "this controller runs alone (no --peers): start the members with --id and --peers (docs/operations.md)",
            ));
        };
        self.require_leader()?;
        let failed = |e: openraft::error::RaftError<u64, ClientWriteError<u64, BasicNode>>| {
            Status::failed_precondition(format!("the membership was not changed: {e}"))
        };
        match (req.add_id, req.remove_id) {
            (0, 0) | (1.., 1..) => {
                return Err(Status::invalid_argument(
                    "name one controller to add (an id and address) or one to remove",
                ));
            }
            (id @ 1.., 0) => {
                let addr = req.add_address.trim();
                if addr.is_empty() || addr.len() > 256 || addr.chars().any(char::is_control) {
                    return Err(Status::invalid_argument(
                        "a controller's address is its gRPC HOST:PORT (at most 256 printable bytes)",
                    ));
                }
                tracing::info!(id, addr, "adding a controller: catching up as a learner");
                let node = BasicNode::new(addr);
                r.raft.add_learner(id, node, true).await.map_err(failed)?;
                let voters = openraft::ChangeMembers::AddVoterIds([id].into());
                r.raft
                    .change_membership(voters, false)
                    .await
                    .map_err(failed)?;
                tracing::info!(id, addr, "controller added");
            }
            (0, id) => {
                if id == r.me {
                    return Err(Status::failed_precondition(
                        "the leader does not remove itself: remove it at another member once a new leader is elected (stop it first)",
                    ));
                }
                let voters = openraft::ChangeMembers::RemoveVoters([id].into());
                r.raft
                    .change_membership(voters, false)
                    .await
                    .map_err(failed)?;
                tracing::info!(id, "controller removed");
            }
        }
        Ok(self.controllers())
    }

    /// The cluster's controllers as this one knows them (`gpuctl admin controllers`).
    pub fn controllers(&self) -> pb::ControllersResponse {
        let Some(r) = self.raft() else {
            return pb::ControllersResponse {
                id: 0,
                replicated: false,
                members: vec![pb::ControllerMember {
                    id: 0,
                    address: String::new(),
                    leader: true,
                    term: 0,
                    commit_index: 0,
                    state: "leader".into(),
                    voter: true,
                }],
            };
        };
        let m = r.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        let nodes: BTreeMap<u64, BasicNode> =
            membership.nodes().map(|(id, n)| (*id, n.clone())).collect();
        let replication = m.replication.clone().unwrap_or_default();
        let commit = m.last_applied.map_or(0, |l| l.index);
        // This controller leads only while a quorum confirms it (its lease): a leader
        // cut off from the others says so before it learns of a newer term.
        let confirmed = self.is_leader();
        let members = nodes
            .into_iter()
            .map(|(id, node)| {
                let leader = m.current_leader == Some(id) && (id != r.me || confirmed);
                let (state, commit_index) = if id == r.me {
                    let state = match m.state {
                        ServerState::Leader if !confirmed => "unconfirmed".to_string(),
                        s => state_name(s),
                    };
                    (state, commit)
                } else if leader {
                    ("leader".to_string(), commit)
                } else if m.state == ServerState::Leader {
                    match replication.get(&id) {
                        Some(Some(l)) => ("follower".to_string(), l.index),
                        _ => ("unreachable".to_string(), 0),
                    }
                } else {
                    let role = if voters.contains(&id) {
                        "follower"
                    } else {
                        "learner"
                    };
                    (role.to_string(), 0)
                };
                pb::ControllerMember {
                    id,
                    address: node.addr,
                    leader,
                    term: m.current_term,
                    commit_index,
                    state,
                    voter: voters.contains(&id),
                }
            })
            .collect();
        pb::ControllersResponse {
            id: r.me,
            replicated: true,
            members,
        }
    }

    /// Follows this controller's part: on becoming leader, agents get a full node
    /// timeout to attach to it (it heard from none of them) and a pass runs; on losing
    /// it, the agents' streams close so that they find the new leader.
    pub async fn follow_leadership(self: Arc<Self>) {
        let Some(r) = self.raft() else { return };
        tokio::spawn(self.clone().confirm_loop());
        tokio::spawn(self.clone().batch_loop());
        let mut metrics = r.raft.metrics();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut leading = false;
        loop {
            let now_leading = self.is_leader();
            if now_leading != leading {
                leading = now_leading;
                let term = self.term();
                if leading {
                    tracing::info!(id = r.me, term, "this controller leads");
                    self.take_config();
                    let sessions = {
                        let mut c = self.lock();
                        c.core.leader().hear_all(now_ms());
                        c.fleet().sessions()
                    };
                    // The sessions held now were opened with earlier leaders, whose
                    // streams are gone: they end (through the log), so that the agents
                    // attach here without waiting out their old session.
                    let ctl = self.clone();
                    tokio::spawn(async move { ctl.end_old_sessions(sessions).await });
                    self.wake_scheduler();
                } else {
                    tracing::info!(id = r.me, term, "this controller follows");
                    self.lock().links.clear();
                }
                self.metrics.raft.leader.set(i64::from(leading));
            }
            self.metrics.raft.term.set(self.term() as i64);
            // A change of role, or a lease that ran out (no metrics change then).
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                _ = tick.tick() => {}
            }
        }
    }
}

impl Controller {
    /// Ends the sessions opened with earlier leaders (`Disconnected` entries, one a
    /// session; a session attached here meanwhile has a newer generation and stays).
    async fn end_old_sessions(&self, sessions: Vec<(String, u64)>) {
        let now = now_ms();
        let mut pending = Vec::new();
        for (node, generation) in sessions {
            match self
                .send_proposal(now, Change::Disconnected { node, generation })
                .await
            {
                Ok(rx) => pending.push(rx),
                Err(_) => return,
            }
        }
        for rx in pending {
            if self.answer_of(rx).await.is_err() {
                return;
            }
        }
    }

    /// While this controller is the leader, has a quorum confirm it (a round of
    /// heartbeats) every 100 ms, renewing its lease (`Repl::confirmed_ms`).
    async fn confirm_loop(self: Arc<Self>) {
        let Some(r) = self.raft() else { return };
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if r.raft.metrics().borrow().state != ServerState::Leader {
                continue;
            }
            let asked = now_ms();
            let wait = Duration::from_millis(r.lease_ms as u64);
            if let Ok(Ok(_)) = tokio::time::timeout(wait, r.raft.ensure_linearizable()).await {
                // The lease runs from when the confirmation was asked for.
                (r.confirmed_ms).fetch_max(asked, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }
}

fn state_name(s: ServerState) -> String {
    match s {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
    .to_string()
}

/// A follower's refusal: where the leader is, if it knows.
fn not_leader(me: u64, leader: Option<u64>, m: &openraft::RaftMetrics<u64, BasicNode>) -> Status {
    let addr = leader.and_then(|l| {
        m.membership_config
            .membership()
            .get_node(&l)
            .map(|n| n.addr.clone())
    });
    let mut status = match (leader, &addr) {
        (Some(l), Some(a)) => Status::unavailable(format!(
            "controller {me} is not the leader: controller {l} at {a} is (clients with --controller a,b,c go there themselves)"
        )),
        _ => Status::unavailable(format!(
            "controller {me} is not the leader and no leader is elected yet: retry shortly"
        )),
    };
    if let Some(a) = addr.and_then(|a| a.parse().ok()) {
        status.metadata_mut().insert("gpuctl-leader", a);
    }
    status
}

/// A proposal that did not apply: UNAVAILABLE (the caller retries, at the leader).
fn write_failed(me: u64, e: ClientWriteError<u64, BasicNode>) -> Status {
    match e {
        ClientWriteError::ForwardToLeader(f) => match f.leader_node {
            Some(n) => Status::unavailable(format!(
                "controller {me} is no longer the leader: controller {} at {} is; nothing was acknowledged",
                f.leader_id.unwrap_or_default(),
                n.addr
            )),
            None => Status::unavailable(format!(
                "controller {me} is no longer the leader, and no leader is elected yet; nothing was acknowledged"
            )),
        },
        other => Status::unavailable(format!(
            "controller {me} could not commit the change ({other}); nothing was acknowledged"
        )),
    }
}
