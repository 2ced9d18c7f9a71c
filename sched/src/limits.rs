//! QoS caps: the most GPUs one user, or one account, may hold at once under a QoS
//! (Slurm's `MaxTRESPerUser`/`MaxTRESPerAccount` on a QOS), in normalised GPU milli: a
//! whole GPU is 1000, a share its compute milli, a MIG instance its fraction of the GPU.
//!
//! A job over a cap waits with the cap as its reason and no reservation; it does not
//! hold back the jobs behind it (the cap, not the cluster, is what it waits for).

use std::collections::{BTreeMap, HashMap};

use super::fairshare::mig_fraction;
use super::model::*;

/// The caps of one QoS (`None`: no cap).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QosCaps {
    pub per_user_milli: Option<u64>,
    pub per_account_milli: Option<u64>,
}

/// The caps, and what each owner holds now under each QoS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caps {
    pub qos: BTreeMap<String, QosCaps>,
    /// (qos, user) -> GPU milli held by running jobs.
    pub by_user: HashMap<(String, String), u64>,
    /// (qos, account) -> GPU milli held by running jobs.
    pub by_account: HashMap<(String, String), u64>,
    /// Throttled job arrays (`--array ...%N`) -> their tasks running now.
    pub arrays: HashMap<JobId, u32>,
}

/// Which cap a job would break.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Over {
    User {
        qos: String,
        limit_milli: u64,
    },
    Account {
        qos: String,
        limit_milli: u64,
    },
    /// Its array runs as many tasks as its `%N` allows.
    Array {
        array: JobId,
        max_running: u32,
    },
}

/// Normalised GPU milli a request holds (over all its nodes).
pub fn norm_milli(req: &Request) -> u64 {
    match &req.gpu {
        GpuRequest::Mig { profile, count } => {
            (mig_fraction(profile) * f64::from(*count) * 1000.0).round() as u64
                * u64::from(req.nodes.max(1))
        }
        _ => req.gpu_milli_total(),
    }
}

impl Caps {
    pub fn is_empty(&self) -> bool {
        self.qos.values().all(|q| *q == QosCaps::default()) && self.arrays.is_empty()
    }

    /// The cap `job` would break if it started now, if any.
    pub fn check(&self, job: &PendingJob) -> Option<Over> {
        if let Some((array, max_running)) = job.array
            && max_running > 0
            && self.arrays.get(&array).copied().unwrap_or(0) >= max_running
        {
            return Some(Over::Array { array, max_running });
        }
        let caps = self.qos.get(&job.qos)?;
        let need = norm_milli(&job.request);
        let key = |who: &str| (job.qos.clone(), who.to_string());
        if let Some(limit) = caps.per_user_milli {
            let held = self.by_user.get(&key(&job.user)).copied().unwrap_or(0);
            if held + need > limit {
                return Some(Over::User {
                    qos: job.qos.clone(),
                    limit_milli: limit,
                });
            }
        }
        if let Some(limit) = caps.per_account_milli {
            let held = self
                .by_account
                .get(&key(&job.account))
                .copied()
                .unwrap_or(0);
            if held + need > limit {
                return Some(Over::Account {
                    qos: job.qos.clone(),
                    limit_milli: limit,
                });
            }
        }
        None
    }

    /// Counts a task of a throttled array that starts (or runs).
    pub fn add_task(&mut self, array: Option<(JobId, u32)>) {
        if let Some((a, max)) = array
            && max > 0
        {
            *self.arrays.entry(a).or_default() += 1;
        }
    }

    /// Counts a job that starts (or runs).
    pub fn add(&mut self, qos: &str, user: &str, account: &str, milli: u64) {
        if !self.qos.contains_key(qos) {
            return;
        }
        *self
            .by_user
            .entry((qos.to_string(), user.to_string()))
            .or_default() += milli;
        *self
            .by_account
            .entry((qos.to_string(), account.to_string()))
            .or_default() += milli;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(user: &str, account: &str, gpus: u32) -> PendingJob {
        PendingJob {
            id: 1,
            qos: "normal".into(),
            user: user.into(),
            account: account.into(),
            request: Request::whole(gpus),
            ..PendingJob::default()
        }
    }

    #[test]
    fn user_and_account_caps() {
        let mut c = Caps::default();
        c.qos.insert(
            "normal".into(),
            QosCaps {
                per_user_milli: Some(4000),
                per_account_milli: Some(6000),
            },
        );
        assert_eq!(c.check(&job("alice", "a", 4)), None);
        assert!(matches!(
            c.check(&job("alice", "a", 5)),
            Some(Over::User {
                limit_milli: 4000,
                ..
            })
        ));
        c.add("normal", "alice", "a", 3000);
        c.add("normal", "bob", "a", 2000);
        assert!(matches!(
            c.check(&job("alice", "a", 2)),
            Some(Over::User { .. })
        ));
        assert!(matches!(
            c.check(&job("bob", "a", 2)),
            Some(Over::Account { .. })
        ));
        assert_eq!(c.check(&job("carol", "b", 4)), None);
        // Another QoS is not capped.
        let mut other = job("alice", "a", 8);
        other.qos = "low".into();
        assert_eq!(c.check(&other), None);
    }

    #[test]
    fn shares_and_mig_count_their_fraction() {
        let share = Request {
            gpu: GpuRequest::Share {
                compute_milli: Some(250),
                memory_mib: None,
            },
            ..Request::default()
        };
        assert_eq!(norm_milli(&share), 250);
        let mig = Request {
            gpu: GpuRequest::Mig {
                profile: "1g.10gb".into(),
                count: 7,
            },
            ..Request::default()
        };
        assert_eq!(norm_milli(&mig), 1000);
    }
}
