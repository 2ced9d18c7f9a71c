//! Window floors: while a time-of-day window is open, a share of the cluster's GPUs is
//! kept for an account, or for the jobs of a partition. Other jobs may hold at most the
//! rest then, except jobs that give GPUs back: those of exempt QoS levels (those that
//! others preempt) and, where the floor lends (`Floor::lends`), reclaimable jobs (they
//! checkpoint on a signal and are requeued). Those borrow the floor's idle GPUs and are
//! taken back when the owner needs them (`preempt`). A job that would still run when a
//! window opens starts only if the floor holds at the opening too, so backfill never
//! starts a job that cannot give back across a boundary that would break the guarantee.

use std::collections::BTreeSet;

use super::limits::norm_milli;
use super::model::*;

/// Whose GPUs a floor keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FloorOwner {
    Account(String),
    Partition(String),
}

impl std::fmt::Display for FloorOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FloorOwner::Account(a) => write!(f, "{a}"),
            FloorOwner::Partition(p) => write!(f, "partition {p}"),
        }
    }
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
    /// What others' running jobs that count hold: (end, GPU milli).
    pub others: Vec<(Millis, u64)>,
    /// Reclaimable jobs may borrow it (its owner can take them back: preemption is
    /// allowed while the window is open).
    pub lends: bool,
    /// A job of its owner waits that its room would take: nothing is lent meanwhile
    /// (what a borrower gives back goes to the owner, not to the next borrower).
    pub owner_waits: bool,
}

impl Floor {
    /// Whether a reclaimable job may borrow it now.
    fn lends_now(&self) -> bool {
        self.lends && !self.owner_waits
    }
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

    /// Whether `job` counts against `f` (`borrow`: as one that gives back, if it does).
    fn counts(&self, f: &Floor, job: &PendingJob, borrow: bool) -> bool {
        let gives_back =
            self.exempt_qos.contains(&job.qos) || (borrow && f.lends_now() && job.reclaimable);
        !f.owner.owns(&job.account, &job.partition) && !gives_back
    }

    /// The window whose floor `job` would break if it started at `now` for `d` ms.
    pub fn check(&self, job: &PendingJob, now: Millis, d: Millis) -> Option<&str> {
        self.breaks(job, now, d, true).map(|f| f.window.as_str())
    }

    /// The floor a reclaimable `job` borrows if it starts at `now` for `d` ms: the one
    /// it would break if it could not give its GPUs back.
    pub fn borrows(&self, job: &PendingJob, now: Millis, d: Millis) -> Option<&Floor> {
        if !job.reclaimable || self.exempt_qos.contains(&job.qos) {
            return None;
        }
        self.breaks(job, now, d, false)
    }

    fn breaks(&self, job: &PendingJob, now: Millis, d: Millis, borrow: bool) -> Option<&Floor> {
        let end = now.saturating_add(d);
        let need = norm_milli(&job.request);
        for f in &self.floors {
            if !self.counts(f, job, borrow) || end <= f.from_ms || now >= f.until_ms {
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
                return Some(f);
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
            let borrows = f.lends_now() && job.reclaimable;
            if !f.owner.owns(&job.account, &job.partition) && !exempt && !borrows {
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
                lends: true,
                owner_waits: false,
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

    #[test]
    fn a_reclaimable_job_borrows_a_floor_that_lends_and_only_that() {
        let mut f = floors();
        let mut ckpt = job("training", "normal", 8);
        ckpt.reclaimable = true;
        // Open, and across the opening: it may start, and says whose floor it borrows.
        assert_eq!(f.check(&ckpt, 1500, 100), None);
        let window = |f: Option<&Floor>| f.map(|f| f.window.clone());
        assert_eq!(window(f.borrows(&ckpt, 1500, 100)), Some("business".into()));
        assert_eq!(f.check(&ckpt, 0, 1500), None);
        assert_eq!(window(f.borrows(&ckpt, 0, 1500)), Some("business".into()));
        // Within what others may hold it borrows nothing.
        let mut small = job("training", "normal", 1);
        small.reclaimable = true;
        assert_eq!(f.borrows(&small, 1500, 100), None);
        // Its start does not count against the floor.
        f.add(&ckpt, 1500, 100_000);
        assert_eq!(f.check(&job("training", "normal", 1), 1500, 100), None);
        // While the owner waits for its room nothing more is lent.
        f.floors[0].owner_waits = true;
        assert_eq!(f.check(&ckpt, 1500, 100), Some("business"));
        f.floors[0].owner_waits = false;
        // A floor that does not lend (no preemption while open) holds it back.
        f.floors[0].lends = false;
        assert_eq!(f.check(&ckpt, 1500, 100), Some("business"));
        assert!(f.borrows(&ckpt, 1500, 100).is_some());
    }
}
