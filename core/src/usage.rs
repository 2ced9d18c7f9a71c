//! What every job really uses: the agents' GPU samples folded into per-slot figures
//! while the job runs (memory only: a heartbeat a second from every node must not
//! write the store), kept with the job record when its run ends, with the host figures
//! (cgroup CPU time, peak memory) its ranks report as they end.
//!
//! Shares are measured against their share: a GPU's utilisation is split over the jobs
//! on it in proportion to their compute shares, and a job's part is then read against
//! its own share (a quarter share keeping a quarter of the GPU busy is at 100%). Energy
//! is split the same way. GPU memory is each job's own (its processes').

use std::collections::HashMap;

use crate::record::{Job, JobUsage, SlotUsage, SlotUse, Step};
use crate::state::{Cluster, live_allocs};

/// A gap between two samples longer than this is not charged energy in full: the agent
/// was away, and what the GPU drew meanwhile is unknown.
const MAX_SAMPLE_GAP_MS: i64 = 60_000;

/// Live usage of running jobs, by job id.
pub type LiveUsage = HashMap<u64, JobUsage>;

/// Running ranks' (CPU time ms, peak memory bytes), by (job id, node).
pub type LiveHost = HashMap<(u64, String), (u64, u64)>;

/// Running ranks' steps running now, by job id, then node (a listing asks of every
/// job whether it has any: one lookup).
pub type LiveSteps = HashMap<u64, HashMap<String, Vec<Step>>>;

/// One allocated slot of a job on a node: (job, its slot use, the GPU's uuid).
struct Holder<'a> {
    job: u64,
    slot: &'a SlotUse,
}

impl Cluster {
    /// Folds a heartbeat's samples into the usage of the jobs the agent runs. `now` is
    /// when the controller got them: a busy sample marks the job busy then (the idle
    /// policy compares the controller's times, whatever the agent's clock says).
    pub(crate) fn fold_usage(
        &mut self,
        node: &str,
        running: &[crate::event::Running],
        samples: &[crate::node::GpuMetrics],
        now: i64,
    ) {
        if samples.is_empty() || running.is_empty() {
            return;
        }
        // The MIG instances of each GPU (a slice's samples are its GPU's).
        let parent: HashMap<&str, &str> = self
            .fleet
            .nodes
            .get(node)
            .map(|n| {
                n.gpus
                    .iter()
                    .flat_map(|g| {
                        g.mig
                            .iter()
                            .map(move |m| (m.uuid.as_str(), g.uuid.as_str()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        // Who holds what on each GPU of the node, from the jobs the agent runs.
        let mut on_gpu: HashMap<&str, Vec<Holder<'_>>> = HashMap::new();
        for r in running {
            let Some(j) = self.jobs.job(r.job_id).filter(|j| j.attempt == r.attempt) else {
                continue;
            };
            for a in live_allocs(j).filter(|a| a.node == node) {
                for s in &a.slots {
                    let gpu = parent.get(s.uuid.as_str()).copied().unwrap_or(&s.uuid);
                    on_gpu
                        .entry(gpu)
                        .or_default()
                        .push(Holder { job: j.id, slot: s });
                }
            }
        }
        let mut busy = Vec::new();
        for m in samples {
            let Some(holders) = on_gpu.get(m.uuid.as_str()) else {
                continue;
            };
            let shares: u64 = holders.iter().map(|h| u64::from(share_of(h.slot))).sum();
            for h in holders {
                let own = m.jobs.iter().find(|u| u.job_id == h.job);
                let used = (
                    own.map_or(0, |u| u.mem_used_mib),
                    own.and_then(|u| u.util_pct),
                );
                let usage = self.live_usage.entry(h.job).or_default();
                if let Some(util) = fold_sample(usage, node, h.slot, shares, used, m) {
                    busy.push((h.job, util));
                }
            }
        }
        for (job, util) in busy {
            self.note_busy(job, now, util);
        }
    }

    /// The usage to show for a job: the live figures while it runs (with its running
    /// ranks' host figures so far), else the record's.
    pub fn usage_of(&self, j: &Job) -> Option<JobUsage> {
        let mut u = self.live_usage.get(&j.id).cloned();
        for ((id, _), &(cpu, mem)) in &self.live_host {
            if *id == j.id {
                let u = u.get_or_insert_with(Default::default);
                u.cpu_time_ms += cpu;
                u.host_mem_peak_bytes = u.host_mem_peak_bytes.max(mem);
                u.host_reports += 1;
            }
        }
        u.or_else(|| j.usage.clone())
    }

    /// The steps to show for a job: its record's, with those its nodes say run now.
    pub fn steps_of(&self, j: &Job) -> Vec<Step> {
        let mut steps = j.steps.clone();
        for (node, live) in self.live_steps.get(&j.id).into_iter().flatten() {
            crate::steps::merge(&mut steps, node, live);
        }
        steps
    }

    /// Node `node` no longer runs steps of job `id`.
    fn forget_steps(&mut self, id: u64, node: &str) {
        if let Some(nodes) = self.live_steps.get_mut(&id) {
            nodes.remove(node);
            if nodes.is_empty() {
                self.live_steps.remove(&id);
            }
        }
    }

    /// Whether any node says steps of job `id` run now.
    pub fn has_live_steps(&self, id: u64) -> bool {
        self.live_steps.contains_key(&id)
    }

    /// A heartbeat's host figures and running steps of the ranks the agent runs.
    pub(crate) fn note_host(&mut self, node: &str, running: &[crate::event::Running]) {
        for r in running {
            let holds = self
                .jobs
                .job(r.job_id)
                .is_some_and(|j| j.attempt == r.attempt && live_allocs(j).any(|a| a.node == node));
            if r.steps.is_empty() {
                self.forget_steps(r.job_id, node);
            } else if holds {
                let mut steps = Vec::new();
                crate::steps::merge(&mut steps, node, &r.steps);
                let nodes = self.live_steps.entry(r.job_id).or_default();
                nodes.insert(node.to_string(), steps);
            }
            if r.cpu_time_ms.is_none() && r.mem_peak_bytes.is_none() {
                continue;
            }
            if holds {
                let v = (r.cpu_time_ms.unwrap_or(0), r.mem_peak_bytes.unwrap_or(0));
                self.live_host.insert((r.job_id, node.to_string()), v);
            }
        }
    }

    /// A rank's host figures, from its end report.
    /// (Where the report has none, the rank's last heartbeat's figures count.)
    pub(crate) fn add_host_usage(&mut self, r: &crate::event::Report) {
        self.forget_steps(r.job_id, &r.node);
        let live = self.live_host.remove(&(r.job_id, r.node.clone()));
        let cpu = r.cpu_time_ms.or(live.map(|l| l.0));
        let mem = r.mem_peak_bytes.or(live.map(|l| l.1));
        if cpu.is_none() && mem.is_none() {
            return;
        }
        let u = self.live_usage.entry(r.job_id).or_default();
        u.cpu_time_ms += cpu.unwrap_or(0);
        u.host_mem_peak_bytes = u.host_mem_peak_bytes.max(mem.unwrap_or(0));
        u.host_reports += 1;
    }

    /// Moves a job's live usage into its record once its run is over (it ended, or went
    /// back to the queue): the record keeps the last run's.
    pub(crate) fn settle_usage(&mut self, id: u64) {
        let running = self
            .jobs
            .job(id)
            .is_some_and(|j| live_allocs(j).next().is_some());
        if running {
            return;
        }
        self.live_steps.remove(&id);
        // Ranks that ended without an end report (their node failed) count with what
        // their last heartbeat said.
        let ranks: Vec<(u64, String)> = self
            .live_host
            .keys()
            .filter(|k| k.0 == id)
            .cloned()
            .collect();
        for k in ranks {
            if let Some((cpu, mem)) = self.live_host.remove(&k) {
                let u = self.live_usage.entry(id).or_default();
                u.cpu_time_ms += cpu;
                u.host_mem_peak_bytes = u.host_mem_peak_bytes.max(mem);
                u.host_reports += 1;
            }
        }
        if let Some(u) = self.live_usage.remove(&id) {
            self.jobs.edit(id, |s| {
                s.job.usage = Some(u);
            });
        }
    }

    /// Forgets live usage of jobs no longer running (a job removed, a run ended by a
    /// path that did not settle it).
    pub(crate) fn sweep_usage(&mut self) {
        let jobs = &self.jobs;
        let mut gone: Vec<u64> = (self.live_usage.keys().copied())
            .chain(self.live_host.keys().map(|k| k.0))
            .filter(|&id| {
                jobs.get(id)
                    .is_none_or(|s| live_allocs(&s.job).next().is_none())
            })
            .collect();
        gone.sort_unstable();
        gone.dedup();
        for id in gone {
            self.settle_usage(id);
            self.live_usage.remove(&id);
            self.live_host.retain(|k, _| k.0 != id);
            self.live_steps.remove(&id);
        }
    }
}

/// The compute share of a slot use in milli (a MIG instance or a whole GPU: 1000).
pub fn share_of(s: &SlotUse) -> u32 {
    match s.compute_milli {
        0 => 1000,
        c => c.min(1000),
    }
}

/// Folds one sample of the GPU under `slot` into `usage`. `shares`: the compute shares
/// of every job on the GPU, summed; `used`: this job's GPU memory (MiB) and, where the
/// driver samples it per process, its processes' share of the GPU's time (percent of
/// the GPU). Without the latter, the GPU's utilisation is split by compute shares.
pub fn fold_sample(
    usage: &mut JobUsage,
    node: &str,
    slot: &SlotUse,
    shares: u64,
    used: (u64, Option<u32>),
    m: &crate::node::GpuMetrics,
) -> Option<f64> {
    let (mem_used, own_util) = used;
    let i = match usage
        .slots
        .iter()
        .position(|s| s.node == node && s.uuid == slot.uuid)
    {
        Some(i) => i,
        None => {
            usage.slots.push(SlotUsage {
                node: node.to_string(),
                uuid: slot.uuid.clone(),
                share_milli: share_of(slot),
                memory_mib: slot.memory_mib,
                ..Default::default()
            });
            usage.slots.len() - 1
        }
    };
    let s = &mut usage.slots[i];
    if m.time_ms <= s.last_sample_ms {
        // A sample already counted (a repeated heartbeat).
        return None;
    }
    let share = f64::from(share_of(slot));
    let shares = (shares.max(u64::from(share_of(slot)))) as f64;
    // The job's part of the GPU's utilisation (its own processes' where the driver
    // says, else the GPU's split by compute shares), read against its own share.
    let part = match own_util {
        Some(p) => f64::from(p.min(100)),
        None => f64::from(m.util_pct.min(100)) * share / shares,
    };
    let util = (part * 1000.0 / share).min(100.0);
    if s.samples > 0 {
        let dt = (m.time_ms - s.last_sample_ms).min(MAX_SAMPLE_GAP_MS) as f64 / 1000.0;
        s.energy_j += m.power_w.max(0.0) * dt * share / shares;
    }
    s.samples += 1;
    s.util_sum += util;
    s.util_max = s.util_max.max(util);
    s.mem_peak_mib = s.mem_peak_mib.max(mem_used);
    s.mem_sum_mib += mem_used as f64;
    s.last_sample_ms = m.time_ms;
    Some(util)
}

/// Mean utilisation against the share over every slot and sample, percent (`None`
/// without samples).
pub fn util_mean(u: &JobUsage) -> Option<f64> {
    let n: u64 = u.slots.iter().map(|s| s.samples).sum();
    (n > 0).then(|| u.slots.iter().map(|s| s.util_sum).sum::<f64>() / n as f64)
}

/// The highest GPU memory of one slot, MiB.
pub fn mem_peak(u: &JobUsage) -> u64 {
    u.slots.iter().map(|s| s.mem_peak_mib).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(util: u32, power: f64, t: i64, jobs: &[(u64, u64)]) -> crate::node::GpuMetrics {
        crate::node::GpuMetrics {
            uuid: "GPU-0".into(),
            util_pct: util,
            power_w: power,
            time_ms: t,
            jobs: jobs
                .iter()
                .map(|&(job_id, mem_used_mib)| crate::node::JobGpuUse {
                    job_id,
                    mem_used_mib,
                    processes: 1,
                    util_pct: None,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn whole_gpu_figures_are_the_samples() {
        let slot = SlotUse {
            uuid: "GPU-0".into(),
            compute_milli: 1000,
            memory_mib: 81920,
        };
        let mut u = JobUsage::default();
        for (k, (util, mem)) in [(20, 1000), (40, 3000), (90, 2000)].into_iter().enumerate() {
            let m = sample(util, 200.0, 10_000 * (k as i64 + 1), &[(7, mem)]);
            fold_sample(&mut u, "n1", &slot, 1000, (mem, None), &m);
        }
        // The same sample again is not counted twice.
        fold_sample(
            &mut u,
            "n1",
            &slot,
            1000,
            (2000, None),
            &sample(90, 200.0, 30_000, &[]),
        );
        let s = &u.slots[0];
        assert_eq!(s.samples, 3);
        assert_eq!(util_mean(&u), Some(50.0));
        assert_eq!(s.util_max, 90.0);
        assert_eq!(mem_peak(&u), 3000);
        assert_eq!(s.mem_sum_mib, 6000.0);
        // Two gaps of 10 s at 200 W.
        assert_eq!(s.energy_j, 4000.0);
    }

    #[test]
    fn a_share_is_measured_against_its_share() {
        let quarter = SlotUse {
            uuid: "GPU-0".into(),
            compute_milli: 250,
            memory_mib: 20480,
        };
        let mut u = JobUsage::default();
        // Alone on the GPU, 25% busy: all of its quarter.
        fold_sample(
            &mut u,
            "n1",
            &quarter,
            250,
            (100, None),
            &sample(25, 100.0, 1000, &[]),
        );
        assert_eq!(u.slots[0].util_sum, 100.0);
        // With a half share next to it (750 milli in all), 60% busy: its part is
        // 60 x 250/750 = 20% of the GPU, 80% of its quarter; a third of 100 W for 2 s.
        fold_sample(
            &mut u,
            "n1",
            &quarter,
            750,
            (100, None),
            &sample(60, 100.0, 3000, &[]),
        );
        let s = &u.slots[0];
        assert!((s.util_sum - 180.0).abs() < 1e-9, "{}", s.util_sum);
        assert!((s.energy_j - 200.0 / 3.0).abs() < 1e-9, "{}", s.energy_j);
        assert_eq!(s.share_milli, 250);
    }

    #[test]
    fn the_drivers_per_process_figure_is_used_where_it_gives_one() {
        let whole = SlotUse {
            uuid: "GPU-0".into(),
            compute_milli: 1000,
            memory_mib: 81920,
        };
        // Two whole-GPU holders (a holder and a borrower): the GPU reads 70%. Split by
        // shares each would be 35%; the driver says 40% and 30%.
        let (mut a, mut b) = (JobUsage::default(), JobUsage::default());
        let m = sample(70, 100.0, 1000, &[]);
        fold_sample(&mut a, "n1", &whole, 2000, (100, Some(40)), &m);
        fold_sample(&mut b, "n1", &whole, 2000, (100, Some(30)), &m);
        assert_eq!((a.slots[0].util_sum, b.slots[0].util_sum), (40.0, 30.0));
        let mut split = JobUsage::default();
        fold_sample(&mut split, "n1", &whole, 2000, (100, None), &m);
        assert_eq!(split.slots[0].util_sum, 35.0);
    }
}
