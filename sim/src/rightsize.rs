//! What right-sizing would have saved: a trace's jobs as submitted, and the same jobs
//! with their requests shrunk the way `gpuctl submit --right-size` shrinks them
//! (`gpuctl_core::efficiency`'s margin and rounding) from their recorded usage.
//!
//! Neither trace here records usage (Philly's converted trace and Alibaba's pods list
//! have requests and times only), so usage is modelled, per job and deterministically
//! (a hash of the seed and the job's id), by the calibrated model of `crate::usage`:
//! whole-GPU jobs as Philly's training jobs (GPU-hour weighted mean 50%), shares as
//! the instances of Alibaba PAI's mixed fleet (median 1.5%, mean 10.5%). A job runs as
//! long right-sized as as submitted (a share of what it used is enough; interference
//! between shares is not modelled).

use gpuctl_core::efficiency::{share_for_whole, shrunk_share, time_limit_for};
use gpuctl_sched::GpuRequest;

use crate::replay::TraceJob;
use crate::usage::{self, Kind};

/// The modelled fraction of its GPU request `j` keeps busy (`crate::usage`).
pub fn modelled_util(j: &TraceJob, seed: u64) -> f64 {
    let kind = match j.request.gpu {
        GpuRequest::Whole { .. } => Kind::Training,
        _ => Kind::Instance,
    };
    usage::busy(
        kind,
        j.duration as f64 / 1000.0,
        usage::uniform(seed, j.id, 0),
    )
}

/// What right-sizing changed over a trace.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Changes {
    pub jobs: usize,
    /// Whole single GPUs turned into shares, and shares shrunk.
    pub to_share: usize,
    pub shares_shrunk: usize,
    pub time_limits_cut: usize,
    /// GPU-hours requested (request x duration), before and after.
    pub gpu_hours_before: f64,
    pub gpu_hours_after: f64,
    /// GPU-hours the jobs keep busy (the same either way).
    pub gpu_hours_used: f64,
}

/// Shrinks each job's request to its modelled use with the rules of
/// `efficiency::right_size` (the same functions: `share_for_whole`, `shrunk_share`,
/// `time_limit_for`): a whole single GPU becomes a share when use x 1.25 fits in half a
/// GPU, a share shrinks when that saves a quarter of it, time limits become the run
/// time x 1.25 rounded up to 5 minutes when that is at most half of them. Multi-GPU jobs
/// keep their GPUs.
pub fn right_size(jobs: &mut [TraceJob], seed: u64) -> Changes {
    let mut c = Changes {
        jobs: jobs.len(),
        ..Changes::default()
    };
    for j in jobs.iter_mut() {
        let u = modelled_util(j, seed);
        let hours = j.duration as f64 / 3.6e6;
        c.gpu_hours_before += j.gpu_milli as f64 / 1000.0 * hours;
        c.gpu_hours_used += j.gpu_milli as f64 / 1000.0 * u * hours;
        match j.request.gpu {
            GpuRequest::Whole { count: 1 } if j.request.nodes <= 1 => {
                if let Some(share) = share_for_whole(u, 0.0) {
                    let milli = (share * 1000.0).round() as u32;
                    j.request.gpu = GpuRequest::Share {
                        compute_milli: Some(milli),
                        memory_mib: None,
                    };
                    j.gpu_milli = u64::from(milli);
                    c.to_share += 1;
                }
            }
            // (The Alibaba pods ask for no GPU memory: `Some(0)`.)
            GpuRequest::Share {
                compute_milli: Some(had),
                memory_mib,
            } if memory_mib.is_none_or(|m| m == 0) => {
                if let Some(want) = shrunk_share(f64::from(had) / 1000.0, u, 0.0) {
                    let milli = (want * 1000.0).round() as u32;
                    j.request.gpu = GpuRequest::Share {
                        compute_milli: Some(milli),
                        memory_mib,
                    };
                    j.gpu_milli = u64::from(milli);
                    c.shares_shrunk += 1;
                }
            }
            _ => {}
        }
        let (run_s, limit_s) = (j.duration as f64 / 1000.0, j.time_limit as f64 / 1000.0);
        if let Some(limit) = time_limit_for(run_s, limit_s) {
            j.time_limit = ((limit * 1000.0) as i64).max(j.duration);
            c.time_limits_cut += 1;
        }
        c.gpu_hours_after += j.gpu_milli as f64 / 1000.0 * hours;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_sched::Request;

    #[test]
    fn the_model_is_the_calibrated_one_by_request() {
        let job = |id, gpu| TraceJob {
            id,
            duration: 3_600_000,
            request: Request {
                gpu,
                ..Request::whole(1)
            },
            ..TraceJob::default()
        };
        let whole = job(42, GpuRequest::Whole { count: 1 });
        assert_eq!(modelled_util(&whole, 7), modelled_util(&whole, 7));
        assert_ne!(modelled_util(&whole, 7), modelled_util(&whole, 8));
        let u = usage::uniform(7, 42, 0);
        assert_eq!(
            modelled_util(&whole, 7),
            usage::busy(Kind::Training, 3600.0, u)
        );
        let share = GpuRequest::Share {
            compute_milli: Some(500),
            memory_mib: None,
        };
        assert_eq!(
            modelled_util(&job(42, share), 7),
            usage::busy(Kind::Instance, 3600.0, u)
        );
    }

    #[test]
    fn requests_shrink_as_the_cli_would() {
        let job = |id, gpu: GpuRequest, dur_s: i64, limit_s: i64| TraceJob {
            id,
            duration: dur_s * 1000,
            time_limit: limit_s * 1000,
            gpu_milli: match gpu {
                GpuRequest::Whole { count } => u64::from(count) * 1000,
                GpuRequest::Share { compute_milli, .. } => u64::from(compute_milli.unwrap_or(0)),
                _ => 0,
            },
            request: Request {
                gpu,
                ..Request::whole(1)
            },
            ..TraceJob::default()
        };
        // Find ids with a low and a high modelled use.
        let one = |i| job(i, GpuRequest::Whole { count: 1 }, 600, 7200);
        let low = (0..).find(|&i| modelled_util(&one(i), 1) < 0.3).unwrap();
        let high = (0..).find(|&i| modelled_util(&one(i), 1) > 0.42).unwrap();
        let mut jobs = vec![
            job(low, GpuRequest::Whole { count: 1 }, 600, 7200),
            job(high, GpuRequest::Whole { count: 1 }, 600, 1000),
            job(low, GpuRequest::Whole { count: 4 }, 600, 7200),
        ];
        let c = right_size(&mut jobs, 1);
        let u = modelled_util(&one(low), 1);
        let want = ((u * 1.25 / 0.05 - 1e-9).ceil() * 50.0).round() as u32;
        assert_eq!(
            jobs[0].request.gpu,
            GpuRequest::Share {
                compute_milli: Some(want),
                memory_mib: None
            }
        );
        // 600 s x 1.25 = 750 s -> 15 minutes, at most half of 2 hours.
        assert_eq!(jobs[0].time_limit, 900_000);
        // Busy: a whole GPU stays; its limit is under twice the run: it stays too.
        assert_eq!(jobs[1].request.gpu, GpuRequest::Whole { count: 1 });
        assert_eq!(jobs[1].time_limit, 1_000_000);
        // Four GPUs stay four.
        assert_eq!(jobs[2].request.gpu, GpuRequest::Whole { count: 4 });
        assert_eq!((c.to_share, c.time_limits_cut), (1, 2));
        assert!(c.gpu_hours_after < c.gpu_hours_before);
    }
}

/// One policy's replay as submitted against right-sized.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Comparison {
    pub policy: String,
    pub packing: String,
    pub wait_mean_s: [f64; 2],
    pub wait_p95_s: [f64; 2],
    pub bounded_slowdown_mean: [f64; 2],
    pub makespan_s: [f64; 2],
    /// Allocated GPU-time over available while jobs waited, and from the first submit
    /// to the last end (a trace's long tail stretches the latter).
    pub util_backlogged: [f64; 2],
    pub util_overall: [f64; 2],
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    pub changes: Changes,
    pub runs: Vec<Comparison>,
}

/// Pairs each policy's as-submitted summary with its right-sized one (`-rightsized`).
pub fn compare(rows: &[crate::replay::Summary], changes: &Changes) -> Report {
    let runs = rows
        .iter()
        .filter(|r| !r.policy.ends_with("-rightsized"))
        .filter_map(|a| {
            let b = rows.iter().find(|b| {
                b.packing == a.packing && b.policy == format!("{}-rightsized", a.policy)
            })?;
            Some(Comparison {
                policy: a.policy.clone(),
                packing: a.packing.clone(),
                wait_mean_s: [a.wait_mean_s, b.wait_mean_s],
                wait_p95_s: [a.wait_p95_s, b.wait_p95_s],
                bounded_slowdown_mean: [a.bounded_slowdown_mean, b.bounded_slowdown_mean],
                makespan_s: [a.makespan_s, b.makespan_s],
                util_backlogged: [a.util_backlogged, b.util_backlogged],
                util_overall: [a.util_overall, b.util_overall],
            })
        })
        .collect();
    Report {
        changes: changes.clone(),
        runs,
    }
}

/// The comparison as a Markdown table.
pub fn table(r: &Report) -> String {
    let c = &r.changes;
    let mut s = format!(
        "Right-sized {} jobs: {} whole GPUs to shares, {} shares shrunk, {} time limits cut; GPU-hours requested {:.0} -> {:.0} (used, modelled: {:.0})\n\n",
        c.jobs,
        c.to_share,
        c.shares_shrunk,
        c.time_limits_cut,
        c.gpu_hours_before,
        c.gpu_hours_after,
        c.gpu_hours_used
    );
    s.push_str("| policy | packing | wait mean (s) | wait p95 (s) | bounded slowdown | makespan (h) | util while backlogged | util overall |\n|---|---|---|---|---|---|---|---|\n");
    let pair = |x: [f64; 2], k: f64, d: usize| format!("{:.d$} -> {:.d$}", x[0] * k, x[1] * k);
    for run in &r.runs {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            run.policy,
            run.packing,
            pair(run.wait_mean_s, 1.0, 0),
            pair(run.wait_p95_s, 1.0, 0),
            pair(run.bounded_slowdown_mean, 1.0, 2),
            pair(run.makespan_s, 1.0 / 3600.0, 1),
            pair(run.util_backlogged, 100.0, 1),
            pair(run.util_overall, 100.0, 1),
        ));
    }
    s
}
