//! The bank week's analysts and research team, and what every job of the week does on
//! its GPUs (the profiles the simulated agents run, `crate::replay::agents::Usage`).
//!
//! - **Analysts' notebooks**: each business day 24 analysts open a notebook (one whole
//!   GPU, an interactive allocation) between 08:30 and 10:30 for 6 to 9 hours. A
//!   session alternates think time (the GPU idle, the model kept in its memory) and
//!   cells that train or evaluate: NotebookOS (ASPLOS 2026) found production notebook
//!   sessions "long-running but with intermittent and sporadic GPU usage", idle
//!   "during most of their lifetimes". Here think time is exponential with a mean of
//!   30 minutes and a cell's work exponential with a mean of 6 minutes (1 to 30), at
//!   Philly's training busy level while it runs (`usage::TRAINING_ACTIVE`): a session
//!   keeps its GPU busy about an eighth of its time.
//! - **Research sweeps** (hyperparameter trials and back-tests of the risk models): 30
//!   an hour all week, 1-4 hours of work each, Philly-like training in their use of
//!   a GPU (`usage::busy`), GPU memory from the Perlmutter distribution over half an
//!   A100 (the models of a sweep are small), checkpointing on `USR1@60` and requeued
//!   when stopped. Where the opportunistic class exists they are submitted in it,
//!   asking for half a GPU's compute and their GPU memory; elsewhere as `low` jobs.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};

use gpuctl_sched::{GpuRequest, Millis};

use crate::bankday::{GPU_MEMORY_MIB, Shape, business, busy_of_charge, nominal_milli, peak_mib};
use crate::replay::TraceJob;
use crate::replay::agents::Profile;
use crate::usage::{Kind, TRAINING_ACTIVE, busy, memory, uniform};

const MIN: f64 = 60.0;
const HOUR: f64 = 3600.0;

/// Analysts, notebooks each business day.
pub const ANALYSTS: u32 = 24;
/// Research sweeps submitted an hour.
pub const SWEEPS_PER_HOUR: f64 = 60.0;
/// A sweep's compute share where it borrows (thousandths of a GPU).
pub const SWEEP_SHARE: u32 = 500;

/// The notebooks and sweeps of the week, ids from `first_id`.
pub fn jobs(seed: u64, first_id: u64, shape: Shape) -> Vec<TraceJob> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x6e6f_7465_626f_6f6b);
    let mut out = Vec::new();
    let mut id = first_id;
    for day in 0..5 {
        for _ in 0..ANALYSTS {
            let t = (f64::from(day) * 24.0 + 8.5) * HOUR + rng.random::<f64>() * 2.0 * HOUR;
            let session = 6.0 * HOUR + rng.random::<f64>() * 3.0 * HOUR;
            out.push(notebook(id, t, session));
            id += 1;
        }
    }
    let week = 7.0 * 24.0 * HOUR;
    let mut t = 0.0;
    while t < week {
        t += -(HOUR / SWEEPS_PER_HOUR) * (1.0 - rng.random::<f64>()).ln();
        let dur = HOUR + rng.random::<f64>() * 3.0 * HOUR;
        out.push(sweep(id, t, dur, seed, shape));
        id += 1;
    }
    out
}

/// One whole GPU, as the week's other jobs are made (`bankday::job`).
fn base(id: u64, submit_s: f64, dur_s: f64, who: &str, qos: &str) -> TraceJob {
    crate::bankday::job(
        id,
        submit_s,
        dur_s,
        GpuRequest::Whole { count: 1 },
        1000,
        who,
        qos,
    )
}

fn notebook(id: u64, submit_s: f64, session_s: f64) -> TraceJob {
    base(id, submit_s, session_s, "analysts", "normal")
}

/// A sweep's GPU memory (MiB): the Perlmutter distribution over half an A100.
fn sweep_memory_mib(seed: u64, id: u64) -> u64 {
    (memory(uniform(seed, id, 1)) * GPU_MEMORY_MIB / 2.0) as u64
}

fn sweep(id: u64, submit_s: f64, dur_s: f64, seed: u64, shape: Shape) -> TraceJob {
    let mut j = base(id, submit_s, dur_s, "research", "low");
    j.requeue = true;
    j.signal = "USR1@60".into();
    j.opportunistic = shape.opportunistic;
    if shape.opportunistic || shape.shares {
        j.request.gpu = GpuRequest::Share {
            compute_milli: Some(SWEEP_SHARE),
            memory_mib: Some(sweep_memory_mib(seed, id)),
        };
        j.gpu_milli = u64::from(SWEEP_SHARE);
    }
    j
}

/// A notebook session's phases: think time (idle) and cells (work at the training busy
/// level), `session_ms` of them in all when run alone.
pub fn notebook_phases(seed: u64, id: u64, session_ms: Millis) -> Vec<(Millis, f64)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(id));
    let mut phases = Vec::new();
    let mut left = session_ms;
    let mut cell = false;
    while left > 0 {
        let s = if cell {
            (-6.0 * MIN * (1.0 - rng.random::<f64>()).ln()).clamp(MIN, 30.0 * MIN)
        } else {
            -30.0 * MIN * (1.0 - rng.random::<f64>()).ln()
        };
        let ms = ((s * 1000.0) as Millis).clamp(1000, left);
        phases.push((ms, if cell { TRAINING_ACTIVE } else { 0.0 }));
        left -= ms;
        cell = !cell;
    }
    phases
}

/// What each job of the week does on its GPUs, by trace id.
pub fn profiles(jobs: &[TraceJob], seed: u64, shape: Shape) -> HashMap<u64, Profile> {
    jobs.iter()
        .map(|j| {
            let p = match j.account.as_str() {
                "analysts" => Profile {
                    phases: notebook_phases(seed, j.id, j.duration),
                    memory_mib: (memory(uniform(seed, j.id, 1)) * GPU_MEMORY_MIB) as u64,
                },
                "research" => {
                    let alone = busy(
                        Kind::Training,
                        j.duration as f64 / 1000.0,
                        uniform(seed, j.id, 0),
                    );
                    Profile {
                        // Its busy share of a whole GPU, over the share it is charged.
                        phases: vec![(j.duration, alone * 1000.0 / j.gpu_milli.max(1) as f64)],
                        memory_mib: sweep_memory_mib(seed, j.id),
                    }
                }
                "training" => Profile {
                    phases: vec![(j.duration, busy_of_charge(j, seed, shape))],
                    memory_mib: (memory(uniform(seed, j.id, 1)) * GPU_MEMORY_MIB) as u64,
                },
                _ => Profile {
                    phases: vec![(j.duration, busy_of_charge(j, seed, shape))],
                    memory_mib: peak_mib(j, seed, nominal_milli(j, shape)) as u64,
                },
            };
            (j.id, p)
        })
        .collect()
}

/// Whether trace time `t` is in business hours (re-exported for the ladder's rows).
pub fn in_business(t: Millis) -> bool {
    business(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notebook_session_is_mostly_idle_and_its_phases_fill_it() {
        let mut busy_ms = 0.0;
        let mut total = 0;
        for id in 0..200 {
            let session = 8 * 3_600_000;
            let p = notebook_phases(7, id, session);
            assert_eq!(p.iter().map(|x| x.0).sum::<Millis>(), session);
            assert_eq!(p[0].1, 0.0, "a session opens with think time");
            busy_ms += p.iter().map(|x| x.0 as f64 * x.1).sum::<f64>();
            total += session;
        }
        // Cells 6 min in 36: a sixth of the time, at the training busy level.
        let busy = busy_ms / total as f64;
        assert!(busy > 0.08 && busy < 0.16, "{busy}");
    }

    #[test]
    fn sweeps_are_opportunistic_only_where_the_class_exists() {
        let on = Shape {
            shares: true,
            checkpoints: true,
            right_size: true,
            colocate: true,
            opportunistic: true,
        };
        let off = Shape {
            opportunistic: false,
            shares: false,
            ..on
        };
        let (a, b) = (jobs(7, 1000, on), jobs(7, 1000, off));
        assert_eq!(a.len(), b.len());
        let sweeps = a.iter().filter(|j| j.account == "research").count();
        // About SWEEPS_PER_HOUR an hour over the week (a Poisson count: within 5%).
        let expected = SWEEPS_PER_HOUR * 168.0;
        assert!(
            (sweeps as f64 - expected).abs() < 0.05 * expected,
            "{sweeps}"
        );
        assert!(
            a.iter()
                .filter(|j| j.account == "research")
                .all(|j| j.opportunistic && j.requeue)
        );
        assert!(b.iter().all(|j| !j.opportunistic));
        assert_eq!(
            a.iter().filter(|j| j.account == "analysts").count(),
            5 * ANALYSTS as usize
        );
        assert!(
            a.iter()
                .filter(|j| j.account == "analysts")
                .all(|j| in_business(j.submit))
        );
    }
}
