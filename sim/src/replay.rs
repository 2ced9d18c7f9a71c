//! Time-based replay: jobs arrive at their submit times, wait in the queue, and run for
//! their real durations on a virtual clock. What decides is the controller's own
//! cluster state machine (`gpuctl-core`): jobs are submitted to it as job specs, and
//! after every batch of events at one instant it runs one scheduling pass (input,
//! `sched::schedule`, plan applied); simulated agents report each start at once and
//! each end after the job's duration.
//!
//! Jobs CSV: `submit_time,duration,num_gpus` (seconds) and optionally `gpu_milli,cpus,
//! memory_mib,time_limit,priority,user,nodes`. `num_gpus` is the job's total: a job
//! larger than a node takes whole nodes as a gang. The Alibaba pods CSV is accepted too
//! (creation_time, scheduled/deletion time, num_gpu, gpu_milli, cpu_milli, memory_mib).

pub mod agents;
mod input;
mod logged;
pub mod mig;
mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Serialize;

use gpuctl_core::log::{Applied, Change};
use gpuctl_core::ops::Admission;
use gpuctl_core::record::{JobSpec, Resources};
use gpuctl_core::{Actor, Cluster, Config, Effects};
use gpuctl_sched::packing::{Policy, Workload};
use gpuctl_sched::priority::PriorityWeights;
use gpuctl_sched::{self as sched, Millis, NodeView, SchedConfig};
use logged::Logged;
pub use logged::Observer;

use input::gpus_of;
pub use input::{TraceJob, parse_cluster, read_jobs};
pub use report::table;
use report::{plot, timeline_csv, users_csv};

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Nodes CSV, or a short form NODESxGPUSxMODEL like 64x8xA100-80GB.
    #[arg(long)]
    pub cluster: String,
    /// Jobs CSV (see docs/simulator.md) or an Alibaba pods CSV.
    #[arg(long)]
    pub jobs: PathBuf,
    /// Scheduling policies to compare: fifo, priority, backfill.
    #[arg(long, value_delimiter = ',', default_value = "backfill")]
    pub policy: Vec<String>,
    /// Packing policies to compare: first-fit, best-fit, fgd.
    #[arg(long, value_delimiter = ',', default_value = "fgd")]
    pub packing: Vec<Policy>,
    /// Divide submit times by this to raise the load.
    #[arg(long, default_value_t = 1.0)]
    pub load_factor: f64,
    /// Time limits default to the duration times this (users over-request time).
    #[arg(long, default_value_t = 2.0)]
    pub overestimate: f64,
    /// The controller's config (TOML, as `gpuctld --config`): its `[scheduler.priority]`
    /// weights, `[fairshare]`, `[accounts]` and `[qos]` apply. Default: the embedded one.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Reservation depth for backfill (default: the whole queue).
    #[arg(long)]
    pub reservation_depth: Option<usize>,
    /// The instant trace time 0 stands for (RFC 3339), so that time-of-day windows
    /// see local times: by default Monday 2024-01-01 00:00 UTC.
    #[arg(long, default_value = "2024-01-01T00:00:00Z", value_parser = parse_epoch)]
    pub epoch: Millis,
    /// Only the first N jobs of the file.
    #[arg(long)]
    pub limit: Option<usize>,
    #[arg(long)]
    pub out: PathBuf,
    /// Also draw utilisation and queue length over time (SVG).
    #[arg(long)]
    pub plot: bool,
    /// Replay twice: as submitted, and with every request right-sized from its
    /// modelled usage (`rightsize.rs`); writes rightsize.json and rightsize.md.
    #[arg(long)]
    pub right_size: bool,
    /// The seed of the modelled usage.
    #[arg(long, default_value_t = 1)]
    pub usage_seed: u64,
    /// GPU shares asked as MIG instances (the smallest that holds each), on GPUs cut
    /// by hand (`static`: half of each node's) or laid out by the controller as jobs
    /// wait (`dynamic`, `gpud --mig dynamic`). Needs a MIG-capable model.
    #[arg(long, value_enum)]
    pub mig: Option<mig::MigMode>,
    /// Plan every pass from a fresh build of every node's calendar, not from the base
    /// carried from pass to pass (the daemon's way): the same plans (`plans_digest`),
    /// slower.
    #[arg(long)]
    pub full_pass: bool,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Summary {
    pub policy: String,
    pub packing: String,
    pub jobs: usize,
    /// Jobs no node could ever run (skipped).
    pub infeasible: usize,
    pub makespan_s: f64,
    /// Allocated GPU-time over available GPU-time while jobs were waiting.
    pub util_backlogged: f64,
    /// Allocated GPU-time over available GPU-time from first submit to last end.
    pub util_overall: f64,
    pub wait_mean_s: f64,
    pub wait_p50_s: f64,
    pub wait_p95_s: f64,
    pub wait_p99_s: f64,
    pub jct_mean_s: f64,
    pub bounded_slowdown_mean: f64,
    /// The highest mean wait of one user (virtual cluster), and the standard deviation
    /// of users' mean waits: how evenly waiting is spread.
    pub user_wait_mean_max_s: f64,
    pub user_wait_mean_sd_s: f64,
    pub passes: usize,
    pub pass_p50_ms: f64,
    pub pass_p99_ms: f64,
    pub pass_max_ms: f64,
    /// A digest of every plan the replay made, in order (equal plans, equal digests).
    pub plans_digest: String,
}

/// One sample of the utilisation timeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub t: Millis,
    pub allocated_milli: u64,
    pub queued: usize,
}

/// The scheduler's configuration for a replay policy; FGD measures fragmentation against
/// the shapes of the replayed jobs (as the controller does with the jobs it knows).
pub fn config_for(
    policy: &str,
    packing: Policy,
    depth: Option<usize>,
    jobs: &[TraceJob],
    base: &Config,
) -> anyhow::Result<SchedConfig> {
    let weights = base.scheduler.priority.clone();
    let (backfill, weights) = match policy {
        "fifo" => (false, PriorityWeights::fifo()),
        "priority" => (false, weights),
        "backfill" => (true, weights),
        other => bail!("unknown policy {other:?} (fifo, priority or backfill)"),
    };
    Ok(SchedConfig {
        policy: packing,
        weights,
        backfill,
        reservation_depth: depth,
        // The replay needs only the starts (the same with or without every reservation).
        expected_starts: false,
        workload: Workload::from_requests(jobs.iter().map(|j| &j.request)),
        ..SchedConfig::default()
    })
}

/// The replay's controller: the controller's own cluster state machine
/// (`gpuctl-core`) with this policy's scheduler configuration, and an agent attached for
/// every node. Time limits and queue lengths are the trace's: the site limits are off.
fn controller<'a>(
    nodes: &[NodeView],
    config: &SchedConfig,
    base: &Config,
    t0: Millis,
    observer: Option<logged::Observer<'a>>,
    mig_dynamic: bool,
) -> Logged<'a> {
    let mut c = Logged::new(empty(config, base), observer);
    for (i, n) in nodes.iter().enumerate() {
        let nonce = i.to_le_bytes().to_vec();
        let register = gpuctl_core::event::Register {
            node: n.name.clone(),
            gpus: gpus_of(n),
            cpus: n.cpu_milli / 1000,
            memory_bytes: n.memory_bytes,
            gpu_backend: "simulated".into(),
            nonce,
            agent_id: format!("sim-{i}"),
            mig_dynamic,
            ..Default::default()
        };
        let (attached, _) = c.apply(
            t0,
            Change::Attach {
                register,
                peer: None,
            },
        );
        attached.expect("a simulated agent attaches");
    }
    c.take_changes();
    c
}

/// The replay's controller before its agents attach: what a replica of its log starts
/// from.
pub fn empty(config: &SchedConfig, base: &Config) -> Cluster {
    let mut cfg = base.clone();
    cfg.limits.max_time_limit = Duration::from_secs(u64::from(u32::MAX));
    cfg.limits.max_pending_per_user = usize::MAX;
    cfg.retention.max_age = Duration::from_secs(u64::from(u32::MAX));
    cfg.retention.max_jobs = usize::MAX;
    Cluster::new(cfg).planning_with(config.clone())
}

/// A pass, as the daemon runs it: its changing start, a plan on the state then, and the
/// plan's entries (starts, waiting jobs' reasons, preemption).
fn pass(c: &mut Logged, now: Millis, planning: &mut Planning) -> Effects {
    // The start also runs the lend pass (opportunistic jobs on lent GPUs).
    let (answer, mut effects) = c.apply(now, Change::Prepare);
    let Ok(Applied::Prepared(waiting)) = answer else {
        unreachable!("a pass's start answers the jobs it leaves out");
    };
    let plan = planning.plan(c.view(), &c.queue(&waiting), &c.pass_config(now), now);
    for entry in gpuctl_core::log::plan_entries(&plan, usize::MAX, now) {
        effects.merge(c.apply(now, entry.change).1);
    }
    effects
}

/// How the replay's passes plan: from the base carried from pass to pass, as the daemon
/// does (`sched::Base`), or from a fresh build of every node's calendar each time (the
/// check: `Usage::full_pass`); and a digest of every plan, in order.
struct Planning {
    full: bool,
    base: sched::Base,
    digest: std::hash::DefaultHasher,
}

impl Planning {
    fn new(full: bool) -> Planning {
        Planning {
            full,
            base: sched::Base::default(),
            digest: std::hash::DefaultHasher::new(),
        }
    }

    fn plan(
        &mut self,
        view: sched::ClusterView,
        queue: &[sched::PendingJob],
        config: &SchedConfig,
        now: Millis,
    ) -> sched::Plan {
        let plan = if self.full {
            sched::schedule(&view, queue, config, now)
        } else {
            self.base.update(view, now);
            sched::schedule_from(&self.base, queue, config)
        };
        std::hash::Hash::hash(&(now, &plan), &mut self.digest);
        plan
    }

    fn digest(&self) -> String {
        format!("{:016x}", std::hash::Hasher::finish(&self.digest))
    }
}

/// A trace job as a job file would ask for it.
fn spec_of(j: &TraceJob) -> JobSpec {
    let r = &j.request;
    JobSpec {
        name: format!("trace-{}", j.id),
        command: vec!["/bin/true".into()],
        workdir: "/".into(),
        user: if j.user.is_empty() {
            "sim".into()
        } else {
            j.user.clone()
        },
        account: j.account.clone(),
        qos: j.qos.clone(),
        partition: j.partition.clone(),
        requeue: j.requeue,
        signal: j.signal.clone(),
        priority: j.priority,
        opportunistic: j.opportunistic,
        resources: Resources {
            gpu: gpuctl_core::request::gpu_part(&r.gpu),
            cpus: r.cpu_milli.div_ceil(1000).max(1),
            cpu_milli: r.cpu_milli,
            memory_bytes: r.memory_bytes,
            time_limit_secs: (j.time_limit.max(1000) as u64).div_ceil(1000),
            gpu_models: r.models.clone(),
            nodes: r.nodes,
            ..Resources::default()
        },
        ..JobSpec::default()
    }
}

/// What the replay measures as it goes.
#[derive(Default)]
struct Tally {
    waits: Vec<f64>,
    jcts: Vec<f64>,
    slowdowns: Vec<f64>,
    pass_ms: Vec<f64>,
    samples: Vec<Sample>,
    by_user: BTreeMap<String, UserTally>,
}

#[derive(Default)]
struct UserTally {
    waits: Vec<f64>,
    slowdowns: Vec<f64>,
    gpu_hours: f64,
}

/// One job's wait, as the replay saw it (its first start).
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    pub account: String,
    pub qos: String,
    pub partition: String,
    pub submit: Millis,
    pub wait_s: f64,
}

/// Everything a replay measured.
pub struct Outcome {
    pub summary: Summary,
    pub samples: Vec<Sample>,
    pub users: Vec<UserSummary>,
    pub jobs: Vec<JobRecord>,
    pub runs: Vec<agents::RunRecord>,
}

/// Replays `jobs` on `nodes` through the controller's state machine: jobs are
/// submitted at their times (trace time 0 is `epoch_ms`), a pass runs after every
/// instant with events, and the simulated agents (`agents`) run what it sends.
pub fn replay(
    nodes: &[NodeView],
    jobs: &[TraceJob],
    config: &SchedConfig,
    base: &Config,
    policy: &str,
    epoch_ms: Millis,
) -> Outcome {
    replay_observed(nodes, jobs, config, base, policy, epoch_ms, None).0
}

/// `replay` with the jobs' use of their GPUs (`agents::Usage`): each job runs its
/// profile's work at the rates of the interference model, and the agents send
/// heartbeats with GPU use when asked to.
pub fn replay_with(
    nodes: &[NodeView],
    jobs: &[TraceJob],
    config: &SchedConfig,
    base: &Config,
    policy: &str,
    epoch_ms: Millis,
    usage: agents::Usage,
) -> Outcome {
    run(nodes, jobs, config, base, policy, epoch_ms, None, usage).0
}

/// `replay`, `observer` seeing every change it makes to its controller, in order, with
/// the state each leaves: the replay's log, which applied to `empty(config, base)`
/// passes through the same states. Answers the state it ends in, too.
pub fn replay_observed(
    nodes: &[NodeView],
    jobs: &[TraceJob],
    config: &SchedConfig,
    base: &Config,
    policy: &str,
    epoch_ms: Millis,
    observer: Option<Observer<'_>>,
) -> (Outcome, Cluster) {
    let usage = agents::Usage::default();
    run(nodes, jobs, config, base, policy, epoch_ms, observer, usage)
}

#[allow(clippy::too_many_arguments)]
fn run(
    nodes: &[NodeView],
    jobs: &[TraceJob],
    config: &SchedConfig,
    base: &Config,
    policy: &str,
    epoch_ms: Millis,
    observer: Option<Observer<'_>>,
    usage: agents::Usage,
) -> (Outcome, Cluster) {
    let capacity: u64 = nodes.iter().map(|n| n.slots.len() as u64 * 1000).sum();
    let dynamic = usage.mig_dynamic;
    let feasible: Vec<TraceJob> = jobs
        .iter()
        .filter(|j| {
            nodes
                .iter()
                .filter(|n| {
                    if dynamic {
                        mig::fits_dynamic(n, &j.request)
                    } else {
                        sched::fits_empty(n, &j.request)
                    }
                })
                .count()
                >= j.request.nodes as usize
        })
        .map(|j| TraceJob {
            submit: j.submit + epoch_ms,
            ..j.clone()
        })
        .collect();
    let infeasible = jobs.len() - feasible.len();
    let mut now: Millis = feasible.first().map_or(epoch_ms, |j| j.submit);
    let mut c = controller(nodes, config, base, now, observer, dynamic);
    let actor = Actor {
        user: "sim".into(),
        admin: true,
    };
    // The controller's job id -> the trace job.
    let mut by_id: BTreeMap<u64, &TraceJob> = BTreeMap::new();
    let mut first_start: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let mut records = Vec::new();
    let mut pending = 0usize;
    let mut planning = Planning::new(usage.full_pass);
    let mut sim = agents::SimAgents::new(usage);
    let mut next = 0usize;
    let first_submit = now;
    let mut tally = Tally::default();
    let (mut backlog_area, mut backlog_cap, mut area) = (0f64, 0f64, 0f64);
    let mut last_end = now;
    // Progress in trace hours (shown only when a replay takes more than a second).
    let last_submit = feasible.last().map_or(now, |j| j.submit);
    let mut progress =
        super::Progress::new(((last_submit - now) / 3_600_000).max(1) as u64, policy);
    let mut shown_h = 0u64;
    loop {
        let h = ((now - first_submit) / 3_600_000) as u64;
        if h > shown_h {
            progress.inc(h - shown_h);
            shown_h = h;
        }
        // Everything that happens at `now`: ends, then arrivals.
        let woke = c.next_wake_ms().is_some_and(|t| t <= now);
        let ended = sim.report_due(&mut c, &by_id, now);
        // Heartbeats: yields to deliver, and a pass when a GPU became lendable.
        let beat = sim.heartbeat(&mut c, now);
        sim.deliver(&mut c, beat.sends, &by_id, now);
        let requeued = std::mem::take(&mut sim.requeued);
        pending += requeued;
        last_end = last_end.max(ended.unwrap_or(last_end));
        let reattached = std::mem::take(&mut sim.reattached);
        let mut eventful = woke || beat.wake || ended.is_some() || requeued > 0 || reattached;
        while next < feasible.len() && feasible[next].submit <= now {
            eventful = true;
            let j = &feasible[next];
            next += 1;
            match c.admit(&actor, spec_of(j), "", now) {
                Ok(Admission::New(stored)) => {
                    by_id.insert(stored.job.id, j);
                    c.apply_sure(now, Change::Submit(vec![*stored]));
                    pending += 1;
                }
                Ok(Admission::Repeat(_) | Admission::Array(_)) => {
                    unreachable!("no request ids, no arrays")
                }
                Err(e) => panic!("trace job {} refused: {e}", j.id),
            }
        }
        if pending > 0 && eventful {
            let t0 = Instant::now();
            let effects = pass(&mut c, now, &mut planning);
            tally.pass_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
            for j in sim.deliver(&mut c, effects.sends, &by_id, now) {
                pending -= 1;
                if !first_start.insert(j.id) {
                    continue; // a requeued job's restart: its wait was counted
                }
                let wait = (now - j.submit) as f64 / 1000.0;
                let run = j.duration as f64 / 1000.0;
                let slowdown = ((wait + run) / run.max(10.0)).max(1.0);
                tally.waits.push(wait);
                tally.jcts.push(wait + run);
                tally.slowdowns.push(slowdown);
                let u = tally.by_user.entry(j.account.clone()).or_default();
                u.waits.push(wait);
                u.slowdowns.push(slowdown);
                u.gpu_hours += j.gpu_milli as f64 / 1000.0 * run / 3600.0;
                records.push(JobRecord {
                    account: j.account.clone(),
                    qos: j.qos.clone(),
                    partition: j.partition.clone(),
                    submit: j.submit - epoch_ms,
                    wait_s: wait,
                });
            }
        }
        c.take_changes();
        tally.samples.push(Sample {
            t: now - epoch_ms,
            allocated_milli: sim.allocated_milli,
            queued: pending,
        });
        // Advance to the next event.
        let next_arrival = feasible.get(next).map(|j| j.submit);
        sim.waiting = pending > 0 && next_arrival.is_some();
        let wake = c.next_wake_ms().filter(|&t| t > now && pending > 0);
        let Some(t) = [next_arrival, sim.next_end(), wake]
            .into_iter()
            .flatten()
            .min()
        else {
            break;
        };
        let dt = (t - now) as f64;
        area += dt * sim.allocated_milli as f64;
        if pending > 0 {
            backlog_area += dt * sim.allocated_milli as f64;
            backlog_cap += dt * capacity as f64;
        }
        now = t;
    }
    progress.finish();
    let span = Span {
        makespan_ms: (last_end - first_submit).max(0) as f64,
        capacity,
        area,
        backlog_area,
        backlog_cap,
        jobs: feasible.len(),
        infeasible,
    };
    let (mut summary, samples, users) = summarize(tally, &span, policy, &config.policy.to_string());
    summary.plans_digest = planning.digest();
    let outcome = Outcome {
        summary,
        samples,
        users,
        jobs: records,
        runs: sim.runs,
    };
    (outcome, c.into_inner())
}

/// The replay's time and area totals.
struct Span {
    makespan_ms: f64,
    capacity: u64,
    area: f64,
    backlog_area: f64,
    backlog_cap: f64,
    jobs: usize,
    infeasible: usize,
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn summarize(
    tally: Tally,
    span: &Span,
    policy: &str,
    packing: &str,
) -> (Summary, Vec<Sample>, Vec<UserSummary>) {
    let Tally {
        waits,
        jcts,
        slowdowns,
        pass_ms,
        samples,
        by_user,
    } = tally;
    let makespan = span.makespan_ms;
    let mut sorted = waits.clone();
    sorted.sort_by(f64::total_cmp);
    let mut ps = pass_ms.clone();
    ps.sort_by(f64::total_cmp);
    let users: Vec<UserSummary> = by_user
        .into_iter()
        .map(|(user, t)| UserSummary {
            user,
            jobs: t.waits.len(),
            gpu_hours: t.gpu_hours,
            wait_mean_s: mean(&t.waits),
            bounded_slowdown_mean: mean(&t.slowdowns),
        })
        .collect();
    let user_means: Vec<f64> = users.iter().map(|u| u.wait_mean_s).collect();
    let um = mean(&user_means);
    let user_sd = mean(
        &user_means
            .iter()
            .map(|x| (x - um).powi(2))
            .collect::<Vec<_>>(),
    )
    .sqrt();
    let summary = Summary {
        policy: policy.to_string(),
        packing: packing.to_string(),
        jobs: span.jobs,
        infeasible: span.infeasible,
        makespan_s: makespan / 1000.0,
        util_backlogged: if span.backlog_cap > 0.0 {
            span.backlog_area / span.backlog_cap
        } else {
            0.0
        },
        util_overall: if makespan > 0.0 {
            span.area / (makespan * span.capacity as f64)
        } else {
            0.0
        },
        wait_mean_s: mean(&waits),
        wait_p50_s: super::percentile(&sorted, 50.0),
        wait_p95_s: super::percentile(&sorted, 95.0),
        wait_p99_s: super::percentile(&sorted, 99.0),
        jct_mean_s: mean(&jcts),
        bounded_slowdown_mean: mean(&slowdowns),
        user_wait_mean_max_s: user_means.iter().copied().fold(0.0, f64::max),
        user_wait_mean_sd_s: user_sd,
        passes: pass_ms.len(),
        pass_p50_ms: super::percentile(&ps, 50.0),
        pass_p99_ms: super::percentile(&ps, 99.0),
        pass_max_ms: ps.last().copied().unwrap_or(0.0),
        plans_digest: String::new(),
    };
    (summary, samples, users)
}

/// One user's (or virtual cluster's) waits in a replay.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UserSummary {
    pub user: String,
    pub jobs: usize,
    pub gpu_hours: f64,
    pub wait_mean_s: f64,
    pub bounded_slowdown_mean: f64,
}

/// An RFC 3339 instant in Unix ms.
fn parse_epoch(s: &str) -> Result<Millis, String> {
    let t = humantime::parse_rfc3339(s).map_err(|e| format!("{s:?}: {e}"))?;
    let d = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| format!("{s:?} is before 1970"))?;
    Millis::try_from(d.as_millis()).map_err(|_| format!("{s:?} is too far away"))
}

pub fn main(a: Args) -> anyhow::Result<()> {
    let mut nodes = parse_cluster(&a.cluster)?;
    let per_node = nodes
        .iter()
        .map(|n| n.slots.len() as u32)
        .max()
        .unwrap_or(1);
    let mut jobs = read_jobs(&a.jobs, a.load_factor, a.overestimate, per_node)?;
    if let Some(n) = a.limit {
        jobs.truncate(n);
    }
    let mut mig_tag = "";
    if let Some(mode) = a.mig {
        let model = (nodes.iter().flat_map(|n| n.slots.first()))
            .map(|s| s.model.clone())
            .next()
            .unwrap_or_default();
        let changed = mig::as_mig(&mut jobs, &model)?;
        eprintln!(
            "--mig: {changed} of {} jobs ask for a MIG instance",
            jobs.len()
        );
        mig_tag = match mode {
            mig::MigMode::Static => {
                mig::static_layout(&mut nodes);
                "-mig-static"
            }
            mig::MigMode::Dynamic => "-mig-dynamic",
        };
    }
    let usage = agents::Usage {
        mig_dynamic: a.mig == Some(mig::MigMode::Dynamic),
        full_pass: a.full_pass,
        ..agents::Usage::default()
    };
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let capacity: u64 = nodes.iter().map(|n| n.slots.len() as u64 * 1000).sum();
    let mut rows = Vec::new();
    let combos: Vec<(String, Policy)> = a
        .policy
        .iter()
        .flat_map(|p| a.packing.iter().map(move |k| (p.clone(), *k)))
        .collect();
    let base = match &a.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let sized = a.right_size.then(|| {
        let mut sized = jobs.clone();
        let changes = crate::rightsize::right_size(&mut sized, a.usage_seed);
        (sized, changes)
    });
    let sets: Vec<(&[TraceJob], &str)> = std::iter::once((jobs.as_slice(), ""))
        .chain(sized.as_ref().map(|(s, _)| (s.as_slice(), "-rightsized")))
        .collect();
    let runs: Vec<(String, Policy, &[TraceJob], &str)> = sets
        .iter()
        .flat_map(|&(js, tag)| combos.iter().map(move |(p, k)| (p.clone(), *k, js, tag)))
        .collect();
    let mut progress = super::Progress::new(runs.len() as u64, "replaying");
    for (policy, packing, jobs, tag) in runs {
        let config = config_for(&policy, packing, a.reservation_depth, jobs, &base)?;
        let out = replay_with(
            &nodes,
            jobs,
            &config,
            &base,
            &policy,
            a.epoch,
            usage.clone(),
        );
        let (mut summary, samples, users) = (out.summary, out.samples, out.users);
        summary.policy.push_str(tag);
        summary.policy.push_str(mig_tag);
        let stem = format!("{policy}{tag}{mig_tag}-{packing}");
        std::fs::write(a.out.join(format!("users-{stem}.csv")), users_csv(&users))?;
        std::fs::write(
            a.out.join(format!("timeline-{stem}.csv")),
            timeline_csv(&samples, capacity),
        )?;
        if a.plot {
            plot(
                &a.out.join(format!("timeline-{stem}.svg")),
                &samples,
                capacity,
                &format!("{policy} / {packing}"),
            )?;
        }
        rows.push(summary);
        progress.inc(1);
    }
    progress.finish();
    let json = serde_json::to_string_pretty(&rows)?;
    std::fs::write(a.out.join("summary.json"), &json)?;
    std::fs::write(a.out.join("summary.md"), table(&rows))?;
    println!("{json}");
    print!("{}", table(&rows));
    if let Some((_, changes)) = &sized {
        let cmp = crate::rightsize::compare(&rows, changes);
        std::fs::write(
            a.out.join("rightsize.json"),
            serde_json::to_string_pretty(&cmp)?,
        )?;
        let md = crate::rightsize::table(&cmp);
        std::fs::write(a.out.join("rightsize.md"), &md)?;
        print!("{md}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_sched::{GpuRequest, Request};

    fn job(id: u64, submit_s: i64, dur_s: i64, gpus: u32, limit_s: i64) -> TraceJob {
        TraceJob {
            id,
            submit: submit_s * 1000,
            duration: dur_s * 1000,
            time_limit: limit_s * 1000,
            priority: 0,
            request: Request::whole(gpus),
            gpu_milli: u64::from(gpus) * 1000,
            ..TraceJob::default()
        }
    }

    fn run(jobs: &[TraceJob], policy: &str) -> Summary {
        let nodes = parse_cluster("1x2xA100-80GB").unwrap();
        let base = Config::default();
        let config = config_for(policy, Policy::FirstFit, None, jobs, &base).unwrap();
        replay(&nodes, jobs, &config, &base, policy, 0).summary
    }

    #[test]
    fn hand_computed_fifo_and_backfill() {
        // One node, 2 GPUs. t=0: A (1 GPU, 100 s) starts. t=1: B (2 GPUs, 100 s) must
        // wait for A; C (1 GPU, 50 s, limit 50 s) fits beside A and ends before A does.
        // Backfill runs C at 1; FIFO keeps it behind B (B at 100, C at 200).
        let jobs = [
            job(1, 0, 100, 1, 100),
            job(2, 1, 100, 2, 100),
            job(3, 1, 50, 1, 50),
        ];
        let f = run(&jobs, "fifo");
        // Waits: A 0, B 99, C 199.
        assert!((f.wait_mean_s - 298.0 / 3.0).abs() < 1e-9, "{f:?}");
        assert_eq!(f.makespan_s, 250.0);
        let b = run(&jobs, "backfill");
        // Waits: A 0, C 0, B 99.
        assert!((b.wait_mean_s - 33.0).abs() < 1e-9, "{b:?}");
        assert_eq!(b.makespan_s, 200.0);
        // GPU-seconds 100 + 200 + 50 = 350 over 2 GPUs x 200 s.
        assert!((b.util_overall - 350.0 / 400.0).abs() < 1e-9, "{b:?}");
        // While B waited (1..100): A and C busy until 51, then A alone.
        assert!(
            (b.util_backlogged - (2.0 * 50.0 + 49.0) / 198.0).abs() < 1e-9,
            "{b:?}"
        );
        assert_eq!(b.wait_p50_s, 0.0);
        assert_eq!(b.wait_p99_s, 99.0);
        // Bounded slowdowns: A 1, C 1, B (99 + 100) / 100.
        assert!((b.bounded_slowdown_mean - 3.99 / 3.0).abs() < 1e-9, "{b:?}");
        assert!(b.wait_mean_s < f.wait_mean_s);
    }

    #[test]
    fn gangs_and_infeasible_jobs() {
        let nodes = parse_cluster("2x2xT4-16GB").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("jobs.csv");
        std::fs::write(
            &p,
            "submit_time,duration,num_gpus\n0,10,4\n0,10,1\n5,10,9\n",
        )
        .unwrap();
        let jobs = read_jobs(&p, 1.0, 2.0, 2).unwrap();
        assert_eq!(jobs[0].request.nodes, 2);
        assert_eq!(jobs[0].request.gpu, GpuRequest::Whole { count: 2 });
        assert_eq!(jobs[0].time_limit, 20_000);
        let base = Config::default();
        let config = config_for("backfill", Policy::Fgd, None, &jobs, &base).unwrap();
        let out = replay(&nodes, &jobs, &config, &base, "backfill", 0);
        let (s, samples) = (out.summary, out.samples);
        assert_eq!((s.jobs, s.infeasible), (2, 1));
        // Small jobs first (the default): the 1-GPU job starts at 0 and the gang, which
        // needs all four GPUs, waits until it ends at 10.
        assert_eq!(s.wait_mean_s, 5.0);
        assert_eq!(samples[0].allocated_milli, 1000);
        assert_eq!(samples[1].allocated_milli, 4000);
        // Load factor halves submit times.
        let fast = read_jobs(&p, 2.0, 2.0, 2).unwrap();
        assert_eq!(fast[2].submit, 2500);
    }
}
