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

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use gpuctl_core::ops::Admission;
use gpuctl_core::{Actor, Cluster, Config};
use gpuctl_proto as pb;
use gpuctl_sched::packing::{Policy, Workload};
use gpuctl_sched::priority::PriorityWeights;
use gpuctl_sched::{
    self as sched, Eligibility, GpuRequest, Millis, NodeView, Request, SchedConfig, SlotView,
};

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
    /// Reservation depth for backfill (default: the whole queue).
    #[arg(long)]
    pub reservation_depth: Option<usize>,
    /// Only the first N jobs of the file.
    #[arg(long)]
    pub limit: Option<usize>,
    #[arg(long)]
    pub out: PathBuf,
    /// Also draw utilisation and queue length over time (SVG).
    #[arg(long)]
    pub plot: bool,
}

/// One job to replay.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceJob {
    pub id: u64,
    pub submit: Millis,
    pub duration: Millis,
    pub time_limit: Millis,
    pub priority: i32,
    pub request: Request,
    /// GPUs in milli over all nodes (for utilisation).
    pub gpu_milli: u64,
}

#[derive(Debug, Deserialize)]
struct JobRow {
    submit_time: f64,
    duration: f64,
    num_gpus: u32,
    #[serde(default)]
    gpu_milli: Option<u32>,
    #[serde(default)]
    cpus: Option<u32>,
    #[serde(default)]
    memory_mib: Option<u64>,
    #[serde(default)]
    time_limit: Option<f64>,
    #[serde(default)]
    priority: Option<i32>,
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
    #[serde(default)]
    nodes: Option<u32>,
}

/// `64x8xA100-80GB` -> 64 nodes of 8 GPUs (128 CPUs, 1 TiB each).
pub fn parse_cluster(spec: &str) -> anyhow::Result<Vec<NodeView>> {
    let p = Path::new(spec);
    if p.exists() {
        return Ok(crate::trace::read_nodes(p)?
            .into_iter()
            .filter(|n| !n.slots.is_empty())
            .collect());
    }
    let parts: Vec<&str> = spec.splitn(3, 'x').collect();
    let [n, g, model] = parts[..] else {
        bail!("--cluster {spec:?} is neither a file nor NODESxGPUSxMODEL (e.g. 64x8xA100-80GB)");
    };
    let n: usize = n
        .parse()
        .with_context(|| format!("bad node count in {spec:?}"))?;
    let g: u32 = g
        .parse()
        .with_context(|| format!("bad GPU count in {spec:?}"))?;
    let mem = model
        .rsplit_once('-')
        .and_then(|(_, m)| m.strip_suffix("GB"))
        .and_then(|m| m.parse::<u64>().ok())
        .unwrap_or(80)
        * 1024;
    Ok((0..n)
        .map(|i| NodeView {
            name: format!("node{i:04}"),
            eligibility: Eligibility::Up,
            slots: (0..g)
                .map(|k| SlotView {
                    uuid: format!("node{i:04}-gpu{k}"),
                    gpu_index: k,
                    model: model.to_string(),
                    memory_mib: mem,
                    mig_profile: None,
                })
                .collect(),
            cpu_milli: 128_000,
            memory_bytes: 1 << 40,
        })
        .collect())
}

/// Reads jobs (gpuctl's CSV or the Alibaba pods CSV), scaled by `load_factor`, with time
/// limits `overestimate` x duration unless given. `gpus_per_node` turns big jobs into gangs.
pub fn read_jobs(
    path: &Path,
    load_factor: f64,
    overestimate: f64,
    gpus_per_node: u32,
) -> anyhow::Result<Vec<TraceJob>> {
    let mut rdr =
        csv::Reader::from_path(path).with_context(|| format!("cannot read {}", path.display()))?;
    let headers = rdr.headers()?.clone();
    let ms = |s: f64| (s * 1000.0).round() as Millis;
    let mut jobs = Vec::new();
    if headers.iter().any(|h| h == "creation_time") {
        let pods = crate::trace::read_pods(path)?;
        let start = pods
            .iter()
            .filter_map(|p| p.creation_time)
            .min()
            .unwrap_or(0);
        for p in pods {
            let (Some(c), Some(d)) = (p.creation_time, p.duration_s()) else {
                continue;
            };
            let submit = ms((c - start) as f64 / load_factor);
            let duration = ms(d as f64);
            jobs.push(TraceJob {
                id: jobs.len() as u64 + 1,
                submit,
                duration,
                time_limit: ((duration as f64) * overestimate) as Millis,
                priority: 0,
                request: p.request(),
                gpu_milli: p.gpu_milli_total(),
            });
        }
    } else {
        for (i, row) in rdr.deserialize::<JobRow>().enumerate() {
            let r = row.with_context(|| format!("{} line {}", path.display(), i + 2))?;
            if r.duration <= 0.0 || r.submit_time < 0.0 {
                bail!(
                    "{} line {}: submit_time >= 0 and duration > 0 please",
                    path.display(),
                    i + 2
                );
            }
            let per_node = gpus_per_node.max(1);
            let (gpu, nodes, milli) = match (r.num_gpus, r.gpu_milli) {
                (0, _) => (GpuRequest::None, 1, 0),
                (1, Some(m)) if m < 1000 => (
                    GpuRequest::Share {
                        compute_milli: Some(m.max(1)),
                        memory_mib: None,
                    },
                    1,
                    u64::from(m),
                ),
                (n, _) if n > per_node || r.nodes.is_some_and(|k| k > 1) => {
                    let k = r.nodes.unwrap_or(n.div_ceil(per_node)).max(1);
                    (
                        GpuRequest::Whole {
                            count: n.div_ceil(k),
                        },
                        k,
                        u64::from(n.div_ceil(k) * k) * 1000,
                    )
                }
                (n, _) => (GpuRequest::Whole { count: n }, 1, u64::from(n) * 1000),
            };
            let duration = ms(r.duration);
            jobs.push(TraceJob {
                id: jobs.len() as u64 + 1,
                submit: ms(r.submit_time / load_factor),
                duration,
                time_limit: r
                    .time_limit
                    .map_or(((duration as f64) * overestimate) as Millis, ms)
                    .max(duration),
                priority: r.priority.unwrap_or(0),
                request: Request {
                    gpu,
                    models: Vec::new(),
                    cpu_milli: r.cpus.unwrap_or(1) * 1000,
                    memory_bytes: r.memory_mib.unwrap_or(0) << 20,
                    nodes,
                },
                gpu_milli: milli,
            });
        }
    }
    jobs.sort_by_key(|j| (j.submit, j.id));
    Ok(jobs)
}

#[derive(Debug, Clone, Serialize, PartialEq)]
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
    pub passes: usize,
    pub pass_p50_ms: f64,
    pub pass_p99_ms: f64,
    pub pass_max_ms: f64,
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
fn config_for(
    policy: &str,
    packing: Policy,
    depth: Option<usize>,
    jobs: &[TraceJob],
) -> anyhow::Result<SchedConfig> {
    let (backfill, weights) = match policy {
        "fifo" => (false, PriorityWeights::fifo()),
        "priority" => (false, PriorityWeights::default()),
        "backfill" => (true, PriorityWeights::default()),
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
fn controller(nodes: &[NodeView], config: &SchedConfig, t0: Millis) -> Cluster {
    let mut cfg = Config::default();
    cfg.limits.max_time_limit = Duration::from_secs(u64::from(u32::MAX));
    cfg.limits.max_pending_per_user = usize::MAX;
    cfg.retention.max_age = Duration::from_secs(u64::from(u32::MAX));
    cfg.retention.max_jobs = usize::MAX;
    let mut c = Cluster::new(cfg);
    c.sched_config = config.clone();
    for (i, n) in nodes.iter().enumerate() {
        let nonce = i.to_le_bytes().to_vec();
        c.challenge(&n.name, nonce.clone(), t0);
        let req = pb::RegisterRequest {
            node: n.name.clone(),
            gpus: gpus_of(n),
            cpus: n.cpu_milli / 1000,
            memory_bytes: n.memory_bytes,
            gpu_backend: "simulated".into(),
            nonce,
            agent_id: format!("sim-{i}"),
            ..pb::RegisterRequest::default()
        };
        c.attach(&req, None, t0)
            .expect("a simulated agent attaches");
    }
    c.take_changes();
    c
}

/// A node's GPUs as its agent reports them (MIG instances under their GPU).
fn gpus_of(n: &NodeView) -> Vec<pb::Gpu> {
    let mut out: Vec<pb::Gpu> = Vec::new();
    for s in &n.slots {
        let mig = s.mig_profile.as_ref().map(|p| pb::MigInstance {
            uuid: s.uuid.clone(),
            profile: p.clone(),
            memory_mib: s.memory_mib,
            allocated_to: 0,
        });
        match (out.last_mut(), mig) {
            (Some(g), Some(m)) if g.index == s.gpu_index && !g.mig.is_empty() => g.mig.push(m),
            (_, mig) => out.push(pb::Gpu {
                index: s.gpu_index,
                uuid: if mig.is_some() {
                    format!("{}-gpu", s.uuid)
                } else {
                    s.uuid.clone()
                },
                model: s.model.clone(),
                memory_mib: s.memory_mib,
                mig: mig.into_iter().collect(),
                ..pb::Gpu::default()
            }),
        }
    }
    out
}

/// A trace job as a job file would ask for it.
fn spec_of(j: &TraceJob) -> pb::JobSpec {
    let r = &j.request;
    pb::JobSpec {
        name: format!("trace-{}", j.id),
        command: vec!["/bin/true".into()],
        workdir: "/".into(),
        user: "sim".into(),
        priority: j.priority,
        resources: Some(pb::Resources {
            gpu: gpuctl_proto::convert::gpu_part(&r.gpu),
            cpus: r.cpu_milli.div_ceil(1000).max(1),
            cpu_milli: r.cpu_milli,
            memory_bytes: r.memory_bytes,
            time_limit_secs: (j.time_limit.max(1000) as u64).div_ceil(1000),
            gpu_models: r.models.clone(),
            nodes: r.nodes,
            ..pb::Resources::default()
        }),
        ..pb::JobSpec::default()
    }
}

/// Pending end reports: (end time, job, node), one per rank.
type Ends = BinaryHeap<Reverse<(Millis, u64, String)>>;

/// The simulated agents report every rank that ends by `now` (COMPLETED at its end
/// time). Returns the GPU milli of the jobs that ended and the last end time.
fn report_ends(
    c: &mut Cluster,
    ends: &mut Ends,
    by_id: &BTreeMap<u64, &TraceJob>,
    now: Millis,
) -> (u64, Option<Millis>) {
    let (mut freed, mut last) = (0, None);
    while let Some(Reverse((t, id, node))) = ends.peek().cloned() {
        if t > now {
            break;
        }
        ends.pop();
        let attempt = c.jobs.job(id).map_or(0, |j| j.attempt);
        let end = pb::JobReport {
            node,
            job_id: id,
            kind: pb::job_report::Kind::Ended as i32,
            state: pb::JobState::Completed as i32,
            exit_code: Some(0),
            time_ms: t,
            attempt,
            ..pb::JobReport::default()
        };
        c.report(&end, t);
        if c.jobs.job(id).is_some_and(|j| j.state().is_final()) {
            freed += by_id[&id].gpu_milli;
        }
        last = Some(t);
    }
    (freed, last)
}

/// The simulated agents run the starts a pass sent: each rank reports STARTED at once
/// and is due to end after the job's duration. Returns the jobs started (once each).
fn run_starts<'a>(
    c: &mut Cluster,
    sends: Vec<(String, pb::AgentCommand)>,
    by_id: &BTreeMap<u64, &'a TraceJob>,
    ends: &mut Ends,
    now: Millis,
) -> Vec<&'a TraceJob> {
    let mut started = Vec::new();
    for (node, cmd) in sends {
        let Some(pb::agent_command::Command::Start(s)) = cmd.command else {
            continue;
        };
        let j = by_id[&s.job_id];
        let report = pb::JobReport {
            node: node.clone(),
            job_id: s.job_id,
            kind: pb::job_report::Kind::Started as i32,
            time_ms: now,
            attempt: s.attempt,
            ..pb::JobReport::default()
        };
        c.report(&report, now);
        ends.push(Reverse((now + j.duration, s.job_id, node)));
        if s.rank == 0 {
            started.push(j);
        }
    }
    started
}

/// What the replay measures as it goes.
#[derive(Default)]
struct Tally {
    waits: Vec<f64>,
    jcts: Vec<f64>,
    slowdowns: Vec<f64>,
    pass_ms: Vec<f64>,
    samples: Vec<Sample>,
}

/// Replays `jobs` on `nodes` through the controller's state machine: jobs are
/// submitted at their times, a pass runs after every instant with events, the agents
/// report each start at once and each end after the job's duration. Returns the
/// summary and the utilisation timeline.
pub fn replay(
    nodes: &[NodeView],
    jobs: &[TraceJob],
    config: &SchedConfig,
    policy: &str,
) -> (Summary, Vec<Sample>) {
    let capacity: u64 = nodes.iter().map(|n| n.slots.len() as u64 * 1000).sum();
    let feasible: Vec<&TraceJob> = jobs
        .iter()
        .filter(|j| {
            nodes
                .iter()
                .filter(|n| sched::fits_empty(n, &j.request))
                .count()
                >= j.request.nodes as usize
        })
        .collect();
    let infeasible = jobs.len() - feasible.len();
    let mut now: Millis = feasible.first().map_or(0, |j| j.submit);
    let mut c = controller(nodes, config, now);
    let actor = Actor {
        user: "sim".into(),
        admin: true,
    };
    // The controller's job id -> the trace job.
    let mut by_id: BTreeMap<u64, &TraceJob> = BTreeMap::new();
    let mut pending = 0usize;
    let mut ends = Ends::new();
    let mut next = 0usize;
    let first_submit = now;
    let mut tally = Tally::default();
    let (mut alloc_milli, mut backlog_area, mut backlog_cap, mut area) = (0u64, 0f64, 0f64, 0f64);
    let mut last_end = now;
    loop {
        // Everything that happens at `now`: ends, then arrivals.
        let (freed, ended) = report_ends(&mut c, &mut ends, &by_id, now);
        alloc_milli -= freed;
        last_end = last_end.max(ended.unwrap_or(last_end));
        while next < feasible.len() && feasible[next].submit <= now {
            let j = feasible[next];
            next += 1;
            match c.admit(&actor, spec_of(j), "", now) {
                Ok(Admission::New(stored)) => {
                    by_id.insert(stored.job.as_ref().map_or(0, |x| x.id), j);
                    c.commit_submit(*stored);
                    pending += 1;
                }
                Ok(Admission::Repeat(_)) => unreachable!("no request ids"),
                Err(e) => panic!("trace job {} refused: {e}", j.id),
            }
        }
        if pending > 0 {
            let t0 = Instant::now();
            let (view, queue, cfg) = c.pass_input(now);
            let plan = sched::schedule(&view, &queue, &cfg, now);
            let effects = c.apply_plan(&plan, now);
            tally.pass_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
            for j in run_starts(&mut c, effects.sends, &by_id, &mut ends, now) {
                pending -= 1;
                alloc_milli += j.gpu_milli;
                let wait = (now - j.submit) as f64 / 1000.0;
                let run = j.duration as f64 / 1000.0;
                tally.waits.push(wait);
                tally.jcts.push(wait + run);
                tally
                    .slowdowns
                    .push(((wait + run) / run.max(10.0)).max(1.0));
            }
        }
        // What a store would write; the replay keeps nothing.
        c.take_changes();
        tally.samples.push(Sample {
            t: now,
            allocated_milli: alloc_milli,
            queued: pending,
        });
        // Advance to the next event.
        let next_arrival = feasible.get(next).map(|j| j.submit);
        let next_end = ends.peek().map(|Reverse((t, _, _))| *t);
        let Some(t) = [next_arrival, next_end].into_iter().flatten().min() else {
            break;
        };
        let dt = (t - now) as f64;
        area += dt * alloc_milli as f64;
        if pending > 0 {
            backlog_area += dt * alloc_milli as f64;
            backlog_cap += dt * capacity as f64;
        }
        now = t;
    }
    let Tally {
        waits,
        jcts,
        slowdowns,
        pass_ms,
        samples,
    } = tally;
    let makespan = (last_end - first_submit).max(0) as f64;
    let mut sorted = waits.clone();
    sorted.sort_by(f64::total_cmp);
    let mut ps = pass_ms.clone();
    ps.sort_by(f64::total_cmp);
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let summary = Summary {
        policy: policy.to_string(),
        packing: config.policy.to_string(),
        jobs: feasible.len(),
        infeasible,
        makespan_s: makespan / 1000.0,
        util_backlogged: if backlog_cap > 0.0 {
            backlog_area / backlog_cap
        } else {
            0.0
        },
        util_overall: if makespan > 0.0 {
            area / (makespan * capacity as f64)
        } else {
            0.0
        },
        wait_mean_s: mean(&waits),
        wait_p50_s: super::percentile(&sorted, 50.0),
        wait_p95_s: super::percentile(&sorted, 95.0),
        wait_p99_s: super::percentile(&sorted, 99.0),
        jct_mean_s: mean(&jcts),
        bounded_slowdown_mean: mean(&slowdowns),
        passes: pass_ms.len(),
        pass_p50_ms: super::percentile(&ps, 50.0),
        pass_p99_ms: super::percentile(&ps, 99.0),
        pass_max_ms: ps.last().copied().unwrap_or(0.0),
    };
    (summary, samples)
}

fn timeline_csv(samples: &[Sample], capacity: u64) -> String {
    let mut out = String::from("time_s,allocated_gpus,utilisation,queued\n");
    for s in samples {
        let _ = writeln!(
            out,
            "{:.3},{:.3},{:.4},{}",
            s.t as f64 / 1000.0,
            s.allocated_milli as f64 / 1000.0,
            s.allocated_milli as f64 / capacity.max(1) as f64,
            s.queued
        );
    }
    out
}

fn plot(path: &Path, samples: &[Sample], capacity: u64, title: &str) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let t_max = samples
        .last()
        .map_or(1.0, |s| s.t as f64 / 3_600_000.0)
        .max(1e-3);
    let t0 = samples.first().map_or(0.0, |s| s.t as f64 / 3_600_000.0);
    let q_max = samples.iter().map(|s| s.queued).max().unwrap_or(1).max(1) as f64;
    let (top, bottom) = root.split_vertically(250);
    let mut c = ChartBuilder::on(&top)
        .caption(title, ("sans-serif", 18))
        .margin(8)
        .x_label_area_size(24)
        .y_label_area_size(48)
        .build_cartesian_2d(t0..t_max, 0f64..1.05)?;
    c.configure_mesh().y_desc("GPU utilisation").draw()?;
    c.draw_series(LineSeries::new(
        samples.iter().map(|s| {
            (
                s.t as f64 / 3_600_000.0,
                s.allocated_milli as f64 / capacity.max(1) as f64,
            )
        }),
        &BLUE,
    ))?;
    let mut q = ChartBuilder::on(&bottom)
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(48)
        .build_cartesian_2d(t0..t_max, 0f64..q_max * 1.05)?;
    q.configure_mesh()
        .x_desc("hours")
        .y_desc("queued jobs")
        .draw()?;
    q.draw_series(LineSeries::new(
        samples
            .iter()
            .map(|s| (s.t as f64 / 3_600_000.0, s.queued as f64)),
        &RED,
    ))?;
    root.present()?;
    Ok(())
}

/// Markdown table of summaries.
pub fn table(rows: &[Summary]) -> String {
    let mut out = String::from(
        "| policy | packing | jobs | makespan (h) | util while backlogged | util overall | wait mean (s) | p50 | p95 | p99 | JCT mean (s) | bounded slowdown | pass p50 / p99 / max (ms) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.2} | {:.1}% | {:.1}% | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} / {:.2} / {:.2} |",
            r.policy,
            r.packing,
            r.jobs,
            r.makespan_s / 3600.0,
            r.util_backlogged * 100.0,
            r.util_overall * 100.0,
            r.wait_mean_s,
            r.wait_p50_s,
            r.wait_p95_s,
            r.wait_p99_s,
            r.jct_mean_s,
            r.bounded_slowdown_mean,
            r.pass_p50_ms,
            r.pass_p99_ms,
            r.pass_max_ms
        );
    }
    out
}

pub fn main(a: Args) -> anyhow::Result<()> {
    let nodes = parse_cluster(&a.cluster)?;
    let per_node = nodes
        .iter()
        .map(|n| n.slots.len() as u32)
        .max()
        .unwrap_or(1);
    let mut jobs = read_jobs(&a.jobs, a.load_factor, a.overestimate, per_node)?;
    if let Some(n) = a.limit {
        jobs.truncate(n);
    }
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let capacity: u64 = nodes.iter().map(|n| n.slots.len() as u64 * 1000).sum();
    let mut rows = Vec::new();
    let combos: Vec<(String, Policy)> = a
        .policy
        .iter()
        .flat_map(|p| a.packing.iter().map(move |k| (p.clone(), *k)))
        .collect();
    let mut progress = super::Progress::new(combos.len() as u64, "replaying");
    for (policy, packing) in combos {
        let config = config_for(&policy, packing, a.reservation_depth, &jobs)?;
        let (summary, samples) = replay(&nodes, &jobs, &config, &policy);
        let stem = format!("{policy}-{packing}");
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, submit_s: i64, dur_s: i64, gpus: u32, limit_s: i64) -> TraceJob {
        TraceJob {
            id,
            submit: submit_s * 1000,
            duration: dur_s * 1000,
            time_limit: limit_s * 1000,
            priority: 0,
            request: Request::whole(gpus),
            gpu_milli: u64::from(gpus) * 1000,
        }
    }

    fn run(jobs: &[TraceJob], policy: &str) -> Summary {
        let nodes = parse_cluster("1x2xA100-80GB").unwrap();
        let config = config_for(policy, Policy::FirstFit, None, jobs).unwrap();
        replay(&nodes, jobs, &config, policy).0
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
        let config = config_for("backfill", Policy::Fgd, None, &jobs).unwrap();
        let (s, samples) = replay(&nodes, &jobs, &config, "backfill");
        assert_eq!((s.jobs, s.infeasible), (2, 1));
        // The gang takes all four GPUs at 0; the 1-GPU job waits until 10.
        assert_eq!(s.wait_mean_s, 5.0);
        assert_eq!(samples[0].allocated_milli, 4000);
        // Load factor halves submit times.
        let fast = read_jobs(&p, 2.0, 2.0, 2).unwrap();
        assert_eq!(fast[2].submit, 2500);
    }
}
