//! `gpuctl report`: GPU-hours allocated against used over a window, by user, account or
//! partition, the top wasters and the load by weekday and hour
//! (`gpuctl_core::report`), as a table, JSON or an SVG picture.

use std::path::{Path, PathBuf};

use gpuctl_core::report::{self, By, Figures, Report};
use gpuctl_proto as pb;

use super::View;
use super::history::parse_when;
use crate::cli::{Client, Failure, fail};
use crate::format;

#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// The window's start: a duration ago (`7d`), a date or a time (UTC).
    #[arg(short = 'S', long, default_value = "7d")]
    pub since: String,
    /// The window's end (same forms). Default: now.
    #[arg(short = 'E', long)]
    pub until: Option<String>,
    /// Group by user, account or partition.
    #[arg(long, default_value = "user")]
    pub by: String,
    #[arg(long)]
    pub json: bool,
    /// Also draw the report as an SVG picture: the load by weekday and hour, and each
    /// group's GPU-hours allocated, used and idle.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

pub struct ReportView(pub Report);

impl serde::Serialize for ReportView {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(ser)
    }
}

fn pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.1}%"))
}

fn figures_row(name: &str, f: &Figures) -> Vec<String> {
    vec![
        format::printable(name).into_owned(),
        f.jobs.to_string(),
        format!("{:.1}", f.gpu_hours_allocated),
        format!("{:.1}", f.gpu_hours_borrowed),
        format!("{:.1}", f.gpu_hours_used),
        pct(f.gpu_efficiency_pct),
        format!("{:.1}", f.gpu_hours_idle),
        format!("{:.0}", f.gpu_memory_unused_gib_hours),
        pct(f.time_limit_used_pct),
        format!("{:.1}", f.energy_kwh),
        f.kwh_per_busy_gpu_hour
            .map_or("-".into(), |k| format!("{k:.2}")),
    ]
}

const HEADER: [&str; 11] = [
    "",
    "JOBS",
    "GPU-H ALLOC",
    "GPU-H BORROWED",
    "GPU-H USED",
    "EFFICIENCY",
    "GPU-H IDLE",
    "UNUSED GPU MEM GIB-H",
    "TIME LIMIT USED",
    "KWH",
    "KWH/BUSY GPU-H",
];

impl View for ReportView {
    fn text(&self) -> String {
        let r = &self.0;
        let t = &r.total;
        let mut text = format!(
            "GPU use from {} to {} (UTC), by {}\n\n",
            format::short_time(r.since_ms),
            format::short_time(r.until_ms),
            r.by
        );
        if let Some(c) = &r.cluster {
            text.push_str(&format!(
                "Cluster: {} GPUs, {:.0} GPU-hours in the window: utilisation {:.1}%, allocation {:.1}% ({:.0}% of the allocated GPU-hours measured)\n\n",
                c.gpus,
                c.gpu_hours_available,
                c.utilization * 100.0,
                c.allocation * 100.0,
                c.measured * 100.0
            ));
        }
        let mut rows = vec![figures_row("TOTAL", t)];
        rows.extend(r.groups.iter().map(|g| figures_row(&g.name, &g.figures)));
        text.push_str(&format::table(&HEADER, rows));
        text.push_str(&format!(
            "\nUnmeasured GPU-hours (no samples): {:.1}. Jobs that used under half their time limit: {}.\n",
            t.gpu_hours_allocated - t.gpu_hours_measured,
            t.time_limit_over_2x
        ));
        if !r.top_wasters.is_empty() {
            text.push_str("\nTop wasters (GPU-hours allocated and not used):\n");
            for w in &r.top_wasters {
                text.push_str(&format!(
                    "  {:<20} {:>8.1} GPU-h ({} used)\n",
                    format::printable(&w.name),
                    w.figures.gpu_hours_wasted(),
                    pct(w.figures.gpu_efficiency_pct)
                ));
            }
        }
        if !r.windows.is_empty() {
            text.push_str("\nEnergy while each time window was open:\n");
            for w in &r.windows {
                text.push_str(&format!(
                    "  {:<20} {:>7.1} h open {:>9.1} kWh {:>9.1} busy GPU-h {:>6} kWh/busy GPU-h\n",
                    format::printable(&w.name),
                    w.hours_open,
                    w.energy_kwh,
                    w.gpu_hours_used,
                    w.kwh_per_busy_gpu_hour
                        .map_or("-".into(), |k| format!("{k:.2}"))
                ));
            }
        }
        text.push_str("\nGPUs allocated by weekday and hour (GPU-hours, UTC):\n");
        let mut header = vec!["".to_string()];
        header.extend((0..24).map(|h| format!("{h:02}")));
        let header: Vec<&str> = header.iter().map(String::as_str).collect();
        let rows = DAYS
            .iter()
            .zip(&r.demand_gpu_hours)
            .map(|(d, hours)| {
                let mut row = vec![d.to_string()];
                row.extend(hours.iter().map(|&x| format!("{x:.0}")));
                row
            })
            .collect();
        text.push_str(&format::table(&header, rows));
        text
    }
}

/// Energy while each of the controller's time windows was open over [since, until).
async fn window_energy(
    client: &mut Client,
    jobs: &[gpuctl_core::record::Job],
    since: i64,
    until: i64,
    now: i64,
) -> Result<Vec<report::WindowEnergy>, Failure> {
    let w = client.windows(pb::WindowsRequest {}).await?.into_inner();
    if w.windows.is_empty() {
        return Ok(Vec::new());
    }
    let tz = gpuctl_core::windows::zone(&w.timezone).map_err(fail)?;
    let openings: Vec<(String, Vec<(i64, i64)>)> = w
        .windows
        .iter()
        .map(|row| {
            let window = gpuctl_core::windows::Window {
                days: row.days.clone(),
                start: row.start.clone(),
                end: row.end.clone(),
                floor: Default::default(),
                partition_floor: Default::default(),
                qos_priority: Default::default(),
                preemption: None,
                gpu_power_limit: None,
                gpu_power_limit_nodes: Default::default(),
            };
            (row.name.clone(), window.openings(since, until, &tz))
        })
        .collect();
    Ok(report::window_energy(jobs, &openings, since, until, now))
}

const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

/// The SVG: a weekday x hour heat map of allocated GPU-hours over bars of each group's
/// GPU-hours (allocated, used, idle).
pub fn plot(r: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let groups: Vec<_> = r.groups.iter().take(15).collect();
    let root = SVGBackend::new(path, (1000, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(330);
    let max = r
        .demand_gpu_hours
        .iter()
        .flatten()
        .fold(0.0f64, |a, &b| a.max(b))
        .max(1e-9);
    let mut heat = ChartBuilder::on(&top)
        .caption(
            "GPU-hours allocated by weekday and hour (UTC)",
            ("sans-serif", 18),
        )
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(44)
        .build_cartesian_2d(0i32..24, 0i32..7)?;
    heat.configure_mesh()
        .disable_mesh()
        .x_labels(24)
        .y_labels(7)
        .y_label_formatter(&|d| {
            let day = usize::try_from(6 - *d).ok();
            day.and_then(|k| DAYS.get(k))
                .map_or(String::new(), |s| s.to_string())
        })
        .x_desc("hour")
        .draw()?;
    heat.draw_series(
        r.demand_gpu_hours
            .iter()
            .enumerate()
            .flat_map(|(d, hours)| {
                hours.iter().enumerate().map(move |(h, &v)| {
                    let x = v / max;
                    // White (none) to a deep blue (the busiest hour).
                    let c = RGBColor(
                        (255.0 * (1.0 - 0.85 * x)) as u8,
                        (255.0 * (1.0 - 0.6 * x)) as u8,
                        255,
                    );
                    let y = 6 - d as i32;
                    Rectangle::new([(h as i32, y), (h as i32 + 1, y + 1)], c.filled())
                })
            }),
    )?;
    let top_alloc = groups
        .iter()
        .map(|g| g.figures.gpu_hours_allocated)
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let mut bars = ChartBuilder::on(&bottom)
        .caption(
            format!(
                "GPU-hours by {}: allocated (grey), used (green), idle (red)",
                r.by
            ),
            ("sans-serif", 18),
        )
        .margin(8)
        .x_label_area_size(60)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..groups.len().max(1) as f64, 0f64..top_alloc * 1.1)?;
    let names: Vec<String> = groups.iter().map(|g| g.name.clone()).collect();
    bars.configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len().max(1))
        .x_label_formatter(&|x| names.get(x.floor() as usize).cloned().unwrap_or_default())
        .y_desc("GPU-hours")
        .draw()?;
    let bar = |i: usize, off: f64, v: f64, c: RGBColor| {
        let x = i as f64 + off;
        Rectangle::new([(x, 0.0), (x + 0.28, v)], c.filled())
    };
    bars.draw_series(groups.iter().enumerate().flat_map(|(i, g)| {
        let f = &g.figures;
        [
            bar(i, 0.08, f.gpu_hours_allocated, RGBColor(160, 160, 160)),
            bar(i, 0.36, f.gpu_hours_used, RGBColor(40, 160, 70)),
            bar(i, 0.64, f.gpu_hours_idle, RGBColor(210, 50, 50)),
        ]
    }))?;
    root.present()?;
    Ok(())
}

pub async fn run(client: &mut Client, args: &ReportArgs) -> Result<ReportView, Failure> {
    let now = format::now_ms();
    let by: By = args.by.parse().map_err(fail)?;
    let since = parse_when(&args.since, now)?;
    let until = match &args.until {
        Some(s) => parse_when(s, now)?,
        None => now,
    };
    let req = pb::ListJobsRequest {
        all: true,
        ..Default::default()
    };
    let mut pages = client.list_jobs_paged(req).await?.into_inner();
    let mut jobs = Vec::new();
    // The cluster's GPUs count from its first job on (a cluster a minute old has not
    // had a week of GPU-hours to use): the window starts there if that is later.
    let mut first_submit = i64::MAX;
    while let Some(page) = pages.message().await? {
        for j in &page.jobs {
            if j.submit_time_ms > 0 {
                first_submit = first_submit.min(j.submit_time_ms);
            }
        }
        jobs.extend(
            page.jobs
                .into_iter()
                .filter(|j| super::history::in_window(j, since, until)),
        );
    }
    let since = since.max(first_submit.min(until));
    // The GPUs there are now (of nodes that are not down) over the window.
    let nodes = client
        .list_nodes(pb::ListNodesRequest::default())
        .await?
        .into_inner();
    let gpus: u64 = nodes
        .nodes
        .iter()
        .filter(|n| n.state() != pb::NodeState::Down)
        .map(|n| n.gpus.len() as u64)
        .sum();
    let jobs = (jobs.into_iter())
        .map(gpuctl_core::record::Job::try_from)
        .collect::<Result<Vec<_>, _>>()?;
    let mut r = report::report(&jobs, since, until, now, by).with_capacity(gpus);
    r.windows = window_energy(client, &jobs, since, until, now).await?;
    if let Some(path) = &args.plot {
        plot(&r, path).map_err(|e| fail(format!("cannot draw {}: {e}", path.display())))?;
    }
    Ok(ReportView(r))
}
