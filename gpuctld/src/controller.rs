//! The controller's state and every operation on it.
//!
//! `Controller` owns the in-memory cluster (jobs, nodes, agent connections) behind one
//! mutex, the sled `Store`, and the event that wakes the scheduling loop. RPC handlers in
//! `server` call its methods. Locks are never held across an await: mutate under the
//! lock, write to sled, release, then `flush` (durability) and send to agents.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpuctl_proto::auth::ClusterKey;
use gpuctl_proto::store::{StoredJob, StoredNode};
use gpuctl_proto::convert;
use gpuctl_proto::{self as pb, JobState, NodeState};
use prost::Message as _;
use tokio::sync::{Notify, mpsc};
use tonic::Status;

use crate::auth::{Caller, Tokens};
use crate::config::Config;
use gpuctl_sched::packing::Workload;
use gpuctl_sched::{
    self as sched, ClusterView, Eligibility, NodeView, PendingJob, Request,
};
use crate::store::{Store, StoreError};

mod agents;
mod retention;
mod users;
mod validate;

pub use validate::check_paths;
use validate::{check_dependencies, check_feasible, check_policy, check_text, validate_spec};

/// A time limit in ms, saturating (a stored limit is capped at submit, but records of
/// older versions and the arithmetic must never wrap).
fn limit_ms(secs: u64) -> i64 {
    i64::try_from(secs).unwrap_or(i64::MAX).saturating_mul(1000)
}

pub type CommandTx = mpsc::Sender<Result<pb::AgentCommand, Status>>;

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

struct Conn {
    /// Which registration this is; a stale connection's drop must not mark a newer one down.
    generation: u64,
    tx: CommandTx,
    /// The session (the Attach nonce) and the request numbers seen on it.
    session: Vec<u8>,
    window: gpuctl_proto::auth::ReplayWindow,
    /// The identity the agent keeps in its state dir, and where it connected from.
    agent_id: String,
    peer: String,
    /// Starts sent on this session and not yet seen run: (command number, job, attempt).
    starts: Vec<(u64, u64, u32)>,
}

#[derive(Default)]
struct Cluster {
    jobs: BTreeMap<u64, StoredJob>,
    nodes: BTreeMap<String, StoredNode>,
    conns: HashMap<String, Conn>,
    /// Nonces handed out by `challenge`, per node, with when they expire (Unix ms).
    challenges: HashMap<String, Vec<(Vec<u8>, i64)>>,
    /// When a node's agent was last heard from (heartbeat, attach or report), in memory.
    last_heard: HashMap<String, i64>,
    next_job_id: u64,
    generation: u64,
    tokens: Tokens,
    /// Ids of jobs that may not be final (pending or running): a superset, pruned at
    /// every scheduling pass, so that passes and submits do not walk finished jobs.
    active: BTreeSet<u64>,
    /// The latest GPU metrics each agent sent with its heartbeat (memory only).
    metrics: HashMap<String, Vec<pb::GpuMetrics>>,
    /// Jobs submitted with dependencies that may still be pending (pruned as they leave
    /// PENDING), so that passes do not look for them among all jobs.
    with_deps: BTreeSet<u64>,
    /// Pending jobs per user (for `max_pending_per_user`), kept exact at every change
    /// into or out of PENDING.
    pending_by_user: HashMap<String, usize>,
    /// Finished jobs by (end time, id), for retention (`retention.rs`).
    finished: BTreeSet<(i64, u64)>,
    /// Submits by (user, client request id): a repeated submit gets the same job.
    requests: HashMap<(String, String), u64>,
}

fn owner(j: &pb::Job) -> &str {
    j.spec.as_ref().map_or("", |s| s.user.as_str())
}

impl Cluster {
    /// Pending and running jobs (via the `active` index).
    fn active_jobs(&self) -> impl Iterator<Item = &StoredJob> {
        self.active
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter(|s| !job_of(s).state().is_final())
    }

    /// Drops jobs that became final from `active`; returns them.
    fn prune_active(&mut self) -> Vec<u64> {
        let jobs = &self.jobs;
        let mut ended = Vec::new();
        self.active.retain(|id| {
            let live = jobs.get(id).is_some_and(|s| !job_of(s).state().is_final());
            if !live {
                ended.push(*id);
            }
            live
        });
        ended
    }

    fn pending_changed(&mut self, user: &str, added: bool) {
        let n = self.pending_by_user.entry(user.to_string()).or_default();
        if added {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
    }
}

/// What running jobs hold on one node, per slot UUID: (compute milli, memory MiB, jobs).
#[derive(Default)]
struct Usage {
    slots: HashMap<String, (u32, u64, Vec<u64>)>,
    cpu_milli: u32,
    memory: u64,
    jobs: usize,
}

fn job_of(s: &StoredJob) -> &pb::Job {
    s.job.as_ref().expect("stored job without a job record")
}

fn job_mut(s: &mut StoredJob) -> &mut pb::Job {
    s.job.get_or_insert_with(pb::Job::default)
}

fn resources(j: &pb::Job) -> pb::Resources {
    j.spec
        .as_ref()
        .and_then(|s| s.resources.clone())
        .unwrap_or_default()
}

/// Live allocations of running jobs.
fn live_allocs(j: &pb::Job) -> impl Iterator<Item = &pb::Allocation> {
    let running = j.state() == JobState::Running;
    j.allocations.iter().filter(move |a| running && !a.ended)
}

impl Cluster {
    fn usage(&self) -> HashMap<&str, Usage> {
        let mut u: HashMap<&str, Usage> = HashMap::new();
        for s in self.active_jobs() {
            let j = job_of(s);
            for a in live_allocs(j) {
                let e = u.entry(a.node.as_str()).or_default();
                for sl in &a.slots {
                    let x = e.slots.entry(sl.uuid.clone()).or_default();
                    x.0 += sl.compute_milli;
                    x.1 += sl.memory_mib;
                    x.2.push(j.id);
                }
                e.cpu_milli += a.cpu_milli;
                e.memory += a.memory_bytes;
                e.jobs += 1;
            }
        }
        u
    }

    fn eligibility(&self, n: &StoredNode) -> Eligibility {
        if !self.conns.contains_key(&n.name) {
            Eligibility::Down
        } else if n.drain_reason.is_some() {
            Eligibility::Drained
        } else {
            Eligibility::Up
        }
    }

    fn view(&self) -> ClusterView {
        let mut v = self.node_views();
        v.running = self.running_views();
        v
    }

    /// The nodes alone (what `fits_empty` needs).
    fn node_views(&self) -> ClusterView {
        let nodes = self
            .nodes
            .values()
            .map(|n| NodeView {
                name: n.name.clone(),
                eligibility: self.eligibility(n),
                slots: convert::slots_of(&n.gpus),
                cpu_milli: n.cpus.saturating_mul(1000),
                memory_bytes: n.memory_bytes,
            })
            .collect();
        ClusterView {
            nodes,
            running: Vec::new(),
        }
    }

    fn running_views(&self) -> Vec<sched::Running> {
        let mut running = Vec::new();
        for s in self.active_jobs() {
            let j = job_of(s);
            let end_ms = j.start_time_ms.saturating_add(limit_ms(j.time_limit_secs));
            for a in live_allocs(j) {
                running.push(sched::Running {
                    job: j.id,
                    alloc: sched::Alloc::from(a),
                    end_ms,
                });
            }
        }
        running
    }

    fn pending(&self) -> Vec<PendingJob> {
        let none = pb::Resources::default();
        self.active_jobs()
            .map(job_of)
            .filter(|j| j.state() == JobState::Pending)
            .map(|j| {
                let spec = j.spec.as_ref();
                PendingJob {
                    id: j.id,
                    priority: spec.map_or(0, |s| s.priority),
                    qos: spec.map(|s| s.qos.clone()).unwrap_or_default(),
                    submit_ms: j.submit_time_ms,
                    request: Request::from(spec.and_then(|s| s.resources.as_ref()).unwrap_or(&none)),
                    duration_ms: limit_ms(j.time_limit_secs),
                }
            })
            .collect()
    }

    /// The typical workload (for FGD): the shapes of the jobs the controller knows.
    fn workload(&self) -> Workload {
        let reqs: Vec<Request> = self
            .jobs
            .values()
            .rev()
            .take(10_000)
            .map(|s| Request::from(&resources(job_of(s))))
            .collect();
        Workload::from_requests(&reqs)
    }

    fn node_pb(&self, n: &StoredNode, usage: &HashMap<&str, Usage>) -> pb::Node {
        let empty = Usage::default();
        let u = usage.get(n.name.as_str()).unwrap_or(&empty);
        let connected = self.conns.contains_key(&n.name);
        let mut busy = 0usize;
        let gpus: Vec<pb::Gpu> = n
            .gpus
            .iter()
            .map(|g| {
                let mut g = g.clone();
                let mut jobs = Vec::new();
                if let Some((c, m, js)) = u.slots.get(&g.uuid) {
                    g.compute_allocated_milli = *c;
                    g.memory_allocated_mib = *m;
                    jobs.extend(js.iter().copied());
                }
                for inst in &mut g.mig {
                    if let Some((c, m, js)) = u.slots.get(&inst.uuid) {
                        inst.allocated_to = js[0];
                        g.compute_allocated_milli += c;
                        g.memory_allocated_mib += m;
                        jobs.extend(js.iter().copied());
                    }
                }
                jobs.sort_unstable();
                jobs.dedup();
                g.allocated_to = jobs.first().copied().unwrap_or(0);
                if connected {
                    g.metrics = self
                        .metrics
                        .get(&n.name)
                        .and_then(|ms| ms.iter().find(|m| m.uuid == g.uuid))
                        .cloned();
                }
                let full = if g.mig.is_empty() {
                    g.compute_allocated_milli >= 1000
                } else {
                    g.mig.iter().all(|i| i.allocated_to != 0)
                };
                busy += usize::from(full);
                g.jobs = jobs;
                g
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
        pb::Node {
            name: n.name.clone(),
            state: state as i32,
            gpus,
            reason,
            cpus: n.cpus,
            cpus_allocated: u.cpu_milli.div_ceil(1000),
            memory_bytes: n.memory_bytes,
            memory_allocated: u.memory,
            last_seen_ms: n.last_seen_ms,
            gpu_backend: n.gpu_backend.clone(),
        }
    }
}

pub struct Controller {
    cluster: Mutex<Cluster>,
    store: Store,
    /// The cluster key agents sign with.
    key: ClusterKey,
    config: Config,
    sched_config: sched::SchedConfig,
    /// Wakes the scheduling loop; several events before it runs make one pass.
    wake: Notify,
    metrics: Arc<crate::metrics::Metrics>,
}

/// A store failure as the caller sees it: the controller is up (so not UNAVAILABLE,
/// which clients read as "unreachable"), the change is not durable.
fn store_status(e: StoreError) -> Status {
    tracing::error!("state store: {e}");
    let full = matches!(&e, StoreError::Stalled(_))
        || matches!(&e, StoreError::Io(sled::Error::Io(io)) if io.raw_os_error() == Some(nix::libc::ENOSPC));
    let msg =
        format!("the controller could not write its state ({e}); the request was not acknowledged");
    if full {
        Status::resource_exhausted(msg)
    } else {
        Status::internal(msg)
    }
}

/// The final state of a job from the ends of its allocations: a rank's own failure
/// (FAILED, TIMEOUT) wins over the ranks killed because of it, which win over success.
fn final_state(allocs: &[pb::Allocation]) -> (JobState, Option<i32>, String) {
    let bad = allocs
        .iter()
        .find(|a| matches!(a.state(), JobState::Failed | JobState::Timeout))
        .or_else(|| allocs.iter().find(|a| a.state() != JobState::Completed));
    match bad {
        Some(a) => (a.state(), a.exit_code, a.reason.clone()),
        None => (
            JobState::Completed,
            allocs.first().and_then(|a| a.exit_code),
            String::new(),
        ),
    }
}

impl Controller {
    pub fn open(
        store: Store,
        config: Config,
        key: ClusterKey,
    ) -> Result<Arc<Controller>, StoreError> {
        let loaded = store.load()?;
        let mut cluster = Cluster {
            next_job_id: loaded.next_job_id.max(1),
            tokens: Tokens::new(loaded.tokens),
            ..Cluster::default()
        };
        for mut j in loaded.jobs {
            let id = job_of(&j).id;
            // Records of finished jobs written before compaction existed.
            if job_of(&j).state().is_final() && retention::compact(&mut j) {
                store.put_job(&j)?;
            }
            cluster.next_job_id = cluster.next_job_id.max(id + 1);
            if job_of(&j).state() == JobState::Pending {
                let user = owner(job_of(&j)).to_string();
                cluster.pending_changed(&user, true);
            }
            if job_of(&j).state().is_final() {
                cluster.finished.insert((job_of(&j).end_time_ms, id));
            } else {
                cluster.active.insert(id);
            }
            if job_of(&j).state() == JobState::Pending
                && job_of(&j)
                    .spec
                    .as_ref()
                    .is_some_and(|s| !s.dependencies.is_empty())
            {
                cluster.with_deps.insert(id);
            }
            if !j.request_id.is_empty() {
                let key = (owner(job_of(&j)).to_string(), j.request_id.clone());
                cluster.requests.insert(key, id);
            }
            cluster.jobs.insert(id, j);
        }
        let started = now_ms();
        for n in loaded.nodes {
            // Agents get a full timeout from the controller's start to come back.
            cluster.last_heard.insert(n.name.clone(), started);
            cluster.nodes.insert(n.name.clone(), n);
        }
        tracing::info!(
            jobs = cluster.jobs.len(),
            nodes = cluster.nodes.len(),
            next_job_id = cluster.next_job_id,
            "state loaded"
        );
        let sc = &config.scheduler;
        let sched_config = sched::SchedConfig {
            policy: sc.policy().unwrap_or_default(),
            weights: sc.priority.clone(),
            backfill: sc.backfill,
            reservation_depth: sc.reservation_depth,
            workload: Workload::default(),
            max_scored_nodes: sc.max_scored_nodes,
            expected_starts: true,
        };
        let metrics = crate::metrics::Metrics::new(store.commit_seconds());
        Ok(Arc::new(Controller {
            metrics,
            cluster: Mutex::new(cluster),
            store,
            key,
            config,
            sched_config,
            wake: Notify::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Cluster> {
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Asks for a scheduling pass soon.
    pub fn wake_scheduler(&self) {
        self.wake.notify_one();
    }

    /// Runs scheduling passes on events and every `sched_interval` until `shutdown` fires.
    pub async fn scheduler_loop(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.config.sched_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tick.tick() => {}
                _ = shutdown.changed() => break,
            }
            let started = std::time::Instant::now();
            if let Err(e) = self.schedule_pass().await {
                tracing::error!("scheduling pass failed: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            // Events arriving meanwhile coalesce into the next pass. Waiting twice as
            // long as the pass took (50 ms to 2 s, like Slurm's sched_min_interval) keeps
            // scheduling to about a third of the controller's time under a storm of
            // submits.
            let took = started.elapsed() * 2;
            tokio::time::sleep(took.clamp(Duration::from_millis(50), Duration::from_secs(2))).await;
        }
    }

    /// A snapshot for the pure scheduler: cluster, queue and config (with the current
    /// workload mix).
    /// Also settles dependencies: pending jobs that wait for others are left out (REASON
    /// `Dependency`), those whose dependencies can never be met are cancelled. Returns
    /// whether it changed stored state.
    fn snapshot(
        &self,
    ) -> Result<(ClusterView, Vec<PendingJob>, sched::SchedConfig, bool), StoreError> {
        let mut c = self.lock();
        let ended = c.prune_active();
        let retired = self.retire(&mut c, &ended, now_ms())?;
        let (waiting, changed) = self.settle_dependencies(&mut c)?;
        let changed = changed || retired;
        let mut cfg = self.sched_config.clone();
        if cfg.policy == sched::packing::Policy::Fgd {
            cfg.workload = c.workload();
        }
        let mut queue = c.pending();
        if !waiting.is_empty() {
            queue.retain(|p| !waiting.contains(&p.id));
        }
        Ok((c.view(), queue, cfg, changed))
    }

    /// Evaluates the dependencies of pending jobs (`sched::deps`). Returns the jobs
    /// that must wait, and whether any job was cancelled.
    fn settle_dependencies(&self, c: &mut Cluster) -> Result<(BTreeSet<u64>, bool), StoreError> {
        use sched::deps::Verdict;
        let jobs = &c.jobs;
        c.with_deps.retain(|id| {
            jobs.get(id)
                .is_some_and(|s| job_of(s).state() == JobState::Pending)
        });
        let with_deps: BTreeMap<u64, Vec<(sched::job::DepKind, u64)>> = c
            .with_deps
            .iter()
            .filter_map(|id| c.jobs.get(id))
            .map(job_of)
            .filter_map(|j| {
                let d = &j.spec.as_ref()?.dependencies;
                (!d.is_empty()).then(|| {
                    let deps = d.iter().map(|x| (x.kind().into(), x.job_id)).collect();
                    (j.id, deps)
                })
            })
            .collect();
        if with_deps.is_empty() {
            return Ok((BTreeSet::new(), false));
        }
        let verdicts =
            sched::deps::evaluate(&with_deps, |id| {
                c.jobs
                    .get(&id)
                    .and_then(|s| job_of(s).state().try_into().ok())
            });
        let mut waiting = BTreeSet::new();
        let mut changed = false;
        let now = now_ms();
        for (id, v) in verdicts {
            let Some(stored) = c.jobs.get_mut(&id) else {
                continue;
            };
            let j = job_mut(stored);
            match v {
                Verdict::Ready => {}
                Verdict::Waiting { on } => {
                    waiting.insert(id);
                    j.reason = "Dependency".into();
                    j.expected_start_ms = 0;
                    let _ = on;
                }
                Verdict::Never { job, state } => {
                    let why = match state {
                        Some(s) => format!("job {job} ended {}", JobState::from(s).as_str_name()),
                        None => format!("job {job} is unknown"),
                    };
                    j.set_state(JobState::Cancelled);
                    j.end_time_ms = now;
                    j.expected_start_ms = 0;
                    j.reason = format!("DependencyNeverSatisfied: {why}");
                    let user = owner(j).to_string();
                    tracing::info!(
                        job = id,
                        "cancelled: its dependency can never be satisfied ({why})"
                    );
                    self.store.put_job(stored)?;
                    c.pending_changed(&user, false);
                    changed = true;
                    waiting.insert(id);
                }
            }
        }
        Ok((waiting, changed))
    }

    /// One pass: snapshot, plan (pure, outside the lock and off the async threads),
    /// re-check and apply, persist, then dispatch.
    pub async fn schedule_pass(&self) -> Result<(), StoreError> {
        let (view, queue, cfg, changed) = self.snapshot()?;
        if changed {
            self.store.flush().await?;
        }
        if queue.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        let started = std::time::Instant::now();
        let plan = tokio::task::spawn_blocking(move || sched::schedule(&view, &queue, &cfg, now))
            .await
            .expect("scheduler pass panicked");
        self.metrics
            .pass_seconds
            .observe(started.elapsed().as_secs_f64());

        let mut sends = Vec::new();
        {
            let mut c = self.lock();
            // Re-check against the state as it is now: things may have moved while planning.
            let mut ledger = sched::Ledger::new(&c.view());
            let mut accepted = sched::Plan::default();
            for start in &plan.starts {
                let pending = c
                    .jobs
                    .get(&start.job)
                    .is_some_and(|j| job_of(j).state() == JobState::Pending);
                let connected = start.allocs.iter().all(|a| c.conns.contains_key(&a.node));
                if !pending || !connected {
                    continue;
                }
                match ledger.take(start) {
                    Ok(()) => accepted.starts.push(start.clone()),
                    Err(why) => tracing::debug!(
                        job = start.job,
                        "placement no longer valid ({why}); next pass retries"
                    ),
                }
            }
            for start in &accepted.starts {
                let nodelist: Vec<String> = start.allocs.iter().map(|a| a.node.clone()).collect();
                let stored = c.jobs.get_mut(&start.job).expect("checked above");
                let j = job_mut(stored);
                j.set_state(JobState::Running);
                j.attempt += 1;
                let user = owner(j).to_string();
                j.allocations = start
                    .allocs
                    .iter()
                    .enumerate()
                    .map(|(r, a)| convert::allocation(a, r as u32))
                    .collect();
                j.node = nodelist.join(",");
                j.gpus = start
                    .allocs
                    .iter()
                    .flat_map(|a| a.slots.iter().map(|s| s.uuid.clone()))
                    .collect();
                j.start_time_ms = now;
                j.expected_start_ms = 0;
                j.reason = String::new();
                stored.start_confirmed = false;
                stored.requeued_from = None;
                self.store.put_job(stored)?;
                let j = job_of(stored).clone();
                c.pending_changed(&user, false);
                let addresses: Vec<String> = nodelist
                    .iter()
                    .map(|n| {
                        c.nodes
                            .get(n)
                            .map(|x| x.address.clone())
                            .unwrap_or_default()
                    })
                    .collect();
                tracing::info!(job = j.id, attempt = j.attempt, nodes = %j.node, gpus = ?j.gpus, "starting job");
                for a in &j.allocations {
                    let Some(tx) = c.conns.get(&a.node).map(|conn| conn.tx.clone()) else {
                        continue;
                    };
                    sends.push((
                        tx,
                        pb::AgentCommand {
                            command: Some(pb::agent_command::Command::Start(pb::StartJob {
                                job_id: j.id,
                                spec: j.spec.clone(),
                                gpus: a.slots.iter().map(|s| s.uuid.clone()).collect(),
                                time_limit_secs: j.time_limit_secs,
                                kill_grace_secs: self.config.kill_grace.as_secs(),
                                slots: a.slots.clone(),
                                rank: a.rank,
                                nodelist: nodelist.clone(),
                                attempt: j.attempt,
                                addresses: addresses.clone(),
                            })),
                            ..pb::AgentCommand::default()
                        },
                    ));
                }
            }
            // Under the lock for every pending job: no allocation unless a reason changed.
            let mut reason = String::new();
            for w in &plan.waiting {
                if let Some(s) = c.jobs.get_mut(&w.job) {
                    let j = job_mut(s);
                    if j.state() == JobState::Pending {
                        use std::fmt::Write as _;
                        reason.clear();
                        let _ = write!(reason, "{}", w.reason);
                        if j.reason != reason {
                            j.reason.clone_from(&reason);
                        }
                        j.expected_start_ms = w.reservation.as_ref().map_or(0, |r| r.start);
                    }
                }
            }
        }
        if sends.is_empty() {
            return Ok(());
        }
        self.store.flush().await?;
        for (tx, cmd) in sends {
            // A closed stream means the agent left; its reconnect reconciles the job.
            let _ = tx.send(Ok(cmd)).await;
        }
        Ok(())
    }

    // ------------------------------------------------------------ user operations

    /// Queues a job for `caller`. The job runs as the caller; an admin may name another
    /// user in the spec (like `sbatch --uid`), anyone else is refused for trying.
    pub async fn submit(
        &self,
        caller: &Caller,
        spec: Option<pb::JobSpec>,
        request_id: &str,
    ) -> Result<u64, Status> {
        let mut spec = spec.ok_or_else(|| Status::invalid_argument("submit without a job spec"))?;
        if request_id.len() > 64 || request_id.chars().any(|c| !c.is_ascii_graphic()) {
            return Err(Status::invalid_argument(
                "request_id must be at most 64 printable ASCII characters",
            ));
        }
        if spec.user.is_empty() || spec.user == caller.user {
            spec.user = caller.user.clone();
            spec.uid = caller.uid.unwrap_or(0);
            spec.gid = caller.gid.unwrap_or(0);
        } else if caller.admin {
            if !crate::auth::valid_user_name(&spec.user) {
                return Err(Status::invalid_argument(format!(
                    "user {:?} is not a valid user name",
                    spec.user
                )));
            }
            spec.uid = 0;
            spec.gid = 0;
        } else {
            return Err(caller.deny(&format!(
                "cannot submit a job as user {:?} (only admins submit for others)",
                spec.user
            )));
        }
        let limits = &self.config.limits;
        let size = spec.encoded_len() as u64;
        if size > limits.max_job_bytes.as_u64() {
            return Err(Status::invalid_argument(format!(
                "job is {} encoded, over the controller's limit of {} (limits.max_job_bytes)",
                bytesize::ByteSize(size),
                limits.max_job_bytes
            )));
        }
        validate_spec(&spec, limits.max_list_len)?;
        check_text(&spec)?;
        if self.store.failed() {
            return Err(Status::resource_exhausted(
                "the controller's state store failed (disk full?); it restarts from its durable state once space is back; nothing was queued",
            ));
        }
        if let Some(free) = self.store.free_bytes()
            && free < limits.min_free_disk.as_u64()
        {
            tracing::warn!(free, "submit refused: the state dir's disk is nearly full");
            return Err(Status::resource_exhausted(format!(
                "the controller's disk is nearly full ({} free, under limits.min_free_disk {}): submits resume once space is freed; nothing was queued",
                bytesize::ByteSize(free),
                limits.min_free_disk
            )));
        }
        check_policy(&self.config, caller, &spec)?;
        let res = spec.resources.clone().unwrap_or_default();
        let earlier = (!request_id.is_empty())
            .then(|| {
                let key = (spec.user.clone(), request_id.to_string());
                self.lock().requests.get(&key).copied()
            })
            .flatten();
        if let Some(id) = earlier {
            // The first submit may still be on its way to the disk.
            self.store.flush().await.map_err(store_status)?;
            tracing::info!(
                job = id,
                request_id,
                "repeated submit answered with its job"
            );
            return Ok(id);
        }
        let id = {
            let mut c = self.lock();
            let pending = c.pending_by_user.get(&spec.user).copied().unwrap_or(0);
            if pending >= limits.max_pending_per_user {
                return Err(Status::resource_exhausted(format!(
                    "user {} already has {pending} pending jobs, the most allowed (limits.max_pending_per_user)",
                    spec.user
                )));
            }
            check_feasible(&c.node_views(), &res)?;
            check_dependencies(&c, &spec)?;
            // Like the agents would: a job of root runs only where an agent allows it.
            if spec.user == "root"
                && !c.nodes.is_empty()
                && !c.nodes.values().any(|n| n.allow_root_jobs)
            {
                return Err(Status::failed_precondition(
                    "jobs of root are refused: no agent of this cluster runs them (start gpud with --allow-root-jobs, or submit as an ordinary user)",
                ));
            }
            // Like the pass would say: it waits while a job it depends on has not ended
            // (those that can never be met were refused above).
            let waits = spec.dependencies.iter().any(|d| {
                c.jobs
                    .get(&d.job_id)
                    .is_some_and(|s| !job_of(s).state().is_final())
            });
            let id = c.next_job_id;
            let time_limit_secs = if res.time_limit_secs > 0 {
                res.time_limit_secs
            } else {
                self.config.default_time_limit.as_secs()
            }
            .min(self.config.limits.max_time_limit.as_secs());
            let stored = StoredJob {
                job: Some(pb::Job {
                    id,
                    spec: Some(spec),
                    state: JobState::Pending as i32,
                    reason: if waits { "Dependency" } else { "None" }.into(),
                    submit_time_ms: now_ms(),
                    time_limit_secs,
                    ..pb::Job::default()
                }),
                request_id: request_id.to_string(),
                ..StoredJob::default()
            };
            self.store
                .insert_new_job(&stored, id + 1)
                .map_err(store_status)?;
            c.next_job_id = id + 1;
            if !request_id.is_empty() {
                let key = (owner(job_of(&stored)).to_string(), request_id.to_string());
                c.requests.insert(key, id);
            }
            let user = owner(job_of(&stored)).to_string();
            c.pending_changed(&user, true);
            if !job_of(&stored)
                .spec
                .as_ref()
                .is_none_or(|s| s.dependencies.is_empty())
            {
                c.with_deps.insert(id);
            }
            c.jobs.insert(id, stored);
            c.active.insert(id);
            id
        };
        // Acknowledge only once durable.
        self.store.flush().await.map_err(store_status)?;
        tracing::info!(job = id, "job submitted");
        self.metrics.submits.inc();
        self.wake_scheduler();
        Ok(id)
    }

    pub fn list_jobs(&self, all: bool) -> Vec<pb::Job> {
        let c = self.lock();
        if all {
            c.jobs.values().map(job_of).cloned().collect()
        } else {
            c.active_jobs().map(job_of).cloned().collect()
        }
    }

    /// Ids of the jobs `list_jobs(all)` would return, in order.
    pub fn job_ids(&self, all: bool) -> Vec<u64> {
        let c = self.lock();
        if all {
            c.jobs.keys().copied().collect()
        } else {
            c.active_jobs().map(|s| job_of(s).id).collect()
        }
    }

    /// These jobs (those that still exist), for one page of a listing.
    pub fn jobs_by_id(&self, ids: &[u64], all: bool) -> Vec<pb::Job> {
        let c = self.lock();
        ids.iter()
            .filter_map(|id| c.jobs.get(id))
            .map(job_of)
            .filter(|j| all || !j.state().is_final())
            .cloned()
            .collect()
    }

    pub fn get_job(&self, id: u64) -> Result<pb::Job, Status> {
        let c = self.lock();
        c.jobs
            .get(&id)
            .map(|s| job_of(s).clone())
            .ok_or_else(|| Status::not_found(format!("no job {id}")))
    }

    // ------------------------------------------------------------ agent operations
}
