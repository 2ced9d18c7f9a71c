//! The controller's state and every operation on it.
//!
//! `Controller` owns the in-memory cluster (jobs, nodes, agent connections) behind one
//! mutex, the sled `Store`, and the event that wakes the scheduling loop. RPC handlers in
//! `server` call its methods. Locks are never held across an await: mutate under the
//! lock, write to sled, release, then `flush` (durability) and send to agents.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpuctl_proto::store::{StoredJob, StoredNode};
use gpuctl_proto::{self as pb, JobState, NodeState};
use tokio::sync::{Notify, mpsc};
use tonic::Status;

use crate::config::Config;
use crate::sched::{self, ClusterView, Eligibility, GpuSlot, NodeView, PendingJob, Request};
use crate::store::{Store, StoreError};

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
}

#[derive(Default)]
struct Cluster {
    jobs: BTreeMap<u64, StoredJob>,
    nodes: BTreeMap<String, StoredNode>,
    conns: HashMap<String, Conn>,
    next_job_id: u64,
    generation: u64,
}

/// What running jobs hold on one node.
#[derive(Default)]
struct Usage {
    gpus: HashMap<String, u64>,
    cpus: u32,
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
        .and_then(|s| s.resources)
        .unwrap_or_default()
}

impl Cluster {
    fn usage(&self) -> HashMap<&str, Usage> {
        let mut u: HashMap<&str, Usage> = HashMap::new();
        for s in self.jobs.values() {
            let j = job_of(s);
            if j.state() != JobState::Running {
                continue;
            }
            let r = resources(j);
            let e = u.entry(j.node.as_str()).or_default();
            for g in &j.gpus {
                e.gpus.insert(g.clone(), j.id);
            }
            e.cpus += r.cpus;
            e.memory += r.memory_bytes;
            e.jobs += 1;
        }
        u
    }

    fn view(&self) -> ClusterView {
        let usage = self.usage();
        let empty = Usage::default();
        let nodes = self
            .nodes
            .values()
            .map(|n| {
                let u = usage.get(n.name.as_str()).unwrap_or(&empty);
                NodeView {
                    name: n.name.clone(),
                    eligibility: if !self.conns.contains_key(&n.name) {
                        Eligibility::Down
                    } else if n.drain_reason.is_some() {
                        Eligibility::Drained
                    } else {
                        Eligibility::Up
                    },
                    gpus: n
                        .gpus
                        .iter()
                        .map(|g| GpuSlot {
                            uuid: g.uuid.clone(),
                            model: g.model.clone(),
                            memory_mib: g.memory_mib,
                            holder: u.gpus.get(&g.uuid).copied(),
                        })
                        .collect(),
                    cpus: n.cpus,
                    cpus_used: u.cpus,
                    memory_bytes: n.memory_bytes,
                    memory_used: u.memory,
                }
            })
            .collect();
        ClusterView { nodes }
    }

    fn pending(&self) -> Vec<PendingJob> {
        self.jobs
            .values()
            .map(job_of)
            .filter(|j| j.state() == JobState::Pending)
            .map(|j| {
                let r = resources(j);
                PendingJob {
                    id: j.id,
                    priority: j.spec.as_ref().map_or(0, |s| s.priority),
                    submit_ms: j.submit_time_ms,
                    request: Request {
                        gpus: r.gpus,
                        cpus: r.cpus,
                        memory_bytes: r.memory_bytes,
                    },
                }
            })
            .collect()
    }

    fn node_pb(&self, n: &StoredNode, usage: &HashMap<&str, Usage>) -> pb::Node {
        let empty = Usage::default();
        let u = usage.get(n.name.as_str()).unwrap_or(&empty);
        let connected = self.conns.contains_key(&n.name);
        let gpus: Vec<pb::Gpu> = n
            .gpus
            .iter()
            .map(|g| pb::Gpu {
                allocated_to: u.gpus.get(&g.uuid).copied().unwrap_or(0),
                ..g.clone()
            })
            .collect();
        let allocated = gpus.iter().filter(|g| g.allocated_to != 0).count();
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
            (None, true) if !gpus.is_empty() && allocated == gpus.len() => {
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
            cpus_allocated: u.cpus,
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
    config: Config,
    sched_config: sched::SchedConfig,
    /// Wakes the scheduling loop; several events before it runs make one pass.
    wake: Notify,
}

fn store_status(e: StoreError) -> Status {
    tracing::error!("state store: {e}");
    Status::unavailable(format!("controller cannot write its state: {e}"))
}

impl Controller {
    pub fn open(store: Store, config: Config) -> Result<Arc<Controller>, StoreError> {
        let loaded = store.load()?;
        let mut cluster = Cluster {
            next_job_id: loaded.next_job_id.max(1),
            ..Cluster::default()
        };
        for j in loaded.jobs {
            let id = job_of(&j).id;
            cluster.next_job_id = cluster.next_job_id.max(id + 1);
            cluster.jobs.insert(id, j);
        }
        for n in loaded.nodes {
            cluster.nodes.insert(n.name.clone(), n);
        }
        tracing::info!(
            jobs = cluster.jobs.len(),
            nodes = cluster.nodes.len(),
            next_job_id = cluster.next_job_id,
            "state loaded"
        );
        Ok(Arc::new(Controller {
            cluster: Mutex::new(cluster),
            store,
            config,
            sched_config: sched::SchedConfig::default(),
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
            if let Err(e) = self.schedule_pass().await {
                tracing::error!("scheduling pass failed: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }

    /// One pass: snapshot, plan (pure, outside the lock), re-check and apply, persist,
    /// then dispatch.
    pub async fn schedule_pass(&self) -> Result<(), StoreError> {
        let (view, queue) = {
            let c = self.lock();
            (c.view(), c.pending())
        };
        if queue.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        let plan = sched::schedule(&view, &queue, &self.sched_config, now);

        let mut sends = Vec::new();
        {
            let mut c = self.lock();
            // Re-check against the state as it is now: things may have moved while planning.
            let mut current = c.view();
            for start in &plan.starts {
                let ok = c
                    .jobs
                    .get(&start.job)
                    .is_some_and(|j| job_of(j).state() == JobState::Pending);
                let Some(node) = current.nodes.iter_mut().find(|n| n.name == start.node) else {
                    continue;
                };
                let req = {
                    let Some(j) = c.jobs.get(&start.job) else {
                        continue;
                    };
                    resources(job_of(j))
                };
                let gpus_free = start
                    .gpus
                    .iter()
                    .all(|u| node.gpus.iter().any(|g| &g.uuid == u && g.holder.is_none()));
                let fits = node.eligible()
                    && gpus_free
                    && node.cpus.saturating_sub(node.cpus_used) >= req.cpus
                    && node.memory_bytes.saturating_sub(node.memory_used) >= req.memory_bytes;
                if !ok || !fits {
                    tracing::debug!(
                        job = start.job,
                        "placement no longer valid; next pass retries"
                    );
                    continue;
                }
                for g in node
                    .gpus
                    .iter_mut()
                    .filter(|g| start.gpus.contains(&g.uuid))
                {
                    g.holder = Some(start.job);
                }
                node.cpus_used += req.cpus;
                node.memory_used += req.memory_bytes;

                let Some(tx) = c.conns.get(&start.node).map(|conn| conn.tx.clone()) else {
                    continue;
                };
                let stored = c.jobs.get_mut(&start.job).expect("checked above");
                let j = job_mut(stored);
                j.set_state(JobState::Running);
                j.node = start.node.clone();
                j.gpus = start.gpus.clone();
                j.start_time_ms = now;
                j.reason = String::new();
                stored.start_confirmed = false;
                self.store.put_job(stored)?;
                let j = job_of(stored);
                tracing::info!(job = j.id, node = %j.node, gpus = ?j.gpus, "starting job");
                sends.push((
                    tx,
                    pb::AgentCommand {
                        command: Some(pb::agent_command::Command::Start(pb::StartJob {
                            job_id: j.id,
                            spec: j.spec.clone(),
                            gpus: j.gpus.clone(),
                            time_limit_secs: j.time_limit_secs,
                            kill_grace_secs: self.config.kill_grace.as_secs(),
                        })),
                    },
                ));
            }
            for (id, why) in &plan.blocked {
                if let Some(s) = c.jobs.get_mut(id) {
                    let j = job_mut(s);
                    if j.state() == JobState::Pending {
                        j.reason = why.to_string();
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

    pub async fn submit(&self, spec: Option<pb::JobSpec>) -> Result<u64, Status> {
        let spec = spec.ok_or_else(|| Status::invalid_argument("submit without a job spec"))?;
        validate_spec(&spec)?;
        let res = spec.resources.unwrap_or_default();
        let id = {
            let mut c = self.lock();
            check_feasible(&c.view(), &res)?;
            let id = c.next_job_id;
            let time_limit_secs = if res.time_limit_secs > 0 {
                res.time_limit_secs
            } else {
                self.config.default_time_limit.as_secs()
            };
            let stored = StoredJob {
                job: Some(pb::Job {
                    id,
                    spec: Some(spec),
                    state: JobState::Pending as i32,
                    reason: "None".into(),
                    submit_time_ms: now_ms(),
                    time_limit_secs,
                    ..pb::Job::default()
                }),
                ..StoredJob::default()
            };
            self.store
                .insert_new_job(&stored, id + 1)
                .map_err(store_status)?;
            c.next_job_id = id + 1;
            c.jobs.insert(id, stored);
            id
        };
        // Acknowledge only once durable.
        self.store.flush().await.map_err(store_status)?;
        tracing::info!(job = id, "job submitted");
        self.wake_scheduler();
        Ok(id)
    }

    pub fn list_jobs(&self, all: bool) -> Vec<pb::Job> {
        let c = self.lock();
        c.jobs
            .values()
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

    pub async fn cancel(&self, ids: &[u64]) -> Result<Vec<pb::CancelResult>, Status> {
        let mut results = Vec::new();
        let mut kills = Vec::new();
        {
            let mut c = self.lock();
            for &id in ids {
                let result = |ok: bool, msg: &str| pb::CancelResult {
                    job_id: id,
                    ok,
                    message: msg.to_string(),
                };
                let Some(stored) = c.jobs.get_mut(&id) else {
                    results.push(result(false, "no such job"));
                    continue;
                };
                let j = job_mut(stored);
                match j.state() {
                    JobState::Pending => {
                        j.set_state(JobState::Cancelled);
                        j.end_time_ms = now_ms();
                        j.reason = "cancelled while pending".into();
                        self.store.put_job(stored).map_err(store_status)?;
                        results.push(result(true, "removed from the queue"));
                    }
                    JobState::Running => {
                        let node = j.node.clone();
                        stored.cancel_requested = true;
                        self.store.put_job(stored).map_err(store_status)?;
                        if let Some(conn) = c.conns.get(&node) {
                            kills.push((conn.tx.clone(), self.kill_cmd(id, "cancelled by user")));
                            results.push(result(true, "killing"));
                        } else {
                            results.push(result(
                                true,
                                "node not connected; the job is killed when its agent returns",
                            ));
                        }
                    }
                    s => results.push(result(
                        false,
                        &format!("already finished ({})", s.as_str_name()),
                    )),
                }
            }
        }
        self.store.flush().await.map_err(store_status)?;
        for (tx, cmd) in kills {
            let _ = tx.send(Ok(cmd)).await;
        }
        self.wake_scheduler();
        Ok(results)
    }

    fn kill_cmd(&self, job_id: u64, reason: &str) -> pb::AgentCommand {
        pb::AgentCommand {
            command: Some(pb::agent_command::Command::Kill(pb::KillJob {
                job_id,
                as_state: JobState::Cancelled as i32,
                kill_grace_secs: self.config.kill_grace.as_secs(),
                reason: reason.into(),
            })),
        }
    }

    pub fn list_nodes(&self) -> Vec<pb::Node> {
        let c = self.lock();
        let usage = c.usage();
        c.nodes.values().map(|n| c.node_pb(n, &usage)).collect()
    }

    pub async fn set_drain(&self, name: &str, drain: Option<String>) -> Result<pb::Node, Status> {
        let node = {
            let mut c = self.lock();
            let n = c
                .nodes
                .get_mut(name)
                .ok_or_else(|| Status::not_found(format!("no node named {name:?}")))?;
            n.drain_reason = drain;
            self.store.put_node(n).map_err(store_status)?;
            let n = n.clone();
            let usage = c.usage();
            c.node_pb(&n, &usage)
        };
        self.store.flush().await.map_err(store_status)?;
        tracing::info!(node = name, state = ?node.state(), reason = %node.reason, "drain state changed");
        self.wake_scheduler();
        Ok(node)
    }

    // ------------------------------------------------------------ agent operations

    /// Registers an agent (or re-registers after a disconnect or a controller restart)
    /// and reconciles what it runs with what the controller believes.
    pub async fn connect(
        self: &Arc<Self>,
        req: pb::RegisterRequest,
    ) -> Result<(mpsc::Receiver<Result<pb::AgentCommand, Status>>, u64), Status> {
        if req.node.is_empty() || req.node.len() > 255 || req.node.contains('/') {
            return Err(Status::invalid_argument(
                "node name must be 1 to 255 characters without '/'",
            ));
        }
        let (tx, rx) = mpsc::channel(1024);
        let now = now_ms();
        let mut to_kill = Vec::new();
        let generation = {
            let mut c = self.lock();
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
                        ..g.clone()
                    })
                    .collect(),
                cpus: req.cpus,
                memory_bytes: req.memory_bytes,
                drain_reason,
                gpu_backend: req.gpu_backend.clone(),
                last_seen_ms: now,
            };
            self.store.put_node(&node).map_err(store_status)?;
            c.nodes.insert(req.node.clone(), node);

            for r in &req.unacked_reports {
                self.apply_report(&mut c, r).map_err(store_status)?;
            }
            let running: BTreeSet<u64> = req.running_jobs.iter().copied().collect();
            let ids: Vec<u64> = c.jobs.keys().copied().collect();
            for id in ids {
                let stored = c.jobs.get_mut(&id).expect("key from map");
                let confirmed = stored.start_confirmed;
                let j = job_mut(stored);
                if j.state() != JobState::Running || j.node != req.node || running.contains(&id) {
                    continue;
                }
                if confirmed {
                    j.set_state(JobState::Failed);
                    j.end_time_ms = now;
                    j.reason = "agent restarted without the job (lost)".into();
                    tracing::warn!(job = id, node = %req.node, "running job lost by its agent");
                } else {
                    // Never confirmed started, and the agent does not run it: safe to requeue.
                    j.set_state(JobState::Pending);
                    j.node.clear();
                    j.gpus.clear();
                    j.start_time_ms = 0;
                    j.reason = "requeued: start was not delivered".into();
                    tracing::info!(job = id, "requeued an undelivered start");
                }
                self.store.put_job(stored).map_err(store_status)?;
            }
            for &id in &running {
                let keep = c.jobs.get(&id).is_some_and(|s| {
                    let j = job_of(s);
                    j.state() == JobState::Running && j.node == req.node && !s.cancel_requested
                });
                if !keep {
                    to_kill.push(self.kill_cmd(id, "not running here according to the controller"));
                }
            }
            c.conns.insert(
                req.node.clone(),
                Conn {
                    generation,
                    tx: tx.clone(),
                },
            );
            generation
        };
        self.store.flush().await.map_err(store_status)?;
        for cmd in to_kill {
            let _ = tx.send(Ok(cmd)).await;
        }
        tracing::info!(node = %req.node, gpus = req.gpus.len(), running = req.running_jobs.len(), "agent connected");
        self.wake_scheduler();
        Ok((rx, generation))
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

    pub fn heartbeat(&self, req: &pb::HeartbeatRequest) -> bool {
        let mut c = self.lock();
        let known = c.conns.contains_key(&req.node);
        if let Some(n) = c.nodes.get_mut(&req.node) {
            n.last_seen_ms = now_ms();
        }
        known
    }

    pub async fn report(&self, r: &pb::JobReport) -> Result<(), Status> {
        {
            let mut c = self.lock();
            self.apply_report(&mut c, r).map_err(store_status)?;
        }
        self.store.flush().await.map_err(store_status)?;
        self.wake_scheduler();
        Ok(())
    }

    fn apply_report(&self, c: &mut Cluster, r: &pb::JobReport) -> Result<(), StoreError> {
        let Some(stored) = c.jobs.get_mut(&r.job_id) else {
            tracing::warn!(job = r.job_id, node = %r.node, "report for an unknown job");
            return Ok(());
        };
        let j = job_mut(stored);
        if j.state() != JobState::Running || j.node != r.node {
            tracing::debug!(job = r.job_id, "stale report ignored");
            return Ok(());
        }
        match r.kind() {
            pb::job_report::Kind::Started => {
                stored.start_confirmed = true;
            }
            pb::job_report::Kind::Ended => {
                let state = match r.state() {
                    s @ (JobState::Completed
                    | JobState::Failed
                    | JobState::Cancelled
                    | JobState::Timeout) => s,
                    _ => JobState::Failed,
                };
                j.set_state(state);
                j.exit_code = r.exit_code;
                j.end_time_ms = if r.time_ms > 0 { r.time_ms } else { now_ms() };
                j.reason = r.reason.clone();
                stored.start_confirmed = true;
                let j = job_of(stored);
                tracing::info!(job = j.id, state = j.state().as_str_name(), exit_code = ?j.exit_code, "job ended");
            }
            pb::job_report::Kind::Unspecified => return Ok(()),
        }
        self.store.put_job(stored)
    }

    /// Drops every agent connection so that their streams end (for shutdown).
    pub fn close_agent_streams(&self) {
        self.lock().conns.clear();
    }
}

fn validate_spec(spec: &pb::JobSpec) -> Result<(), Status> {
    let bad = |m: &str| Err(Status::invalid_argument(m.to_string()));
    if spec.command.is_empty() == spec.script.is_empty() {
        return bad("a job needs exactly one of `command` or `script`");
    }
    if spec.command.first().is_some_and(String::is_empty) {
        return bad("`command` needs a program name");
    }
    if !spec.workdir.starts_with('/') {
        return bad("workdir must be an absolute path");
    }
    if spec.user.is_empty() {
        return bad("the job has no user");
    }
    let r = spec.resources.unwrap_or_default();
    if r.cpus == 0 {
        return bad("cpus must be at least 1");
    }
    Ok(())
}

/// Refuses a job that no known node could ever run. With no node known yet, the job waits.
fn check_feasible(view: &ClusterView, r: &pb::Resources) -> Result<(), Status> {
    if view.nodes.is_empty() {
        return Ok(());
    }
    let req = Request {
        gpus: r.gpus,
        cpus: r.cpus,
        memory_bytes: r.memory_bytes,
    };
    if view.nodes.iter().any(|n| sched::fits_empty(n, &req)) {
        return Ok(());
    }
    let max_gpus = view.nodes.iter().map(|n| n.gpus.len()).max().unwrap_or(0);
    let max_cpus = view.nodes.iter().map(|n| n.cpus).max().unwrap_or(0);
    let max_mem = view.nodes.iter().map(|n| n.memory_bytes).max().unwrap_or(0);
    Err(Status::invalid_argument(format!(
        "impossible request: no node can ever run it (asked {} GPUs, {} CPUs, {} memory on one node; the largest node has {} GPUs, {} CPUs, {})",
        req.gpus,
        req.cpus,
        bytesize::ByteSize(req.memory_bytes),
        max_gpus,
        max_cpus,
        bytesize::ByteSize(max_mem),
    )))
}
