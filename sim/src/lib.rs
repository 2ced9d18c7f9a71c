//! gpuctl-sim: `gpuctld simulate` (the scheduler core on a virtual clock, over traces,
//! with no daemons), the trace readers and the benchmark's inputs.
//!
//! - `inflation`: the FGD paper's fragmentation experiment (arrivals only, no queue).
//! - `replay`: a time-based replay with queueing, priority and backfill.
//! - `bankday`: the bank-day scenario (inference by day, training by night) replayed
//!   with and without a time-of-day window, and with plain priority.
//!
//! Both call the same `sched` code as the controller.

pub use gpuctl_alloc as alloc;
pub mod bankday;
pub mod bench;
pub mod idle_work;
pub mod inflation;
pub mod interference;
pub mod ladder;
pub mod power;
pub mod replay;
pub mod rightsize;
pub mod trace;
pub mod usage;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuctl_sched::packing::Policy;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// `gpuctld simulate`'s modes.
#[derive(clap::Subcommand)]
pub enum Mode {
    /// The FGD paper's fragmentation experiment: arrivals only, inflated to 130% of capacity.
    Inflation {
        /// Nodes CSV (openb_node_list_gpu_node.csv).
        #[arg(long)]
        nodes: PathBuf,
        /// Pods CSV(s) (openb_pod_list_*.csv); repeat or comma-separate for several workloads.
        #[arg(long, value_delimiter = ',', required = true)]
        pods: Vec<PathBuf>,
        /// Packing policies to compare (first-fit, best-fit, fgd); default: the scheduler's default.
        #[arg(long, value_delimiter = ',')]
        policy: Vec<Policy>,
        /// Seeds, e.g. 42-51.
        #[arg(long, default_value = "42-51", value_parser = crate::parse_seeds)]
        seeds: std::vec::Vec<u64>,
        /// Inflation target as a multiple of GPU capacity.
        #[arg(long, default_value_t = 1.3)]
        tune: f64,
        /// The FGD authors' analysis_allo_discrete.csv to compare with (default: next to the pods).
        #[arg(long)]
        expected: Option<PathBuf>,
        #[arg(long)]
        out: PathBuf,
    },
    /// A time-based replay with queueing, priority and backfill.
    Replay(crate::replay::Args),
    /// The bank-day scenario: a week of daytime inference and nightly training.
    Bankday(crate::bankday::Args),
}

/// Runs one `gpuctld simulate` mode.
pub fn run(mode: Mode) -> anyhow::Result<()> {
    match mode {
        Mode::Inflation {
            nodes,
            pods,
            policy,
            seeds,
            tune,
            expected,
            out,
        } => {
            let expected = expected.or_else(|| {
                let p = pods
                    .first()?
                    .parent()?
                    .join("fgd_expected_results/analysis_allo_discrete.csv");
                p.exists().then_some(p)
            });
            let opts = crate::inflation::Options {
                nodes,
                pods,
                policies: if policy.is_empty() {
                    vec![Policy::default()]
                } else {
                    policy
                },
                seeds,
                tune,
                out: out.clone(),
                expected,
            };
            let rows = crate::inflation::run(&opts)?;
            print!("{}", crate::inflation::summary_table(&rows));
            println!(
                "wrote {}/analysis_allo_discrete.csv, analysis_frag_discrete.csv, summary.md",
                out.display()
            );
            Ok(())
        }
        Mode::Replay(a) => crate::replay::main(a),
        Mode::Bankday(a) => crate::bankday::main(a),
    }
}

/// A progress bar that shows itself only once a run has taken more than a second.
pub struct Progress {
    bar: ProgressBar,
    started: Instant,
    shown: bool,
}

impl Progress {
    pub fn new(total: u64, what: &str) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({elapsed}, eta {eta})")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(what.to_string());
        Progress {
            bar,
            started: Instant::now(),
            shown: false,
        }
    }

    pub fn inc(&mut self, n: u64) {
        if !self.shown && self.started.elapsed() > Duration::from_secs(1) {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.shown = true;
        }
        self.bar.inc(n);
    }

    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}

/// Parses `42-51` or `42,43,50`.
pub fn parse_seeds(s: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) = (
                    a.trim().parse().map_err(|_| format!("bad seed {a:?}"))?,
                    b.trim().parse().map_err(|_| format!("bad seed {b:?}"))?,
                );
                if a > b || b - a > 10_000 {
                    return Err(format!("bad seed range {part:?}"));
                }
                out.extend(a..=b);
            }
            None => out.push(
                part.trim()
                    .parse()
                    .map_err(|_| format!("bad seed {part:?}"))?,
            ),
        }
    }
    Ok(out)
}

/// Percentile (nearest rank) of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_and_percentiles() {
        assert_eq!(parse_seeds("42-45").unwrap(), vec![42, 43, 44, 45]);
        assert_eq!(parse_seeds("1,5").unwrap(), vec![1, 5]);
        assert!(parse_seeds("5-1").is_err());
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(percentile(&v, 50.0), 5.0);
        assert_eq!(percentile(&v, 95.0), 10.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
    }
}
