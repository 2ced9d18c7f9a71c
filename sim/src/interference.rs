//! How jobs sharing a GPU slow each other: the simulator's interference model,
//! calibrated to published measurements (docs/utilisation.md cites each figure; the
//! tests below reproduce them).
//!
//! Each job on a GPU has a *demand*: the share of the GPU's time it would keep busy
//! alone (its busy fraction times the share of the GPU it holds). From the demands of
//! everything on one GPU the model gives each job a *rate*: how fast its work
//! advances, 1 alone. Work is conserved: a job at rate 0.9 runs 1/0.9 as long.
//!
//! - **Guaranteed jobs** share the GPU among themselves by time: while their demands
//!   sum to at most 1 they run at full speed; above, each gets `1 / sum` (time-sliced
//!   contexts, Gandiva's observation that packed jobs whose use sums under the GPU keep
//!   their speed).
//! - **Opportunistic jobs with compute priority below the holders'** (MPS client
//!   priority, as the agent sets): together they fill at most `FILL` of the idle the
//!   guaranteed jobs leave, split by demand; each guaranteed job with work to do is
//!   slowed by `PRIORITY_SLOWDOWN` times the part of that idle they fill. Tally
//!   (ASPLOS 2025) measured 7.2% mean overhead on the p99 latency of high-priority
//!   inference beside best-effort training (the tail, so the mean slowdown here is an
//!   upper figure), with best-effort throughput 80% of TGS's (NSDI 2023), which runs
//!   opportunistic jobs in all the idle (its production jobs "little affected").
//! - **Without compute priority** (plain time-slicing, or MPS without priorities):
//!   every job competes alike; while all demands sum to at most 1 nobody is slowed,
//!   above each gets `1 / sum`.

/// The part of the idle left by the guaranteed jobs that prioritised opportunistic
/// jobs fill at most (Tally: 80% of the throughput of TGS, which fills it).
pub const FILL: f64 = 0.8;

/// A guaranteed job's slowdown when prioritised opportunistic jobs fill all they can of
/// its GPU's idle (Tally: 7.2% mean p99 overhead of high-priority work).
pub const PRIORITY_SLOWDOWN: f64 = 0.072;

/// One job on a GPU: its demand (0 to 1 of the GPU's time, alone) and its class.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OnGpu {
    pub demand: f64,
    pub opportunistic: bool,
}

/// The rate of each job on one GPU, in order, given whether opportunistic jobs run at
/// a compute priority below the guaranteed ones.
pub fn rates(jobs: &[OnGpu], priority: bool) -> Vec<f64> {
    let demand = |o: bool| -> f64 {
        jobs.iter()
            .filter(|j| j.opportunistic == o)
            .map(|j| j.demand.max(0.0))
            .sum()
    };
    let (held, borrowed) = (demand(false), demand(true));
    if !priority {
        let all = held + borrowed;
        let r = if all > 1.0 { 1.0 / all } else { 1.0 };
        return vec![r; jobs.len()];
    }
    let held_rate = if held > 1.0 { 1.0 / held } else { 1.0 };
    let idle = (1.0 - held).max(0.0);
    let room = FILL * idle;
    let filled = borrowed.min(room);
    let borrow_rate = if borrowed > 0.0 {
        filled / borrowed
    } else {
        1.0
    };
    // How much of what they could fill they do fill.
    let fill = if room > 0.0 { filled / room } else { 0.0 };
    let slowed = held_rate / (1.0 + PRIORITY_SLOWDOWN * fill);
    jobs.iter()
        .map(|j| match (j.opportunistic, j.demand > 0.0) {
            (true, _) => borrow_rate,
            (false, true) => slowed,
            (false, false) => 1.0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(demand: f64) -> OnGpu {
        OnGpu {
            demand,
            opportunistic: false,
        }
    }

    fn o(demand: f64) -> OnGpu {
        OnGpu {
            demand,
            opportunistic: true,
        }
    }

    #[test]
    fn tally_a_saturating_best_effort_job_slows_the_prioritised_one_by_7_2_percent() {
        // High-priority inference (20% busy) beside best-effort training that would
        // keep the GPU fully busy: the training fills all it may of the idle.
        let r = rates(&[g(0.2), o(1.0)], true);
        assert!((1.0 / r[0] - 1.0 - 0.072).abs() < 1e-9, "{r:?}");
        // The best-effort job does 80% of what it would in all the idle (TGS's).
        let tgs_throughput = 1.0 - 0.2;
        assert!((r[1] * 1.0 / tgs_throughput - 0.8).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn a_borrower_that_fills_part_of_the_idle_slows_the_holder_in_proportion() {
        // Holder 50% busy; a borrower wanting 20% fills half of the 40% it may.
        let r = rates(&[g(0.5), o(0.2)], true);
        assert_eq!(r[1], 1.0);
        assert!((1.0 / r[0] - 1.0 - 0.072 * 0.5).abs() < 1e-9, "{r:?}");
        // A holder with nothing to do (an idle notebook) is not slowed.
        let r = rates(&[g(0.0), o(0.9)], true);
        assert_eq!(r[0], 1.0);
        assert!((r[1] - 0.8 / 0.9).abs() < 1e-9);
    }

    #[test]
    fn guaranteed_jobs_share_by_time_and_borrowers_get_no_idle_when_there_is_none() {
        let r = rates(&[g(0.4), g(0.4)], true);
        assert_eq!(r, vec![1.0, 1.0]);
        let r = rates(&[g(0.8), g(0.8), o(0.5)], true);
        assert!((r[0] - 1.0 / 1.6).abs() < 1e-9);
        assert_eq!(r[2], 0.0);
    }

    #[test]
    fn without_priority_everyone_competes_alike() {
        let r = rates(&[g(0.6), o(0.9)], false);
        assert!(r.iter().all(|x| (x - 1.0 / 1.5).abs() < 1e-9), "{r:?}");
        let r = rates(&[g(0.5), o(0.3)], false);
        assert_eq!(r, vec![1.0, 1.0]);
        // With priority the holder keeps (almost all) its speed instead.
        let p = rates(&[g(0.6), o(0.9)], true);
        assert!((1.0 / p[0] - 1.072).abs() < 1e-9, "{p:?}");
    }

    #[test]
    fn work_is_conserved_a_slowed_job_runs_longer() {
        // An hour of work at the slowed rate takes 1 / rate hours.
        let r = rates(&[g(0.5), o(1.0)], true)[0];
        let hours = 1.0 / r;
        assert!((hours - 1.072).abs() < 1e-9);
    }
}
