//! The cluster state: jobs, nodes, attached agents, and the views the scheduler and the
//! users see. Pure: no store, no clock, no connections. The operations on it are in
//! `ops`, `agents` and `users`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::record::{Allocation, DependencyKind, Job, JobSpec, JobState, Resources, state_name};
use gpuctl_sched::packing::Workload;
use gpuctl_sched::{self as sched, ClusterView, Eligibility, NodeView, PendingJob, Request};

use crate::command::{Command, Kill};
use crate::config::Config;
use crate::fleet::Fleet;
use crate::jobs::{Jobs, Transition};
use crate::node::{GpuRow, Node, NodeRow, NodeState};

/// A time limit in ms, saturating (a stored limit is capped at submit, but records of
/// older versions and the arithmetic must never wrap).
pub fn limit_ms(secs: u64) -> i64 {
    i64::try_from(secs).unwrap_or(i64::MAX).saturating_mul(1000)
}

/// Where a view taken in parts has got to (`Cluster::view_part`).
#[derive(Debug, Default)]
pub struct ViewCursor {
    after_node: Option<String>,
    nodes_done: bool,
    after_job: u64,
}

/// The whole cluster as the controller knows it. Every operation takes `now` and
/// returns what the shell must do (`Effects`); what must be written is taken with
/// `take_changes`.
#[derive(Default)]
pub struct Cluster {
    /// Every job, its indexes, and the one place its state changes (`jobs.rs`).
    pub(crate) jobs: Jobs,
    /// The nodes and their agents' sessions (`fleet.rs`).
    pub(crate) fleet: Fleet,
    pub(crate) next_job_id: u64,
    /// What running jobs used so far (`usage.rs`), memory only.
    pub(crate) live_usage: crate::usage::LiveUsage,
    /// Each running rank's cgroup CPU time and peak memory, from heartbeats, by (job,
    /// node); memory only, replaced by the end report's figures.
    pub(crate) live_host: crate::usage::LiveHost,
    /// Each running rank's steps running now, from heartbeats, by (job, node); memory
    /// only, replaced by the end report's.
    pub(crate) live_steps: crate::usage::LiveSteps,
    /// When each running job was last seen busy (`idle.rs`), memory only.
    pub(crate) idle: crate::idle::IdleTracks,
    /// The earliest begin time of a job waiting for one (`begin.rs`).
    pub(crate) next_begin_ms: Option<i64>,
    /// When a floor's owner waiting now would put the reclaim bound at risk (the
    /// last pass's answer): a pass must run then.
    pub(crate) next_reclaim_ms: Option<i64>,
    pub(crate) config: Config,
    pub(crate) sched_config: sched::SchedConfig,
    /// Fair share's usage and what running jobs are charged (`fairshare.rs`).
    pub(crate) fair: crate::fairshare::FairShare,
    /// The workload mix (`workload`) and the jobs' revision it was computed at: every
    /// pass and node listing asks for it, and at 10,000 queued jobs computing it was
    /// most of a pass after a cancel.
    workload: std::cell::RefCell<Option<(u64, Workload)>>,
    /// What the samples say of each held GPU's guaranteed holders
    /// (`opportunistic.rs`), memory only.
    pub(crate) watch: crate::opportunistic::Watches,
    /// The GPUs lent now (as their watches say): the main pass tries the others first.
    pub(crate) lent_gpus: std::collections::BTreeSet<String>,
    /// Dynamic MIG's changes under way (`crate::mig`), memory only.
    pub(crate) mig: crate::mig::MigState,
}

/// Read access for the shell, the simulator and the tests: state changes only through
/// the cluster's operations, which keep its owners' invariants (`Cluster::check`).
impl Cluster {
    /// The job table.
    pub fn jobs(&self) -> &Jobs {
        &self.jobs
    }

    /// The nodes and their agents' sessions.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// The id the next job gets.
    pub fn next_job_id(&self) -> u64 {
        self.next_job_id
    }

    /// The configuration in force (a new one comes with `reconfigure`).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What a pass is configured with.
    pub fn sched_config(&self) -> &sched::SchedConfig {
        &self.sched_config
    }

    /// Fair share's decayed usage per account and user.
    pub fn fair_usage(&self) -> &sched::fairshare::Usage {
        &self.fair.usage
    }

    /// What running jobs used so far, by job (memory only).
    pub fn live_usage(&self) -> &crate::usage::LiveUsage {
        &self.live_usage
    }

    /// Running ranks' host figures, by (job, node) (memory only).
    pub fn live_host(&self) -> &crate::usage::LiveHost {
        &self.live_host
    }

    /// Ends every agent session (the shell closes every agent stream, at shutdown).
    pub(crate) fn end_sessions(&mut self) {
        self.fleet.end_sessions();
    }

    /// Counts every node as heard from at `now`: a controller that becomes the leader
    /// heard from no agent yet, and gives each a full node timeout to attach to it.
    /// (Leader-local: the watchdog's decision travels in its entry, `silent_nodes`.)
    pub(crate) fn hear_all(&mut self, now: i64) {
        self.fleet.hear_all(now);
    }

    /// How many running jobs fair share's charge cache holds.
    pub fn charged_jobs(&self) -> usize {
        self.fair.held.len()
    }
}

/// What the shell does after an operation, in this order: write `take_changes`, flush,
/// close the streams of `closed` sessions, send `sends`, and run a pass if `wake`.
#[derive(Debug, Default, PartialEq)]
pub struct Effects {
    /// Commands for agents (by node), sent once what changed is durable.
    pub sends: Vec<(String, Command)>,
    /// A scheduling pass is due.
    pub wake: bool,
    /// Nodes whose agent session ended (their command streams close).
    pub closed: Vec<String>,
    /// Mails about jobs due (`crate::mail`): the leader sends them.
    pub mails: Vec<crate::mail::Mail>,
}

impl Effects {
    pub fn wake() -> Effects {
        Effects {
            wake: true,
            ..Effects::default()
        }
    }

    /// Adds `other`'s commands, closed sessions and wake-up to these.
    pub fn merge(&mut self, other: Effects) {
        self.sends.extend(other.sends);
        self.closed.extend(other.closed);
        self.mails.extend(other.mails);
        self.wake |= other.wake;
    }
}

/// What must be written: jobs (put or deleted) and nodes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub jobs: crate::jobs::Changes,
    pub nodes: BTreeSet<String>,
    /// Fair share's usage.
    pub usage: bool,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.nodes.is_empty() && !self.usage
    }
}

impl Cluster {
    /// This cluster, planning with `sched_config` rather than what its configuration
    /// says (the simulator's: policies compared on one trace).
    pub fn planning_with(self, sched_config: sched::SchedConfig) -> Cluster {
        Cluster {
            sched_config,
            ..self
        }
    }

    /// An empty cluster with this configuration.
    pub fn new(config: Config) -> Cluster {
        let sc = &config.scheduler;
        let sched_config = sched::SchedConfig {
            policy: sc.policy().unwrap_or_default(),
            weights: sc.priority.clone(),
            backfill: sc.backfill,
            reservation_depth: sc.reservation_depth,
            workload: Workload::default(),
            max_scored_nodes: sc.max_scored_nodes,
            expected_starts: true,
            caps: sched::limits::Caps::default(),
            floors: sched::floors::Floors::default(),
        };
        Cluster {
            next_job_id: 1,
            config,
            sched_config,
            ..Cluster::default()
        }
    }

    /// What changed since the last call, for the shell to write (one controller's
    /// journal: the records it puts in its store). Changes nothing the state decides by.
    pub fn take_changes(&mut self) -> Changes {
        Changes {
            jobs: self.jobs.take_changes(),
            nodes: std::mem::take(&mut self.fleet.changed),
            usage: std::mem::take(&mut self.fair.dirty),
        }
    }

    /// Records a node as changed (to be written).
    pub(crate) fn node_changed(&mut self, name: &str) {
        self.fleet.changed.insert(name.to_string());
    }

    /// A kill of a job's instance (`attempt` 0: whichever runs there), ending it
    /// CANCELLED after the configured grace.
    pub fn kill(&self, job_id: u64, attempt: u32, reason: &str) -> Kill {
        Kill {
            job_id,
            attempt,
            as_state: sched::job::JobState::Cancelled,
            kill_grace_secs: self.config.kill_grace.as_secs(),
            reason: reason.into(),
            signal: String::new(),
            signal_only: false,
        }
    }

    /// `kill` as a command.
    pub fn kill_cmd(&self, job_id: u64, attempt: u32, reason: &str) -> Command {
        Command::Kill(self.kill(job_id, attempt, reason))
    }
}

impl Cluster {
    /// Marks running job `id` cancel-requested and asks each of its connected nodes to
    /// kill its instance, ending it as `as_state` with `reason`. Returns those commands
    /// and how many of its nodes are not connected (their agents kill it when they
    /// return).
    pub(crate) fn kill_running(
        &mut self,
        id: u64,
        reason: &str,
        as_state: sched::job::JobState,
    ) -> (Vec<(String, Command)>, usize) {
        let Some(j) = self.jobs.job(id) else {
            return (Vec::new(), 0);
        };
        let nodes: Vec<String> = live_allocs(j).map(|a| a.node.clone()).collect();
        let attempt = j.attempt;
        self.jobs.edit(id, |s| s.cancel_requested = true);
        let (mut sends, mut missing) = (Vec::new(), 0);
        for node in nodes {
            if !self.fleet.conns.contains_key(&node) {
                missing += 1;
                continue;
            }
            let kill = Kill {
                as_state,
                ..self.kill(id, attempt, reason)
            };
            sends.push((node, Command::Kill(kill)));
        }
        (sends, missing)
    }
}

/// What running jobs hold on one node, per slot UUID: (compute milli, memory MiB, jobs).
#[derive(Default)]
pub struct Usage {
    pub slots: HashMap<String, (u32, u64, Vec<u64>)>,
    pub cpu_milli: u32,
    pub memory: u64,
    pub jobs: usize,
}

pub fn resources(j: &Job) -> Resources {
    j.spec.resources.clone()
}

/// Whether a job is in a pass's queue: pending and not held (opportunistic jobs are
/// the lend pass's, `opportunistic.rs`).
fn queued(j: &Job) -> bool {
    j.state == JobState::Pending && j.hold.is_empty() && !j.spec.opportunistic
}

/// A job's running claims (none unless it runs): each live allocation until its
/// expected end (its limit, or its preemption's deadline if sooner).
fn claims_of(s: &crate::record::Record) -> impl Iterator<Item = sched::Running> + '_ {
    let j = &s.job;
    let mut end_ms = j.start_time_ms.saturating_add(limit_ms(j.time_limit_secs));
    if s.vacate_by_ms > 0 {
        end_ms = end_ms.min(s.vacate_by_ms);
    }
    live_allocs(j).map(move |a| sched::Running {
        job: j.id,
        alloc: guaranteed_alloc(j, a),
        end_ms,
    })
}

/// Live allocations of running jobs.
pub fn live_allocs(j: &Job) -> impl Iterator<Item = &Allocation> {
    let running = j.state == JobState::Running;
    j.allocations.iter().filter(move |a| running && !a.ended)
}

impl Cluster {
    pub fn usage(&self) -> HashMap<&str, Usage> {
        let mut u: HashMap<&str, Usage> = HashMap::new();
        for s in self.jobs.active() {
            let j = &s.job;
            for a in live_allocs(j) {
                let e = u.entry(a.node.as_str()).or_default();
                for sl in &a.slots {
                    let x = e.slots.entry(sl.uuid.clone()).or_default();
                    // A borrower holds none of its GPU's compute or memory: it runs in
                    // its holders' idle (`opportunistic.rs`).
                    if !j.spec.opportunistic {
                        x.0 += sl.compute_milli;
                        x.1 += sl.memory_mib;
                    }
                    x.2.push(j.id);
                }
                e.cpu_milli += a.cpu_milli;
                e.memory += a.memory_bytes;
                e.jobs += 1;
            }
        }
        u
    }

    pub fn eligibility(&self, n: &Node) -> Eligibility {
        if !self.fleet.conns.contains_key(&n.name) {
            Eligibility::Down
        } else if n.drain_reason.is_some() {
            Eligibility::Drained
        } else {
            Eligibility::Up
        }
    }

    pub fn view(&self) -> ClusterView {
        let mut v = self.node_views();
        v.running = self.running_views();
        v
    }

    /// The view of some nodes only: those nodes and what runs on them (what a plan's
    /// starts are checked against; building the whole cluster's view for that cost the
    /// lock as much as the pass's own input at 10,000 nodes).
    pub fn view_of(&self, names: &std::collections::BTreeSet<&str>) -> ClusterView {
        let partitions = self.config.all_partitions();
        let mut v = ClusterView {
            nodes: names
                .iter()
                .filter_map(|n| self.fleet.nodes.get(*n))
                .map(|n| self.node_view(n, &partitions))
                .collect(),
            running: Vec::new(),
        };
        if names.is_empty() {
            return v;
        }
        // The jobs on those nodes from the by-node index (a walk over every active job
        // was most of applying a plan at 120,000 jobs), each once, in id order.
        let mut ids: Vec<u64> = names.iter().flat_map(|n| self.jobs.on_node(n)).collect();
        ids.sort_unstable();
        ids.dedup();
        for j in ids.into_iter().filter_map(|id| self.jobs.job(id)) {
            for a in live_allocs(j).filter(|a| names.contains(a.node.as_str())) {
                v.running.push(sched::Running {
                    job: j.id,
                    alloc: guaranteed_alloc(j, a),
                    end_ms: 0,
                });
            }
        }
        v
    }

    /// Adds the next part of the cluster's view to `view`: up to `nodes` nodes (by
    /// name), then, once every node is in, what runs on up to `jobs` active jobs (by
    /// id). Answers whether there is more. The daemon takes each part in a hold of its
    /// lock of its own; with nothing changing in between, the parts make `view()`.
    pub fn view_part(
        &self,
        at: &mut ViewCursor,
        view: &mut ClusterView,
        nodes: usize,
        jobs: usize,
    ) -> bool {
        if !at.nodes_done {
            let (part, next) = self.node_views_part(at.after_node.as_deref(), nodes);
            view.nodes.extend(part);
            at.nodes_done = next.is_none();
            at.after_node = next;
            return true;
        }
        let (part, next) = self.running_views_part(at.after_job, jobs);
        view.running.extend(part);
        match next {
            Some(id) => {
                at.after_job = id;
                true
            }
            None => false,
        }
    }

    /// The nodes alone (what `fits_empty` needs).
    pub fn node_views(&self) -> ClusterView {
        ClusterView {
            nodes: self.node_views_part(None, usize::MAX).0,
            running: Vec::new(),
        }
    }

    /// Up to `max` nodes as the scheduler sees them, by name, from the one after
    /// `after` (the first when `None`), and the name to go on after when there are
    /// more: the daemon takes a large cluster's view in parts, releasing its lock in
    /// between (a plan's starts are checked again against the nodes when applied).
    pub fn node_views_part(
        &self,
        after: Option<&str>,
        max: usize,
    ) -> (Vec<NodeView>, Option<String>) {
        use std::ops::Bound;
        let partitions = self.config.all_partitions();
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut nodes = self
            .fleet
            .nodes
            .range::<str, _>((from, Bound::Unbounded))
            .map(|(_, n)| n);
        let part: Vec<NodeView> = nodes
            .by_ref()
            .take(max)
            .map(|n| self.node_view(n, &partitions))
            .collect();
        let next = match (nodes.next(), part.last()) {
            (Some(_), Some(last)) => Some(last.name.clone()),
            _ => None,
        };
        (part, next)
    }

    /// One node as the scheduler sees it (`partitions`: `config.all_partitions()`).
    pub fn node_view(
        &self,
        n: &Node,
        partitions: &std::collections::BTreeMap<&str, &crate::partitions::PartitionConfig>,
    ) -> NodeView {
        let mut slots = n.slots();
        if !self.mig.changing.is_empty() {
            // A GPU being reconfigured is in no pass until its agent shows it again.
            slots.retain(|s| !self.mig_changing(&n.name, s.gpu_index));
        }
        if !self.lent_gpus.is_empty() {
            // GPUs with borrowers last: a guaranteed job takes one only when it must
            // (it then waits for their yield if their memory is in its way).
            slots.sort_by_key(|s| self.lent_gpus.contains(&s.uuid));
        }
        NodeView {
            name: n.name.clone(),
            eligibility: self.eligibility(n),
            slots,
            cpu_milli: n.cpus.saturating_mul(1000),
            memory_bytes: n.memory_bytes,
            partitions: crate::partitions::partitions_holding(partitions, &n.name),
            features: n.features.clone(),
        }
    }

    pub fn running_views(&self) -> Vec<sched::Running> {
        self.running_views_part(0, usize::MAX).0
    }

    /// What runs, from the active jobs with ids above `after`, up to `max` of them
    /// looked at, and the id to go on after when there are more (the daemon's parts,
    /// as with `node_views_part`).
    pub fn running_views_part(&self, after: u64, max: usize) -> (Vec<sched::Running>, Option<u64>) {
        let mut running = Vec::new();
        let mut jobs = self.jobs.active_after(after);
        let mut last = None;
        for s in jobs.by_ref().take(max) {
            last = Some(s.job.id);
            running.extend(claims_of(s));
        }
        let next = jobs.next().and(last);
        (running, next)
    }

    /// What the jobs `ids` (in id order) hold now, as `view` has it: a pass that carries
    /// its view from the last reads these for the jobs changed since
    /// (`Jobs::touched_since`), not every running job's.
    pub fn running_of(&self, ids: &[u64]) -> Vec<sched::Running> {
        (ids.iter())
            .filter_map(|id| self.jobs.get(*id))
            .flat_map(claims_of)
            .collect()
    }

    pub fn pending(&self) -> Vec<PendingJob> {
        let shares = self.fair_share_table();
        self.pending_part(&shares, 0, usize::MAX).0
    }

    /// The jobs `ids` (in id order) as a pass's queue has them now: each pending job a
    /// pass plans (not held, not opportunistic) as the scheduler sees it, `None` for
    /// the rest (gone, running, ended, held). A pass that carries its queue from the
    /// last reads these for the jobs changed since (`Jobs::touched_since`).
    pub fn pending_of(
        &self,
        ids: &[u64],
        shares: &sched::fairshare::FairShareTable,
    ) -> Vec<(u64, Option<PendingJob>)> {
        (ids.iter())
            .map(|&id| {
                let pending = (self.jobs.job(id))
                    .filter(|j| queued(j))
                    .map(|j| pending_job(j, shares, &self.config));
                (id, pending)
            })
            .collect()
    }

    /// Up to `max` pending jobs (not held) with ids above `after`, as the scheduler
    /// sees them, and the id to go on after when there are more: the daemon takes a
    /// large queue in parts, releasing its lock in between.
    pub fn pending_part(
        &self,
        shares: &sched::fairshare::FairShareTable,
        after: u64,
        max: usize,
    ) -> (Vec<PendingJob>, Option<u64>) {
        let mut out = Vec::new();
        for s in self.jobs.active_after(after) {
            let j = &s.job;
            if !queued(j) {
                continue;
            }
            if out.len() == max {
                return (out, Some(after.max(j.id - 1)));
            }
            out.push(pending_job(j, shares, &self.config));
        }
        (out, None)
    }

    /// The typical workload (for FGD): the shapes of the jobs the controller knows.
    pub fn workload(&self) -> Workload {
        let rev = self.jobs.revision();
        if let Some((at, w)) = &*self.workload.borrow()
            && *at == rev
        {
            return w.clone();
        }
        let reqs = (self.jobs.newest().take(10_000)).map(|s| Request::from(&s.job.spec.resources));
        let w = Workload::from_requests(reqs);
        *self.workload.borrow_mut() = Some((rev, w.clone()));
        w
    }

    /// One node as the listings show it: its record, what is allocated on each GPU
    /// and to whom, its latest samples (while its agent is connected), and its state.
    pub fn node_row(&self, n: &Node, usage: &HashMap<&str, Usage>) -> NodeRow {
        let empty = Usage::default();
        let u = usage.get(n.name.as_str()).unwrap_or(&empty);
        let connected = self.fleet.conns.contains_key(&n.name);
        let mut busy = 0usize;
        let gpus: Vec<GpuRow> = n
            .gpus
            .iter()
            .map(|g| {
                let mut row = GpuRow {
                    gpu: g.clone(),
                    mig_changing_to: self.mig.changing.get(&g.uuid).map(|c| c.layout.clone()),
                    ..GpuRow::default()
                };
                let mut jobs = Vec::new();
                if let Some((c, m, js)) = u.slots.get(&g.uuid) {
                    row.compute_allocated_milli = *c;
                    row.memory_allocated_mib = *m;
                    jobs.extend(js.iter().copied());
                }
                for inst in &g.mig {
                    let mut to = 0;
                    if let Some((c, m, js)) = u.slots.get(&inst.uuid) {
                        to = js[0];
                        row.compute_allocated_milli += c;
                        row.memory_allocated_mib += m;
                        jobs.extend(js.iter().copied());
                    }
                    row.mig_allocated_to.push(to);
                }
                jobs.sort_unstable();
                jobs.dedup();
                row.allocated_to = jobs.first().copied().unwrap_or(0);
                if connected {
                    row.metrics = self
                        .fleet
                        .metrics
                        .get(&n.name)
                        .and_then(|ms| ms.iter().find(|m| m.uuid == g.uuid))
                        .cloned();
                }
                let full = if g.mig.is_empty() {
                    row.compute_allocated_milli >= 1000
                } else {
                    row.mig_allocated_to.iter().all(|&to| to != 0)
                };
                busy += usize::from(full);
                row.jobs = jobs;
                row
            })
            .collect();
        let (state, reason) = match (&n.drain_reason, connected) {
            (_, false) => (
                NodeState::Down,
                n.drain_reason
                    .clone()
                    .unwrap_or_else(|| "agent not connected".into()),
            ),
            (Some(r), true) if u.jobs > 0 => (NodeState::Draining, r.clone()),
            (Some(r), true) => (NodeState::Drained, r.clone()),
            (None, true) if u.jobs == 0 => (NodeState::Idle, String::new()),
            (None, true) if !gpus.is_empty() && busy == gpus.len() => {
                (NodeState::Allocated, String::new())
            }
            (None, true) => (NodeState::Mixed, String::new()),
        };
        NodeRow {
            node: n.clone(),
            state,
            reason,
            gpus,
            cpus_allocated: u.cpu_milli.div_ceil(1000),
            memory_allocated: u.memory,
            partitions: self.config.partitions_of(&n.name),
        }
    }
}

/// The verdict on every pending job with dependencies (`sched::deps`).
fn dependency_verdicts(c: &Cluster) -> BTreeMap<u64, sched::deps::Verdict> {
    let mut namesakes: Option<Namesakes> = None;
    let with_deps: BTreeMap<u64, Vec<(sched::job::DepKind, u64)>> = c
        .jobs
        .with_deps()
        .map(|j| {
            let d = &j.spec.dependencies;
            let mut deps: Vec<_> = d
                .iter()
                .filter(|x| x.kind != DependencyKind::Singleton)
                .map(|x| (x.kind.into(), x.job_id))
                .collect();
            if d.iter().any(|x| x.kind == DependencyKind::Singleton) {
                let by_name = namesakes.get_or_insert_with(|| namesakes_of(c));
                deps.extend(singleton_waits(j, by_name));
            }
            (j.id, deps)
        })
        .collect();
    if with_deps.is_empty() {
        return BTreeMap::new();
    }
    sched::deps::evaluate(&with_deps, |id| c.jobs.job(id).map(|j| j.state))
}

/// Unfinished jobs by (user, name): (id, running).
type Namesakes<'a> = HashMap<(&'a str, &'a str), Vec<(u64, bool)>>;

fn namesakes_of(c: &Cluster) -> Namesakes<'_> {
    let mut out = Namesakes::new();
    for s in c.jobs.active() {
        let j = &s.job;
        out.entry((crate::jobs::owner(j), j.spec.name.as_str()))
            .or_default()
            .push((j.id, j.state == JobState::Running));
    }
    out
}

/// What a `singleton` job waits for (sbatch --dependency=singleton): every running
/// job of its user and name, and every earlier one not yet ended. The earliest waiting
/// one never waits for a later one, so a run of singletons goes one at a time, in order.
fn singleton_waits(j: &Job, namesakes: &Namesakes<'_>) -> Vec<(sched::job::DepKind, u64)> {
    let name = j.spec.name.as_str();
    namesakes
        .get(&(crate::jobs::owner(j), name))
        .into_iter()
        .flatten()
        .filter(|&&(id, running)| id != j.id && (running || id < j.id))
        .map(|&(id, _)| (sched::job::DepKind::AfterAny, id))
        .collect()
}

/// Pending jobs that may not run yet, or never, for their dependencies.
pub fn dependency_blocked(c: &Cluster) -> BTreeSet<u64> {
    dependency_verdicts(c)
        .into_iter()
        .filter(|(_, v)| *v != sched::deps::Verdict::Ready)
        .map(|(id, _)| id)
        .collect()
}

/// Evaluates the dependencies of pending jobs: cancels those that can never be met, and
/// returns those that must wait (and those cancelled).
pub fn settle_dependencies(c: &mut Cluster, now: i64) -> BTreeSet<u64> {
    use sched::deps::Verdict;
    let mut waiting = BTreeSet::new();
    for (id, v) in dependency_verdicts(c) {
        match v {
            Verdict::Ready => {}
            Verdict::Waiting { .. } => {
                waiting.insert(id);
                c.jobs.annotate_pending(id, |j| {
                    j.reason = "Dependency".into();
                    j.expected_start_ms = 0;
                });
            }
            Verdict::Never { job, state } => {
                let why = match state {
                    Some(s) => format!("job {job} ended {}", state_name(s)),
                    None => format!("job {job} is unknown"),
                };
                tracing::info!(
                    job = id,
                    "cancelled: its dependency can never be satisfied ({why})"
                );
                let never = Transition::Finish {
                    state: JobState::Cancelled,
                    exit_code: None,
                    reason: format!("DependencyNeverSatisfied: {why}"),
                };
                c.jobs
                    .transition(id, never, now)
                    .expect("a job with dependencies is pending");
                waiting.insert(id);
            }
        }
    }
    waiting
}

/// A pending job as the scheduler sees it.
/// A running job's allocation as the main pass sees it: a borrower's GPUs are its
/// holders' (`opportunistic.rs`), its host CPU and memory its own.
pub fn guaranteed_alloc(j: &Job, a: &crate::record::Allocation) -> sched::Alloc {
    let mut alloc = sched::Alloc::from(a);
    if j.spec.opportunistic {
        alloc.slots.clear();
    }
    alloc
}

pub fn pending_job(j: &Job, shares: &sched::fairshare::FairShareTable, cfg: &Config) -> PendingJob {
    let spec = &j.spec;
    let mut request = Request::from(&spec.resources);
    let partition = cfg.partition_name(&spec.partition).to_string();
    request.partition = cfg.partition_filter(&partition);
    let account = spec.account.clone();
    let user = crate::jobs::owner(j).to_string();
    PendingJob {
        id: j.id,
        priority: spec.priority,
        qos: spec.qos.clone(),
        fair_share_milli: shares.factor(&account, &user),
        account,
        user,
        partition,
        array: array_of(spec),
        submit_ms: j.submit_time_ms,
        request,
        duration_ms: limit_ms(j.time_limit_secs),
        reclaimable: crate::policy::reclaimable(spec, cfg),
    }
}

/// A task's array and its throttle (`%N`; 0 = none), read from the spec's suffix only.
pub fn array_of(spec: &JobSpec) -> Option<(u64, u32)> {
    spec.array_task_id?;
    let max = spec
        .array
        .rsplit_once('%')
        .and_then(|(_, n)| n.trim().parse().ok())
        .unwrap_or(0);
    Some((spec.array_job_id, max))
}
