//! `gpuctl efficiency` (like `seff`, GPU-aware): a job's requests against what it used,
//! and advice written as the job-file lines to use next time. Pure: the job record (with
//! its usage) and the time in, the report out.

use crate::record::{
    GpuPart, GpuShare, Job, JobState, JobUsage, Resources, SlotUsage, Step, state_name,
};
use serde::Serialize;

use crate::usage::{mem_peak, util_mean};

/// Ask for what was used plus this much (25%), rounded up.
pub const MARGIN: f64 = 1.25;
/// Advise a smaller request only when it saves at least this part of the old one.
const WORTH: f64 = 0.25;

/// One line of the requested-vs-used table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub what: String,
    pub requested: String,
    pub used: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Efficiency {
    pub job_id: u64,
    pub state: String,
    pub elapsed_secs: u64,
    pub time_limit_secs: u64,
    pub gpu_slots: usize,
    pub gpu_samples: u64,
    /// Mean utilisation against the share, percent (over every slot and sample).
    pub gpu_util_mean: Option<f64>,
    pub gpu_util_max: Option<f64>,
    pub gpu_memory_peak_mib: u64,
    /// The job's GPU memory, mean over samples (of the slot with the highest mean).
    pub gpu_memory_mean_mib: Option<f64>,
    /// Per slot, what it was given (MiB).
    pub gpu_memory_requested_mib: u64,
    pub gpu_energy_j: f64,
    pub cpus_requested: f64,
    /// Mean cores busy per node (`None`: no host figures).
    pub cpus_used_mean: Option<f64>,
    pub memory_requested_bytes: u64,
    pub memory_peak_bytes: Option<u64>,
    pub rows: Vec<Row>,
    /// Job-file lines for next time, each with its evidence after a `#`.
    pub advice: Vec<String>,
    /// Each allocated GPU or slice.
    pub slots: Vec<SlotFigures>,
    /// Its steps (each `srun` or `gpuctl run` in it), in order.
    pub steps: Vec<StepFigures>,
    /// The share of the job's run time during which at least one step ran (the union
    /// of their spans; `None`: no steps). An allocation's idle time is the rest.
    pub steps_busy: Option<f64>,
}

/// One step of the job: what it ran, how long, how it ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepFigures {
    pub id: u32,
    pub name: String,
    pub tasks: u32,
    pub elapsed_secs: u64,
    /// `None`: its end was never recorded (its job ended under it).
    pub exit_code: Option<i32>,
}

/// The steps' figures, and the share of `[start, end]` at least one of them ran (a step
/// with no recorded end ran until `end`).
pub fn step_figures(steps: &[Step], start: i64, end: i64) -> (Vec<StepFigures>, Option<f64>) {
    let span = |st: &Step| {
        let to = if st.end_ms > 0 { st.end_ms } else { end };
        (
            st.start_ms.max(start),
            to.min(end).max(st.start_ms.max(start)),
        )
    };
    let figures = steps
        .iter()
        .map(|st| {
            let (a, b) = span(st);
            StepFigures {
                id: st.id,
                name: st.name.clone(),
                tasks: st.tasks,
                elapsed_secs: ((b - a).max(0) / 1000) as u64,
                exit_code: st.exit_code,
            }
        })
        .collect();
    if steps.is_empty() || end <= start {
        return (figures, None);
    }
    let mut spans: Vec<(i64, i64)> = steps.iter().map(span).collect();
    spans.sort_unstable();
    let (mut busy, mut cur): (i64, Option<(i64, i64)>) = (0, None);
    for (a, b) in spans {
        cur = match cur {
            Some((ca, cb)) if a <= cb => Some((ca, cb.max(b))),
            Some((ca, cb)) => {
                busy += cb - ca;
                Some((a, b))
            }
            None => Some((a, b)),
        };
    }
    if let Some((ca, cb)) = cur {
        busy += cb - ca;
    }
    (figures, Some(busy as f64 / (end - start) as f64))
}

/// One GPU or slice of the job: its share and what it used.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotFigures {
    pub node: String,
    pub uuid: String,
    pub share_milli: u32,
    pub memory_mib: u64,
    pub samples: u64,
    pub util_mean: Option<f64>,
    pub util_max: f64,
    pub memory_peak_mib: u64,
    pub memory_mean_mib: Option<f64>,
    pub energy_j: f64,
}

fn slot_figures(s: &SlotUsage) -> SlotFigures {
    let n = s.samples as f64;
    SlotFigures {
        node: s.node.clone(),
        uuid: s.uuid.clone(),
        share_milli: s.share_milli,
        memory_mib: s.memory_mib,
        samples: s.samples,
        util_mean: (s.samples > 0).then(|| s.util_sum / n),
        util_max: s.util_max,
        memory_peak_mib: s.mem_peak_mib,
        memory_mean_mib: (s.samples > 0).then(|| s.mem_sum_mib / n),
        energy_j: s.energy_j,
    }
}

/// The report for `job` at `now` (Unix ms; a running job's elapsed time runs to it).
pub fn report(job: &Job, now: i64) -> Efficiency {
    let res = job.spec.resources.clone();
    let none = JobUsage::default();
    let usage = job.usage.as_ref().unwrap_or(&none);
    let end = if job.end_time_ms > 0 {
        job.end_time_ms
    } else {
        now
    };
    let elapsed_ms = if job.start_time_ms > 0 {
        (end - job.start_time_ms).max(0)
    } else {
        0
    };
    let nodes = f64::from(res.nodes.max(1));
    let slot_mem = job
        .allocations
        .iter()
        .flat_map(|a| &a.slots)
        .map(|s| s.memory_mib)
        .max()
        .unwrap_or(0);
    let gpu_samples = usage.slots.iter().map(|s| s.samples).sum();
    let util = util_mean(usage);
    let util_max =
        (gpu_samples > 0).then(|| usage.slots.iter().map(|s| s.util_max).fold(0.0, f64::max));
    let peak = mem_peak(usage);
    let cpus = if res.cpu_milli > 0 {
        f64::from(res.cpu_milli) / 1000.0
    } else {
        f64::from(res.cpus.max(1))
    };
    let cpus_used = (usage.host_reports > 0 && elapsed_ms > 0)
        .then(|| usage.cpu_time_ms as f64 / elapsed_ms as f64 / nodes);
    let mem_peak_host = (usage.host_reports > 0 && usage.host_mem_peak_bytes > 0)
        .then_some(usage.host_mem_peak_bytes);
    let mut e = Efficiency {
        job_id: job.id,
        state: state_name(job.state).to_string(),
        elapsed_secs: (elapsed_ms / 1000) as u64,
        time_limit_secs: job.time_limit_secs,
        gpu_slots: usage.slots.len(),
        gpu_samples,
        gpu_util_mean: util,
        gpu_util_max: util_max,
        gpu_memory_peak_mib: peak,
        gpu_memory_mean_mib: usage
            .slots
            .iter()
            .filter(|s| s.samples > 0)
            .map(|s| s.mem_sum_mib / s.samples as f64)
            .reduce(f64::max),
        gpu_memory_requested_mib: slot_mem,
        gpu_energy_j: usage.slots.iter().map(|s| s.energy_j).sum(),
        cpus_requested: cpus,
        cpus_used_mean: cpus_used,
        memory_requested_bytes: res.memory_bytes,
        memory_peak_bytes: mem_peak_host,
        rows: Vec::new(),
        advice: Vec::new(),
        slots: usage.slots.iter().map(slot_figures).collect(),
        steps: Vec::new(),
        steps_busy: None,
    };
    (e.steps, e.steps_busy) = step_figures(&job.steps, job.start_time_ms, end);
    e.rows = rows(&e, &res);
    e.advice = advice(&e, job, &res, usage);
    e
}

fn gib(mib: u64) -> String {
    format!("{:.1} GiB", mib as f64 / 1024.0)
}

fn rows(e: &Efficiency, res: &Resources) -> Vec<Row> {
    let gpu_asked = match &res.gpu {
        Some(GpuPart::Gpus(n)) => format!("{n} GPU(s)"),
        Some(GpuPart::Share(s)) => {
            format!("{:.2} of a GPU", f64::from(s.compute_milli) / 1000.0)
        }
        Some(GpuPart::Mig(m)) => format!("{} x MIG {}", m.count.max(1), m.profile),
        None => "none".to_string(),
    };
    let mut rows = vec![
        Row {
            what: "GPU compute".into(),
            requested: gpu_asked,
            used: match (e.gpu_util_mean, e.gpu_util_max) {
                (Some(mean), Some(max)) => {
                    format!("mean {mean:.1}%, max {max:.1}% of its share")
                }
                _ => "no samples".into(),
            },
        },
        Row {
            what: "GPU memory (per GPU)".into(),
            requested: gib(e.gpu_memory_requested_mib),
            used: if e.gpu_samples > 0 {
                format!("peak {}", gib(e.gpu_memory_peak_mib))
            } else {
                "no samples".into()
            },
        },
        Row {
            what: "Time".into(),
            requested: humantime::format_duration(std::time::Duration::from_secs(
                e.time_limit_secs,
            ))
            .to_string(),
            used: humantime::format_duration(std::time::Duration::from_secs(e.elapsed_secs))
                .to_string(),
        },
        Row {
            what: "CPUs (per node)".into(),
            requested: format!("{}", e.cpus_requested),
            used: e.cpus_used_mean.map_or_else(
                || "not measured".into(),
                |c| format!("{c:.2} busy on average"),
            ),
        },
        Row {
            what: "Host memory (per node)".into(),
            requested: if e.memory_requested_bytes == 0 {
                "none reserved".into()
            } else {
                gib(e.memory_requested_bytes >> 20)
            },
            used: e.memory_peak_bytes.map_or_else(
                || "not measured".into(),
                |b| format!("peak {}", gib(b >> 20)),
            ),
        },
    ];
    if e.gpu_energy_j > 0.0 {
        rows.push(Row {
            what: "GPU energy".into(),
            requested: "-".into(),
            used: format!("{:.3} kWh", e.gpu_energy_j / 3.6e6),
        });
    }
    rows
}

/// Rounds `x` up to a multiple of `step`.
fn round_up(x: f64, step: f64) -> f64 {
    (x / step - 1e-9).ceil() * step
}

const GIB: f64 = (1u64 << 30) as f64;

/// The rules of the advice and of right-sizing (and of the replay's model of it): each
/// takes what was used and what was asked, and gives the smaller request, or `None`
/// where it would not pay.
///
/// A whole GPU as a share: the larger of the busy fraction and the memory fraction,
/// with `MARGIN`, rounded up to 0.05 (at least 0.05), when that is half a GPU or less.
pub fn share_for_whole(busy: f64, mem_frac: f64) -> Option<f64> {
    let share = round_up((busy * MARGIN).max(mem_frac * MARGIN).max(0.05), 0.05);
    (share <= 0.5).then_some(share)
}

/// A share (`had`, a fraction of a GPU) shrunk to its busy and memory fractions of
/// itself, with `MARGIN`, rounded up to 0.05, when that saves a quarter.
pub fn shrunk_share(had: f64, busy: f64, mem_frac: f64) -> Option<f64> {
    let want = round_up(
        (had * busy * MARGIN).max(had * mem_frac * MARGIN).max(0.05),
        0.05,
    );
    cheaper(want, had).then_some(want)
}

/// A time limit (seconds) from the longest run: run x `MARGIN` rounded up to 5 minutes,
/// when that is at most half the limit.
pub fn time_limit_for(run_secs: f64, limit_secs: f64) -> Option<f64> {
    let want = round_up(run_secs * MARGIN, 300.0);
    (want <= limit_secs * 0.5).then_some(want)
}

/// CPUs from the mean busy ones, with `MARGIN`, rounded up (at least 1).
fn cpus_for(used: f64, asked: f64) -> Option<f64> {
    let want = (used * MARGIN).ceil().max(1.0);
    cheaper(want, asked).then_some(want)
}

/// Memory (GiB) from a peak (`unit` bytes, 1 MiB or 1 GiB...), with `MARGIN`, rounded up
/// to a GiB (at least 1), for an ask of `asked` (the same unit).
fn memory_gib_for(peak: f64, asked: f64, unit: f64) -> Option<f64> {
    let want = round_up(peak * unit * MARGIN / GIB, 1.0).max(1.0);
    cheaper(want * GIB / unit, asked).then_some(want)
}

/// Whether `new` saves at least `WORTH` of `old`.
fn cheaper(new: f64, old: f64) -> bool {
    new <= old * (1.0 - WORTH)
}

fn advice(e: &Efficiency, job: &Job, res: &Resources, usage: &JobUsage) -> Vec<String> {
    let mut out = Vec::new();
    let mem_mib = e.gpu_memory_requested_mib as f64;
    // Below a few samples the figures say little.
    let sampled = e.gpu_samples >= 3;
    let peak = e.gpu_memory_peak_mib as f64;
    match &res.gpu {
        Some(GpuPart::Gpus(n)) if sampled => {
            let n = *n;
            // GPUs that did nothing: no compute and no memory to speak of.
            let idle = usage
                .slots
                .iter()
                .filter(|s| {
                    s.samples > 0
                        && s.util_sum / (s.samples as f64) < 1.0
                        && (s.mem_peak_mib as f64) < 0.01 * s.memory_mib.max(1) as f64
                })
                .count() as u32;
            let util = e.gpu_util_mean.unwrap_or(100.0);
            if n == 1 && mem_mib > 0.0 {
                // One whole GPU: would a share have done?
                if let Some(share) = share_for_whole(util / 100.0, peak / mem_mib) {
                    out.push(format!(
                        "gpus = {share:.2}  # GPU busy {util:.0}% on average, memory peak {} of {}",
                        gib(e.gpu_memory_peak_mib),
                        gib(e.gpu_memory_requested_mib)
                    ));
                }
            } else if idle > 0 && idle < n {
                out.push(format!(
                    "gpus = {}  # {idle} of its {n} GPUs did nothing (no compute, no memory)",
                    n - idle
                ));
            } else if idle == n {
                out.push(format!(
                    "gpus = 0  # none of its {n} GPUs did anything (no compute, no memory): does it use the GPU at all?"
                ));
            }
        }
        Some(GpuPart::Share(s)) if sampled => {
            let had = f64::from(s.compute_milli) / 1000.0;
            let util = e.gpu_util_mean.unwrap_or(100.0);
            if (s.memory_mib.is_some() || cheaper(peak * MARGIN, mem_mib))
                && let Some(want) = memory_gib_for(peak, mem_mib, (1 << 20) as f64)
            {
                out.push(format!(
                    "gpu_memory = \"{want:.0}GiB\"  # GPU memory peak {} of {}",
                    gib(e.gpu_memory_peak_mib),
                    gib(e.gpu_memory_requested_mib)
                ));
            }
            if let Some(compute) = shrunk_share(had, util / 100.0, 0.0)
                && s.memory_mib.is_none()
            {
                out.push(format!(
                    "gpus = {compute:.2}  # busy {util:.0}% of its {had:.2} share on average"
                ));
            }
        }
        _ => {}
    }
    let state = job.state;
    if state == JobState::Completed
        && e.elapsed_secs > 0
        && e.time_limit_secs > 0
        && let Some(want) = time_limit_for(e.elapsed_secs as f64, e.time_limit_secs as f64)
    {
        let d = std::time::Duration::from_secs(want as u64);
        out.push(format!(
            "time_limit = \"{}\"  # ran {} of {}",
            humantime::format_duration(d),
            humantime::format_duration(std::time::Duration::from_secs(e.elapsed_secs)),
            humantime::format_duration(std::time::Duration::from_secs(e.time_limit_secs))
        ));
    }
    if let Some(used) = e.cpus_used_mean
        && let Some(want) = cpus_for(used, e.cpus_requested)
    {
        out.push(format!(
            "cpus = {want:.0}  # {used:.2} CPUs busy on average of {}",
            e.cpus_requested
        ));
    }
    if let Some(peak) = e.memory_peak_bytes
        && e.memory_requested_bytes > 0
        && let Some(want) = memory_gib_for(peak as f64, e.memory_requested_bytes as f64, 1.0)
    {
        out.push(format!(
            "memory = \"{want:.0}GiB\"  # host memory peak {} of {}",
            gib(peak >> 20),
            gib(e.memory_requested_bytes >> 20)
        ));
    }
    out
}

#[cfg(test)]
mod tests;

/// How many earlier runs right-sizing looks at.
pub const RIGHT_SIZE_RUNS: usize = 5;

/// Shrinks `res` to what `runs` (reports of earlier completed runs of the same job,
/// latest first) needed at most, with `MARGIN`, where that saves at least a quarter;
/// `limit` is the time limit the job would get. Returns one line per change (or why
/// nothing changed). Several whole GPUs are left as asked: which GPUs a multi-GPU job
/// can do without is the user's call, not a guess.
pub fn right_size(res: &mut Resources, limit: u64, runs: &[Efficiency]) -> Vec<String> {
    let mut notes = Vec::new();
    let sampled: Vec<&Efficiency> = runs.iter().filter(|e| e.gpu_samples >= 3).collect();
    let n = runs.len();
    // The most any of `of` used, by `f`.
    fn most<'a>(
        of: impl IntoIterator<Item = &'a Efficiency>,
        f: impl Fn(&Efficiency) -> Option<f64>,
    ) -> Option<f64> {
        of.into_iter().filter_map(f).reduce(f64::max)
    }
    if !sampled.is_empty() {
        let util = most(sampled.iter().copied(), |e| e.gpu_util_mean).unwrap_or(100.0);
        let mem_frac = most(sampled.iter().copied(), |e| {
            (e.gpu_memory_requested_mib > 0)
                .then(|| e.gpu_memory_peak_mib as f64 / e.gpu_memory_requested_mib as f64)
        })
        .unwrap_or(1.0);
        let peak_mib = most(sampled.iter().copied(), |e| {
            Some(e.gpu_memory_peak_mib as f64)
        })
        .unwrap_or(0.0);
        match res.gpu.clone() {
            Some(GpuPart::Gpus(1)) => {
                if let Some(share) = share_for_whole(util / 100.0, mem_frac) {
                    res.gpu = Some(GpuPart::Share(GpuShare {
                        compute_milli: (share * 1000.0).round() as u32,
                        memory_mib: None,
                    }));
                    notes.push(format!(
                        "right-size: gpus 1 -> {share:.2} (last {} run(s): GPU busy {util:.0}% on average at most, memory peak {:.0}% of the GPU)",
                        sampled.len(),
                        mem_frac * 100.0
                    ));
                }
            }
            Some(GpuPart::Share(mut s)) => {
                let had = f64::from(s.compute_milli) / 1000.0;
                match s.memory_mib {
                    Some(m) => {
                        let mib = (1u64 << 20) as f64;
                        if let Some(gib_want) = memory_gib_for(peak_mib, m as f64, mib) {
                            let want = gib_want * 1024.0;
                            s.memory_mib = Some(want as u64);
                            notes.push(format!(
                                "right-size: gpu_memory {} -> {} (GPU memory peak {})",
                                gib(m),
                                gib(want as u64),
                                gib(peak_mib as u64)
                            ));
                        }
                    }
                    None => {
                        if let Some(want) = shrunk_share(had, util / 100.0, mem_frac) {
                            s.compute_milli = (want * 1000.0).round() as u32;
                            notes.push(format!(
                                "right-size: gpus {had:.2} -> {want:.2} (busy {util:.0}% of its share on average at most)"
                            ));
                        }
                    }
                }
                res.gpu = Some(GpuPart::Share(s));
            }
            _ => {}
        }
    }
    let longest = most(runs, |e| {
        (e.elapsed_secs > 0).then_some(e.elapsed_secs as f64)
    });
    if let Some(ran) = longest
        && limit > 0
        && let Some(want) = time_limit_for(ran, limit as f64)
    {
        res.time_limit_secs = want as u64;
        notes.push(format!(
            "right-size: time_limit {} -> {} (longest run {})",
            humantime::format_duration(std::time::Duration::from_secs(limit)),
            humantime::format_duration(std::time::Duration::from_secs(want as u64)),
            humantime::format_duration(std::time::Duration::from_secs(ran as u64))
        ));
    }
    if let Some(used) = most(runs, |e| e.cpus_used_mean) {
        let asked = if res.cpu_milli > 0 {
            f64::from(res.cpu_milli) / 1000.0
        } else {
            f64::from(res.cpus.max(1))
        };
        if let Some(want) = cpus_for(used, asked) {
            res.cpus = want as u32;
            res.cpu_milli = 0;
            notes.push(format!(
                "right-size: cpus {asked} -> {want:.0} ({used:.2} busy on average at most)"
            ));
        }
    }
    if let Some(peak) = most(runs, |e| e.memory_peak_bytes.map(|b| b as f64))
        && res.memory_bytes > 0
        && let Some(gib_want) = memory_gib_for(peak, res.memory_bytes as f64, 1.0)
    {
        let want = gib_want * GIB;
        notes.push(format!(
            "right-size: memory {} -> {} (host memory peak {})",
            gib(res.memory_bytes >> 20),
            gib(want as u64 >> 20),
            gib(peak as u64 >> 20)
        ));
        res.memory_bytes = want as u64;
    }
    if notes.is_empty() {
        notes.push(if n == 0 {
            "right-size: no earlier completed run of this name with usage figures; the request is as written".into()
        } else {
            format!("right-size: the last {n} run(s) used about what is asked; nothing changed")
        });
    }
    notes
}
