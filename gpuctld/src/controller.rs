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
use gpuctl_proto::convert;
use gpuctl_proto::store::{StoredJob, StoredNode};
use gpuctl_proto::{self as pb, JobState, NodeState};
use prost::Message as _;
use tokio::sync::{Notify, mpsc};
use tonic::Status;

use crate::auth::{Caller, Tokens};
use crate::config::Config;
use crate::store::{Store, StoreError};
use gpuctl_sched::packing::Workload;
use gpuctl_sched::{self as sched, ClusterView, Eligibility, NodeView, PendingJob, Request};

mod agents;
mod jobs;
mod retention;
mod users;
mod validate;

use jobs::{Jobs, Transition, job_of, owner};
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
    /// Every job, its indexes, and the one place its state changes (`jobs.rs`).
    jobs: Jobs,
    nodes: BTreeMap<String, StoredNode>,
    conns: HashMap<String, Conn>,
    /// Nonces handed out by `challenge`, per node, with when they expire (Unix ms).
    challenges: HashMap<String, Vec<(Vec<u8>, i64)>>,
    /// When a node's agent was last heard from (heartbeat, attach or report), in memory.
    last_heard: HashMap<String, i64>,
    next_job_id: u64,
    generation: u64,
    tokens: Tokens,
    /// The latest GPU metrics each agent sent with its heartbeat (memory only).
    metrics: HashMap<String, Vec<pb::GpuMetrics>>,
}

/// What running jobs hold on one node, per slot UUID: (compute milli, memory MiB, jobs).
#[derive(Default)]
struct Usage {
    slots: HashMap<String, (u32, u64, Vec<u64>)>,
    cpu_milli: u32,
    memory: u64,
    jobs: usize,
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
        for s in self.jobs.active() {
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
        for s in self.jobs.active() {
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
        self.jobs
            .active()
            .map(job_of)
            .filter(|j| j.state() == JobState::Pending)
            .map(|j| {
                let spec = j.spec.as_ref();
                PendingJob {
                    id: j.id,
                    priority: spec.map_or(0, |s| s.priority),
                    qos: spec.map(|s| s.qos.clone()).unwrap_or_default(),
                    submit_ms: j.submit_time_ms,
                    request: Request::from(
                        spec.and_then(|s| s.resources.as_ref()).unwrap_or(&none),
                    ),
                    duration_ms: limit_ms(j.time_limit_secs),
                }
            })
            .collect()
    }

    /// The typical workload (for FGD): the shapes of the jobs the controller knows.
    fn workload(&self) -> Workload {
        let reqs: Vec<Request> = self
            .jobs
            .all()
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
            cluster.jobs.insert(j);
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

    /// Writes the jobs changed since the last call (not yet flushed). Returns whether
    /// anything was written.
    fn persist(&self, c: &mut Cluster) -> Result<bool, StoreError> {
        let changes = c.jobs.take_changes();
        for &id in &changes.put {
            if let Some(s) = c.jobs.get(id) {
                self.store.put_job(s)?;
            }
        }
        for &id in &changes.delete {
            self.store.delete_job(id)?;
        }
        Ok(!changes.is_empty())
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
        let now = now_ms();
        self.retire(&mut c, now);
        let waiting = settle_dependencies(&mut c, now);
        let changed = self.persist(&mut c)?;
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
                    .job(start.job)
                    .is_some_and(|j| j.state() == JobState::Pending);
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
                let allocations = start
                    .allocs
                    .iter()
                    .enumerate()
                    .map(|(r, a)| convert::allocation(a, r as u32))
                    .collect();
                c.jobs
                    .transition(start.job, Transition::Start { allocations }, now)
                    .expect("checked pending above");
                let j = c.jobs.job(start.job).expect("just started").clone();
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
                use std::fmt::Write as _;
                reason.clear();
                let _ = write!(reason, "{}", w.reason);
                c.jobs.annotate_pending(w.job, |j| {
                    if j.reason != reason {
                        j.reason.clone_from(&reason);
                    }
                    j.expected_start_ms = w.reservation.as_ref().map_or(0, |r| r.start);
                });
            }
            self.persist(&mut c)?;
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
            .then(|| self.lock().jobs.by_request(&spec.user, request_id))
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
            let pending = c.jobs.pending_of(&spec.user);
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
            let waits = spec
                .dependencies
                .iter()
                .any(|d| c.jobs.job(d.job_id).is_some_and(|j| !j.state().is_final()));
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
            c.jobs.insert(stored);
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
            c.jobs.all().map(job_of).cloned().collect()
        } else {
            c.jobs.active().map(job_of).cloned().collect()
        }
    }

    /// Ids of the jobs `list_jobs(all)` would return, in order.
    pub fn job_ids(&self, all: bool) -> Vec<u64> {
        let c = self.lock();
        if all {
            c.jobs.ids().collect()
        } else {
            c.jobs.active_ids()
        }
    }

    /// These jobs (those that still exist), for one page of a listing.
    pub fn jobs_by_id(&self, ids: &[u64], all: bool) -> Vec<pb::Job> {
        let c = self.lock();
        ids.iter()
            .filter_map(|&id| c.jobs.job(id))
            .filter(|j| all || !j.state().is_final())
            .cloned()
            .collect()
    }

    pub fn get_job(&self, id: u64) -> Result<pb::Job, Status> {
        let c = self.lock();
        c.jobs
            .job(id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("no job {id}")))
    }

    // ------------------------------------------------------------ agent operations
}

/// Evaluates the dependencies of pending jobs (`sched::deps`): cancels those that can
/// never be met, and returns those that must wait.
fn settle_dependencies(c: &mut Cluster, now: i64) -> BTreeSet<u64> {
    use sched::deps::Verdict;
    let with_deps: BTreeMap<u64, Vec<(sched::job::DepKind, u64)>> = c
        .jobs
        .with_deps()
        .filter_map(|j| {
            let d = &j.spec.as_ref()?.dependencies;
            let deps = d.iter().map(|x| (x.kind().into(), x.job_id)).collect();
            Some((j.id, deps))
        })
        .collect();
    if with_deps.is_empty() {
        return BTreeSet::new();
    }
    let verdicts = sched::deps::evaluate(&with_deps, |id| {
        c.jobs.job(id).and_then(|j| j.state().try_into().ok())
    });
    let mut waiting = BTreeSet::new();
    for (id, v) in verdicts {
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
                    Some(s) => format!("job {job} ended {}", JobState::from(s).as_str_name()),
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
