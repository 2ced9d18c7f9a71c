//! The agent: registers with the controller, keeps the command stream open (reconnecting
//! with backoff), runs the jobs it is given and reports their ends.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use gpuctl_proto::auth::{ClusterKey, Signed};
use gpuctl_proto::{self as pb, JobState};
use prost::Message;
use tokio::sync::{Notify, mpsc};
use tonic::transport::{Channel, Endpoint};

use crate::exporter::Exporter;
use crate::gpu::{GpuBackend, GpuInfo};
use crate::launch::{JobLauncher, Launcher};
use crate::monitor::{Enforcer, Watched};
use crate::reports::ReportQueue;

mod jobs;
mod link;
mod mig;
mod remote;
mod setup;
use jobs::{adopt_jobs, run_job};
use link::{attach_loop, reporter};
use setup::agent_id;
pub use setup::identity;

pub struct Options {
    pub controller: String,
    pub name: String,
    pub state_dir: PathBuf,
    pub backend: Arc<dyn GpuBackend>,
    pub cpus: u32,
    pub memory_bytes: u64,
    pub heartbeat: Duration,
    /// Jobs of root run as root (otherwise they are refused).
    pub allow_root_jobs: bool,
    /// Where job cgroups go (normally /sys/fs/cgroup).
    pub cgroup_base: PathBuf,
    /// Jobs' cgroups are `<cgroup_parent>/job-<id>` under every hierarchy (default
    /// `gpuctl/<name>-<first 8 of the agent id>`).
    pub cgroup_parent: Option<String>,
    /// Remount the cgroup2 mount with `favordynmods` at start (cheap job launches).
    pub cgroup_favordynmods: bool,
    /// The key requests are signed with: the node's own (from its join), or the shared
    /// cluster key of the old mode.
    pub key: ClusterKey,
    /// TLS to the controller with the node's certificate (`None`: the shared-key mode,
    /// plain TCP or the Unix socket).
    pub tls: Option<crate::identity::Tls>,
    /// How often GPUs are sampled.
    pub sample_interval: Duration,
    /// A job over its GPU memory share this long is ended.
    pub gpu_memory_grace: Duration,
    /// Serve Prometheus metrics here.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The site's health program.
    pub health: Option<crate::health::HealthProgram>,
    /// `nvidia-cuda-mps-control` (default: looked up on $PATH).
    pub mps_control: Option<PathBuf>,
    /// How often the GPU inventory (GPUs, MIG layouts) is discovered again.
    pub inventory_interval: Duration,
    /// The address other nodes reach this one at (default: the local address of the
    /// route to the controller).
    pub address: Option<String>,
    /// Node features jobs' constraints name (`--features`).
    pub features: Vec<String>,
    /// The controller may change the MIG layouts of GPUs that hold no job (`--mig
    /// dynamic`).
    pub mig_dynamic: bool,
}

/// The session of the current Attach: every request names it with a growing number,
/// every command must carry it.
struct Session {
    id: Vec<u8>,
    /// Number of the last request sent.
    seq: std::sync::atomic::AtomicU64,
    /// Number of the last command accepted (replays are refused against it).
    last_cmd: std::sync::atomic::AtomicU64,
    /// Number of the last command fully handled (run or refused), for heartbeats.
    handled: std::sync::atomic::AtomicU64,
    /// When the controller last answered a heartbeat (or the attach), and how long it
    /// waits before it declares this node down.
    confirmed: Mutex<std::time::Instant>,
    node_timeout: Duration,
}

/// What a running instance's task hears from the agent.
enum Control {
    Kill(KillRequest),
    /// Its new time limit, counted from its start (`scontrol update TimeLimit=`).
    Limit(Duration),
}

struct KillRequest {
    as_state: JobState,
    grace: Duration,
    reason: String,
    /// Sent first (TERM when `None`), SIGKILL after `grace`.
    signal: Option<nix::sys::signal::Signal>,
    /// Send `signal` alone: the job keeps running (`scancel -s SIG`).
    signal_only: bool,
}

struct Agent {
    name: String,
    state_dir: PathBuf,
    launcher: Box<dyn Launcher>,
    allow_root_jobs: bool,
    key: ClusterKey,
    /// Running job instances by (job id, attempt).
    jobs: Mutex<HashMap<(u64, u32), mpsc::Sender<Control>>>,
    /// What the monitor watches of each running instance, and its kill grace.
    watched: Mutex<HashMap<(u64, u32), (Watched, Duration)>>,
    /// The latest GPU sample, for heartbeats.
    latest: Mutex<Vec<pb::GpuMetrics>>,
    mps: crate::mps::Mps,
    /// The GPUs as last discovered; a change re-registers the agent.
    gpus: Mutex<Vec<GpuInfo>>,
    /// MIG capability device numbers (the driver's, or the fake backend's numbering).
    caps: Option<crate::devices::Caps>,
    gpus_changed: Notify,
    reports: Arc<ReportQueue>,
    /// Wakes the reporter when a report is queued.
    report_ready: Notify,
    /// This agent's identity (`<state-dir>/agent-id`).
    id: String,
    /// The live session; `None` while not attached.
    session: Mutex<Option<Arc<Session>>>,
    session_ready: Notify,
    /// The health program's latest complaint ("" = healthy, or no program).
    health: Arc<Mutex<String>>,
    /// A launch this node refused for a reason of its own (`launch::NodeFault`):
    /// reported with the health program's complaint, so the node stays drained until
    /// the agent is restarted (with its options fixed).
    launch_fault: Mutex<Option<String>>,
    /// The directory put first on jobs' PATH, holding `srun` (`launch::job_tools`).
    tools: Option<PathBuf>,
    /// The GPUs' power limits, as the controller's windows cap them.
    power: crate::power::Power,
    /// Where the GPUs come from (MIG layout changes).
    backend: Arc<dyn GpuBackend>,
    /// The controller may change MIG layouts here (`--mig dynamic`).
    mig_dynamic: bool,
    /// A channel to each controller of `--controller a,b,c` (replicated controllers),
    /// and which one the agent attaches to now (the leader, once found).
    channels: std::sync::OnceLock<Vec<Channel>>,
    current: std::sync::atomic::AtomicUsize,
    /// The newest Raft term a controller answered with (0: one controller): commands
    /// of an older term, a deposed leader's, are not run.
    term: std::sync::atomic::AtomicU64,
}

impl Agent {
    /// The channel to the controller attached to now.
    fn channel(&self) -> Channel {
        let all = self.channels.get().expect("channels are set before use");
        all[self.current.load(std::sync::atomic::Ordering::SeqCst) % all.len()].clone()
    }

    /// Which controller of the list is the current one, and how many there are.
    fn controller_index(&self) -> (usize, usize) {
        let n = self.channels.get().map_or(1, Vec::len);
        (
            self.current.load(std::sync::atomic::Ordering::SeqCst) % n,
            n,
        )
    }

    /// Moves on to the next controller of the list.
    fn next_controller(&self) {
        let n = self.channels.get().map_or(1, Vec::len);
        let at = self.current.load(std::sync::atomic::Ordering::SeqCst);
        self.current
            .store((at + 1) % n, std::sync::atomic::Ordering::SeqCst);
    }

    /// A challenge's answer from a controller whose term is not older than one this
    /// agent has seen (a deposed leader is refused); its term is remembered.
    fn check_term(
        &self,
        ch: pb::ChallengeResponse,
    ) -> Result<pb::ChallengeResponse, tonic::Status> {
        let seen = self
            .term
            .fetch_max(ch.term, std::sync::atomic::Ordering::SeqCst);
        if ch.term < seen {
            return Err(tonic::Status::unavailable(format!(
                "the controller answers in term {}, older than term {seen}: a deposed leader",
                ch.term
            )));
        }
        Ok(ch)
    }
}

/// The next number of `session` (`None`: Challenge and Attach, which belong to none yet
/// and carry no number).
fn numbered(session: Option<&Session>) -> Signed {
    use std::sync::atomic::Ordering;
    Signed {
        session: session.map(|s| s.id.clone()).unwrap_or_default(),
        seq: session.map_or(0, |s| s.seq.fetch_add(1, Ordering::SeqCst) + 1),
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Agent {
    /// An agent with what it needs from the host passed in: the launcher (a test double
    /// in the unit tests), MPS, its identity and the GPUs discovered.
    fn new(
        opts: &Options,
        launcher: Box<dyn Launcher>,
        mps: crate::mps::Mps,
        id: String,
        gpus: Vec<GpuInfo>,
    ) -> anyhow::Result<Agent> {
        let caps = if opts.backend.kind() == "fake" {
            Some(crate::devices::Caps::numbered(gpus.len() as u32))
        } else {
            crate::devices::Caps::from_driver()
        };
        Ok(Agent {
            caps,
            name: opts.name.clone(),
            reports: Arc::new(ReportQueue::open(opts.state_dir.join("reports.pb"))?),
            state_dir: opts.state_dir.clone(),
            launcher,
            allow_root_jobs: opts.allow_root_jobs,
            key: opts.key.clone(),
            jobs: Mutex::new(HashMap::new()),
            watched: Mutex::new(HashMap::new()),
            latest: Mutex::new(Vec::new()),
            mps,
            gpus: Mutex::new(gpus),
            gpus_changed: Notify::new(),
            report_ready: Notify::new(),
            id,
            session: Mutex::new(None),
            session_ready: Notify::new(),
            health: Arc::default(),
            launch_fault: Mutex::new(None),
            tools: crate::launch::job_tools(&opts.state_dir),
            power: crate::power::Power::new(opts.backend.clone()),
            backend: opts.backend.clone(),
            mig_dynamic: opts.mig_dynamic,
            channels: std::sync::OnceLock::new(),
            current: std::sync::atomic::AtomicUsize::new(0),
            term: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Applies the power caps a heartbeat's answer carries (off the runtime: NVML
    /// blocks), when they changed.
    fn apply_power(self: &Arc<Self>, caps: Vec<pb::PowerCap>) {
        if !self.power.changed(&caps) {
            return;
        }
        let gpus: Vec<String> = (self.gpus.lock().unwrap_or_else(|p| p.into_inner()))
            .iter()
            .map(|g| g.uuid.clone())
            .collect();
        let a = self.clone();
        tokio::task::spawn_blocking(move || a.power.apply(&gpus, &caps));
    }

    fn running(&self) -> Vec<pb::RunningJob> {
        let mut v: Vec<(u64, u32)> = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect();
        v.sort_unstable();
        v.into_iter()
            .map(|(job_id, attempt)| pb::RunningJob {
                job_id,
                attempt,
                ..Default::default()
            })
            .collect()
    }

    /// `running`, with each instance's cgroup CPU time and peak memory (read from the
    /// kernel's cgroup files, never from anything a user names).
    fn running_with_usage(&self) -> Vec<pb::RunningJob> {
        let cgroups: HashMap<(u64, u32), crate::cgroup::JobCgroup> = self
            .watched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(k, (w, _))| Some((*k, w.cgroup.clone()?)))
            .collect();
        let mut running = self.running();
        for r in &mut running {
            if let Some(cg) = cgroups.get(&(r.job_id, r.attempt)) {
                (r.cpu_time_ms, r.mem_peak_bytes) = cg.stats();
            }
            // Its steps running now (`queue --steps`); the ended ones come with its end.
            let file = crate::steps::path(&self.state_dir, r.job_id, r.attempt);
            r.steps = crate::steps::read(&file);
            r.steps.retain(|s| s.end_ms == 0);
        }
        running
    }

    fn current_session(&self) -> Option<Arc<Session>> {
        self.session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A request signed with the cluster key (see `gpuctl_proto::auth`), numbered in
    /// `session` (`None`: Challenge and Attach, which belong to none yet).
    fn signed<T: Message>(
        &self,
        method: &str,
        session: Option<&Session>,
        msg: T,
    ) -> tonic::Request<T> {
        self.key
            .signed_request(method, &self.name, now_ms(), &numbered(session), msg)
            .expect("node names are ASCII")
    }

    /// A heartbeat for the Heartbeats stream, numbered in `session` like any request.
    fn signed_heartbeat(&self, session: &Session, hb: pb::HeartbeatRequest) -> pb::SignedHeartbeat {
        self.key
            .sign_heartbeat(&self.name, now_ms(), &numbered(Some(session)), &hb)
    }

    /// Queues a report and wakes the reporter, which sends it while the queue's copy on
    /// disk is written on a blocking thread (a write and a rename, about 0.3 ms, that
    /// the job's end no longer waits for). The handle resolves once the copy holds it:
    /// a job's end awaits it before removing the job's own records, so that a crash at
    /// any point leaves one of the two to report the end from.
    fn report(&self, r: pb::JobReport) -> tokio::task::JoinHandle<()> {
        self.reports.push(r);
        self.report_ready.notify_one();
        self.persist_reports()
    }

    /// Writes the report queue to disk off the async workers.
    fn persist_reports(&self) -> tokio::task::JoinHandle<()> {
        let q = self.reports.clone();
        tokio::task::spawn_blocking(move || q.persist())
    }

    /// Asks the running instance(s) of a job to end (`attempt` 0: whichever runs here).
    /// Returns whether one was running.
    fn kill(
        &self,
        job_id: u64,
        attempt: u32,
        state: JobState,
        grace: Duration,
        reason: &str,
    ) -> bool {
        self.kill_with(job_id, attempt, state, grace, reason, None)
    }

    /// `kill` with the first signal named (a checkpoint signal before a preemption).
    fn kill_with(
        &self,
        job_id: u64,
        attempt: u32,
        state: JobState,
        grace: Duration,
        reason: &str,
        signal: Option<nix::sys::signal::Signal>,
    ) -> bool {
        let targets = self.controls(job_id, attempt);
        for tx in &targets {
            let _ = tx.try_send(Control::Kill(KillRequest {
                as_state: state,
                grace,
                reason: reason.to_string(),
                signal,
                signal_only: false,
            }));
        }
        !targets.is_empty()
    }

    /// Sends `signal` to a job's instance(s) here (`attempt` 0: whichever runs), which
    /// keep running. Answers whether one runs here.
    fn signal_job(
        &self,
        job_id: u64,
        attempt: u32,
        signal: nix::sys::signal::Signal,
        why: &str,
    ) -> bool {
        let targets = self.controls(job_id, attempt);
        for tx in &targets {
            let _ = tx.try_send(Control::Kill(KillRequest {
                as_state: JobState::Running,
                grace: Duration::ZERO,
                reason: why.to_string(),
                signal: Some(signal),
                signal_only: true,
            }));
        }
        !targets.is_empty()
    }

    /// The control channels of a job's instances here (`attempt` 0: whichever run).
    fn controls(&self, job_id: u64, attempt: u32) -> Vec<mpsc::Sender<Control>> {
        (self.jobs.lock().unwrap_or_else(|p| p.into_inner()).iter())
            .filter(|((id, a), _)| *id == job_id && (attempt == 0 || *a == attempt))
            .map(|(_, tx)| tx.clone())
            .collect()
    }

    /// Gives a running instance a new time limit (and writes it into its record, so
    /// that an agent restarted later keeps it). Answers whether it runs here.
    fn set_limit(&self, job_id: u64, attempt: u32, secs: u64) -> bool {
        let Some(tx) = self.controls(job_id, attempt).pop() else {
            return false;
        };
        if let Err(e) = jobs::save_limit(&self.state_dir, job_id, attempt, secs) {
            tracing::warn!(
                job = job_id,
                "cannot write the new time limit into the job's record (an agent restart would bring back the old one): {e}"
            );
        }
        let _ = tx.try_send(Control::Limit(Duration::from_secs(secs)));
        true
    }

    /// Kills an instance the controller no longer holds as running, at once.
    fn kill_stale(&self, job_id: u64, attempt: u32, why: &str) {
        tracing::warn!(job = job_id, attempt, "{why}; killing it");
        self.kill(
            job_id,
            attempt,
            JobState::Cancelled,
            Duration::ZERO,
            "stale instance",
        );
    }

    /// A warning about a running job, kept on its record by the controller.
    fn warn(&self, job_id: u64, attempt: u32, why: &str) {
        drop(self.report(pb::JobReport {
            node: self.name.clone(),
            job_id,
            kind: pb::job_report::Kind::Warning as i32,
            reason: format!("warning: {why}"),
            time_ms: now_ms(),
            attempt,
            ..pb::JobReport::default()
        }));
    }
}

/// Runs the agent until `shutdown` resolves. Running jobs are left running.
pub async fn run(
    mut opts: Options,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    // 0711: job users pass through to their own scripts (scripts/, 0711, each file
    // theirs and 0500); nobody but root lists or reads anything else.
    let (state_dir, wide) = gpuctl_proto::statedir::prepare(&opts.state_dir, 0o711)
        .with_context(|| format!("cannot create state dir {}", opts.state_dir.display()))?;
    if let Some(w) = wide {
        tracing::warn!("{w}");
    }
    opts.state_dir = state_dir;
    let id = agent_id(&opts.state_dir)?;
    let cgroup_parent = opts
        .cgroup_parent
        .clone()
        .unwrap_or_else(|| format!("gpuctl/{}-{}", opts.name, &id[..id.len().min(8)]));
    let gpus = opts.backend.discover()?;
    tracing::info!(
        node = %opts.name,
        backend = opts.backend.kind(),
        gpus = gpus.len(),
        "discovered GPUs: {}",
        gpus.iter().map(|g| format!("{} {}", g.model, g.uuid)).collect::<Vec<_>>().join(", ")
    );
    let urls: Vec<String> = (opts.controller.split(','))
        .map(|u| u.trim().to_string())
        .collect();
    anyhow::ensure!(
        urls.iter().all(|u| !u.is_empty()),
        "bad --controller list {:?}: an empty address between commas",
        opts.controller
    );
    let tls = opts.tls.take();
    let mut channels = Vec::new();
    for url in &urls {
        let endpoint = Endpoint::from_shared(url.clone())
            .with_context(|| format!("bad --controller URL {url:?}"))?
            .connect_timeout(Duration::from_secs(3))
            // Reports and heartbeats go out at once, not after the controller's delayed ACK.
            .tcp_nodelay(true);
        channels.push(match &tls {
            Some(tls) => tls.client.channel(endpoint),
            None if url.starts_with("https://") => {
                anyhow::bail!(
                    "--controller {url}: https needs the node's identity (join with --join)"
                )
            }
            None => endpoint.connect_lazy(),
        });
    }
    if let Some(tls) = tls {
        tokio::spawn(crate::identity::renew_loop(
            opts.state_dir.clone(),
            opts.name.clone(),
            opts.key.clone(),
            tls,
            urls.iter().cloned().zip(channels.iter().cloned()).collect(),
        ));
    }
    let (cgroups, confine_devices) = setup::job_cgroups(&opts, &cgroup_parent);
    let cgroups_for_adoption = cgroups.clone();
    let launcher = Box::new(JobLauncher {
        confine_devices,
        cgroups,
        parent: cgroup_parent.clone(),
        server: crate::forkserver::Client::new(std::env::current_exe()?),
    });
    let mps = crate::mps::Mps::find(opts.mps_control.clone(), &opts.state_dir.join("mps"));
    let agent = Arc::new(Agent::new(&opts, launcher, mps, id.clone(), gpus.clone())?);

    let _ = agent.channels.set(channels);
    adopt_jobs(&agent, &cgroups_for_adoption, &cgroup_parent);
    // Every GPU at its default power limit until a window's cap says otherwise.
    agent.apply_power(Vec::new());
    let reporter = tokio::spawn(reporter(agent.clone()));
    let exporter = Arc::new(Exporter::new());
    if let Some(addr) = opts.metrics_listen {
        setup::serve_metrics(addr, exporter.clone()).await?;
    }
    let health = opts.health.take().map(|p| {
        tracing::info!(program = %p.program.display(), every = ?p.every, "health program");
        tokio::spawn(crate::health::run(p, agent.health.clone()))
    });
    let sampler = tokio::spawn(sampler(
        agent.clone(),
        opts.backend.clone(),
        opts.sample_interval,
        opts.inventory_interval,
        opts.gpu_memory_grace,
        exporter,
    ));
    // A task of its own, not this function's future (which `main` blocks on): the
    // command stream is then read on the worker whose I/O driver saw its bytes, not
    // handed to the main thread (a thread switch on every launch, 0.1-0.6 ms on the
    // 2-core host; docs/benchmarks.md, "Fast paths, third round").
    let mut link = tokio::spawn(attach_loop(agent.clone(), opts));
    tokio::select! {
        r = &mut link => r.context("the controller link panicked")??,
        _ = shutdown => tracing::info!("shutting down; running jobs keep running"),
    }
    link.abort();
    reporter.abort();
    sampler.abort();
    if let Some(h) = health {
        h.abort();
    }
    Ok(())
}

/// Samples the GPUs every `every`: metrics for heartbeats and Prometheus, and GPU
/// memory shares enforced (warning, then the job ends after `grace`).
async fn sampler(
    agent: Arc<Agent>,
    backend: Arc<dyn GpuBackend>,
    every: Duration,
    inventory_every: Duration,
    grace: Duration,
    exporter: Arc<Exporter>,
) {
    let started = std::time::Instant::now();
    let mut enforcer = Enforcer::default();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    let mut inventory_at = std::time::Instant::now();
    loop {
        tick.tick().await;
        // The inventory (GPUs, MIG layouts) is discovered again now and then; a change
        // is reported by registering again.
        if inventory_at.elapsed() >= inventory_every {
            inventory_at = std::time::Instant::now();
            let b = backend.clone();
            if let Ok(Ok(now)) = tokio::task::spawn_blocking(move || b.discover()).await {
                let mut cur = agent.gpus.lock().unwrap_or_else(|p| p.into_inner());
                if *cur != now {
                    tracing::info!(
                        before = cur.len(),
                        now = now.len(),
                        "GPU inventory changed; registering again"
                    );
                    *cur = now;
                    agent.gpus_changed.notify_one();
                }
            }
        }
        let gpus = agent.gpus.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let t0 = std::time::Instant::now();
        let secs = started.elapsed().as_secs_f64();
        let b = backend.clone();
        let samples = match tokio::task::spawn_blocking(move || b.sample(secs)).await {
            Ok(Ok(s)) => {
                failing = false;
                s
            }
            Ok(Err(e)) => {
                if !failing {
                    tracing::warn!("cannot sample GPUs: {e}");
                }
                failing = true;
                continue;
            }
            Err(_) => continue,
        };
        let watched: Vec<(Watched, Duration)> = agent
            .watched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let jobs: Vec<Watched> = watched.iter().map(|w| w.0.clone()).collect();
        let owners = crate::monitor::Owners::new(&jobs);
        let usage = crate::monitor::job_memory(&samples, |pid| owners.of_pid(pid));
        let busy = crate::monitor::job_busy(&samples, |pid| owners.of_pid(pid));
        let verdicts = enforcer.check(&gpus, &jobs, &usage, grace, std::time::Instant::now());
        let of_job = |id: u64| watched.iter().find(|w| w.0.job_id == id);
        for o in verdicts.warn {
            let why = format!(
                "GPU memory {} MiB on {} is over its share of {} MiB; it ends in {} unless it drops",
                o.used_mib,
                o.gpu,
                o.share_mib,
                humantime::format_duration(grace)
            );
            tracing::warn!(job = o.job_id, "{why}");
            agent.warn(o.job_id, of_job(o.job_id).map_or(0, |w| w.0.attempt), &why);
        }
        for o in verdicts.kill {
            let reason = format!(
                "GPU memory {} MiB on {} over its share of {} MiB for {}",
                o.used_mib,
                o.gpu,
                o.share_mib,
                humantime::format_duration(grace)
            );
            tracing::warn!(job = o.job_id, "ending job: {reason}");
            let (attempt, kill_grace) =
                of_job(o.job_id).map_or((0, Duration::from_secs(10)), |w| (w.0.attempt, w.1));
            agent.kill(o.job_id, attempt, JobState::Failed, kill_grace, &reason);
        }
        // GPU (parent UUID) -> jobs holding it or one of its MIG instances; a MIG
        // instance's UUID -> the jobs on it.
        let mut holders = crate::exporter::Holders::new();
        let mut hold = |uuid: &str, w: &Watched| {
            let e = holders.entry(uuid.to_string()).or_default();
            if !e.iter().any(|h| h.0 == w.job_id) {
                e.push((w.job_id, w.user.clone()));
            }
        };
        for w in &jobs {
            for slot in &w.slots {
                let parent = gpus
                    .iter()
                    .find(|g| g.uuid == slot.uuid || g.mig.iter().any(|m| m.uuid == slot.uuid));
                if let Some(g) = parent {
                    hold(&g.uuid, w);
                    if g.uuid != slot.uuid {
                        hold(&slot.uuid, w);
                    }
                }
            }
        }
        exporter.update(&agent.name, &gpus, &samples, &usage, &holders, t0.elapsed());
        *agent.latest.lock().unwrap_or_else(|p| p.into_inner()) =
            crate::monitor::to_pb(&samples, &usage, &busy, now_ms());
    }
}

/// Runs one command of the live session: it must verify with the cluster key (over the
/// bytes received), belong to this session, and come after the last one run. A start
/// that arrives when no heartbeat has been answered for the controller's node timeout
/// is not run: the controller has declared this node down and the job failed or was
/// requeued (an agent that was stalled reads such starts late).
fn handle(agent: &Arc<Agent>, session: &Session, signed: pb::SignedCommand) {
    let seq = run_command(agent, session, signed);
    // Commands arrive in order; one that did not verify still counts as handled (the
    // controller learns from the heartbeat that its start was not run).
    session
        .handled
        .fetch_max(seq, std::sync::atomic::Ordering::SeqCst);
}

/// Runs one command; returns the number it had (or the next expected one when it did
/// not verify).
fn run_command(agent: &Arc<Agent>, session: &Session, signed: pb::SignedCommand) -> u64 {
    use std::sync::atomic::Ordering;
    let next = session.handled.load(Ordering::SeqCst) + 1;
    let cmd = match agent.key.verify_command(&agent.name, &signed) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("dropping a command that does not verify with the cluster key: {e}");
            return next;
        }
    };
    if cmd.session != session.id {
        tracing::error!("dropping a command of another session (replayed?)");
        return 0;
    }
    let term = agent.term.load(Ordering::SeqCst);
    if cmd.term < term {
        tracing::error!(
            command_term = cmd.term,
            term,
            "dropping a command of a deposed leader (its term is older than one seen)"
        );
        return next;
    }
    if cmd.seq <= session.last_cmd.fetch_max(cmd.seq, Ordering::SeqCst) {
        tracing::error!(seq = cmd.seq, "dropping a command seen before (replayed?)");
        return 0;
    }
    match cmd.command {
        Some(pb::agent_command::Command::Start(start)) => {
            let confirmed = *session.confirmed.lock().unwrap_or_else(|p| p.into_inner());
            if confirmed.elapsed() > session.node_timeout {
                tracing::warn!(
                    job = start.job_id,
                    attempt = start.attempt,
                    "not starting: no heartbeat answered for {:?}, so the controller has declared this node down",
                    confirmed.elapsed()
                );
                return cmd.seq;
            }
            let (tx, rx) = mpsc::channel(4);
            {
                let mut jobs = agent.jobs.lock().unwrap_or_else(|p| p.into_inner());
                let key = (start.job_id, start.attempt);
                if jobs.contains_key(&key) {
                    tracing::warn!(
                        job = start.job_id,
                        attempt = start.attempt,
                        "duplicate start ignored"
                    );
                    return cmd.seq;
                }
                jobs.insert(key, tx);
            }
            let begin = jobs::launch(agent, &start);
            tokio::spawn(run_job(agent.clone(), start, rx, begin));
        }
        Some(pb::agent_command::Command::Kill(k)) => kill(agent, k),
        Some(pb::agent_command::Command::Kills(batch)) => {
            for k in batch.kills {
                kill(agent, k);
            }
        }
        Some(pb::agent_command::Command::Step(s)) => remote::open(agent, s),
        Some(pb::agent_command::Command::Mig(m)) => mig::set_layout(agent, m),
        Some(pb::agent_command::Command::Limit(l)) => {
            if agent.set_limit(l.job_id, l.attempt, l.time_limit_secs) {
                tracing::info!(
                    job = l.job_id,
                    attempt = l.attempt,
                    secs = l.time_limit_secs,
                    "time limit changed"
                );
            } else {
                tracing::debug!(job = l.job_id, "new time limit for a job not running here");
            }
        }
        None => {}
    }
    cmd.seq
}

/// Runs one kill (or, `signal_only`, one signal) of a job instance this agent runs.
fn kill(agent: &Arc<Agent>, kill: pb::KillJob) {
    let grace = Duration::from_secs(kill.kill_grace_secs);
    let signal = gpuctl_proto::convert::parse_signal(&kill.signal)
        .ok()
        .flatten()
        .and_then(|n| format!("SIG{n}").parse::<nix::sys::signal::Signal>().ok());
    if kill.signal_only {
        let Some(signal) = signal else {
            tracing::error!(job = kill.job_id, signal = %kill.signal, "dropping a signal this agent cannot send");
            return;
        };
        if !agent.signal_job(kill.job_id, kill.attempt, signal, &kill.reason) {
            tracing::debug!(job = kill.job_id, "signal for a job not running here");
        }
        return;
    }
    if !agent.kill_with(
        kill.job_id,
        kill.attempt,
        kill.as_state(),
        grace,
        &kill.reason,
        signal,
    ) {
        tracing::debug!(job = kill.job_id, "kill for a job not running here");
    }
}

#[cfg(test)]
#[path = "agent/tests.rs"]
mod tests;
