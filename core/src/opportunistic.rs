//! The opportunistic class (issue 60): jobs that run in the idle that guaranteed jobs
//! leave on the GPUs they hold (AntMan, OSDI 2020; Gandiva, OSDI 2018).
//!
//! - **Guaranteed** jobs (every job unless it says otherwise) get their GPUs as asked
//!   and keep their speed: the scheduler's main pass never sees an opportunistic job,
//!   nor the GPUs opportunistic jobs hold (their host CPU and memory it does see).
//! - A GPU is **lent** while its guaranteed holders keep it little busy: measured by
//!   the agents' samples (`watch_gpus`, from every heartbeat) for at least `measure`
//!   with their busy share never above `lend_below` (averaged over `yield_window`), or
//!   idle (under `[idle] util_below`) for `[idle] lend_after`. Its room is its memory
//!   less the holders' peak with `memory_margin`.
//! - The **lend pass** (`lend_pass`, at the start of every scheduling pass) places the
//!   waiting opportunistic jobs on lent GPUs only, with the same pure scheduler over a
//!   view of the lent GPUs alone: a whole GPU asked is one lent GPU (its compute idle,
//!   its memory the room, a hard limit the agent enforces as a share's), a share a
//!   share of the room.
//! - A GPU **nobody holds** (free for `free_after`: the scheduler's main pass found no
//!   guaranteed job for it that long, a window's floor, a gap no gang fits) is lent
//!   too, with `free_gpus`, once free for `free_after`. So is **the part of a shared
//!   GPU nobody holds** (guaranteed shares hold less than all of it, the same holders
//!   for `free_after`): the holders keep their compute share and their memory limits,
//!   which the agent enforces, so the room is the memory their limits leave, known
//!   without measuring them. A guaranteed job placed on a GPU whose borrowers' memory
//!   leaves it no room waits for them (`borrowers_in_the_way`): they yield at once and
//!   the GPU is measured anew, so it is not lent again before the job takes it.
//! - A borrower **yields** (its checkpoint signal, then requeued: never the holder)
//!   when its holders' busy share passes `yield_above` (lent by measure) or leaves idle
//!   (lent by idle), when their GPU memory and the borrowers' limits pass the GPU's
//!   memory, and when a guaranteed job starts on its GPU (`evict_borrowers`). The bound
//!   from the rise to the kill: `yield_window` for the average to cross, a heartbeat,
//!   and the borrower's signal lead (`docs/scheduling.md`).
//!
//! Pure: samples and times in, the lend decisions and commands out; every member of a
//! replicated controller folds the same heartbeats and runs the same passes.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use gpuctl_sched as sched;
use serde::Deserialize;

use crate::event::Heartbeat;
use crate::record::{Job, JobState};
use crate::state::{Cluster, Effects, live_allocs};

/// The `[opportunistic]` table.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Opportunistic {
    /// Opportunistic jobs run (else they wait, told why).
    pub enabled: bool,
    /// A GPU is lent while its holders keep it busy at most this share (0 to 1).
    pub lend_below: f64,
    /// Borrowers yield once their holders' busy share passes this (0 to 1).
    pub yield_above: f64,
    /// How long holders are measured before their GPU is lent.
    #[serde(with = "humantime_serde")]
    pub measure: Duration,
    /// The window the holders' busy share is averaged over.
    #[serde(with = "humantime_serde")]
    pub yield_window: Duration,
    /// Room is left for the holders' GPU memory peak times this.
    pub memory_margin: f64,
    /// A GPU with less room than this is not lent (MiB).
    pub min_memory_mib: u64,
    /// GPUs that nobody holds are lent too, once free for `free_after` (the main pass
    /// had that long to find them a guaranteed job).
    pub free_gpus: bool,
    #[serde(with = "humantime_serde")]
    pub free_after: Duration,
}

impl Default for Opportunistic {
    fn default() -> Self {
        Opportunistic {
            enabled: true,
            lend_below: 0.6,
            yield_above: 0.8,
            measure: Duration::from_secs(300),
            yield_window: Duration::from_secs(10),
            memory_margin: 1.25,
            min_memory_mib: 2048,
            free_gpus: true,
            free_after: Duration::from_secs(60),
        }
    }
}

impl Opportunistic {
    /// What is wrong with the table, if anything.
    pub fn check(&self) -> Result<(), String> {
        let share = |name: &str, x: f64| {
            if (0.0..=1.0).contains(&x) {
                Ok(())
            } else {
                Err(format!(
                    "opportunistic.{name} = {x}: a share of the GPU from 0 to 1"
                ))
            }
        };
        share("lend_below", self.lend_below)?;
        share("yield_above", self.yield_above)?;
        if self.yield_above < self.lend_below {
            return Err(format!(
                "opportunistic.yield_above = {} is under lend_below = {}: a GPU would be lent and taken back at once",
                self.yield_above, self.lend_below
            ));
        }
        if !(1.0..=4.0).contains(&self.memory_margin) {
            return Err(format!(
                "opportunistic.memory_margin = {}: a factor from 1 to 4",
                self.memory_margin
            ));
        }
        if self.free_after < Duration::from_secs(1) {
            return Err("opportunistic.free_after is under a second: give it as \"1m\"".into());
        }
        if self.yield_window < Duration::from_secs(1)
            || self.yield_window > Duration::from_secs(3600)
        {
            return Err("opportunistic.yield_window: from 1s to 1h".into());
        }
        Ok(())
    }
}

/// How a GPU was lent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lent {
    /// Its holders were measured busy at most `lend_below` for `measure`.
    Measured,
    /// Its holders sat idle for `[idle] lend_after`.
    Idle,
    /// Nobody held it for `free_after`.
    Free,
    /// Guaranteed shares held part of it, the same ones for `free_after`: the rest is
    /// lent (its room what their memory limits leave).
    Unheld,
}

/// What the samples say of one GPU's guaranteed holders, since they are the ones they are.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuWatch {
    pub node: String,
    pub memory_mib: u64,
    /// The guaranteed jobs holding it, by id, since `since_ms`.
    pub holders: Vec<u64>,
    /// What they were given of it: compute (milli-GPUs, 1000 = all of it) and memory
    /// (MiB), summed.
    pub held_milli: u32,
    pub held_mib: u64,
    pub since_ms: i64,
    pub last_ms: i64,
    /// Their busy share of the GPU (0 to 1) averaged over `yield_window`.
    pub busy: f64,
    /// The most `busy` was since `since_ms`.
    pub busy_high: f64,
    /// Their GPU memory at the last sample, and at most since `since_ms` (MiB).
    pub memory_used_mib: u64,
    pub memory_peak_mib: u64,
    /// Since when they have been idle, while they are.
    pub idle_since_ms: Option<i64>,
    /// How it was lent, while borrowers run there.
    pub lent: Option<Lent>,
    /// A guaranteed job waits for its borrowers to yield it: not lent again while that
    /// job waits.
    pub reclaimed_for: Option<u64>,
}

impl GpuWatch {
    /// How it may be lent at `now`, if it may.
    pub fn lendable(
        &self,
        cfg: &Opportunistic,
        lend_after: Option<Duration>,
        now: i64,
    ) -> Option<Lent> {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        if self.holders.is_empty() {
            return (cfg.free_gpus && now.saturating_sub(self.since_ms) >= ms(cfg.free_after))
                .then_some(Lent::Free);
        }
        // Idle first: lent as idle, it goes back as soon as its use resumes.
        let held_for = now.saturating_sub(self.since_ms);
        match (lend_after, self.idle_since_ms) {
            (Some(after), Some(t)) if now.saturating_sub(t) >= ms(after) => Some(Lent::Idle),
            _ if held_for >= ms(cfg.measure) && self.busy_high <= cfg.lend_below => {
                Some(Lent::Measured)
            }
            // Not while they use more than the borrowers would be let stay beside.
            _ => (cfg.free_gpus
                && self.held_milli < 1000
                && self.held_mib < self.memory_mib
                && self.busy_high <= cfg.yield_above
                && held_for >= ms(cfg.free_after))
            .then_some(Lent::Unheld),
        }
    }

    /// The GPU memory left to borrowers lent it as `how`: its memory less the holders'
    /// peak with the margin, and for the part nobody holds, less their limits too (MiB).
    pub fn room_mib(&self, cfg: &Opportunistic, how: Lent) -> u64 {
        let peak = (self.memory_peak_mib as f64 * cfg.memory_margin).ceil() as u64;
        let kept = match how {
            Lent::Unheld => peak.max(self.held_mib),
            Lent::Measured | Lent::Idle | Lent::Free => peak,
        };
        self.memory_mib.saturating_sub(kept)
    }
}

/// GPU uuid -> its watch.
pub type Watches = HashMap<String, GpuWatch>;

/// Per GPU uuid of a node: its guaranteed holders and its borrowers, by id.
type Held = HashMap<String, (Vec<u64>, Vec<u64>)>;

/// A job of the opportunistic class.
pub fn is_borrower(j: &Job) -> bool {
    j.spec.opportunistic
}

/// One heartbeat's reading of a GPU: its holders' busy share and memory, and whether
/// per-job figures told them apart from its borrowers'.
struct Reading {
    busy: f64,
    memory_mib: u64,
}

fn reading(m: &crate::node::GpuMetrics, holders: &[u64], borrowers: &[u64]) -> Reading {
    let own = |ids: &[u64]| -> Option<(f64, u64)> {
        let mut busy = 0.0;
        let mut mem = 0;
        for id in ids {
            if let Some(u) = m.jobs.iter().find(|u| u.job_id == *id) {
                busy += f64::from(u.util_pct?) / 100.0;
                mem += u.mem_used_mib;
            }
        }
        Some((busy, mem))
    };
    // Per-job figures where the agent has them; else the whole GPU's, counted as the
    // holders' (never less than theirs: a borrower's use then reads as theirs).
    let (busy, memory_mib) = own(holders)
        .filter(|_| m.jobs.iter().any(|u| u.util_pct.is_some()))
        .unwrap_or_else(|| {
            let borrowed: u64 = m
                .jobs
                .iter()
                .filter(|u| borrowers.contains(&u.job_id))
                .map(|u| u.mem_used_mib)
                .sum();
            (
                f64::from(m.util_pct) / 100.0,
                m.mem_used_mib.saturating_sub(borrowed),
            )
        });
    Reading {
        busy: busy.clamp(0.0, 1.0),
        memory_mib,
    }
}

impl Cluster {
    /// The guaranteed holders and the borrowers of each whole GPU of `node`, by uuid.
    fn holders_on(&self, node: &str) -> Held {
        let mut out = Held::new();
        for id in self.jobs.on_node(node) {
            let Some(j) = self.jobs.job(id).filter(|j| j.state == JobState::Running) else {
                continue;
            };
            for a in live_allocs(j).filter(|a| a.node == node) {
                for s in &a.slots {
                    let e = out.entry(s.uuid.clone()).or_default();
                    if is_borrower(j) {
                        e.1.push(j.id);
                    } else {
                        e.0.push(j.id);
                    }
                }
            }
        }
        for (h, b) in out.values_mut() {
            h.sort_unstable();
            h.dedup();
            b.sort_unstable();
            b.dedup();
        }
        out
    }

    /// Folds a heartbeat's GPU samples into the watches of its node's GPUs, and makes
    /// the borrowers whose holders need their GPU back yield. Wakes the scheduler when
    /// a GPU becomes lendable while opportunistic jobs wait.
    pub(crate) fn watch_gpus(&mut self, hb: &Heartbeat, now: i64) -> Effects {
        let mut effects = Effects::default();
        let cfg = self.config.opportunistic.clone();
        if !cfg.enabled || hb.metrics.is_empty() {
            return effects;
        }
        let lend_after = self.config.idle.lend_after;
        let idle_below = self.config.idle.util_below / 100.0;
        let held = self.holders_on(&hb.node);
        let whole: HashMap<&str, u64> = self
            .fleet
            .nodes
            .get(&hb.node)
            .map(|n| {
                n.gpus
                    .iter()
                    .filter(|g| g.mig.is_empty())
                    .map(|g| (g.uuid.as_str(), g.memory_mib))
                    .collect()
            })
            .unwrap_or_default();
        let mut yields: Vec<(u64, String)> = Vec::new();
        let mut newly_lendable = false;
        let tau = cfg.yield_window.as_secs_f64() * 1000.0;
        for m in &hb.metrics {
            let Some(&memory_mib) = whole.get(m.uuid.as_str()) else {
                continue;
            };
            let (holders, borrowers) = held.get(&m.uuid).cloned().unwrap_or_default();
            if holders.is_empty() && borrowers.is_empty() && !cfg.free_gpus {
                self.watch.remove(&m.uuid);
                continue;
            }
            // Nobody's use to protect on a GPU nobody holds.
            let r = if holders.is_empty() {
                Reading {
                    busy: 0.0,
                    memory_mib: 0,
                }
            } else {
                reading(m, &holders, &borrowers)
            };
            let limits = self.borrowed_mib(&borrowers, &m.uuid);
            // New holders (or a first sample): what they were given, for the watch anew.
            let anew = (self.watch.get(&m.uuid))
                .is_none_or(|w| w.holders != holders || w.since_ms == 0)
                .then(|| self.given(&holders, &m.uuid));
            let w = self.watch.entry(m.uuid.clone()).or_default();
            let before = w.lendable(&cfg, lend_after, w.last_ms).is_some();
            if let Some((held_milli, held_mib)) = anew {
                *w = GpuWatch {
                    node: hb.node.clone(),
                    memory_mib,
                    holders,
                    held_milli,
                    held_mib,
                    since_ms: now,
                    busy: r.busy,
                    lent: w.lent.filter(|_| !borrowers.is_empty()),
                    ..GpuWatch::default()
                };
            } else {
                let dt = (now - w.last_ms).max(0) as f64;
                let a = 1.0 - (-dt / tau).exp();
                w.busy += a * (r.busy - w.busy);
            }
            w.last_ms = now;
            w.busy_high = w.busy_high.max(w.busy);
            w.memory_used_mib = r.memory_mib;
            w.memory_peak_mib = w.memory_peak_mib.max(r.memory_mib);
            if r.busy < idle_below {
                w.idle_since_ms.get_or_insert(now);
            } else {
                w.idle_since_ms = None;
            }
            if borrowers.is_empty() {
                w.lent = None;
                newly_lendable |= !before && w.lendable(&cfg, lend_after, now).is_some();
                continue;
            }
            let (used, size) = (w.memory_used_mib, w.memory_mib);
            let why = yield_reason(w, &cfg, idle_below, r.busy);
            let why = why.or_else(|| {
                (used + limits > size).then(|| {
                    format!(
                        "its holders' GPU memory rose to {used} MiB; with the borrowers' {limits} MiB over the GPU's {size}"
                    )
                })
            });
            if let Some(why) = why {
                // What it does now is measured anew before it is lent again.
                w.since_ms = now;
                w.busy_high = w.busy;
                w.memory_peak_mib = w.memory_used_mib;
                let gpu = short(&m.uuid);
                for b in borrowers {
                    yields.push((b, format!("Yielded GPU {gpu}: {why}")));
                }
            }
        }
        for m in &hb.metrics {
            if self.watch.get(&m.uuid).is_some_and(|w| w.lent.is_some()) {
                self.lent_gpus.insert(m.uuid.clone());
            } else {
                self.lent_gpus.remove(&m.uuid);
            }
        }
        for (id, why) in yields {
            effects.merge(self.yield_borrower(id, &why, now));
        }
        if newly_lendable && self.opportunistic_waiting() {
            effects.wake = true;
        }
        effects
    }

    /// GPU memory the borrowers `ids` are given on `uuid` (their limits, MiB).
    fn borrowed_mib(&self, ids: &[u64], uuid: &str) -> u64 {
        self.given(ids, uuid).1
    }

    /// What the jobs `ids` are given of GPU `uuid`: compute (milli-GPUs) and memory
    /// (MiB), summed.
    fn given(&self, ids: &[u64], uuid: &str) -> (u32, u64) {
        ids.iter()
            .filter_map(|id| self.jobs.job(*id))
            .flat_map(|j| live_allocs(j).flat_map(|a| a.slots.iter()))
            .filter(|s| s.uuid == uuid)
            .fold((0, 0), |(c, m), s| {
                (c.saturating_add(s.compute_milli), m + s.memory_mib)
            })
    }

    /// Whether an opportunistic job waits (not held).
    fn opportunistic_waiting(&self) -> bool {
        self.jobs.active().any(|s| {
            s.job.state == JobState::Pending && s.job.hold.is_empty() && is_borrower(&s.job)
        })
    }

    /// A borrower gives its GPU back: its checkpoint signal (its own, else SIGTERM and
    /// the kill grace), then requeued. Once per run.
    pub(crate) fn yield_borrower(&mut self, id: u64, why: &str, now: i64) -> Effects {
        let Some(s) = self.jobs.get(id) else {
            return Effects::default();
        };
        if s.job.state != JobState::Running || !s.requeue_requested.is_empty() {
            return Effects::default();
        }
        let signal = crate::request::parse_signal_spec(&s.job.spec.signal)
            .ok()
            .flatten()
            .map(|(sig, _)| (sig, crate::policy::lead_secs(&s.job.spec, &self.config)));
        tracing::info!(job = id, why, "opportunistic job yields");
        let mut effects = self.request_requeue(id, why, signal, now);
        self.jobs.edit(id, |s| s.job.reason = why.to_string());
        effects.wake = true;
        effects
    }

    /// A guaranteed job starting on `slots` of `node` takes their GPUs back from the
    /// borrowers there.
    pub(crate) fn evict_borrowers(
        &mut self,
        node: &str,
        slots: &[crate::record::SlotUse],
        by: u64,
        now: i64,
        effects: &mut Effects,
    ) {
        let uuids: BTreeSet<&str> = slots.iter().map(|s| s.uuid.as_str()).collect();
        let mut out = Vec::new();
        for id in self.jobs.on_node(node) {
            let Some(j) = self.jobs.job(id).filter(|j| is_borrower(j)) else {
                continue;
            };
            let on = live_allocs(j)
                .filter(|a| a.node == node)
                .flat_map(|a| a.slots.iter())
                .find(|s| uuids.contains(s.uuid.as_str()));
            if let Some(s) = on {
                out.push((
                    id,
                    format!("Yielded GPU {}: job {by} starts there", short(&s.uuid)),
                ));
            }
        }
        for (id, why) in out {
            effects.merge(self.yield_borrower(id, &why, now));
        }
    }

    /// Whether a guaranteed job placed by `start` must wait for borrowers: on one of
    /// its GPUs the holders' memory now, the borrowers' limits and what the job is
    /// given pass the GPU's memory. Those borrowers yield (once), and the GPU is
    /// measured anew, so that it is not lent again before the job takes it.
    pub(crate) fn borrowers_in_the_way(
        &mut self,
        start: &sched::Start,
        now: i64,
        effects: &mut Effects,
    ) -> bool {
        let mut wait = false;
        for a in &start.allocs {
            let held = self.holders_on(&a.node);
            for slot in &a.slots {
                let Some((holders, borrowers)) = held.get(&slot.uuid) else {
                    continue;
                };
                if borrowers.is_empty() {
                    continue;
                }
                let size = self
                    .fleet
                    .nodes
                    .get(&a.node)
                    .and_then(|n| n.gpus.iter().find(|g| g.uuid == slot.uuid))
                    .map_or(0, |g| g.memory_mib);
                let limits = self.borrowed_mib(borrowers, &slot.uuid);
                let used = if holders.is_empty() {
                    0
                } else {
                    self.watch.get(&slot.uuid).map_or(0, |w| w.memory_used_mib)
                };
                if used + limits + slot.memory_mib <= size {
                    continue;
                }
                wait = true;
                if let Some(w) = self.watch.get_mut(&slot.uuid) {
                    w.since_ms = now;
                    w.lent = None;
                    w.reclaimed_for = Some(start.job);
                }
                self.lent_gpus.remove(&slot.uuid);
                let why = format!(
                    "Yielded GPU {}: job {} needs its memory",
                    short(&slot.uuid),
                    start.job
                );
                for &b in borrowers {
                    effects.merge(self.yield_borrower(b, &why, now));
                }
            }
        }
        if wait {
            self.jobs.annotate_pending(start.job, |j| {
                j.reason = "Waiting for opportunistic jobs to yield its GPUs".into();
            });
        }
        wait
    }

    /// The GPUs lent now, as the scheduler sees them: per node that takes jobs, its
    /// lent GPUs (memory: the room left) and what runs there (the host CPU and memory
    /// of every job, the lent GPUs' borrowers).
    pub fn lent_view(&self, now: i64) -> (sched::ClusterView, HashMap<String, Lent>) {
        let cfg = &self.config.opportunistic;
        let lend_after = self.config.idle.lend_after;
        let mut lent: HashMap<String, Lent> = HashMap::new();
        let mut by_node: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
        let mut held: HashMap<&str, Held> = HashMap::new();
        for (uuid, w) in &self.watch {
            // Its holders as they are now: a watch is as new as the last heartbeat.
            let now_held = held
                .entry(w.node.as_str())
                .or_insert_with(|| self.holders_on(&w.node));
            let same = now_held
                .get(uuid)
                .map_or(w.holders.is_empty(), |(h, _)| *h == w.holders);
            let reclaimed = w.reclaimed_for.is_some_and(|id| {
                self.jobs
                    .job(id)
                    .is_some_and(|j| j.state == JobState::Pending)
            });
            if let Some(how) = w.lendable(cfg, lend_after, now)
                && same
                && !reclaimed
                && w.room_mib(cfg, how) >= cfg.min_memory_mib
            {
                lent.insert(uuid.clone(), how);
                by_node.entry(w.node.as_str()).or_default().push(uuid);
            }
        }
        let partitions = self.config.all_partitions();
        let mut view = sched::ClusterView::default();
        for (name, uuids) in by_node {
            let Some(n) = self.fleet.nodes.get(name) else {
                continue;
            };
            let mut nv = self.node_view(n, &partitions);
            if !nv.eligible() {
                continue;
            }
            nv.slots.retain(|s| uuids.contains(&s.uuid.as_str()));
            for s in &mut nv.slots {
                s.memory_mib = self.watch[&s.uuid].room_mib(cfg, lent[&s.uuid]);
            }
            for id in self.jobs.on_node(name) {
                let Some(j) = self.jobs.job(id) else { continue };
                for a in live_allocs(j).filter(|a| a.node == name) {
                    let mut alloc = sched::Alloc::from(a);
                    if is_borrower(j) {
                        alloc.slots.retain(|s| uuids.contains(&s.uuid.as_str()));
                    } else {
                        alloc.slots.clear();
                    }
                    view.running.push(sched::Running {
                        job: j.id,
                        alloc,
                        end_ms: i64::MAX,
                    });
                }
            }
            view.nodes.push(nv);
        }
        (view, lent)
    }

    /// The lend pass: the waiting opportunistic jobs placed on the GPUs lent now
    /// (`lent_view`), by the same pure scheduler, in priority order; the others say
    /// what they wait for. Runs at the start of every scheduling pass.
    pub(crate) fn lend_pass(&mut self, now: i64) -> Effects {
        let mut effects = Effects::default();
        if !self.opportunistic_waiting() {
            return effects;
        }
        let enabled = self.config.opportunistic.enabled;
        let blocked = crate::state::dependency_blocked(self);
        let shares = self.fair_share_table();
        let queue: Vec<sched::PendingJob> = self
            .jobs
            .active()
            .map(|s| &s.job)
            .filter(|j| j.state == JobState::Pending && j.hold.is_empty() && is_borrower(j))
            .filter(|j| !blocked.contains(&j.id))
            .map(|j| crate::state::pending_job(j, &shares, &self.config))
            .collect();
        let (view, lent) = if enabled {
            self.lent_view(now)
        } else {
            Default::default()
        };
        let mut cfg = self.sched_config.clone();
        cfg.policy = sched::packing::Policy::BestFit;
        cfg.expected_starts = false;
        cfg.floors = Default::default();
        cfg.caps = self.caps();
        let plan = sched::schedule(&view, &queue, &cfg, now);
        for start in &plan.starts {
            for a in &start.allocs {
                for s in &a.slots {
                    if let Some(w) = self.watch.get_mut(&s.uuid) {
                        w.lent = lent.get(&s.uuid).copied();
                        self.lent_gpus.insert(s.uuid.clone());
                    }
                }
            }
            let why = borrowing_reason(start, &self.watch);
            self.start(start, now, &mut effects);
            self.cache_held(start.job);
            self.jobs.edit(start.job, |s| s.job.reason = why);
        }
        let why = if !enabled {
            "Opportunistic: the class is off ([opportunistic] enabled = false)"
        } else if lent.is_empty() {
            "Opportunistic: no GPU is lent now (none held little busy long enough)"
        } else {
            "Opportunistic: no lent GPU fits"
        };
        for w in &plan.waiting {
            self.jobs.annotate_pending(w.job, |j| {
                // A borrower that yielded says so until it runs again.
                if j.reason != why && !j.reason.starts_with("Yielded") {
                    j.reason = why.into();
                }
                j.expected_start_ms = 0;
            });
        }
        effects
    }
}

/// Why a borrower's GPUs must go back, if they must (`busy`: the last sample's).
fn yield_reason(w: &GpuWatch, cfg: &Opportunistic, idle_below: f64, busy: f64) -> Option<String> {
    match w.lent {
        Some(Lent::Idle) if busy >= idle_below => Some(format!(
            "its holder's use resumed ({:.0}% busy)",
            busy * 100.0
        )),
        _ if w.busy > cfg.yield_above => Some(format!(
            "its holders' busy share rose to {:.0}% (over {:.0}%)",
            w.busy * 100.0,
            cfg.yield_above * 100.0
        )),
        _ => None,
    }
}

/// What a borrower says while it runs: whose idle it fills.
fn borrowing_reason(start: &sched::Start, watch: &Watches) -> String {
    let mut parts = Vec::new();
    for a in &start.allocs {
        for s in &a.slots {
            if let Some(w) = watch.get(&s.uuid) {
                if w.holders.is_empty() {
                    parts.push(format!(
                        "{} GPU {} (nobody holds it)",
                        a.node,
                        short(&s.uuid)
                    ));
                    continue;
                }
                let holders: Vec<String> = w.holders.iter().map(u64::to_string).collect();
                parts.push(format!(
                    "{} GPU {} of job {} ({:.0}% busy)",
                    a.node,
                    short(&s.uuid),
                    holders.join(","),
                    w.busy_high * 100.0
                ));
            }
        }
    }
    format!("Borrowing idle: {}", parts.join("; "))
}

/// A GPU's uuid as listings show it (its first 12 characters).
fn short(uuid: &str) -> &str {
    uuid.get(..12).unwrap_or(uuid)
}
