//! The controller's shell around the cluster state machine (`gpuctl_core::Cluster`).
//!
//! `Controller` owns what the state machine must not: the lock, the sled `Store`, the
//! agents' command streams, the clock and the event that wakes the scheduling loop. An
//! operation locks, reads the clock once, calls the state, writes what changed
//! (`persist`), routes the effects' commands to their streams, and releases; then it
//! flushes (durability) and only then sends and answers. Locks are never held across an
//! await.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpuctl_core::log::{Applied, Change, Entry};
use gpuctl_core::policy::GpuRoom;
use gpuctl_core::room::{Deferred, PassRoom};
use gpuctl_core::{Cluster, Effects, Kind, Refusal};
use gpuctl_proto::auth::ClusterKey;
use gpuctl_proto::{self as pb};
use parking_lot::{Mutex, MutexGuard};
use prost::Message as _;
use tokio::sync::{Notify, mpsc};
use tonic::Status;

use crate::auth::Caller;
use crate::store::{Store, StoreError};
use gpuctl_core::Config;
use gpuctl_sched as sched;

mod agents;
mod carried;
mod identity;
mod journal;
mod listing;
mod steps;
pub use journal::{Repl, Shell};
pub use steps::ClientStream;
pub mod users;

pub use gpuctl_core::validate::check_paths;

/// An agent's command stream. Commands are boxed: a channel's storage is blocks of 32
/// slots of its item, allocated when it opens, and an `AgentCommand` is 656 bytes, so an
/// idle attached agent held 21 KB here (210 MB at 10,000 agents).
pub type CommandTx = mpsc::Sender<Result<Box<pb::AgentCommand>, Status>>;

/// Jobs per hold of the lock when a pass takes its queue or annotates its waiting jobs
/// (about 15 ms each at 100,000 pending on the development machine).
const PART: usize = 20_000;

/// Nodes per hold of the lock when a pass takes its view of the cluster (25,000 nodes'
/// views in one piece held it for 70-100 ms; a part of 5,000 takes about 15).
const NODE_PART: usize = 5_000;

/// Starts per hold of the lock when a pass applies its plan (55,000 starts at once, a
/// cluster filling up, held the lock for 500 ms in one piece).
const START_PART: usize = 2_000;

/// A pass that took less than this (its input, plan and apply) runs the next time on
/// an async worker, not on the blocking pool.
const INLINE_PASS: Duration = Duration::from_millis(2);

/// ... and while fewer jobs than this are pending or running.
const INLINE_JOBS: usize = 2_000;

/// A submit or a job's end runs the pass itself (`pass_now`) when the last one took
/// under this: its answer waits for the pass, so only where a pass costs less than the
/// flush it saves (a sequential submit loop against a long queue must not pay for
/// passes).
const SUBMIT_PASS: Duration = Duration::from_micros(300);

/// The least time between two passes. Each pass is followed by a pause of twice its own
/// length (up to 2 s), which bounds scheduling to a third of the controller's time under
/// a storm of events; this floor only spaces cheap passes (a small queue's pass takes
/// well under a millisecond), so that a submit to an idle cluster starts at once
/// instead of waiting out a fixed interval (it was 50 ms: up to 50 ms of a job's
/// submit-to-launch time; Slurm's `sched_min_interval` is 2 ms).
const MIN_PASS_GAP: Duration = Duration::from_millis(2);

/// How long a submit's pass may wait while its job cannot start (`Shared::room`): the
/// submits of a loop against a full cluster share one pass a second instead of each
/// waking one over the whole queue (Slurm's `batch_sched_delay`, 3 s by default). Their
/// jobs show reason `None` meanwhile, as a new job does in Slurm.
const DEFERRED_PASS: Duration = Duration::from_secs(1);

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// An attached agent's command stream.
struct Link {
    generation: u64,
    tx: CommandTx,
    /// The agent takes several kills in one command (`KillJobs`).
    batches: bool,
}

/// What the lock guards: the cluster state and what lives beside it.
struct Shared {
    core: Cluster,
    /// Command streams by node (the state knows the sessions).
    links: HashMap<String, Link>,
    /// Starts decided under a session whose stream is not in `links` yet (its attach
    /// applied, its `connect` not back): (node, session generation, command).
    held_starts: Vec<(String, u64, pb::AgentCommand)>,
    /// Whether a submit may leave its pass to later (`gpuctl_core::room`): a submit of
    /// a job that needs a GPU and does not fit the room the last pass left defers its
    /// pass (`DEFERRED_PASS`).
    room: PassRoom,
    /// On Raft: the id past the last submit this controller proposed (ids are handed
    /// out past submits still in the log; `Cluster::admit_from`).
    next_id: u64,
    /// Alone: large cancels written as one record, their jobs' records not all yet.
    cancels: journal::OpenCancels,
}

impl std::ops::Deref for Shared {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.core
    }
}

/// Commands ready to go, each to the stream of its node.
type Sends = Vec<(CommandTx, pb::AgentCommand)>;

/// What an operation leaves to do once the lock is released.
struct Out {
    sends: Sends,
    wake: bool,
    /// Whether it wrote to the store (so a flush is due).
    wrote: bool,
}

/// Adds `cmd` to `last` (a kill, or kills, of the same node) if it is a kill; answers
/// it back if it is not.
fn join_kill(last: &mut pb::AgentCommand, cmd: pb::AgentCommand) -> Option<pb::AgentCommand> {
    use pb::agent_command::Command;
    let Some(Command::Kill(kill)) = cmd.command else {
        return Some(cmd);
    };
    match last.command.take() {
        Some(Command::Kill(first)) => {
            let kills = vec![first, kill];
            last.command = Some(Command::Kills(pb::KillJobs { kills }));
        }
        Some(Command::Kills(mut batch)) => {
            batch.kills.push(kill);
            last.command = Some(Command::Kills(batch));
        }
        other => unreachable!("a node's last command noted as a kill is {other:?}"),
    }
    None
}

impl Shared {
    /// Closes the streams of ended sessions and finds the stream of every command (a
    /// node without one gets nothing: its reconnect reconciles).
    fn route(&mut self, effects: Effects) -> (Sends, bool) {
        for node in &effects.closed {
            self.links.remove(node);
        }
        // Effects reach the controller that proposed their entry: the leader.
        crate::mail::send(&self.core.config().mail.program, effects.mails);
        if effects.wake {
            self.room.woken();
        }
        if !self.held_starts.is_empty() {
            // Held for a session that is no longer the node's: never sent.
            let fleet = self.core.fleet();
            self.held_starts
                .retain(|(n, g, _)| fleet.session(n).is_some_and(|s| s.generation == *g));
        }
        let mut sends: Sends = Vec::with_capacity(effects.sends.len());
        // Per node, where its last command went in `sends` if that was a kill: the kills
        // that follow it join it (`KillJobs`, one signed command: a cancel of a node's
        // jobs) when its agent takes them.
        let mut last_kill: HashMap<String, usize> = HashMap::new();
        for (node, cmd) in effects.sends {
            let session = match &cmd {
                gpuctl_core::command::Command::Start(s) => Some(s.session_generation),
                _ => None,
            };
            let link = (self.links.get(&node)).map(|l| (l.generation, (l.tx.clone(), l.batches)));
            match (session, link) {
                // A start goes out on the session it was decided under only: one
                // attached since was reconciled without it (`Start::session_generation`).
                (Some(g), Some((lg, _))) if lg > g => {
                    tracing::info!(%node, session = g, now = lg, "a start decided for an earlier session of the node is not sent (its job was requeued at the attach)");
                }
                (Some(g), Some((lg, _))) if lg < g => {
                    self.held_starts
                        .push((node, g, gpuctl_proto::wire::command_pb(cmd)));
                }
                (Some(g), None)
                    if g > 0
                        && self
                            .core
                            .fleet()
                            .session(&node)
                            .is_some_and(|s| s.generation == g) =>
                {
                    self.held_starts
                        .push((node, g, gpuctl_proto::wire::command_pb(cmd)));
                }
                (_, Some((_, (tx, batches)))) => {
                    let cmd = gpuctl_proto::wire::command_pb(cmd);
                    let joined = match last_kill.get(&node) {
                        Some(&at) if batches => join_kill(&mut sends[at].1, cmd),
                        _ => Some(cmd),
                    };
                    if let Some(cmd) = joined {
                        let kill = matches!(cmd.command, Some(pb::agent_command::Command::Kill(_)));
                        if kill {
                            last_kill.insert(node, sends.len());
                        } else {
                            last_kill.remove(&node);
                        }
                        sends.push((tx, cmd));
                    }
                }
                // A node without a stream gets nothing: its reconnect reconciles.
                (_, None) => {}
            }
        }
        (sends, effects.wake)
    }

    /// The stream of `node`'s session `generation` is in `links` now: the starts
    /// decided under that session before it was go out on it (earlier sessions'
    /// are dropped: the attach reconciled their jobs).
    fn link_added(&mut self, node: &str, generation: u64, tx: &CommandTx) {
        let held = std::mem::take(&mut self.held_starts);
        for (n, g, cmd) in held {
            if n != node {
                self.held_starts.push((n, g, cmd));
            } else if g == generation {
                // A fresh channel of 1,024: a handful of starts fit.
                let _ = tx.try_send(Ok(Box::new(cmd)));
            }
        }
    }

    /// Applies a change decided now (`gpuctl_core::log`): the one way the shell
    /// changes the cluster's durable state.
    fn apply(&mut self, now: i64, change: Change) -> (Result<Applied, Refusal>, Effects) {
        self.core.apply(Entry::new(now, change))
    }

    /// `apply` for a change that is never refused (admitted jobs, a pass's parts, a
    /// closed stream): its effects.
    fn apply_sure(&mut self, now: i64, change: Change) -> Effects {
        let (answer, effects) = self.apply(now, change);
        debug_assert!(answer.is_ok(), "{answer:?}");
        effects
    }

    /// Whether the submit of `j` defers its pass (and records that it did).
    fn defers(&mut self, j: &gpuctl_core::record::Job) -> bool {
        self.room.defers(&self.core, j)
    }
}

/// A pass's input (`Controller::pass_input`): what it read, the config, whether
/// anything was written, and the lend pass's commands.
type PassInput = (carried::PassRead, sched::SchedConfig, bool, Out);

/// What the controller needs to know who nodes are.
pub struct PkiSetup {
    pub ca: gpuctl_proto::tls::Ca,
    pub key: ClusterKey,
    /// `false`: `--insecure-shared-key`.
    pub secure: bool,
    /// API tokens accepted over plain TCP (`--insecure`).
    pub clear_tokens: bool,
    pub node_lifetime_s: i64,
}

impl PkiSetup {
    /// The old mode (`--insecure-shared-key`): agents sign with `key` itself. The CA is
    /// made in `dir` (unused in that mode but for its fingerprint).
    pub fn shared_key(key: ClusterKey, dir: &std::path::Path) -> PkiSetup {
        let dir = dir.join("pki");
        std::fs::create_dir_all(&dir).expect("create the CA's dir");
        let (ca, _) = gpuctl_proto::tls::Ca::load_or_create(&dir, now_ms() / 1000)
            .expect("create a CA in the given dir");
        PkiSetup {
            ca,
            key,
            secure: false,
            clear_tokens: true,
            node_lifetime_s: 30 * 86_400,
        }
    }
}

pub struct Controller {
    shared: Mutex<Shared>,
    store: Store,
    /// Who nodes are: the CA, join tokens, node certificates and keys.
    pki: crate::pki::Pki,
    /// The configuration in effect (a reconfigure swaps it; the core holds its own copy,
    /// changed under the lock at the same moment).
    config: std::sync::RwLock<Arc<Config>>,
    /// Where the configuration was read from (`None`: the embedded defaults).
    config_path: Option<std::path::PathBuf>,
    /// Wakes the scheduling loop; several events before it runs make one pass.
    wake: Notify,
    /// Asks the scheduling loop for a pass within `DEFERRED_PASS`.
    defer: Notify,
    /// Tells the scheduling loop that a pass ran outside it (`pass_now`): the moments it
    /// waits for (a begin time, a reclaim bound) may have changed.
    rearm: Notify,
    metrics: Arc<crate::metrics::Metrics>,
    /// How long the last pass took (microseconds; see `INLINE_PASS`).
    last_pass_us: AtomicU64,
    /// Held through a pass: one at a time, from the loop or from a submit.
    pass_lock: Arc<tokio::sync::Mutex<()>>,
    /// What the last pass planned from (`sched::Base`): the next rebuilds only the
    /// calendars of the nodes that changed. Used under `pass_lock` alone.
    base: Mutex<carried::Carried>,
    /// When a pass last planned every waiting job (`expected_starts_every`), and
    /// whether the last pass left jobs it did not plan.
    planned_all_ms: std::sync::atomic::AtomicI64,
    unplanned_left: std::sync::atomic::AtomicBool,
    /// Steps opened from outside their jobs, waiting for their agents.
    steps: steps::Relay,
    /// On Raft (`--peers`): this controller's part; unset with one controller. Read
    /// by the journal alone (`journal.rs`): nothing else asks which it is.
    repl: std::sync::OnceLock<Repl>,
}

/// A store failure as the caller sees it: the controller is up (so not UNAVAILABLE,
/// which clients read as "unreachable"), the change is not durable.
fn store_status(e: StoreError) -> Status {
    tracing::error!("state store: {e}");
    let full = matches!(&e, StoreError::Stalled(_) | StoreError::Failed)
        || matches!(&e, StoreError::Io(sled::Error::Io(io)) if io.raw_os_error() == Some(nix::libc::ENOSPC));
    let msg =
        format!("the controller could not write its state ({e}); the request was not acknowledged");
    if full {
        Status::resource_exhausted(msg)
    } else {
        Status::internal(msg)
    }
}

/// The gRPC status of a refusal.
fn status(r: Refusal) -> Status {
    match r.kind {
        Kind::InvalidArgument => Status::invalid_argument(r.message),
        Kind::PermissionDenied => {
            crate::auth::note_denied(&r.message);
            Status::permission_denied(r.message)
        }
        Kind::NotFound => Status::not_found(r.message),
        Kind::FailedPrecondition => Status::failed_precondition(r.message),
        Kind::ResourceExhausted => Status::resource_exhausted(r.message),
        Kind::AlreadyExists => Status::already_exists(r.message),
    }
}

impl Controller {
    pub fn open(
        store: Store,
        config: Config,
        config_path: Option<std::path::PathBuf>,
        pki: PkiSetup,
    ) -> Result<Arc<Controller>, StoreError> {
        let loaded = store.load()?;
        let pki = crate::pki::Pki::new(
            pki.ca,
            pki.key,
            pki.secure,
            pki.clear_tokens,
            pki.node_lifetime_s,
            crate::credentials::Credentials::new(
                loaded.tokens,
                loaded.join_tokens,
                loaded.identities,
            ),
        );
        let records = gpuctl_core::restore::Records {
            jobs: loaded.jobs,
            upgraded: loaded.upgraded,
            nodes: loaded
                .nodes
                .into_iter()
                .map(gpuctl_proto::wire::node)
                .collect(),
            usage: loaded.usage,
            next_job_id: loaded.next_job_id,
            cancels: loaded.cancels.iter().map(|(_, c)| c.clone()).collect(),
            // No sessions: after a restart every agent attaches again.
            ..Default::default()
        };
        // Agents get a full timeout from the controller's start to come back.
        let restored = gpuctl_core::restore::restore(config.clone(), records, now_ms());
        for j in &restored.rewrite {
            store.put_job(j)?;
        }
        let last_cancel = loaded.cancels.last().map(|(seq, _)| *seq);
        if last_cancel.is_some() {
            // The jobs of cancels kept as one record are written; then the records go.
            store.db().flush()?;
            store.delete_cancels(loaded.cancels.iter().map(|(seq, _)| *seq))?;
            store.db().flush()?;
        }
        let core = restored.cluster;
        tracing::info!(
            jobs = core.jobs().len(),
            nodes = core.fleet().nodes().len(),
            next_job_id = core.next_job_id(),
            "state loaded"
        );
        let metrics = crate::metrics::Metrics::new(store.commit_seconds());
        Ok(Arc::new(Controller {
            metrics,
            shared: Mutex::new(Shared {
                core,
                links: HashMap::new(),
                held_starts: Vec::new(),
                room: PassRoom::default(),
                next_id: 0,
                cancels: journal::OpenCancels::after(last_cancel),
            }),
            store,
            pki,
            config: std::sync::RwLock::new(Arc::new(config)),
            config_path,
            wake: Notify::new(),
            defer: Notify::new(),
            rearm: Notify::new(),
            // The first pass (perhaps over a large recovered queue) on the blocking pool.
            last_pass_us: AtomicU64::new(u64::MAX),
            pass_lock: Arc::new(tokio::sync::Mutex::new(())),
            base: Mutex::new(carried::Carried::default()),
            planned_all_ms: std::sync::atomic::AtomicI64::new(i64::MIN),
            unplanned_left: std::sync::atomic::AtomicBool::new(false),
            steps: steps::Relay::default(),
            repl: std::sync::OnceLock::new(),
        }))
    }

    /// The store this controller writes (what tests read behind it).
    pub fn store(&self) -> &Store {
        &self.store
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock()
    }

    /// One step of a long operation (a pass, on a blocking thread) under the lock.
    /// The lock then goes straight to a request waiting for it, and the step is followed
    /// by a pause of a tenth of its own length, so that the requests that
    /// queued up behind it (each async worker blocked on the lock holds one, the rest
    /// wait for a worker) are all served before the next step: a plain unlock let the
    /// pass take the lock again at once, and a request waited for every step of the pass
    /// (a user's queue p99 of 300 ms at 10,000 nodes, while no single hold was over 70).
    /// Steps of a small cluster's pass take microseconds and pause for none; `inline`
    /// (a small pass on an async worker) never pauses.
    fn step<R>(&self, inline: bool, f: impl FnOnce(&mut Shared) -> R) -> R {
        let mut c = self.lock();
        let started = std::time::Instant::now();
        let r = f(&mut c);
        let took = started.elapsed();
        MutexGuard::unlock_fair(c);
        let gap = took / 10;
        if !inline && gap >= Duration::from_micros(200) {
            std::thread::sleep(gap);
        }
        r
    }

    /// After `settle`: wakes the scheduler, makes what was written durable (`always`:
    /// whatever was written by anyone, before an answer that lets the caller forget
    /// something), then sends. The pass may run while this flush does: whatever it
    /// starts is sent only after its own flush, which covers everything written
    /// before it (write-ahead holds; the pass saves the flush's time on every start
    /// that follows an end or a submit).
    ///
    /// The flush and the sends run in a task of their own: a client that goes away
    /// drops its request's future, and what the state already decided (a cancel's kill,
    /// a start) must still reach the disk and the agents.
    async fn deliver(&self, out: Out, always: bool) -> Result<(), StoreError> {
        let (sends, wake) = (out.sends, out.wake);
        if wake {
            self.wake_scheduler();
        }
        // On Raft what a change wrote is durable in the log before it applied.
        let flush = self.flush_due(out.wrote, always);
        if !flush && sends.is_empty() {
            return Ok(());
        }
        let store = self.store.clone();
        let sent = !sends.is_empty();
        tokio::spawn(async move {
            if flush {
                store.flush().await?;
            }
            for (tx, cmd) in sends {
                // A closed stream means the agent left; its reconnect reconciles the job.
                let _ = tx.send(Ok(Box::new(cmd))).await;
            }
            if sent {
                // The agents' streams write their commands now: without this, the
                // request that caused them (woken as this task ends, so run first)
                // answered its caller before the StartJob left, 0.7 ms later.
                tokio::task::yield_now().await;
            }
            Ok(())
        })
        .await
        .expect("delivery panicked")
    }

    /// Takes the configuration the cluster holds as the one in effect (on Raft, a
    /// reconfigure reaches every member through the log).
    pub(crate) fn take_config(&self) {
        let config = Arc::new(self.lock().config().clone());
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = config;
    }

    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads the configuration file again and takes it if it loads (`gpuctl admin
    /// reconfigure`, SIGHUP); a bad file changes nothing and says why (file, line and
    /// column).
    pub fn reconfigure(&self) -> Result<(String, gpuctl_core::reconfig::Reconfigured), String> {
        let Some(path) = &self.config_path else {
            return Err(
                "gpuctld runs on its embedded defaults (no --config): there is no file to read again"
                    .into(),
            );
        };
        let new = Config::load(path).map_err(|e| e.to_string())?;
        // Called on a blocking thread (SIGHUP, the RPC): it may wait for the journal.
        let change = Change::Reconfigure(Box::new(new));
        let committed = tokio::runtime::Handle::current().block_on(async {
            let (answer, out) = self
                .commit(
                    |_, _| Ok((change, ())),
                    |c, (), answer| {
                        *self.config.write().unwrap_or_else(|p| p.into_inner()) =
                            Arc::new(c.config().clone());
                        Ok(answer)
                    },
                )
                .await?;
            self.deliver(out, false).await.map_err(store_status)?;
            Ok::<_, Status>(answer)
        });
        let answer = committed.map_err(|s| s.message().to_string())?;
        let done = match answer {
            Ok(Applied::Reconfigured(done)) => done,
            other => unreachable!("a reconfigure answers what it did, not {other:?}"),
        };
        self.wake.notify_one();
        tracing::info!(
            path = %path.display(),
            applied = ?done.applied,
            needs_restart = ?done.needs_restart,
            "configuration read again"
        );
        Ok((path.display().to_string(), done))
    }

    /// At the end of a pass (`waiting`: jobs still wait; `room`: `gpu_room` after its
    /// plan): the room submits are measured against from now on. A submit that deferred
    /// since the pass took its input (so is not in it) gets its pass: at once if it may
    /// fit after all (answers true: wake the loop), else within `DEFERRED_PASS`.
    fn settle_room(&self, c: &mut Shared, waiting: bool, room: GpuRoom, now: i64) -> bool {
        match c.room.settle(&c.core, waiting, room, now) {
            Deferred::None => false,
            Deferred::PassNow => true,
            Deferred::PassSoon => {
                self.defer.notify_one();
                false
            }
        }
    }

    /// Asks for a scheduling pass soon.
    pub fn wake_scheduler(&self) {
        self.wake.notify_one();
    }

    /// Runs scheduling passes on events and every `sched_interval` until `shutdown` fires.
    pub async fn scheduler_loop(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.config().sched_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut due: Option<tokio::time::Instant> = None;
        loop {
            let deferred = async {
                match due {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            // A job's begin time (sbatch --begin), or the moment a floor's owner would
            // miss its reclaim bound, runs a pass of its own.
            let begin = self.lock().next_wake_ms();
            let begun = async {
                match begin {
                    Some(ms) => {
                        let wait = u64::try_from(ms - now_ms()).unwrap_or(0);
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                    }
                    None => std::future::pending().await,
                }
            };
            // A pass left jobs it did not plan: the next that plans every waiting job
            // comes within `expected_starts_every`, whatever `sched_interval` is.
            let full = async {
                match self.full_pass_due_ms() {
                    Some(ms) => {
                        let wait = u64::try_from(ms - now_ms()).unwrap_or(0);
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tick.tick() => {}
                () = deferred => {}
                () = begun => {}
                () = full => {}
                _ = self.defer.notified() => {
                    due.get_or_insert_with(|| tokio::time::Instant::now() + DEFERRED_PASS);
                    continue;
                }
                _ = self.rearm.notified() => continue,
                _ = shutdown.changed() => break,
            }
            due = None;
            let pass = self.pass_lock.lock().await;
            let started = std::time::Instant::now();
            let done = self.schedule_pass().await;
            drop(pass);
            if let Err(e) = done {
                tracing::error!("scheduling pass failed: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            // Events arriving meanwhile coalesce into the next pass (see MIN_PASS_GAP).
            let took = started.elapsed() * 2;
            tokio::time::sleep(took.clamp(MIN_PASS_GAP, Duration::from_secs(2))).await;
        }
    }

    /// When the next pass that plans every waiting job is due, if the last pass left
    /// some it did not plan.
    fn full_pass_due_ms(&self) -> Option<i64> {
        (self.unplanned_left.load(Ordering::Relaxed)).then(|| self.planned_all_due_ms())
    }

    /// When a pass plans every waiting job again (`expected_starts_every` after the
    /// last that did).
    fn planned_all_due_ms(&self) -> i64 {
        let every = self.config().scheduler.expected_starts_every.as_millis() as i64;
        (self.planned_all_ms.load(Ordering::Relaxed)).saturating_add(every)
    }

    // ------------------------------------------------------------ user operations

    /// Queues a job for `caller` (`submit_noted`), answering its id.
    pub async fn submit(
        self: &Arc<Self>,
        caller: &Caller,
        spec: Option<pb::JobSpec>,
        request_id: &str,
        hold: bool,
    ) -> Result<u64, Status> {
        Ok(self.submit_noted(caller, spec, request_id, hold).await?.0)
    }

    /// Queues a job for `caller`. The job runs as the caller; an admin may name another
    /// user in the spec (like `sbatch --uid`), anyone else is refused for trying.
    /// Answers its id and what admission changed in the request (right-sizing,
    /// co-location: the notes the state recorded on it; none for a repeated request).
    pub async fn submit_noted(
        self: &Arc<Self>,
        caller: &Caller,
        spec: Option<pb::JobSpec>,
        request_id: &str,
        hold: bool,
    ) -> Result<(u64, Vec<String>), Status> {
        let spec = spec.ok_or_else(|| Status::invalid_argument("submit without a job spec"))?;
        if request_id.len() > 64 || request_id.chars().any(|c| !c.is_ascii_graphic()) {
            return Err(Status::invalid_argument(
                "request_id must be at most 64 printable ASCII characters",
            ));
        }
        let config = self.config();
        let limits = &config.limits;
        let size = spec.encoded_len() as u64;
        if size > limits.max_job_bytes.as_u64() {
            return Err(Status::invalid_argument(format!(
                "job is {} encoded, over the controller's limit of {} (limits.max_job_bytes)",
                bytesize::ByteSize(size),
                limits.max_job_bytes
            )));
        }
        let mut spec = gpuctl_proto::wire::job_spec(spec)?;
        let creds = caller.uid.map(|uid| (uid, caller.gid.unwrap_or(0)));
        gpuctl_core::validate::set_owner(&caller.actor(), creds, &mut spec).map_err(status)?;
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
        let actor = caller.actor();
        let mut defer = false;
        let admitted = self
            .admit(&actor, spec, request_id, hold, &mut defer)
            .await?;
        let (id, notes) = match admitted {
            Ok(admitted) => admitted,
            Err(id) => {
                // The first submit may still be on its way to the disk.
                self.durable().await?;
                tracing::info!(
                    job = id,
                    request_id,
                    "repeated submit answered with its job"
                );
                return Ok((id, Vec::new()));
            }
        };
        if defer {
            self.metrics.submits_deferred.inc();
            self.defer.notify_one();
        } else if !self.pass_now().await {
            // The pass may start it while this flush runs (see `deliver`).
            self.wake_scheduler();
        }
        self.durable().await?;
        self.metrics.submits.inc();
        Ok((id, notes))
    }

    /// After a submit or a job's end, before the answer's flush: on a small cluster
    /// with no pass running, the pass runs here, so that one flush makes both the event
    /// and the starts it allows durable (the StartJob leaves with the answer: one disk
    /// write less between a submit and its launch, or a job's end and the next start;
    /// Slurm too tries to schedule at submit and at a job's end). Answers whether it
    /// ran; if not (a pass running, or a large one due), the caller wakes the loop.
    pub(crate) async fn pass_now(self: &Arc<Self>) -> bool {
        let small = self.last_pass_us.load(Ordering::Relaxed) < SUBMIT_PASS.as_micros() as u64;
        let Some(pass) = small
            .then(|| self.pass_lock.clone().try_lock_owned().ok())
            .flatten()
        else {
            return false;
        };
        // A task of its own: a client that goes away mid-request drops this future, and
        // a pass must never stop between applying its starts and sending them.
        let ctl = self.clone();
        let pass = tokio::spawn(async move {
            let done = ctl.schedule_pass().await;
            drop(pass);
            ctl.rearm.notify_one();
            if let Err(e) = done {
                // The caller's own flush reports a store that failed; the loop retries.
                tracing::error!("scheduling pass failed: {e}");
                ctl.wake_scheduler();
            }
        });
        pass.await.is_ok()
    }

    pub fn get_job(&self, id: u64) -> Result<pb::Job, Status> {
        let c = self.lock();
        c.jobs()
            .job(id)
            .map(|j| {
                let mut p = listing::presented_pb(j);
                p.usage = c.usage_of(j).as_ref().map(Into::into);
                p.steps = c.steps_of(j).iter().map(Into::into).collect();
                p
            })
            .ok_or_else(|| Status::not_found(format!("no job {id}")))
    }
}

#[cfg(test)]
#[path = "controller/route_tests.rs"]
mod route_tests;
