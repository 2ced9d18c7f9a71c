//! `gpuctld simulate`: the scheduler core on a virtual clock, over traces, with no
//! daemons.
//!
//! - `inflation`: the FGD paper's fragmentation experiment (arrivals only, no queue).
//! - `replay`: a time-based replay with queueing, priority and backfill.
//!
//! Both call the same `sched` code as the controller.

pub mod inflation;
pub mod replay;

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

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
