//! Window floors: while a time-of-day window is open, a share of the cluster's GPUs is
//! kept for an account, or for the jobs of a partition. Other jobs may hold at most the
//! rest then, except
//! jobs of exempt QoS levels (those that others preempt: they are taken back when the
//! account needs its GPUs). A job that would still run when a window opens starts only
//! if the floor holds at the opening too, so backfill never starts a non-preemptible
//! job across a boundary that would break the guarantee.

use std::collections::BTreeSet;

use super::limits::norm_milli;
use super::model::*;

/// Whose GPUs a floor keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FloorOwner {
    Account(String),
    Partition(String),
}

impl FloorOwner {
    /// Whether a job of `account` in `partition` is the floor's own.
    pub fn owns(&self, account: &str, partition: &str) -> bool {
        match self {
            FloorOwner::Account(a) => a == account,
            FloorOwner::Partition(p) => p == partition,
        }
    }
}

/// One owner's floor in one window opening.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Floor {
    pub window: String,
    pub owner: FloorOwner,
    /// The opening (current or next): [from, until), Unix ms.
    pub from_ms: Millis,
    pub until_ms: Millis,
    /// The most GPU milli others' non-exempt jobs may hold while it is open.
    pub others_max_milli: u64,
    /// What others' non-exempt running jobs hold: (end, GPU milli).
    pub others: Vec<(Millis, u64)>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Floors {
    pub floors: Vec<Floor>,
    /// QoS levels whose jobs do not count against floors (preemptible ones).
    pub exempt_qos: BTreeSet<String>,
}

impl Floors {
    pub fn is_empty(&self) -> bool {
        self.floors.is_empty()
    }

    fn counts(&self, f: &Floor, job: &PendingJob) -> bool {
        !f.owner.owns(&job.account, &job.partition) && !self.exempt_qos.contains(&job.qos)
    }

    /// The window whose floor `job` would break if it started at `now` for `d` ms.
    pub fn check(&self, job: &PendingJob, now: Millis, d: Millis) -> Option<&str> {
        let end = now.saturating_add(d);
        let need = norm_milli(&job.request);
        for f in &self.floors {
            if !self.counts(f, job) || end <= f.from_ms || now >= f.until_ms {
                continue;
            }
            // The floor is checked at the moment it first applies to this job: now, when
            // the window is open (what runs holds its GPUs, even past its planned end),
            // or at the opening (what is planned to run past it).
            let at = now.max(f.from_ms);
            let held: u64 = f
                .others
                .iter()
                .filter(|(e, _)| at == now || *e > at)
                .map(|(_, m)| m)
                .sum();
            if held + need > f.others_max_milli {
                return Some(&f.window);
            }
        }
        None
    }

    /// Counts a job that starts now.
    pub fn add(&mut self, job: &PendingJob, now: Millis, d: Millis) {
        let need = norm_milli(&job.request);
        let end = now.saturating_add(d);
        let exempt = self.exempt_qos.contains(&job.qos);
        for f in &mut self.floors {
            if !f.owner.owns(&job.account, &job.partition) && !exempt {
                f.others.push((end, need));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(account: &str, qos: &str, gpus: u32) -> PendingJob {
        PendingJob {
            id: 1,
            account: account.into(),
            qos: qos.into(),
            request: Request::whole(gpus),
            ..PendingJob::default()
        }
    }

    fn floors() -> Floors {
        Floors {
            floors: vec![Floor {
                window: "business".into(),
                owner: FloorOwner::Account("inference".into()),
                from_ms: 1000,
                until_ms: 2000,
                // 10 GPUs, 70% kept: others hold at most 3.
                others_max_milli: 3000,
                others: vec![(5000, 2000)],
            }],
            exempt_qos: ["low".to_string()].into(),
        }
    }

    #[test]
    fn a_partition_floor_counts_the_jobs_of_other_partitions() {
        let mut f = floors();
        f.floors[0].owner = FloorOwner::Partition("inference".into());
        let mut own = job("training", "normal", 8);
        own.partition = "inference".into();
        assert_eq!(f.check(&own, 1500, 100), None);
        let mut other = job("inference", "normal", 2);
        other.partition = "batch".into();
        assert_eq!(f.check(&other, 1500, 100), Some("business"));
    }

    #[test]
    fn others_stay_under_the_floor_while_it_is_open_and_across_its_opening() {
        let mut f = floors();
        // Open: 2 held, 1 more fits, 2 do not.
        assert_eq!(f.check(&job("training", "normal", 1), 1500, 100), None);
        assert_eq!(
            f.check(&job("training", "normal", 2), 1500, 100),
            Some("business")
        );
        // Before the opening: a job that ends before it is free; one that runs into it
        // is checked as at the opening.
        assert_eq!(f.check(&job("training", "normal", 8), 0, 999), None);
        assert_eq!(
            f.check(&job("training", "normal", 2), 0, 1500),
            Some("business")
        );
        // The account itself and exempt QoS are never held back.
        assert_eq!(f.check(&job("inference", "normal", 8), 1500, 100), None);
        assert_eq!(f.check(&job("training", "low", 8), 1500, 100), None);
        // After it closes: free.
        assert_eq!(f.check(&job("training", "normal", 8), 2000, 100), None);
        // A start counts.
        f.add(&job("training", "normal", 1), 1500, 100_000);
        assert_eq!(
            f.check(&job("training", "normal", 1), 1500, 100),
            Some("business")
        );
    }
}
