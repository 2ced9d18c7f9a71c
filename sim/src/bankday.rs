//! The bank-day scenario: a week on 16 nodes x 8 A100s of a bank's GPU cluster.
//! Online inference (short jobs in daytime bursts, QoS `high`), model training (long
//! 2-8 GPU jobs all week, QoS `normal`, checkpointing on `USR1@60` and requeued when
//! stopped, as a bank's would) and overnight batch scoring (1-GPU jobs in the evening,
//! QoS `low`, requeued when preempted, with a checkpoint signal).
//!
//! Replayed through the controller's state machine once per rung of a ladder
//! (`crate::ladder`): from a *before* (whole GPUs, FIFO, no windows, no preemption) up
//! to the defaults (priority and backfill, fair share, shares for inference, a
//! business-hours window keeping 70% of the GPUs for inference, and floors that lend
//! to jobs that give back). Each rung reports utilisation and allocation (one
//! definition: docs/utilisation.md), inference's wait in business hours against the
//! target, training's GPU-hours and wait, and the work lost to preemption. What jobs
//! keep busy of their GPUs comes from the calibrated model of `crate::usage`. The
//! workload is drawn from a seeded generator (the same seed, the same week).

use std::path::PathBuf;

use anyhow::Context as _;
use rand::{Rng, SeedableRng};

use gpuctl_core::Config;
use gpuctl_sched::packing::Policy;
use gpuctl_sched::priority::PriorityWeights;
use gpuctl_sched::{GpuRequest, Millis, Request};

use crate::replay::{TraceJob, parse_cluster};

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[arg(long)]
    pub out: PathBuf,
    /// The generator's seed.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Inference's p95 wait in business hours must stay under this (seconds).
    #[arg(long, default_value_t = 300.0)]
    pub target_p95_s: f64,
    /// Only the first N days of the week (a quicker look).
    #[arg(long, default_value_t = 7)]
    pub days: u32,
    /// Only these rungs of the ladder, by number from 0 (*before*) to 9 (the
    /// defaults), and 10 for the defaults with GPUs capped at night (beside the
    /// ladder), e.g. `0,9` (a quicker look; the plot shows the first run and the
    /// defaults, else the last run).
    #[arg(long, value_delimiter = ',')]
    pub rungs: Vec<usize>,
}

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

/// The controller config of the scenario (without the window).
pub const BASE: &str = r#"
timezone = "UTC"
[qos.low]
priority = 0
[qos.normal]
priority = 1000
[qos.high]
priority = 10000
preempts = ["low"]
[preemption]
min_run = "5m"
[accounts.inference]
users = ["inference"]
[accounts.training]
users = ["training"]
[accounts.scoring]
users = ["scoring"]
"#;

/// The business-hours window.
pub const WINDOW: &str = r#"
[windows.business]
days = ["mon", "tue", "wed", "thu", "fri"]
start = "08:00"
end = "20:00"
floor = { inference = 0.7 }
preemption = true
"#;

/// Whether `t` (ms from Monday 00:00 UTC) is in business hours.
pub fn business(t: Millis) -> bool {
    let day = t.div_euclid(DAY) % 7;
    let h = t.rem_euclid(DAY) / HOUR;
    day < 5 && (8..20).contains(&h)
}

fn exp(rng: &mut impl Rng, mean: f64) -> f64 {
    -mean * (1.0 - rng.random::<f64>()).ln()
}

pub(crate) fn job(
    id: u64,
    submit: f64,
    dur: f64,
    gpu: GpuRequest,
    milli: u64,
    who: &str,
    qos: &str,
) -> TraceJob {
    let ms = |s: f64| (s * 1000.0) as Millis;
    TraceJob {
        id,
        submit: ms(submit),
        duration: ms(dur),
        time_limit: ms(dur * 1.5),
        priority: 0,
        request: Request {
            gpu,
            ..Request::default()
        },
        gpu_milli: milli,
        user: who.into(),
        account: who.into(),
        qos: qos.into(),
        partition: String::new(),
        requeue: false,
        signal: String::new(),
        opportunistic: false,
    }
}

/// How the week's jobs ask for GPUs: inference as half a GPU (`shares`) or a whole
/// one, and training with a checkpoint signal and requeue (`checkpoints`) or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub shares: bool,
    pub checkpoints: bool,
    /// Inference and scoring (the same models every day) are right-sized from their
    /// earlier runs.
    pub right_size: bool,
    /// Inference and scoring ask for co-location.
    pub colocate: bool,
    /// The research sweeps are submitted as opportunistic jobs (else `low` ones).
    pub opportunistic: bool,
}

/// The week's jobs, in submit order, as the defaults' users would submit them.
pub fn workload(seed: u64) -> Vec<TraceJob> {
    workload_as(
        seed,
        Shape {
            shares: true,
            checkpoints: true,
            right_size: true,
            colocate: true,
            opportunistic: true,
        },
    )
}

/// The week's jobs, in submit order, shaped by `shape` (the same draws either way).
pub fn workload_as(seed: u64, shape: Shape) -> Vec<TraceJob> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut jobs = Vec::new();
    let mut id = 0u64;
    let mut next = || {
        id += 1;
        id
    };
    let week = 7.0 * 24.0 * 3600.0;
    // Inference: Poisson arrivals, 300 an hour in business hours with a burst of 80 at
    // every full hour, 20 an hour otherwise; half a GPU for 5-40 minutes. Its peak
    // (about 85 GPUs) is what the window's floor (70% of 128) is sized for.
    let mut t = 0.0;
    while t < week {
        let rate = if business((t * 1000.0) as Millis) {
            300.0
        } else {
            20.0
        };
        t += exp(&mut rng, 3600.0 / rate);
        let dur = 300.0 + exp(&mut rng, 900.0).min(2100.0);
        jobs.push(inference(next(), t, dur, shape));
    }
    for day in 0..5 {
        for h in 8..20 {
            let at = (day * 24 + h) as f64 * 3600.0;
            for _ in 0..80 {
                let dur = 300.0 + exp(&mut rng, 600.0).min(1800.0);
                let t = at + rng.random::<f64>() * 300.0;
                jobs.push(inference(next(), t, dur, shape));
            }
        }
    }
    // Training: 2-8 GPUs for 2-12 hours, about 3 an hour all week.
    let mut t = 0.0;
    while t < week {
        t += exp(&mut rng, 1200.0);
        let gpus = [2u32, 4, 8, 8][rng.random_range(0..4)];
        let dur = 2.0 * 3600.0 + rng.random::<f64>() * 10.0 * 3600.0;
        let whole = GpuRequest::Whole { count: gpus };
        let mut j = job(
            next(),
            t,
            dur,
            whole,
            u64::from(gpus) * 1000,
            "training",
            "normal",
        );
        if shape.checkpoints {
            j.requeue = true;
            j.signal = "USR1@60".into();
        }
        jobs.push(j);
    }
    // Scoring: 120 one-GPU jobs of 30-90 minutes each evening (18:00-22:00).
    for day in 0..7 {
        for _ in 0..120 {
            let t = (day * 24 + 18) as f64 * 3600.0 + rng.random::<f64>() * 4.0 * 3600.0;
            let dur = 1800.0 + rng.random::<f64>() * 3600.0;
            let mut j = job(
                next(),
                t,
                dur,
                GpuRequest::Whole { count: 1 },
                1000,
                "scoring",
                "low",
            );
            j.requeue = true;
            j.signal = "USR1@60".into();
            jobs.push(j);
        }
    }
    let first = jobs.iter().map(|j| j.id).max().unwrap_or(0) + 1;
    jobs.extend(crate::idle_work::jobs(seed, first, shape));
    jobs.sort_by_key(|j| (j.submit, j.id));
    let repeat = |j: &TraceJob| j.account == "inference" || j.account == "scoring";
    for j in jobs.iter_mut().filter(|j| repeat(j)) {
        let asked = nominal_milli(j, shape);
        if shape.right_size {
            right_sized(j, seed, asked);
        }
        if shape.colocate {
            colocated(j, seed, asked);
        }
    }
    jobs
}

/// The GPU memory of the week's GPUs (A100 80 GB), in MiB.
pub(crate) const GPU_MEMORY_MIB: f64 = 80.0 * 1024.0;

/// A repeat job's GPU memory peak over the memory it asked for (`crate::usage`).
fn memory_frac(j: &TraceJob, seed: u64) -> f64 {
    crate::usage::memory(crate::usage::uniform(seed, j.id, 1))
}

/// A repeat job's GPU memory peak, in MiB, for what it asked (`asked` milli-GPUs).
pub(crate) fn peak_mib(j: &TraceJob, seed: u64, asked: u64) -> f64 {
    memory_frac(j, seed) * asked as f64 / 1000.0 * GPU_MEMORY_MIB
}

/// A repeat job right-sized as the controller would from its earlier runs
/// (`gpuctl_core::efficiency`: a whole GPU becomes a share when its runs fitted in
/// half of one; a share shrinks to its busy and memory fractions when that saves a
/// quarter; 25% margin): its modelled busy fraction and GPU memory peak (a repeat
/// job's runs are alike). `asked` is what it asked for, in milli-GPUs.
fn right_sized(j: &mut TraceJob, seed: u64, asked: u64) {
    let had = asked as f64 / 1000.0;
    let b = busy(j, seed);
    let mem = memory_frac(j, seed);
    let want = if asked >= 1000 {
        gpuctl_core::efficiency::share_for_whole(b, mem)
    } else {
        gpuctl_core::efficiency::shrunk_share(had, b, mem)
    };
    if let Some(share) = want {
        let milli = (share * 1000.0).round() as u32;
        j.request.gpu = GpuRequest::Share {
            compute_milli: Some(milli),
            memory_mib: None,
        };
        j.gpu_milli = u64::from(milli);
    }
}

/// A repeat job that asks for co-location, charged as the controller would from its
/// earlier runs (`gpuctl_core::colocate::charge`): its modelled busy share of the GPU
/// and GPU memory peak (`crate::usage`; a repeat job's runs are alike), against what
/// it holds now (its request, right-sized or not). `gpu_milli` becomes the charge.
fn colocated(j: &mut TraceJob, seed: u64, asked: u64) {
    let nominal = u32::try_from(j.gpu_milli).unwrap_or(u32::MAX);
    let used = busy(j, seed) * asked as f64 / 1000.0;
    let given = f64::from(nominal) / 1000.0 * GPU_MEMORY_MIB;
    let peak = peak_mib(j, seed, asked);
    let ratio = gpuctl_core::colocate::Colocation::default().compute_overcommit;
    if let Some((milli, mib)) =
        gpuctl_core::colocate::charge(nominal, given as u64, used, peak as u64, ratio)
    {
        j.request.gpu = GpuRequest::Share {
            compute_milli: Some(milli),
            memory_mib: Some(mib),
        };
        j.gpu_milli = u64::from(milli);
    }
}

/// What a job asked for before co-location charged it, in thousandths of a GPU.
pub(crate) fn nominal_milli(j: &TraceJob, shape: Shape) -> u64 {
    match j.account.as_str() {
        "inference" if shape.shares => 500,
        "inference" | "scoring" => 1000,
        _ => j.gpu_milli,
    }
}

/// What a job keeps busy of the GPU time it is charged for: its busy fraction of what
/// it asked for, times what it asked for over its charge (so that utilisation counts
/// the same work whether the job is co-located or not).
pub fn busy_of_charge(j: &TraceJob, seed: u64, shape: Shape) -> f64 {
    busy(j, seed) * nominal_milli(j, shape) as f64 / j.gpu_milli.max(1) as f64
}

/// An inference job: half a GPU, or a whole one when the users are not given shares.
fn inference(id: u64, t: f64, dur: f64, shape: Shape) -> TraceJob {
    if shape.shares {
        let share = GpuRequest::Share {
            compute_milli: Some(500),
            memory_mib: None,
        };
        job(id, t, dur, share, 500, "inference", "high")
    } else {
        job(
            id,
            t,
            dur,
            GpuRequest::Whole { count: 1 },
            1000,
            "inference",
            "high",
        )
    }
}

/// What a job of the week keeps busy of its GPUs (`crate::usage`): inference as online
/// serving, training as Philly's training jobs, scoring as PAI's mixed instances.
pub fn busy(j: &TraceJob, seed: u64) -> f64 {
    use crate::usage::{Kind, busy, uniform};
    let kind = match j.account.as_str() {
        "inference" => Kind::Serving,
        "training" => Kind::Training,
        _ => Kind::Instance,
    };
    busy(kind, j.duration as f64 / 1000.0, uniform(seed, j.id, 0))
}

/// GPU-hours of `[start, end)` (ms from the epoch) outside business hours.
pub fn night_hours(start: Millis, end: Millis, milli: u64) -> f64 {
    let mut t = start;
    let mut night = 0i64;
    while t < end {
        let next = ((t / HOUR) + 1) * HOUR;
        let stop = next.min(end);
        if !business(t) {
            night += stop - t;
        }
        t = stop;
    }
    night as f64 / HOUR as f64 * milli as f64 / 1000.0
}

/// Replays the week once per rung of the ladder (`crate::ladder`); writes
/// `ladder.md`, `ladder.json`, the config of the defaults, and `bankday-hourly.svg`
/// (utilisation and allocation hour by hour, before and after) to `out`.
pub fn main(a: Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let nodes = parse_cluster("16x8xA100-80GB")?;
    let cut = i64::from(a.days.min(7)) * DAY;
    let epoch = 1_704_067_200_000; // Monday 2024-01-01 00:00 UTC
    let mut rows = Vec::new();
    let mut hourly = Vec::new();
    let all: Vec<&crate::ladder::Rung> = (crate::ladder::RUNGS.iter())
        .chain([&crate::ladder::NIGHT_CAP])
        .collect();
    if let Some(bad) = a.rungs.iter().find(|&&i| i >= all.len()) {
        anyhow::bail!(
            "--rungs {bad}: the ladder's rungs are 0 to {} ({} the defaults capped at night)",
            all.len() - 1,
            all.len() - 1
        );
    }
    let chosen = (all.iter().enumerate())
        .filter(|(i, _)| a.rungs.is_empty() || a.rungs.contains(i))
        .map(|(_, r)| *r);
    let defaults = crate::ladder::RUNGS[crate::ladder::RUNGS.len() - 1].name;
    let gpus: usize = nodes.iter().map(|n| n.slots.len()).sum();
    let gpu_mib = (nodes.iter().flat_map(|n| n.slots.iter()))
        .map(|s| s.memory_mib)
        .max()
        .unwrap_or(1);
    for rung in chosen {
        let text = rung.config();
        let p = a.out.join("bankday-config.toml");
        std::fs::write(&p, &text)?;
        let base = Config::load(&p)?;
        let jobs: Vec<TraceJob> = workload_as(a.seed, rung.shape())
            .into_iter()
            .filter(|j| j.submit < cut)
            .collect();
        let mut weights = base.scheduler.priority.clone();
        if !rung.priority {
            // FIFO: age alone orders the queue.
            weights = PriorityWeights {
                size: 0,
                user: 0,
                qos: 0,
                fair_share: 0,
                ..weights
            };
        } else if !rung.fair_share {
            weights.fair_share = 0;
        }
        let config = gpuctl_sched::SchedConfig {
            policy: Policy::FirstFit,
            weights,
            backfill: rung.backfill,
            expected_starts: false,
            ..gpuctl_sched::SchedConfig::default()
        };
        let t0 = std::time::Instant::now();
        let usage = crate::replay::agents::Usage {
            profiles: crate::idle_work::profiles(&jobs, a.seed, rung.shape()),
            // MPS client priority below the holders' (what gpud sets for borrowers).
            priority: true,
            heartbeat_ms: rung.opportunistic.then_some(30_000),
            mig_dynamic: false,
            full_pass: false,
        };
        let out =
            crate::replay::replay_with(&nodes, &jobs, &config, &base, rung.name, epoch, usage);
        eprintln!(
            "{}: replayed in {:.1} s",
            rung.name,
            t0.elapsed().as_secs_f64()
        );
        let by_id: std::collections::HashMap<u64, f64> = jobs
            .iter()
            .map(|j| (j.id, busy_of_charge(j, a.seed, rung.shape())))
            .collect();
        let m = crate::ladder::measure(&out, &by_id, epoch, cut, gpus, gpu_mib);
        hourly.push((rung.name, m.hourly.clone()));
        rows.push(crate::ladder::row(rung.name, &out, &m, epoch, cut));
    }
    // The defaults' config, as the last rung replayed it.
    std::fs::write(
        a.out.join("bankday-config.toml"),
        crate::ladder::RUNGS[crate::ladder::RUNGS.len() - 1].config(),
    )?;
    let md = crate::ladder::table(&rows, a.target_p95_s);
    std::fs::write(a.out.join("ladder.md"), &md)?;
    std::fs::write(
        a.out.join("ladder.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    let first = hourly.first().cloned();
    let last = (hourly.iter().find(|h| h.0 == defaults))
        .or(hourly.last())
        .cloned();
    if let (Some(b), Some(f)) = (first, last) {
        crate::ladder::plot(&a.out.join("bankday-hourly.svg"), &[b, f])?;
    }
    print!("{md}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn business_hours_and_night_hours() {
        assert!(business(8 * HOUR));
        assert!(!business(20 * HOUR));
        assert!(!business(5 * DAY + 10 * HOUR)); // Saturday
        // 19:00-21:00 on a Monday: one hour of night, at 2 GPUs.
        assert!((night_hours(19 * HOUR, 21 * HOUR, 2000) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn the_workload_is_the_same_for_a_seed() {
        let a = workload(7);
        assert_eq!(a, workload(7));
        assert!(a.iter().any(|j| j.account == "scoring" && j.requeue));
        assert!(a.windows(2).all(|w| w[0].submit <= w[1].submit));
    }

    #[test]
    fn colocation_charges_repeat_jobs_their_use_and_keeps_their_work() {
        let plain = Shape {
            shares: true,
            checkpoints: true,
            right_size: false,
            colocate: false,
            opportunistic: false,
        };
        let co = Shape {
            colocate: true,
            ..plain
        };
        let (a, b) = (workload_as(3, plain), workload_as(3, co));
        assert_eq!(a.len(), b.len());
        let mut charged = 0;
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.id, x.submit, x.duration), (y.id, y.submit, y.duration));
            if y.account == "training" {
                assert_eq!(x.request, y.request);
                continue;
            }
            // Never more than asked, never under the overcommit floor (half of it).
            assert!(
                y.gpu_milli <= x.gpu_milli && 2 * y.gpu_milli >= x.gpu_milli,
                "{y:?}"
            );
            if y.gpu_milli < x.gpu_milli {
                charged += 1;
                let GpuRequest::Share {
                    memory_mib: Some(m),
                    ..
                } = y.request.gpu
                else {
                    panic!("{y:?}");
                };
                assert!(m as f64 <= x.gpu_milli as f64 / 1000.0 * GPU_MEMORY_MIB);
            }
            // The same busy GPU time, whatever it is charged.
            let work = |j: &TraceJob, s| busy_of_charge(j, 3, s) * j.gpu_milli as f64;
            assert!((work(x, plain) - work(y, co)).abs() < 1e-6);
        }
        assert!(charged > b.len() / 2, "{charged} of {}", b.len());
    }

    #[test]
    fn right_sizing_shrinks_repeat_jobs_to_their_use_and_keeps_their_work() {
        let plain = Shape {
            shares: true,
            checkpoints: true,
            right_size: false,
            colocate: false,
            opportunistic: false,
        };
        let sized = Shape {
            right_size: true,
            ..plain
        };
        let (a, b) = (workload_as(5, plain), workload_as(5, sized));
        let mut shrunk = 0;
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((x.id, x.submit, x.duration), (y.id, y.submit, y.duration));
            if y.account == "training" {
                assert_eq!(x.request, y.request);
                continue;
            }
            assert!(y.gpu_milli <= x.gpu_milli, "{y:?}");
            // The share it gets holds its GPU memory peak and its busy time.
            let held = y.gpu_milli as f64 / 1000.0;
            assert!(
                held * GPU_MEMORY_MIB >= peak_mib(y, 5, x.gpu_milli),
                "{y:?}"
            );
            assert!(held >= busy(y, 5) * x.gpu_milli as f64 / 1000.0, "{y:?}");
            if y.gpu_milli < x.gpu_milli {
                shrunk += 1;
                // Only where it saves a quarter (or a whole GPU becomes half or less).
                assert!(4 * y.gpu_milli <= 3 * x.gpu_milli, "{y:?}");
            }
            let work = |j: &TraceJob, s| busy_of_charge(j, 5, s) * j.gpu_milli as f64;
            assert!((work(x, plain) - work(y, sized)).abs() < 1e-6);
        }
        assert!(shrunk > b.len() / 4, "{shrunk} of {}", b.len());
    }
}
