//! Co-location by measured use (AntMan, OSDI'20; Gandiva, OSDI'18): a job that opts in
//! (`colocate = true`, `gpuctl submit --colocate`, `#SBATCH --oversubscribe`) is placed
//! on a GPU by what its last runs of the same name used, not by what it asks for.
//!
//! - **Compute** is charged at the measured busy share of the GPU with the margin of
//!   right-sizing (`efficiency::MARGIN`), but never below the request over
//!   `compute_overcommit`: the requests of the jobs on one GPU add up to at most that
//!   many GPUs, and their measured use to at most one. Compute is not capped on the
//!   node (no MPS thread limit): a co-located job may use what its neighbours leave.
//! - **GPU memory** is a hard limit at the measured peak with the margin, rounded up
//!   to a GiB (never above a memory the job gave itself). The scheduler never places
//!   more than a GPU's memory on it, and the agent ends a job that outgrows its limit
//!   as it ends any share over its memory.
//!
//! One GPU or a share of one on one node; other requests are placed as asked (the
//! scheduler's share is a share of one GPU). Pure: the request and the earlier runs'
//! reports in, the request and one note per decision out.

use std::time::Duration;

use crate::record::{GpuPart, GpuShare, Resources};
use serde::Deserialize;

use crate::efficiency::{Efficiency, MARGIN};

/// The `[colocation]` table.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Colocation {
    /// Jobs that ask for co-location get it (else they are placed as asked).
    pub enabled: bool,
    /// The requests of the co-located jobs on one GPU add up to at most this many
    /// GPUs (a job's charge is at least its request over it).
    pub compute_overcommit: f64,
    /// Runs shorter than this say little about a job's use and are not counted.
    #[serde(with = "humantime_serde")]
    pub min_run: Duration,
}

impl Default for Colocation {
    fn default() -> Self {
        Colocation {
            enabled: true,
            compute_overcommit: 2.0,
            min_run: Duration::from_secs(60),
        }
    }
}

impl Colocation {
    /// What is wrong with the table, if anything.
    pub fn check(&self) -> Result<(), String> {
        let r = self.compute_overcommit;
        if !(r.is_finite() && (1.0..=8.0).contains(&r)) {
            return Err(format!(
                "colocation.compute_overcommit = {r}: a ratio from 1 (no overcommit) to 8"
            ));
        }
        Ok(())
    }
}

/// Rounds `x` up to a multiple of `step`.
fn round_up(x: f64, step: f64) -> f64 {
    (x / step - 1e-9).ceil() * step
}

/// The share of its GPU a run kept busy at most: per slot, its utilisation (which is
/// against its share) times that share.
pub fn busy_of(e: &Efficiency) -> Option<f64> {
    e.slots
        .iter()
        .filter(|s| s.samples > 0)
        .filter_map(|s| Some(s.util_mean? / 100.0 * f64::from(s.share_milli.min(1000)) / 1000.0))
        .reduce(f64::max)
}

/// What a co-located job is charged: (compute milli, GPU memory MiB), from its request
/// (`nominal_milli`), the GPU memory it was given (`given_mib`: its own limit, or what
/// its earlier runs had), its measured busy share of a GPU and GPU memory peak, and the
/// overcommit ratio. `None` where it would not save compute.
pub fn charge(
    nominal_milli: u32,
    given_mib: u64,
    busy: f64,
    peak_mib: u64,
    overcommit: f64,
) -> Option<(u32, u64)> {
    let nominal = f64::from(nominal_milli) / 1000.0;
    let floor = nominal / overcommit.max(1.0);
    let compute = round_up((busy.clamp(0.0, 1.0) * MARGIN).max(floor).max(0.05), 0.05);
    let milli = (compute * 1000.0).round() as u32;
    let gib = round_up(peak_mib as f64 * MARGIN / 1024.0, 1.0).max(1.0);
    let memory = ((gib * 1024.0) as u64).min(given_mib.max(1));
    (milli < nominal_milli).then_some((milli, memory))
}

/// Places `res` by the measured use of `runs` (reports of the last completed runs of the
/// same job, latest first) as the module says; one note per decision.
pub fn colocate(res: &mut Resources, runs: &[Efficiency], cfg: &Colocation) -> Vec<String> {
    if !cfg.enabled {
        return vec![
            "co-locate: off on this cluster ([colocation] enabled = false); placed as asked".into(),
        ];
    }
    let (nominal, own_memory) = match &res.gpu {
        Some(GpuPart::Gpus(1)) if res.nodes <= 1 => (1000, None),
        Some(GpuPart::Share(s)) if res.nodes <= 1 && s.compute_milli > 0 => {
            (s.compute_milli, s.memory_mib)
        }
        _ => {
            return vec![
                "co-locate: only one GPU or a share of one on one node is placed by use; this request is placed as asked".into(),
            ];
        }
    };
    let min_secs = cfg.min_run.as_secs();
    let measured: Vec<&Efficiency> = runs
        .iter()
        .filter(|e| e.gpu_samples >= 3 && e.elapsed_secs >= min_secs && busy_of(e).is_some())
        .collect();
    if measured.is_empty() {
        return vec![format!(
            "co-locate: no earlier completed run of this name with GPU figures (at least 3 samples, {} long); placed as asked",
            humantime::format_duration(cfg.min_run)
        )];
    }
    let busy = measured
        .iter()
        .filter_map(|e| busy_of(e))
        .fold(0.0, f64::max);
    // Memory peaks count from every run with samples: one ended over its limit
    // measured what it needed.
    let sampled = || runs.iter().filter(|e| e.gpu_samples > 0);
    let peak = sampled().map(|e| e.gpu_memory_peak_mib).max().unwrap_or(0);
    // Never more memory than the job had: its own limit, else its runs' GPUs (or
    // slices), so that what ran before still fits.
    let had = sampled()
        .flat_map(|e| e.slots.iter().map(|s| s.memory_mib))
        .filter(|&m| m > 0)
        .max();
    let given = own_memory.filter(|&m| m > 0).or(had).unwrap_or(u64::MAX);
    let Some((milli, memory)) = charge(nominal, given, busy, peak, cfg.compute_overcommit) else {
        return vec![format!(
            "co-locate: the last {} run(s) kept {:.0}% of a GPU busy at most; placed as asked",
            measured.len(),
            busy * 100.0
        )];
    };
    res.gpu = Some(GpuPart::Share(GpuShare {
        compute_milli: milli,
        memory_mib: Some(memory),
    }));
    vec![format!(
        "co-locate: compute {:.2} of a GPU charged for {:.2} asked (last {} run(s): busy {:.0}% of a GPU at most; overcommit at most {}x), GPU memory {} GiB hard (peak {} MiB): over it, the job ends",
        f64::from(milli) / 1000.0,
        f64::from(nominal) / 1000.0,
        measured.len(),
        busy * 100.0,
        cfg.compute_overcommit,
        memory / 1024,
        peak
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charge_is_the_use_with_its_margin_and_at_least_the_overcommit_floor() {
        const GPU: u64 = 80 * 1024;
        // Busy 50% of a GPU: 0.625 -> 0.65 charged; memory peak 10 GiB -> 12.5 -> 13 GiB.
        assert_eq!(
            charge(1000, GPU, 0.5, 10 * 1024, 2.0),
            Some((650, 13 * 1024))
        );
        // Busy 7%: the floor of 1/2 of the request is charged.
        assert_eq!(charge(1000, GPU, 0.07, 1024, 2.0), Some((500, 2 * 1024)));
        // A quarter with a 4x overcommit: 0.25 / 4 = 0.0625 -> 0.1 in 0.05 steps.
        assert_eq!(charge(250, GPU, 0.0, 100, 4.0), Some((100, 1024)));
        // A peak near the GPU's memory: never more than the job had.
        assert_eq!(charge(1000, GPU, 0.2, 75 * 1024, 2.0), Some((500, GPU)));
        // A share that gave itself memory: never more than that.
        assert_eq!(charge(500, 4096, 0.1, 8 * 1024, 2.0), Some((250, 4096)));
        // Busier than the request, or already charged its use: nothing to save.
        assert_eq!(charge(1000, GPU, 0.95, 40 * 1024, 2.0), None);
        assert_eq!(charge(300, 4096, 0.3, 1024, 2.0), None);
    }

    #[test]
    fn the_table_refuses_absurd_ratios() {
        for r in [0.5, 0.0, 9.0, f64::NAN, f64::INFINITY] {
            let c = Colocation {
                compute_overcommit: r,
                ..Colocation::default()
            };
            assert!(c.check().is_err(), "{r}");
        }
        assert!(Colocation::default().check().is_ok());
    }
}
