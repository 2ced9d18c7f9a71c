//! The bank week's ladder: one replay per strategy added, from a *before* to the
//! defaults, each measured the same way.
//!
//! *Utilisation* is what monitoring shows: per GPU, the busy fraction of its time (the
//! busy fractions of the jobs on it, each times its share of the GPU, summed and
//! capped at 100%), averaged over every GPU and the whole period. *Allocation* is GPU
//! time allocated over GPU time available (per GPU capped at 100% too), its compute
//! share; *allocation counting memory* takes per GPU the larger of its compute and its
//! memory given (a GPU whose memory is all given to shares has no room left for anyone,
//! whatever compute they were given); *GPUs held* counts a GPU whole while any job
//! holds any part of it (the issue's "a GPU counts as allocated while a guaranteed or
//! an opportunistic job holds it"). A job's busy
//! fraction is its modelled average (`crate::usage`), so the cap applies to averages:
//! co-located jobs whose busy minutes overlap would show less (docs/utilisation.md).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use gpuctl_sched::Millis;

use crate::bankday::{BASE, Shape, WINDOW, business};
use crate::replay::Outcome;
use crate::replay::agents::RunRecord;

const HOUR: i64 = 3_600_000;

/// One rung: what is on.
#[derive(Debug, Clone, Copy)]
pub struct Rung {
    pub name: &'static str,
    /// QoS priorities, size and fair-share factors (else FIFO by age), and preemption.
    pub priority: bool,
    pub backfill: bool,
    pub fair_share: bool,
    /// Inference asks for half a GPU (else a whole one).
    pub shares: bool,
    /// The repeat jobs (inference, scoring) are right-sized from their earlier runs
    /// (`gpuctl submit --right-size`).
    pub right_size: bool,
    /// The business-hours window keeps 70% of the GPUs for inference.
    pub window: bool,
    /// Training checkpoints and requeues, so it may borrow the window's floor.
    pub lend: bool,
    /// The repeat jobs (inference, scoring) ask for co-location and are charged what
    /// their earlier runs used.
    pub colocate: bool,
    /// The opportunistic class: the research sweeps run in the idle of GPUs that
    /// guaranteed jobs hold, lent by measured use (`[opportunistic]`).
    pub opportunistic: bool,
    /// Idle stretches lent too (`[idle] lend_after`, 10 minutes by default).
    pub idle_lend: bool,
    /// GPUs capped at night (`NIGHT_CAP`): not a default, a rung beside the ladder.
    pub power_cap: bool,
}

/// A rung with the first `n` strategies on, in the ladder's order: priority with
/// preemption and backfill, fair share, shares, right-sizing, the window, lending,
/// co-location.
const fn rung(name: &'static str, n: u8) -> Rung {
    Rung {
        name,
        priority: n >= 1,
        backfill: n >= 1,
        fair_share: n >= 2,
        shares: n >= 3,
        right_size: n >= 4,
        window: n >= 5,
        lend: n >= 6,
        colocate: n >= 7,
        opportunistic: n >= 8,
        idle_lend: n >= 9,
        power_cap: false,
    }
}

/// The ladder, first *before* and last the defaults.
pub const RUNGS: [Rung; 10] = [
    rung("before: whole GPUs, FIFO", 0),
    rung("+ priority, preemption and backfill", 1),
    rung("+ fair share", 2),
    rung("+ shares for inference", 3),
    rung("+ right-sizing from history", 4),
    rung("+ business-hours window", 5),
    rung("+ lendable floors", 6),
    rung("+ co-location by measured use", 7),
    rung("+ opportunistic co-location of training", 8),
    rung("+ idle stretches lent (the defaults)", 9),
];

/// Beside the ladder: the defaults with every GPU capped at night (20:00-08:00, every
/// day) to 83% of its maximum limit, 250 W of the measured A100s' 300 W, near the
/// least energy of the measurement (`crate::power`). Power caps are not a default.
pub const NIGHT_CAP: Rung = Rung {
    name: "the defaults + GPUs capped to 83% at night",
    power_cap: true,
    ..RUNGS[9]
};

/// The night window of `NIGHT_CAP`.
pub const NIGHT: &str = r#"
[windows.night]
days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
start = "20:00"
end = "08:00"
gpu_power_limit = "83%"
"#;

impl Rung {
    /// The controller config of the rung.
    pub fn config(&self) -> String {
        let mut text = BASE.to_string();
        if !self.priority {
            text = text.replace("min_run = \"5m\"", "enabled = false\nmin_run = \"5m\"");
        }
        if self.window {
            text.push_str(WINDOW);
        }
        if self.power_cap {
            text.push_str(NIGHT);
        }
        if !self.opportunistic {
            text.push_str("[opportunistic]\nenabled = false\n");
        }
        if !self.idle_lend {
            text.push_str("[idle]\nlend_after = \"off\"\n");
        }
        text
    }

    pub fn shape(&self) -> Shape {
        Shape {
            shares: self.shares,
            right_size: self.right_size,
            checkpoints: self.lend,
            colocate: self.colocate,
            opportunistic: self.opportunistic,
        }
    }
}

/// Utilisation and allocation over a period, and hour by hour.
#[derive(Debug, Clone, Default)]
pub struct Measures {
    pub utilization: f64,
    pub allocation: f64,
    /// Per hour of the period: (utilisation, allocation).
    pub hourly: Vec<(f64, f64)>,
    /// Allocation taking per GPU the larger of its compute and its memory given.
    pub allocation_memory: f64,
    /// GPU time some job held any part of (the issue's "a GPU counts as allocated
    /// while a guaranteed or an opportunistic job holds it"), over GPU time available.
    pub held: f64,
    /// Per hour of the period: that share.
    pub hourly_held: Vec<f64>,
}

/// What a run's start or end changes on a GPU: (time, +/- allocated, +/- busy, +/-
/// memory given, +/- one job), in GPU fractions.
type Change = (Millis, f64, f64, f64, i64);

/// Measures the runs of a replay over `[epoch, epoch + period)` on `gpus` GPUs of
/// `gpu_mib` memory each; `busy` gives each job's busy fraction by its trace id.
pub fn measure(
    out: &Outcome,
    busy: &HashMap<u64, f64>,
    epoch: Millis,
    period: Millis,
    gpus: usize,
    gpu_mib: u64,
) -> Measures {
    let mut events: BTreeMap<&str, Vec<Change>> = BTreeMap::new();
    for r in &out.runs {
        let (s, e) = ((r.start - epoch).max(0), (r.end - epoch).min(period));
        if e <= s {
            continue;
        }
        // What it kept busy as it ran (slowed or borrowing), else its modelled mean.
        let b = r
            .busy
            .unwrap_or_else(|| busy.get(&r.trace_id).copied().unwrap_or(0.0));
        for (uuid, milli, mib) in &r.slots {
            let a = f64::from(*milli) / 1000.0;
            let m = *mib as f64 / gpu_mib.max(1) as f64;
            let v = events.entry(uuid.as_str()).or_default();
            v.push((s, a, a * b, m, 1));
            v.push((e, -a, -a * b, -m, -1));
        }
    }
    let hours = (period / HOUR).max(1) as usize;
    let mut hourly = vec![(0.0, 0.0); hours];
    let mut hourly_held = vec![(0.0, 0.0); hours];
    let (mut used, mut held, mut with_memory, mut any) = (0.0, 0.0, 0.0, 0.0);
    for v in events.values_mut() {
        v.sort_by_key(|x| x.0);
        // Jobs on the GPU are counted, not summed as fractions: float sums of shares
        // that come and go do not come back to exactly 0.
        let (mut alloc, mut work, mut mem, mut on, mut t) = (0.0f64, 0.0f64, 0.0f64, 0i64, 0);
        for &(at, da, db, dm, dn) in v.iter() {
            if at > t {
                let (a, b) = (alloc.clamp(0.0, 1.0), work.clamp(0.0, 1.0));
                let h = if on > 0 { 1.0 } else { 0.0 };
                with_memory += alloc.max(mem).clamp(0.0, 1.0) * (at - t) as f64;
                held += a * (at - t) as f64;
                used += b * (at - t) as f64;
                any += h * (at - t) as f64;
                spread(&mut hourly, t, at, a, b);
                spread(&mut hourly_held, t, at, h, 0.0);
                t = at;
            }
            alloc += da;
            work += db;
            mem += dm;
            on += dn;
        }
    }
    let total = gpus as f64 * period as f64;
    for h in &mut hourly {
        *h = (
            h.0 / (gpus as f64 * HOUR as f64),
            h.1 / (gpus as f64 * HOUR as f64),
        );
    }
    Measures {
        utilization: used / total,
        allocation: held / total,
        hourly,
        allocation_memory: with_memory / total,
        held: any / total,
        hourly_held: (hourly_held.iter())
            .map(|h| h.1 / (gpus as f64 * HOUR as f64))
            .collect(),
    }
}

/// Adds `[from, to)` at allocation `a` and busy `b` to the hourly sums (busy first).
fn spread(hourly: &mut [(f64, f64)], from: Millis, to: Millis, a: f64, b: f64) {
    let mut t = from;
    while t < to {
        let slot = (t / HOUR) as usize;
        let stop = ((t / HOUR + 1) * HOUR).min(to);
        if let Some(h) = hourly.get_mut(slot) {
            h.0 += b * (stop - t) as f64;
            h.1 += a * (stop - t) as f64;
        }
        t = stop;
    }
}

/// One rung's figures (fractions 0-1, seconds, GPU-hours).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub rung: String,
    pub utilization: f64,
    pub allocation: f64,
    pub inference_p95_wait_s: f64,
    pub inference_wait_mean_s: f64,
    /// Training work done in the period: GPU-hours of runs that completed, and of the
    /// checkpointed part of runs that were stopped.
    pub training_gpu_hours: f64,
    pub training_wait_mean_s: f64,
    pub scoring_gpu_hours_lost: f64,
    pub scoring_wait_mean_s: f64,
    /// Training GPU-hours run and not kept (stopped after its last checkpoint or
    /// without one).
    pub training_gpu_hours_lost: f64,
    /// Allocation in business hours and outside them (where the rest is lost).
    pub allocation_business: f64,
    pub allocation_night: f64,
    /// Allocation taking per GPU the larger of its compute and its memory given.
    pub allocation_memory: f64,
    /// GPUs some job holds any part of, over the period, in business hours and outside.
    pub gpus_held: f64,
    pub gpus_held_business: f64,
    pub gpus_held_night: f64,
    /// Over the guaranteed jobs' completed runs: run time over run time alone, less 1
    /// (what sharing their GPUs cost them under the interference model).
    pub guaranteed_slowdown_mean: f64,
    /// GPU-hours the opportunistic class kept in borrowed idle (completed runs, and the
    /// checkpointed part of yielded ones).
    pub opportunistic_gpu_hours: f64,
    /// The research sweeps' kept GPU-hours, whatever their class.
    pub research_gpu_hours: f64,
    /// The analysts' notebooks' mean wait (s).
    pub analysts_wait_mean_s: f64,
    /// Over training's completed runs: run time over the work they did, less 1 (what
    /// sharing their GPUs and power caps cost them).
    pub training_slowdown_mean: f64,
    /// What training's GPUs drew (every run, kept or lost) per training GPU-hour done
    /// (kWh; `crate::power`).
    pub training_kwh_per_gpu_hour: f64,
}

fn gpu_hours(ms: Millis, milli: u64) -> f64 {
    ms.max(0) as f64 / HOUR as f64 * milli as f64 / 1000.0
}

/// Work a run kept in `[0, period)` (ms from the epoch): all of it when it completed,
/// else what it saved at its checkpoint.
fn kept(r: &RunRecord, epoch: Millis, period: Millis) -> f64 {
    let s = r.start - epoch;
    let e = if r.completed {
        r.end - epoch
    } else {
        s + r.saved_ms
    };
    gpu_hours(e.min(period) - s.max(0), r.gpu_milli)
}

/// What a run ran and did not keep.
fn lost(r: &RunRecord) -> f64 {
    if r.completed {
        0.0
    } else {
        gpu_hours(r.end - r.start - r.saved_ms, r.gpu_milli)
    }
}

pub fn row(name: &str, out: &Outcome, m: &Measures, epoch: Millis, period: Millis) -> Row {
    let waits = |a: &str, business_only: bool| -> Vec<f64> {
        let mut w: Vec<f64> = out
            .jobs
            .iter()
            .filter(|j| j.account == a && (!business_only || business(j.submit)))
            .map(|j| j.wait_s)
            .collect();
        w.sort_by(f64::total_cmp);
        w
    };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let inference = waits("inference", true);
    let runs = |a: &'static str| out.runs.iter().filter(move |r| r.account == a);
    let training_gpu_hours: f64 = runs("training").map(|r| kept(r, epoch, period)).sum();
    Row {
        rung: name.into(),
        utilization: m.utilization,
        allocation: m.allocation,
        inference_p95_wait_s: crate::percentile(&inference, 95.0),
        inference_wait_mean_s: mean(&inference),
        training_gpu_hours,
        training_wait_mean_s: mean(&waits("training", false)),
        scoring_gpu_hours_lost: runs("scoring").map(lost).sum(),
        scoring_wait_mean_s: mean(&waits("scoring", false)),
        training_gpu_hours_lost: runs("training").map(lost).sum(),
        allocation_business: hourly_mean(&m.hourly, |x| x.1, true),
        allocation_night: hourly_mean(&m.hourly, |x| x.1, false),
        allocation_memory: m.allocation_memory,
        gpus_held: m.held,
        gpus_held_business: hourly_mean(&m.hourly_held, |x| *x, true),
        gpus_held_night: hourly_mean(&m.hourly_held, |x| *x, false),
        guaranteed_slowdown_mean: slowdown_mean(out, |r| !r.opportunistic),
        training_slowdown_mean: slowdown_mean(out, |r| r.account == "training"),
        training_kwh_per_gpu_hour: runs("training").map(|r| r.energy_kwh).sum::<f64>()
            / training_gpu_hours.max(1e-9),
        opportunistic_gpu_hours: out
            .runs
            .iter()
            .filter(|r| r.opportunistic)
            .map(|r| kept(r, epoch, period))
            // An empty f64 sum is -0.0: shown as "-0".
            .sum::<f64>()
            + 0.0,
        research_gpu_hours: runs("research")
            .map(|r| kept(r, epoch, period))
            .sum::<f64>()
            + 0.0,
        analysts_wait_mean_s: mean(&waits("analysts", false)),
    }
}

/// The mean slowdown of the completed runs `which` picks (run time over the work they
/// did, which is their run time alone, less 1).
fn slowdown_mean(out: &Outcome, which: impl Fn(&RunRecord) -> bool) -> f64 {
    let s: Vec<f64> = out
        .runs
        .iter()
        .filter(|r| r.completed && which(r) && r.work_ms > 0)
        .map(|r| ((r.end - r.start) as f64 / r.work_ms as f64 - 1.0).max(0.0))
        .collect();
    s.iter().sum::<f64>() / s.len().max(1) as f64
}

/// Mean of an hourly figure over the business hours of the period (or the others).
fn hourly_mean<T>(hourly: &[T], figure: impl Fn(&T) -> f64, in_business: bool) -> f64 {
    let v: Vec<f64> = hourly
        .iter()
        .enumerate()
        .filter(|(h, _)| business(*h as i64 * HOUR) == in_business)
        .map(|(_, x)| figure(x))
        .collect();
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

pub fn table(rows: &[Row], target: f64) -> String {
    let mut out = format!(
        "| rung | utilisation | allocation | inference wait p95 (s), business hours | under {target:.0} s | inference wait mean (s) | training GPU-h done | training wait mean (h) | training GPU-h lost | scoring wait mean (h) | scoring GPU-h lost | allocation, business hours / other | allocation counting memory | GPUs held (business / other) | guaranteed slowdown | research GPU-h (opportunistic) | analysts' wait mean (s) | training slowdown | training kWh per GPU-h done |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {:.1}% | {:.1}% | {:.0} | {} | {:.0} | {:.0} | {:.1} | {:.0} | {:.1} | {:.1} | {:.1}% / {:.1}% | {:.1}% | {:.1}% ({:.1}% / {:.1}%) | {:.1}% | {:.0} ({:.0}) | {:.0} | {:.1}% | {:.3} |",
            r.rung,
            r.utilization * 100.0,
            r.allocation * 100.0,
            r.inference_p95_wait_s,
            if r.inference_p95_wait_s <= target {
                "yes"
            } else {
                "no"
            },
            r.inference_wait_mean_s,
            r.training_gpu_hours,
            r.training_wait_mean_s / 3600.0,
            r.training_gpu_hours_lost,
            r.scoring_wait_mean_s / 3600.0,
            r.scoring_gpu_hours_lost,
            r.allocation_business * 100.0,
            r.allocation_night * 100.0,
            r.allocation_memory * 100.0,
            r.gpus_held * 100.0,
            r.gpus_held_business * 100.0,
            r.gpus_held_night * 100.0,
            r.guaranteed_slowdown_mean * 100.0,
            r.research_gpu_hours,
            r.opportunistic_gpu_hours,
            r.analysts_wait_mean_s,
            r.training_slowdown_mean * 100.0,
            r.training_kwh_per_gpu_hour,
        );
    }
    out
}

/// Hourly utilisation and allocation, one panel per rung given.
pub fn plot(path: &std::path::Path, hourly: &[(&str, Vec<(f64, f64)>)]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 260 * hourly.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((hourly.len(), 1));
    for ((name, h), area) in hourly.iter().zip(panels) {
        let mut c = ChartBuilder::on(&area)
            .caption(format!("bank week: {name}"), ("sans-serif", 16))
            .margin(6)
            .x_label_area_size(24)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..h.len() as f64, 0f64..100f64)?;
        c.configure_mesh()
            .x_desc("hour of the week (Mon 00:00 = 0)")
            .y_desc("% of GPU time")
            .draw()?;
        for (k, (label, color)) in [("utilisation", &RED), ("allocation", &BLUE)]
            .into_iter()
            .enumerate()
        {
            let points = h.iter().enumerate().map(|(i, x)| {
                let v = if k == 0 { x.0 } else { x.1 };
                (i as f64, v * 100.0)
            });
            c.draw_series(LineSeries::new(points, color))?
                .label(label)
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
    use crate::replay::{JobRecord, Summary};

    fn run(job: u64, start: Millis, end: Millis, slots: &[(&str, u32)]) -> RunRecord {
        let slots: Vec<(&str, u32, u64)> = slots.iter().map(|&(u, m)| (u, m, 0)).collect();
        run_mem(job, start, end, &slots)
    }

    fn run_mem(job: u64, start: Millis, end: Millis, slots: &[(&str, u32, u64)]) -> RunRecord {
        RunRecord {
            job,
            trace_id: job,
            account: "training".into(),
            start,
            end,
            gpu_milli: slots.iter().map(|s| u64::from(s.1)).sum(),
            completed: true,
            saved_ms: 0,
            slots: (slots.iter())
                .map(|(u, m, mib)| (u.to_string(), *m, *mib))
                .collect(),
            work_ms: end - start,
            busy: None,
            opportunistic: false,
            energy_kwh: 0.0,
        }
    }

    fn outcome(runs: Vec<RunRecord>) -> Outcome {
        Outcome {
            summary: Summary::default(),
            samples: Vec::new(),
            users: Vec::new(),
            jobs: Vec::<JobRecord>::new(),
            runs,
        }
    }

    #[test]
    fn utilisation_sums_colocated_jobs_and_caps_each_gpu() {
        // Two GPUs over two hours. g0: job 1 (whole GPU, 50% busy) for an hour; g1:
        // jobs 2 and 3 (half a GPU each, 80% busy... as averages) for two hours, and
        // job 4 (overcommitted: another whole GPU at 90%) for the second hour.
        let out = outcome(vec![
            run(1, 0, HOUR, &[("g0", 1000)]),
            run(2, 0, 2 * HOUR, &[("g1", 500)]),
            run(3, 0, 2 * HOUR, &[("g1", 500)]),
            run(4, HOUR, 2 * HOUR, &[("g1", 1000)]),
        ]);
        let busy: HashMap<u64, f64> = [(1, 0.5), (2, 0.8), (3, 0.8), (4, 0.9)].into();
        let m = measure(&out, &busy, 0, 2 * HOUR, 2, 1000);
        // Busy GPU-hours: g0 0.5; g1 0.8 in hour 1, min(1, 0.8 + 0.9) = 1 in hour 2.
        assert!((m.utilization - (0.5 + 0.8 + 1.0) / 4.0).abs() < 1e-9);
        // Allocated: g0 1 h, g1 2 h (capped at one GPU in hour 2).
        assert!((m.allocation - 3.0 / 4.0).abs() < 1e-9);
        assert!((m.hourly[0].0 - (0.5 + 0.8) / 2.0).abs() < 1e-9);
        assert!((m.hourly[1].1 - 0.5).abs() < 1e-9);
        // Outside the period counts nothing.
        let m = measure(&out, &busy, 5 * HOUR, HOUR, 2, 1000);
        assert_eq!(m.utilization, 0.0);
    }

    #[test]
    fn allocation_counting_memory_and_gpus_held() {
        // Two GPUs of 1,000 MiB over two hours. g0: a quarter of its compute with all its
        // memory for both hours; g1: a quarter of compute and of memory for the first.
        let out = outcome(vec![
            run_mem(1, 0, 2 * HOUR, &[("g0", 250, 1000)]),
            run_mem(2, 0, HOUR, &[("g1", 250, 250)]),
        ]);
        let m = measure(&out, &HashMap::new(), 0, 2 * HOUR, 2, 1000);
        // Compute: 0.25 * 2 h + 0.25 * 1 h of 4 GPU-hours.
        assert!((m.allocation - 0.75 / 4.0).abs() < 1e-9);
        // Counting memory: g0 whole for 2 h, g1 a quarter for 1 h.
        assert!((m.allocation_memory - 2.25 / 4.0).abs() < 1e-9);
        // Held: g0 2 h, g1 1 h.
        assert!((m.held - 3.0 / 4.0).abs() < 1e-9);
        assert!((m.hourly_held[0] - 1.0).abs() < 1e-9);
        assert!((m.hourly_held[1] - 0.5).abs() < 1e-9);
    }

    #[test]
    fn a_stopped_run_keeps_its_checkpoint_and_loses_the_rest() {
        let mut r = run(1, 0, 2 * HOUR, &[("g0", 1000), ("g1", 1000)]);
        r.completed = false;
        r.saved_ms = HOUR;
        assert!((kept(&r, 0, 10 * HOUR) - 2.0).abs() < 1e-9);
        assert!((lost(&r) - 2.0).abs() < 1e-9);
        r.completed = true;
        assert_eq!(lost(&r), 0.0);
        assert!((kept(&r, 0, HOUR) - 2.0).abs() < 1e-9);
    }

    #[test]
    fn the_ladder_starts_before_and_ends_with_the_defaults() {
        let first = &RUNGS[0];
        assert!(!first.priority && !first.backfill && !first.shares && !first.window);
        assert!(first.config().contains("enabled = false"));
        let last = &RUNGS[RUNGS.len() - 1];
        assert!(last.priority && last.backfill && last.fair_share && last.shares);
        assert!(last.right_size && last.window && last.lend && last.colocate);
        assert!(RUNGS[..RUNGS.len() - 3].iter().all(|r| !r.colocate));
        // Each rung adds one strategy to the one before it.
        let on = |r: &Rung| {
            [
                r.priority,
                r.fair_share,
                r.shares,
                r.right_size,
                r.window,
                r.lend,
                r.colocate,
                r.opportunistic,
                r.idle_lend,
            ]
        };
        for w in RUNGS.windows(2) {
            let (a, b) = (on(&w[0]), on(&w[1]));
            let added = a.iter().zip(&b).filter(|(x, y)| !**x && **y).count();
            assert!(added == 1 && a.iter().zip(&b).all(|(x, y)| !x | y), "{w:?}");
        }
        // The defaults' config sets no lending switch: lending is the default, and so
        // are the opportunistic class and idle stretches lent.
        assert!(!last.config().contains("lend_floors"));
        assert!(last.opportunistic && last.idle_lend);
        assert!(!last.config().contains("[opportunistic]") && !last.config().contains("[idle]"));
        let before_class = &RUNGS[RUNGS.len() - 3];
        assert!(
            before_class
                .config()
                .contains("[opportunistic]\nenabled = false")
        );
        let class_only = &RUNGS[RUNGS.len() - 2];
        assert!(class_only.config().contains("lend_after = \"off\""));
        let dir = tempfile::tempdir().unwrap();
        for r in RUNGS {
            let p = dir.path().join("c.toml");
            std::fs::write(&p, r.config()).unwrap();
            let c = gpuctl_core::Config::load(&p).unwrap_or_else(|e| panic!("{}: {e}", r.name));
            assert_eq!(c.opportunistic.enabled, r.opportunistic, "{}", r.name);
            assert_eq!(c.idle.lend_after.is_some(), r.idle_lend, "{}", r.name);
            assert!(!r.config().contains("gpu_power_limit"), "{}", r.name);
        }
    }

    /// The night-cap rung is the defaults and a night window that caps every GPU; the
    /// controller applies it at night only (its own `power_caps`, which the simulated
    /// agents read as gpud does).
    #[test]
    fn the_night_cap_rung_is_the_defaults_capped_at_night() {
        let defaults = &RUNGS[RUNGS.len() - 1];
        assert_eq!(
            NIGHT_CAP.config(),
            defaults
                .config()
                .replacen(WINDOW, &format!("{WINDOW}{NIGHT}"), 1)
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, NIGHT_CAP.config()).unwrap();
        let c = gpuctl_core::Config::load(&p).unwrap();
        let cluster = gpuctl_core::Cluster::new(c);
        // Monday 2024-01-01 (the replay's epoch) 22:00 and 12:00 UTC.
        let monday = 1_704_067_200_000;
        let caps = cluster.power_caps("n1", monday + 22 * HOUR);
        assert_eq!(caps, vec![gpuctl_core::power::PowerCap::ShareMilli(830)]);
        assert!(cluster.power_caps("n1", monday + 12 * HOUR).is_empty());
        assert!(crate::power::cap_effect(0.83).0 > 1.08);
    }
}
