//! The bank-day scenario: a week on 16 nodes x 8 A100s of a bank's GPU cluster.
//! Online inference (short half-GPU jobs in daytime bursts, QoS `high`), model
//! training (long 2-8 GPU jobs all week, QoS `normal`, not preemptible) and overnight
//! batch scoring (1-GPU jobs in the evening, QoS `low`, requeued when preempted, with a
//! checkpoint signal). Replayed three ways through the controller's state machine:
//! - `windows`: backfill, fair share, and a business-hours window (Mon-Fri
//!   08:00-20:00) that keeps 70% of the GPUs for inference;
//! - `no-windows`: the same without the window;
//! - `priority`: plain priority order (no backfill, no fair share, no window).
//!
//! Reported: inference's wait in business hours (mean, p95) against the target, and
//! training's GPU-hours at night and in all, and the work scoring lost to preemption.
//! The workload is drawn from a seeded generator (the same seed, the same week).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use rand::{Rng, SeedableRng};

use gpuctl_core::Config;
use gpuctl_sched::packing::Policy;
use gpuctl_sched::priority::PriorityWeights;
use gpuctl_sched::{GpuRequest, Millis, Request};

use crate::replay::{Outcome, TraceJob, parse_cluster, replay};

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

fn job(
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
    }
}

/// The week's jobs, in submit order.
pub fn workload(seed: u64) -> Vec<TraceJob> {
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
        let share = GpuRequest::Share {
            compute_milli: Some(500),
            memory_mib: None,
        };
        jobs.push(job(next(), t, dur, share, 500, "inference", "high"));
    }
    for day in 0..5 {
        for h in 8..20 {
            let at = (day * 24 + h) as f64 * 3600.0;
            for _ in 0..80 {
                let dur = 300.0 + exp(&mut rng, 600.0).min(1800.0);
                let share = GpuRequest::Share {
                    compute_milli: Some(500),
                    memory_mib: None,
                };
                let t = at + rng.random::<f64>() * 300.0;
                jobs.push(job(next(), t, dur, share, 500, "inference", "high"));
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
        jobs.push(job(
            next(),
            t,
            dur,
            whole,
            u64::from(gpus) * 1000,
            "training",
            "normal",
        ));
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
    jobs.sort_by_key(|j| (j.submit, j.id));
    jobs
}

/// One variant's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub variant: String,
    pub inference_jobs_business: usize,
    pub inference_wait_mean_s: f64,
    pub inference_wait_p95_s: f64,
    pub training_gpu_hours: f64,
    pub training_gpu_hours_night: f64,
    pub training_wait_mean_s: f64,
    pub scoring_gpu_hours_lost: f64,
    /// GPU-hours run within the scenario's days over the GPU-hours there were.
    pub util_in_period: f64,
}

/// GPU-hours of `[start, end)` (ms from the epoch) outside business hours.
fn night_hours(start: Millis, end: Millis, milli: u64) -> f64 {
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

fn row(variant: &str, out: &Outcome, epoch: Millis, period: Millis, gpus: f64) -> Row {
    let in_period: f64 = out
        .runs
        .iter()
        .map(|r| {
            let (s, e) = ((r.start - epoch).max(0), (r.end - epoch).min(period));
            (e - s).max(0) as f64 / HOUR as f64 * r.gpu_milli as f64 / 1000.0
        })
        .sum();
    let mut waits: Vec<f64> = out
        .jobs
        .iter()
        .filter(|j| j.account == "inference" && business(j.submit))
        .map(|j| j.wait_s)
        .collect();
    waits.sort_by(f64::total_cmp);
    let training: Vec<f64> = out
        .jobs
        .iter()
        .filter(|j| j.account == "training")
        .map(|j| j.wait_s)
        .collect();
    let hours = |r: &crate::replay::agents::RunRecord| {
        (r.end - r.start) as f64 / HOUR as f64 * r.gpu_milli as f64 / 1000.0
    };
    let runs = |a: &'static str| out.runs.iter().filter(move |r| r.account == a);
    Row {
        variant: variant.into(),
        inference_jobs_business: waits.len(),
        inference_wait_mean_s: waits.iter().sum::<f64>() / waits.len().max(1) as f64,
        inference_wait_p95_s: crate::percentile(&waits, 95.0),
        training_gpu_hours: runs("training").map(hours).sum(),
        training_gpu_hours_night: runs("training")
            .map(|r| night_hours(r.start - epoch, r.end - epoch, r.gpu_milli))
            .sum(),
        training_wait_mean_s: training.iter().sum::<f64>() / training.len().max(1) as f64,
        scoring_gpu_hours_lost: runs("scoring")
            .filter(|r| !r.completed)
            .map(hours)
            .sum::<f64>()
            + 0.0,
        util_in_period: in_period / (gpus * period as f64 / HOUR as f64),
    }
}

/// Replays the week three ways; writes `bankday.md`, `bankday.json` and
/// `bankday-hourly.svg` (GPUs in use per account, hour by hour) to `out`.
pub fn main(a: Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let nodes = parse_cluster("16x8xA100-80GB")?;
    let cut = i64::from(a.days.min(7)) * DAY;
    let jobs: Vec<TraceJob> = workload(a.seed)
        .into_iter()
        .filter(|j| j.submit < cut)
        .collect();
    let epoch = 1_704_067_200_000; // Monday 2024-01-01 00:00 UTC
    let parse = |text: &str| -> anyhow::Result<Config> {
        let p = a.out.join("bankday-config.toml");
        std::fs::write(&p, text)?;
        Ok(Config::load(&p)?)
    };
    let with = parse(&format!("{BASE}{WINDOW}"))?;
    let without = parse(BASE)?;
    std::fs::write(a.out.join("bankday-config.toml"), format!("{BASE}{WINDOW}"))?;
    let mut rows = Vec::new();
    let mut hourly = Vec::new();
    for (variant, base, backfill) in [
        ("windows", &with, true),
        ("no-windows", &without, true),
        ("priority", &without, false),
    ] {
        let mut weights = base.scheduler.priority.clone();
        if !backfill {
            weights = PriorityWeights {
                fair_share: 0,
                ..weights
            };
        }
        let config = gpuctl_sched::SchedConfig {
            policy: Policy::FirstFit,
            weights,
            backfill,
            expected_starts: false,
            ..gpuctl_sched::SchedConfig::default()
        };
        let out = replay(&nodes, &jobs, &config, base, variant, epoch);
        hourly.push((variant, per_hour(&out, epoch)));
        rows.push(row(variant, &out, epoch, cut, 128.0));
    }
    let md = table(&rows, a.target_p95_s);
    std::fs::write(a.out.join("bankday.md"), &md)?;
    std::fs::write(
        a.out.join("bankday.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    plot(&a.out.join("bankday-hourly.svg"), &hourly)?;
    print!("{md}");
    Ok(())
}

/// GPUs in use per account, hour by hour: (inference, training, scoring).
fn per_hour(out: &Outcome, epoch: Millis) -> Vec<[f64; 3]> {
    let mut h = vec![[0.0; 3]; 7 * 24];
    for r in &out.runs {
        let k = match r.account.as_str() {
            "inference" => 0,
            "training" => 1,
            _ => 2,
        };
        let (mut t, end) = (r.start - epoch, r.end - epoch);
        while t < end {
            let slot = (t / HOUR) as usize;
            let stop = ((t / HOUR + 1) * HOUR).min(end);
            if let Some(x) = h.get_mut(slot) {
                x[k] += (stop - t) as f64 / HOUR as f64 * r.gpu_milli as f64 / 1000.0;
            }
            t = stop;
        }
    }
    h
}

fn table(rows: &[Row], target: f64) -> String {
    let mut out = format!(
        "| variant | inference jobs (business hours) | inference wait mean (s) | inference wait p95 (s) | p95 under {target:.0} s | training GPU-h | training GPU-h at night | training wait mean (h) | scoring GPU-h lost to preemption | GPU utilisation in the period |\n|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1}% |",
            r.variant,
            r.inference_jobs_business,
            r.inference_wait_mean_s,
            r.inference_wait_p95_s,
            if r.inference_wait_p95_s <= target {
                "yes"
            } else {
                "no"
            },
            r.training_gpu_hours,
            r.training_gpu_hours_night,
            r.training_wait_mean_s / 3600.0,
            r.scoring_gpu_hours_lost,
            r.util_in_period * 100.0
        );
    }
    out
}

fn plot(path: &std::path::Path, hourly: &[(&str, Vec<[f64; 3]>)]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 260 * hourly.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((hourly.len(), 1));
    for ((variant, h), area) in hourly.iter().zip(panels) {
        let mut c = ChartBuilder::on(&area)
            .caption(format!("bank day: {variant}"), ("sans-serif", 16))
            .margin(6)
            .x_label_area_size(24)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..168f64, 0f64..130f64)?;
        c.configure_mesh()
            .x_desc("hour of the week (Mon 00:00 = 0)")
            .y_desc("GPUs")
            .draw()?;
        for (k, (name, color)) in [
            ("inference", &RED),
            ("training", &BLUE),
            ("scoring", &GREEN),
        ]
        .into_iter()
        .enumerate()
        {
            c.draw_series(LineSeries::new(
                h.iter().enumerate().map(|(i, x)| (i as f64, x[k])),
                color,
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
        c.configure_series_labels()
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
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
}
