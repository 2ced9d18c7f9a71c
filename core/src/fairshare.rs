//! Fair share in the controller: charging what runs to its owner's decayed usage
//! (`gpuctl_sched::fairshare::Usage`), and the factor each pending job gets.
//!
//! A pass charges every running job for the time since the last charge, and every run
//! that stopped since then (ended, requeued) for its last stretch, in normalised
//! GPU-seconds: a whole GPU is 1, a share its compute part, a MIG instance its fraction
//! of the GPU, each times its model's weight (`[fairshare] model_weights`).

use std::collections::BTreeMap;

use gpuctl_proto as pb;
use gpuctl_sched::fairshare::{FairShareTable, Shares, mig_fraction};

use gpuctl_proto::store::{StoredUsage, UsageEntry};

use crate::config::Config;
use crate::jobs::{job_of, owner};
use crate::state::{Cluster, live_allocs};

/// Usage is written at most this often (a crash loses at most this much of it).
const USAGE_WRITE_MS: i64 = 60_000;

/// The shares the config gives (accounts not configured hold 1, users 1).
pub struct ConfigShares<'a>(pub &'a Config);

impl Shares for ConfigShares<'_> {
    fn account(&self, account: &str) -> f64 {
        self.0
            .accounts
            .get(account)
            .and_then(|a| a.shares)
            .map_or(1.0, f64::from)
    }

    fn user(&self, account: &str, user: &str) -> f64 {
        self.0
            .accounts
            .get(account)
            .and_then(|a| a.user_shares.get(user))
            .map_or(1.0, |&s| f64::from(s))
    }
}

/// What one slot of a node costs per second: (UUID -> cost).
fn slot_costs(c: &Cluster) -> BTreeMap<&str, (f64, bool)> {
    let fs = &c.config.fairshare;
    let mut out = BTreeMap::new();
    for n in c.nodes.values() {
        for g in &n.gpus {
            let w = fs.model_weight(&g.model);
            out.insert(g.uuid.as_str(), (w, false));
            for m in &g.mig {
                out.insert(m.uuid.as_str(), (w * mig_fraction(&m.profile), true));
            }
        }
    }
    out
}

/// Normalised GPUs an allocation holds.
fn gpus_held<'a>(
    allocs: impl IntoIterator<Item = &'a pb::Allocation>,
    costs: &BTreeMap<&str, (f64, bool)>,
) -> f64 {
    allocs
        .into_iter()
        .flat_map(|a| &a.slots)
        .map(|s| match costs.get(s.uuid.as_str()) {
            Some(&(w, true)) => w,
            Some(&(w, false)) => w * f64::from(s.compute_milli) / 1000.0,
            None => f64::from(s.compute_milli) / 1000.0,
        })
        .sum()
}

impl Cluster {
    /// Charges usage up to `now`: what ran since the last charge.
    pub fn charge_usage(&mut self, now: i64) {
        let half_life =
            i64::try_from(self.config.fairshare.half_life.as_millis()).unwrap_or(i64::MAX);
        let last = self.usage.as_of_ms;
        let ended = self.jobs.take_ended_runs();
        if last == 0 {
            // The first charge only sets the clock.
            self.usage.decay_to(now, half_life);
            return;
        }
        if now <= last {
            return;
        }
        self.usage.decay_to(now, half_life);
        let costs = slot_costs(self);
        let mut charges: Vec<(String, String, f64)> = Vec::new();
        for r in &ended {
            let from = r.start_ms.max(last);
            if r.end_ms > from {
                let secs = (r.end_ms - from) as f64 / 1000.0;
                charges.push((
                    r.account.clone(),
                    r.user.clone(),
                    gpus_held(&r.allocations, &costs) * secs,
                ));
            }
        }
        for s in self.jobs.active() {
            let j = job_of(s);
            // Borrowed, not cloned: this runs for every running job at every pass.
            if live_allocs(j).next().is_none() {
                continue;
            }
            let from = j.start_time_ms.max(last);
            if now > from {
                let secs = (now - from) as f64 / 1000.0;
                let account = j.spec.as_ref().map_or("", |x| x.account.as_str());
                charges.push((
                    account.to_string(),
                    owner(j).to_string(),
                    gpus_held(live_allocs(j), &costs) * secs,
                ));
            }
        }
        for (a, u, amount) in charges {
            self.usage.charge(&a, &u, amount);
        }
        if now - self.usage_marked_ms >= USAGE_WRITE_MS {
            self.usage_dirty = true;
            self.usage_marked_ms = now;
        }
    }

    /// The usage as the store keeps it.
    pub fn usage_record(&self) -> StoredUsage {
        StoredUsage {
            as_of_ms: self.usage.as_of_ms,
            entries: self
                .usage
                .by_user
                .iter()
                .map(|((account, user), &gpu_seconds)| UsageEntry {
                    account: account.clone(),
                    user: user.clone(),
                    gpu_seconds,
                })
                .collect(),
        }
    }

    /// Usage read back at start (entries that are not numbers >= 0 are dropped).
    pub fn restore_usage(&mut self, r: &StoredUsage) {
        self.usage.as_of_ms = r.as_of_ms;
        self.usage.by_user = r
            .entries
            .iter()
            .filter(|e| e.gpu_seconds.is_finite() && e.gpu_seconds > 0.0)
            .map(|e| ((e.account.clone(), e.user.clone()), e.gpu_seconds))
            .collect();
    }

    /// The fair-share table of everyone with usage or pending jobs.
    pub fn fair_share_table(&self) -> FairShareTable {
        // Each (account, user) once: the table makes two strings of each it is given.
        let owners: std::collections::HashSet<(&str, &str)> = self
            .jobs
            .active()
            .map(job_of)
            .map(|j| (j.spec.as_ref().map_or("", |x| x.account.as_str()), owner(j)))
            .collect();
        self.usage.table(owners, &ConfigShares(&self.config))
    }
}
