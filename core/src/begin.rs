//! Jobs that may not start before a time (`sbatch --begin`): held at submit with reason
//! `BeginTime` (hold `"begin"`, which `release` does not lift) and let go by the first
//! pass at or after that time. `Cluster::next_begin_ms` tells the shell when to run it.

use crate::record::{Job, JobSpec, JobState};

use crate::error::Refusal;
use crate::state::Cluster;

/// The hold of a job waiting for its begin time.
pub const BEGIN_HOLD: &str = "begin";
/// Its reason, as squeue says it.
pub const BEGIN_REASON: &str = "BeginTime";
/// The furthest ahead a begin time may be.
const MAX_AHEAD_MS: i64 = 366 * 24 * 3600 * 1000;

/// Checks a spec's begin time against `now`.
pub(crate) fn check(spec: &JobSpec, now: i64) -> Result<(), Refusal> {
    if spec.begin_ms < 0 || spec.begin_ms > now.saturating_add(MAX_AHEAD_MS) {
        return Err(Refusal::invalid_argument(
            "begin time must be within a year from now",
        ));
    }
    Ok(())
}

/// Holds a new job until its begin time, if that is still ahead.
pub(crate) fn hold_new(job: &mut Job, now: i64) {
    let begin = job.spec.begin_ms;
    if begin > now {
        job.hold = BEGIN_HOLD.into();
        job.reason = BEGIN_REASON.into();
        job.expected_start_ms = begin;
    }
}

fn begin_of(j: &Job) -> Option<i64> {
    (j.state == JobState::Pending && j.hold == BEGIN_HOLD).then_some(j.spec.begin_ms)
}

impl Cluster {
    /// The earliest begin time of a job still waiting for one.
    pub fn next_begin_ms(&self) -> Option<i64> {
        self.next_begin_ms
    }

    /// Notes a job that waits for its begin time (at submit, or when loaded).
    pub(crate) fn note_begin(&mut self, j: &Job) {
        if let Some(b) = begin_of(j) {
            self.next_begin_ms = Some(self.next_begin_ms.map_or(b, |n| n.min(b)));
        }
    }

    /// Finds the jobs waiting for a begin time again (after loading the state).
    pub(crate) fn recompute_begins(&mut self) {
        self.next_begin_ms = self.jobs.active().filter_map(|s| begin_of(&s.job)).min();
    }

    /// Lets go of the jobs whose begin time has come (a pass's first step); answers
    /// whether any was.
    pub(crate) fn release_begun(&mut self, now: i64) -> bool {
        if self.next_begin_ms.is_none_or(|n| n > now) {
            return false;
        }
        let due: Vec<u64> = self
            .jobs
            .active()
            .map(|s| &s.job)
            .filter(|j| begin_of(j).is_some_and(|b| b <= now))
            .map(|j| j.id)
            .collect();
        for &id in &due {
            self.jobs.annotate_pending(id, |j| {
                j.hold.clear();
                j.reason = "None".into();
            });
        }
        self.recompute_begins();
        !due.is_empty()
    }
}
