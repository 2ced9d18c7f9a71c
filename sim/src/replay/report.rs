//! The replay's output: the utilisation timeline (CSV, SVG) and the summary table.

use std::fmt::Write as _;
use std::path::Path;

use super::{Sample, Summary, UserSummary};

pub(super) fn timeline_csv(samples: &[Sample], capacity: u64) -> String {
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

pub(super) fn plot(
    path: &Path,
    samples: &[Sample],
    capacity: u64,
    title: &str,
) -> anyhow::Result<()> {
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

/// Per user (virtual cluster): jobs, GPU-hours, mean wait and bounded slowdown.
pub(super) fn users_csv(users: &[UserSummary]) -> String {
    let mut out = String::from("user,jobs,gpu_hours,wait_mean_s,bounded_slowdown_mean\n");
    for u in users {
        let _ = writeln!(
            out,
            "{},{},{:.1},{:.1},{:.3}",
            u.user, u.jobs, u.gpu_hours, u.wait_mean_s, u.bounded_slowdown_mean
        );
    }
    out
}
