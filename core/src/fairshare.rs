//! Fair share in the controller: charging what runs to its owner's decayed usage
//! (`gpuctl_sched::fairshare::Usage`), and the factor each pending job gets.
//!
//! A pass charges every running job for the time since the last charge, and every run
//! that stopped since then (ended, requeued) for its last stretch, in normalised
//! GPU-seconds: a whole GPU is 1, a share its compute part, a MIG instance its fraction
//! of the GPU, each times its model's weight (`[fairshare] model_weights`).

use std::collections::HashMap;

use crate::record::{Allocation, Job, UsageEntry, UsageRecord};
use gpuctl_sched as sched;
use gpuctl_sched::fairshare::{FairShareTable, Shares, mig_fraction};

use crate::config::Config;
use crate::jobs::owner;
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

/// Normalised GPUs an allocation holds: a whole GPU is its model's weight, a share
/// that times its compute part, a MIG instance the weight times the instance's
/// fraction. Slots are found on their own node (eight GPUs to look through, not a table
/// of every GPU in the cluster: at 80,000 GPUs building that table and looking each
/// slot up in it took 50 ms of every pass, under the lock); a slot no node reports
/// counts by its compute part.
fn gpus_held<'a>(c: &Cluster, allocs: impl IntoIterator<Item = &'a Allocation>) -> f64 {
    let fs = &c.config.fairshare;
    let mut held = 0.0;
    for a in allocs {
        let gpus = c.fleet.nodes.get(&a.node).map_or(&[][..], |n| &n.gpus[..]);
        for s in &a.slots {
            let part = f64::from(s.compute_milli) / 1000.0;
            held += gpus
                .iter()
                .find_map(|g| {
                    let w = || fs.model_weight(&g.model);
                    if g.uuid == s.uuid {
                        return Some(w() * part);
                    }
                    let m = g.mig.iter().find(|m| m.uuid == s.uuid)?;
                    Some(w() * mig_fraction(&m.profile))
                })
                .unwrap_or(part);
        }
    }
    held
}

/// Fair share's own state, one owner: the decayed usage per account and user (kept on
/// disk), whether it changed since the shell last wrote it and when it was last marked
/// so (it is written at most once a minute), and what each running job is charged per
/// second (memory only).
#[derive(Debug, Default)]
pub struct FairShare {
    pub(crate) usage: sched::fairshare::Usage,
    pub(crate) dirty: bool,
    pub(crate) marked_ms: i64,
    pub(crate) held: HeldCache,
}

impl FairShare {
    /// The first of its invariants that does not hold, if any: usage finite and not
    /// negative; each running job charged a finite, non-negative rate to an owner the
    /// cache numbers, stamped no later than the last charge; owners and their numbers
    /// one to one.
    pub fn check(&self) -> Result<(), String> {
        if let Some(((a, u), v)) = self
            .usage
            .by_user
            .iter()
            .find(|(_, v)| !v.is_finite() || **v < 0.0)
        {
            return Err(format!("fair-share usage of {a}/{u} is {v}"));
        }
        let h = &self.held;
        for (id, x) in &h.by_job {
            if !x.gpus.is_finite() || x.gpus < 0.0 {
                return Err(format!("job {id} is charged {} GPUs", x.gpus));
            }
            if x.owner >= h.owners.len() {
                return Err(format!(
                    "job {id} is charged to owner {} of {}",
                    x.owner,
                    h.owners.len()
                ));
            }
            if x.seen > h.charges {
                return Err(format!(
                    "job {id} seen at charge {}, past the last {}",
                    x.seen, h.charges
                ));
            }
        }
        if h.owner_ids.len() != h.owners.len()
            || h.owner_ids.iter().any(|(k, &i)| h.owners.get(i) != Some(k))
        {
            return Err("fair share's owners and their numbers differ".into());
        }
        Ok(())
    }
}

/// Per running job: the normalised GPUs it holds and its owner, computed once per run
/// (an allocation does not change while it runs): at 55,000 running jobs, finding every
/// slot on its node at every pass was 50 ms under the lock.
#[derive(Debug, Default)]
pub struct HeldCache {
    by_job: HashMap<u64, Held>,
    /// Charges so far: each running job's entry is stamped with the charge that last
    /// saw it, and entries of jobs no longer running are dropped by their stamp.
    charges: u64,
    /// (account, user) by index: a run names its owner by number.
    owners: Vec<(String, String)>,
    owner_ids: HashMap<(String, String), usize>,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    /// The run it was computed for (a requeued job starts again with another), and
    /// how many of its allocations were live (a gang's rank may end before the rest).
    start_ms: i64,
    live: usize,
    gpus: f64,
    owner: usize,
    /// The charge that last saw it running.
    seen: u64,
    /// A borrower (the opportunistic class): charged by what it used
    /// (`used_gpus`), `gpus` only until its first samples.
    by_use: bool,
}

/// The charge rate of `j`'s run that started at `start_ms` with `live` allocations
/// (its owner numbered in `cache`), stamped `seen`.
fn held(
    c: &Cluster,
    cache: &mut HeldCache,
    j: &Job,
    start_ms: i64,
    live: usize,
    seen: u64,
) -> Held {
    let account = j.spec.account.as_str();
    Held {
        start_ms,
        live,
        gpus: gpus_held(c, live_allocs(j)),
        owner: cache.owner(account, owner(j)),
        seen,
        by_use: crate::opportunistic::is_borrower(j),
    }
}

/// A borrower's charge rate: what it used of each of its GPUs (its mean busy share of
/// it, from its samples: live while it runs, its record's once its run settled), each
/// GPU weighted by its model as held GPUs are. `None` before any sample: it is charged
/// what it holds until then.
fn used_gpus(c: &Cluster, j: &Job) -> Option<f64> {
    let usage = c.live_usage.get(&j.id).or(j.usage.as_ref())?;
    let fs = &c.config.fairshare;
    let mut used = None;
    for s in usage.slots.iter().filter(|s| s.samples > 0) {
        let busy = (s.util_sum / s.samples as f64 / 100.0).clamp(0.0, 1.0);
        let gpus = c.fleet.nodes.get(&s.node).map_or(&[][..], |n| &n.gpus[..]);
        let weight = (gpus.iter())
            .find(|g| g.uuid == s.uuid || g.mig.iter().any(|m| m.uuid == s.uuid))
            .map_or(1.0, |g| fs.model_weight(&g.model));
        *used.get_or_insert(0.0) += busy * weight;
    }
    used
}

/// Adds `x` to `v[i]`, growing `v` with zeros as needed.
fn add(v: &mut Vec<f64>, i: usize, x: f64) {
    if v.len() <= i {
        v.resize(i + 1, 0.0);
    }
    v[i] += x;
}

impl HeldCache {
    /// How many running jobs' charges are kept.
    pub fn len(&self) -> usize {
        self.by_job.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_job.is_empty()
    }

    fn owner(&mut self, account: &str, user: &str) -> usize {
        let key = (account.to_string(), user.to_string());
        if let Some(&i) = self.owner_ids.get(&key) {
            return i;
        }
        self.owners.push(key.clone());
        self.owner_ids.insert(key, self.owners.len() - 1);
        self.owners.len() - 1
    }
}

impl Cluster {
    /// Puts a run that just started into the charge cache, so that the next charge
    /// finds it there: `apply_starts` calls it, in the parts a plan is applied in. Left
    /// to the charge, a mass start's runs were all computed in one hold of the lock
    /// (98,000 at 25,000 nodes: 128 ms).
    pub(crate) fn cache_held(&mut self, id: u64) {
        let (Some((start_ms, live)), Some(j)) = (self.jobs.running_of(id), self.jobs.job(id))
        else {
            return;
        };
        let mut cache = std::mem::take(&mut self.fair.held);
        let seen = cache.charges;
        let h = held(self, &mut cache, j, start_ms, live, seen);
        cache.by_job.insert(id, h);
        self.fair.held = cache;
    }

    /// Charges usage up to `now`: what ran since the last charge.
    pub(crate) fn charge_usage(&mut self, now: i64) {
        let half_life =
            i64::try_from(self.config.fairshare.half_life.as_millis()).unwrap_or(i64::MAX);
        let last = self.fair.usage.as_of_ms;
        let ended = self.jobs.take_ended_runs();
        if last == 0 {
            // The first charge only sets the clock.
            self.fair.usage.decay_to(now, half_life);
            return;
        }
        if now <= last {
            return;
        }
        self.fair.usage.decay_to(now, half_life);
        // Summed per owner (by the cache's owner numbers) first: a few owners,
        // thousands of running jobs. Ended runs and running jobs apart, then added.
        let mut cache = std::mem::take(&mut self.fair.held);
        let (mut ended_by, mut running_by) = (Vec::new(), Vec::new());
        for r in &ended {
            let from = r.start_ms.max(last);
            if r.end_ms > from {
                let secs = (r.end_ms - from) as f64 / 1000.0;
                let o = cache.owner(&r.account, &r.user);
                let borrower =
                    (self.jobs.job(r.job)).filter(|j| crate::opportunistic::is_borrower(j));
                let rate = borrower
                    .and_then(|j| used_gpus(self, j))
                    .unwrap_or_else(|| gpus_held(self, &r.allocations));
                add(&mut ended_by, o, rate * secs);
            }
        }
        // Updated in place (a new map of 55,000 entries each pass was most of a
        // charge's time at 25,000 nodes); entries not seen by this charge go after.
        cache.charges += 1;
        let mark = cache.charges;
        let mut seen = 0;
        for (id, start_ms, live) in self.jobs.running() {
            let held = match cache.by_job.get_mut(&id) {
                Some(h) if h.start_ms == start_ms && h.live == live => {
                    h.seen = mark;
                    *h
                }
                _ => {
                    let Some(j) = self.jobs.job(id) else { continue };
                    let h = held(self, &mut cache, j, start_ms, live, mark);
                    cache.by_job.insert(id, h);
                    h
                }
            };
            seen += 1;
            let from = start_ms.max(last);
            if now > from {
                let rate = match held.by_use {
                    true => (self.jobs.job(id))
                        .and_then(|j| used_gpus(self, j))
                        .unwrap_or(held.gpus),
                    false => held.gpus,
                };
                add(
                    &mut running_by,
                    held.owner,
                    rate * (now - from) as f64 / 1000.0,
                );
            }
        }
        if cache.by_job.len() > seen {
            cache.by_job.retain(|_, h| h.seen == mark);
        }
        self.fair.held = cache;
        for (i, (a, u)) in self.fair.held.owners.iter().enumerate() {
            let ended = ended_by.get(i).copied().unwrap_or(0.0);
            let running = running_by.get(i).copied().unwrap_or(0.0);
            self.fair.usage.charge(a, u, ended + running);
        }
        if now - self.fair.marked_ms >= USAGE_WRITE_MS {
            self.fair.dirty = true;
            self.fair.marked_ms = now;
        }
    }

    /// The usage as the store keeps it.
    pub fn usage_record(&self) -> UsageRecord {
        UsageRecord {
            as_of_ms: self.fair.usage.as_of_ms,
            entries: self
                .fair
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
    pub(crate) fn restore_usage(&mut self, r: &UsageRecord) {
        self.fair.usage.as_of_ms = r.as_of_ms;
        self.fair.usage.by_user = r
            .entries
            .iter()
            .filter(|e| e.gpu_seconds.is_finite() && e.gpu_seconds > 0.0)
            .map(|e| ((e.account.clone(), e.user.clone()), e.gpu_seconds))
            .collect();
    }

    /// The fair-share table of everyone with usage or pending jobs.
    /// Every association (like sshare): the configured accounts' users and whoever has
    /// active jobs, with or without usage.
    pub fn fair_share_table(&self) -> FairShareTable {
        let configured = self
            .config
            .accounts
            .iter()
            .flat_map(|(a, c)| c.users.iter().map(move |u| (a.as_str(), u.as_str())));
        self.fair.usage.table(
            self.jobs.active_owners().chain(configured),
            &ConfigShares(&self.config),
        )
    }
}

#[cfg(test)]
mod owner_tests {
    use super::*;

    #[test]
    fn each_broken_fair_share_invariant_is_named() {
        let mut f = FairShare::default();
        f.usage.charge("acct", "ana", 10.0);
        f.held.charges = 2;
        let o = f.held.owner("acct", "ana");
        let held = |gpus: f64, owner: usize, seen: u64| Held {
            start_ms: 0,
            live: 1,
            gpus,
            owner,
            seen,
            by_use: false,
        };
        f.held.by_job.insert(1, held(0.5, o, 2));
        assert_eq!(f.check(), Ok(()));
        let broken = |edit: &dyn Fn(&mut FairShare)| {
            let mut g = FairShare {
                usage: f.usage.clone(),
                ..FairShare::default()
            };
            g.held.charges = 2;
            g.held.owner("acct", "ana");
            g.held.by_job.insert(1, held(0.5, 0, 2));
            edit(&mut g);
            g.check().unwrap_err()
        };
        let e = broken(&|g| {
            g.usage
                .by_user
                .insert(("acct".into(), "bob".into()), f64::NAN);
        });
        assert!(e.contains("usage of acct/bob is NaN"), "{e}");
        let e = broken(&|g| {
            g.held.by_job.insert(2, held(-1.0, 0, 1));
        });
        assert!(e.contains("job 2 is charged -1 GPUs"), "{e}");
        let e = broken(&|g| {
            g.held.by_job.insert(2, held(1.0, 5, 1));
        });
        assert!(e.contains("owner 5 of 1"), "{e}");
        let e = broken(&|g| {
            g.held.by_job.insert(2, held(1.0, 0, 3));
        });
        assert!(e.contains("past the last 2"), "{e}");
        let e = broken(&|g| g.held.owners.push(("x".into(), "y".into())));
        assert!(e.contains("owners and their numbers differ"), "{e}");
    }
}
