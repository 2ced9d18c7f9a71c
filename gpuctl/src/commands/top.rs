//! `gpuctl top`: a live terminal view (ratatui) of the cluster: totals, every GPU with
//! its utilisation and memory bars, temperature, power and owners, and the queue.
//! `--once` draws one frame as plain text (for scripts and tests). The drawing is a pure
//! function of a `Snapshot`, fetched from the controller each interval.

use std::io::IsTerminal;
use std::time::Duration;

use gpuctl_proto as pb;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table};

use crate::cli::{Client, Failure, fail};
use crate::format;

#[derive(Debug, Clone, clap::Args)]
pub struct TopArgs {
    /// Print one frame as text and exit.
    #[arg(long)]
    pub once: bool,
    /// How often to refresh.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// The frame's width with --once (default: the terminal's, else 120).
    #[arg(long)]
    pub width: Option<u16>,
}

/// What one frame shows.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub nodes: Vec<pb::Node>,
    /// Pending and running jobs.
    pub jobs: Vec<pb::Job>,
    pub now_ms: i64,
}

/// Frames at least this wide get bars and a one-line summary.
const WIDE: u16 = 110;

/// `[#####.....]  50%` for `frac` (0..1) in `width` cells.
fn bar(frac: f64, width: usize) -> String {
    let frac = if frac.is_finite() {
        frac.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let full = (frac * width as f64).round() as usize;
    format!("{}{}", "█".repeat(full), "░".repeat(width - full))
}

fn owners(g: &pb::Gpu, jobs: &[pb::Job]) -> String {
    let mut out: Vec<String> = g
        .jobs
        .iter()
        .map(|id| {
            let user = jobs
                .iter()
                .find(|j| j.id == *id)
                .and_then(|j| j.spec.as_ref())
                .map_or("?", |s| s.user.as_str());
            format!("{id}:{}", format::printable(user))
        })
        .collect();
    out.dedup();
    if out.is_empty() {
        "-".into()
    } else {
        out.join(" ")
    }
}

/// The frame for `s`.
pub fn draw(frame: &mut Frame, s: &Snapshot) {
    let gpus: Vec<(&pb::Node, &pb::Gpu)> = s
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter().map(move |g| (n, g)))
        .collect();
    let running = s
        .jobs
        .iter()
        .filter(|j| j.state() == pb::JobState::Running)
        .count();
    let pending = s.jobs.len() - running;
    let up = s
        .nodes
        .iter()
        .filter(|n| !matches!(n.state(), pb::NodeState::Down))
        .count();
    let busy = gpus.iter().filter(|(_, g)| !g.jobs.is_empty()).count();
    let mean_util = if gpus.is_empty() {
        0.0
    } else {
        gpus.iter()
            .map(|(_, g)| f64::from(g.metrics.as_ref().map_or(0, |m| m.util_pct)))
            .sum::<f64>()
            / gpus.len() as f64
    };
    // Under WIDE columns the bars go and the summary takes two lines: every column
    // still fits an 80-column terminal.
    let narrow = frame.area().width < WIDE;
    let [head, gpu_area, queue_area] = Layout::vertical([
        Constraint::Length(if narrow { 4 } else { 3 }),
        Constraint::Length(gpus.len() as u16 + 3),
        Constraint::Min(3),
    ])
    .areas(frame.area());
    let cluster = format!(
        "nodes {up}/{} up   GPUs {busy}/{} in use   mean GPU util {mean_util:.0}%",
        s.nodes.len(),
        gpus.len(),
    );
    let jobs = format!(
        "jobs {running} running, {pending} pending   {}",
        format::short_time(s.now_ms)
    );
    let lines = if narrow {
        vec![Line::from(cluster), Line::from(jobs)]
    } else {
        vec![Line::from(format!("{cluster}   {jobs}"))]
    };
    frame.render_widget(
        Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(" gpuctl top ")),
        head,
    );
    let rows = gpus.iter().map(|(n, g)| {
        let m = g.metrics.clone().unwrap_or_default();
        let mem = if g.memory_mib > 0 {
            m.mem_used_mib as f64 / g.memory_mib as f64
        } else {
            0.0
        };
        let hot = m.temp_c >= 85;
        Row::new(vec![
            format::printable(&n.name).into_owned(),
            g.index.to_string(),
            g.model.clone(),
            if narrow {
                format!("{:>3}%", m.util_pct)
            } else {
                format!(
                    "{} {:>3}%",
                    bar(f64::from(m.util_pct) / 100.0, 10),
                    m.util_pct
                )
            },
            if narrow {
                format!(
                    "{:.1}/{:.0}G",
                    m.mem_used_mib as f64 / 1024.0,
                    g.memory_mib as f64 / 1024.0
                )
            } else {
                format!(
                    "{} {:>5.1}/{:.0}G",
                    bar(mem, 10),
                    m.mem_used_mib as f64 / 1024.0,
                    g.memory_mib as f64 / 1024.0
                )
            },
            format!("{}C", m.temp_c),
            format!("{:.0}W", m.power_w),
            owners(g, &s.jobs),
        ])
        .style(if hot {
            Style::default().fg(Color::Red)
        } else {
            Style::default()
        })
    });
    let header = Row::new(vec![
        "NODE", "GPU", "MODEL", "UTIL", "MEMORY", "TEMP", "POWER", "JOBS",
    ])
    .style(Style::default().add_modifier(Modifier::BOLD));
    let (model_w, util_w, mem_w) = if narrow { (10, 4, 10) } else { (12, 15, 22) };
    let widths = [
        Constraint::Length(12),
        Constraint::Length(3),
        Constraint::Length(model_w),
        Constraint::Length(util_w),
        Constraint::Length(mem_w),
        Constraint::Length(5),
        Constraint::Length(6),
        Constraint::Min(10),
    ];
    frame.render_widget(
        Table::new(rows, widths)
            .header(header)
            .block(Block::default().borders(Borders::ALL).title(" GPUs ")),
        gpu_area,
    );
    draw_queue(frame, s, queue_area, narrow);
}

/// The queue's table: running jobs first, then pending ones, each by id.
fn draw_queue(frame: &mut Frame, s: &Snapshot, queue_area: Rect, narrow: bool) {
    let mut queue: Vec<&pb::Job> = s.jobs.iter().collect();
    // Running first, then pending, each by id.
    queue.sort_by_key(|j| (j.state() != pb::JobState::Running, j.id));
    let rows = queue.iter().map(|j| {
        let spec = j.spec.clone().unwrap_or_default();
        Row::new(vec![
            j.id.to_string(),
            format::printable(&spec.name).into_owned(),
            format::printable(&spec.user).into_owned(),
            format::state_name(j.state()).to_string(),
            format::slurm_duration(format::elapsed_ms(j, s.now_ms)),
            format::gpu_request(&spec.resources.unwrap_or_default()),
            format::printable(if j.node.is_empty() {
                &j.reason
            } else {
                &j.node
            })
            .into_owned(),
        ])
    });
    let header = Row::new(vec![
        "JOBID",
        "NAME",
        "USER",
        "STATE",
        "TIME",
        "GPUS",
        "NODE/REASON",
    ])
    .style(Style::default().add_modifier(Modifier::BOLD));
    let widths = [
        Constraint::Length(8),
        Constraint::Length(if narrow { 12 } else { 16 }),
        Constraint::Length(10),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Min(10),
    ];
    frame.render_widget(
        Table::new(rows, widths)
            .header(header)
            .block(Block::default().borders(Borders::ALL).title(" Queue ")),
        queue_area,
    );
}

/// One frame of `width` columns as text (trailing blanks trimmed), tall enough for
/// every GPU and job.
pub fn frame_text(s: &Snapshot, width: u16) -> String {
    let gpus: usize = s.nodes.iter().map(|n| n.gpus.len()).sum();
    // A narrow frame's summary takes one line more.
    let height = (4 + gpus + 3 + s.jobs.len() + 3).min(u16::MAX as usize) as u16;
    let mut term = ratatui::Terminal::new(ratatui::backend::TestBackend::new(width, height))
        .expect("a test terminal");
    term.draw(|f| draw(f, s)).expect("drawing to memory");
    let buf = term.backend().buffer();
    let mut out = String::new();
    for y in 0..buf.area.height {
        let line: String = (0..buf.area.width).map(|x| buf[(x, y)].symbol()).collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

async fn snapshot(client: &mut Client) -> Result<Snapshot, Failure> {
    let nodes = client
        .list_nodes(pb::ListNodesRequest { names: Vec::new() })
        .await?
        .into_inner()
        .nodes;
    let mut pages = client
        .list_jobs_paged(pb::ListJobsRequest::default())
        .await?
        .into_inner();
    let mut jobs = Vec::new();
    while let Some(p) = pages.message().await? {
        jobs.extend(p.jobs);
    }
    Ok(Snapshot {
        nodes,
        jobs,
        now_ms: format::now_ms(),
    })
}

pub async fn run(client: &mut Client, args: &TopArgs) -> Result<(), Failure> {
    if args.once || !std::io::stdout().is_terminal() {
        let s = snapshot(client).await?;
        let width = args
            .width
            .or_else(|| ratatui::crossterm::terminal::size().ok().map(|(w, _)| w))
            .unwrap_or(120)
            .max(60);
        crate::cli::print(&frame_text(&s, width));
        return Ok(());
    }
    live(client, args).await
}

/// The live view: redraws every interval until q, Esc or Ctrl-C.
async fn live(client: &mut Client, args: &TopArgs) -> Result<(), Failure> {
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyModifiers};
    let mut term = ratatui::init();
    let result = async {
        loop {
            let s = snapshot(client).await?;
            term.draw(|f| draw(f, &s))
                .map_err(|e| fail(format!("cannot draw: {e}")))?;
            let until = std::time::Instant::now() + args.interval;
            while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
                if !event::poll(left).map_err(|e| fail(e.to_string()))? {
                    break;
                }
                if let Event::Key(k) = event::read().map_err(|e| fail(e.to_string()))? {
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                        return Ok(());
                    }
                }
            }
        }
    }
    .await;
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_shows_gpus_with_bars_owners_and_the_queue() {
        let job = |id, state: pb::JobState, user: &str| pb::Job {
            id,
            state: state as i32,
            node: if state == pb::JobState::Running {
                "n1".into()
            } else {
                String::new()
            },
            reason: "Resources".into(),
            spec: Some(pb::JobSpec {
                name: format!("train-{id}"),
                user: user.into(),
                resources: Some(pb::Resources {
                    gpu: Some(pb::resources::Gpu::Gpus(1)),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let s = Snapshot {
            nodes: vec![pb::Node {
                name: "n1".into(),
                state: pb::NodeState::Mixed as i32,
                gpus: vec![
                    pb::Gpu {
                        index: 0,
                        uuid: "GPU-0".into(),
                        model: "A100-80GB".into(),
                        memory_mib: 81920,
                        jobs: vec![7],
                        metrics: Some(pb::GpuMetrics {
                            util_pct: 50,
                            mem_used_mib: 40960,
                            temp_c: 60,
                            power_w: 250.0,
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    pb::Gpu {
                        index: 1,
                        uuid: "GPU-1".into(),
                        model: "A100-80GB".into(),
                        memory_mib: 81920,
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            jobs: vec![
                job(8, pb::JobState::Pending, "bob"),
                job(7, pb::JobState::Running, "alice"),
            ],
            now_ms: 1_800_000_000_000,
        };
        let text = frame_text(&s, 110);
        assert!(text.contains("GPUs 1/2 in use"), "{text}");
        assert!(text.contains("mean GPU util 25%"), "{text}");
        assert!(text.contains("jobs 1 running, 1 pending"), "{text}");
        // Half the bar for 50% utilisation and half the memory.
        assert!(text.contains("█████░░░░░  50%"), "{text}");
        assert!(text.contains("40.0/80G"), "{text}");
        assert!(text.contains("7:alice"), "{text}");
        // The running job before the pending one.
        let (r, p) = (text.find("train-7").unwrap(), text.find("train-8").unwrap());
        assert!(r < p, "{text}");
        assert!(text.contains("Resources"), "{text}");
    }

    #[test]
    fn narrow_terminals_lose_bars_not_columns() {
        let s = Snapshot {
            nodes: vec![pb::Node {
                name: "node-long-01".into(),
                gpus: vec![pb::Gpu {
                    model: "A100-80GB".into(),
                    memory_mib: 81920,
                    jobs: vec![7],
                    metrics: Some(pb::GpuMetrics {
                        util_pct: 87,
                        mem_used_mib: 40960,
                        temp_c: 61,
                        power_w: 300.0,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            jobs: vec![],
            now_ms: 1_800_000_000_000,
        };
        for width in [80, 100] {
            let text = frame_text(&s, width);
            for want in [
                "JOBS",
                "POWER",
                "87%",
                "40.0/80G",
                "300W",
                "0 pending",
                "NODE/REASON",
                &format::short_time(s.now_ms),
            ] {
                assert!(text.contains(want), "{width}: {want:?} missing:\n{text}");
            }
        }
    }

    #[test]
    fn bars_are_clamped() {
        assert_eq!(bar(1.5, 4), "████");
        assert_eq!(bar(-1.0, 4), "░░░░");
        assert_eq!(bar(f64::NAN, 2), "░░");
    }
}
