//! XID errors from the agents' samples (`[health] xid_drain`, `xid_job`): a hardware
//! XID drains the GPU's node with the reason and requeues (or ends) the jobs on that GPU;
//! a job-caused XID puts a warning on them. Each XID is handled once: the node record
//! keeps the time of the latest handled (`xid_handled_ms`), so a restarted controller
//! does not act again on what the agent still reports.

use crate::jobs::Transition;
use crate::record::JobState;
use crate::state::{Cluster, Effects, live_allocs};

/// What an XID is known as (NVIDIA's XID catalogue, the common ones).
fn xid_name(code: u32) -> &'static str {
    match code {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup",
        48 => "double-bit ECC error",
        61 | 62 => "internal micro-controller error",
        63 | 64 => "ECC page retirement or row remapping",
        68 => "video processor exception",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 | 120 => "GSP error",
        _ => "XID error",
    }
}

impl Cluster {
    /// The XIDs of a heartbeat not handled yet.
    pub(crate) fn check_xids(&mut self, req: &crate::event::Heartbeat, now: i64) -> Effects {
        let mut effects = Effects::default();
        let Some(handled) = self.fleet.nodes.get(&req.node).map(|n| n.xid_handled_ms) else {
            return effects;
        };
        let mut fresh: Vec<(&str, u32, i64)> = req
            .metrics
            .iter()
            .filter_map(|m| Some((m.uuid.as_str(), m.last_xid?, m.last_xid_ms)))
            .filter(|&(_, _, t)| t > handled)
            .collect();
        if fresh.is_empty() {
            return effects;
        }
        fresh.sort_by_key(|x| x.2);
        let latest = fresh.last().map_or(handled, |x| x.2);
        for (gpu, code, _) in fresh {
            let health = &self.config.health;
            let what = format!("XID {code} ({}) on GPU {gpu}", xid_name(code));
            if health.xid_drain.contains(&code) {
                tracing::error!(node = %req.node, "{what}: draining the node");
                effects.merge(self.xid_hardware(&req.node, gpu, &what, now));
            } else if health.xid_job.contains(&code) {
                tracing::warn!(node = %req.node, "{what}: job-caused");
                let why = format!("{what}: an error of the job (the GPU is fine)");
                for id in self.jobs_on_gpu(&req.node, gpu) {
                    self.jobs.edit(id, |s| {
                        let j = &mut s.job;
                        if j.warnings.len() < 20 {
                            j.warnings.push(why.clone());
                        }
                    });
                }
            } else {
                tracing::warn!(node = %req.node, "{what}");
            }
        }
        if let Some(n) = self.fleet.nodes.get_mut(&req.node) {
            n.xid_handled_ms = latest;
        }
        self.node_changed(&req.node);
        effects
    }

    /// Running jobs holding `gpu` (or one of its MIG instances) on `node`.
    fn jobs_on_gpu(&self, node: &str, gpu: &str) -> Vec<u64> {
        let migs: Vec<&str> = self
            .fleet
            .nodes
            .get(node)
            .into_iter()
            .flat_map(|n| &n.gpus)
            .filter(|g| g.uuid == gpu)
            .flat_map(|g| g.mig.iter().map(|m| m.uuid.as_str()))
            .collect();
        self.jobs
            .on_node(node)
            .into_iter()
            .filter_map(|id| self.jobs.job(id))
            .filter(|j| {
                live_allocs(j).any(|a| {
                    a.node == node
                        && a.slots
                            .iter()
                            .any(|s| s.uuid == gpu || migs.contains(&s.uuid.as_str()))
                })
            })
            .map(|j| j.id)
            .collect()
    }

    /// A broken GPU: its node drained (by hardware, for an admin to resume), and its
    /// jobs requeued where they allow it, else ended FAILED with the reason.
    fn xid_hardware(&mut self, node: &str, gpu: &str, what: &str, now: i64) -> Effects {
        let mut effects = Effects::wake();
        if let Some(n) = self.fleet.nodes.get_mut(node) {
            let admin_drain = n.drain_reason.is_some() && !n.drain_automatic;
            if !admin_drain {
                n.drain_reason = Some(format!("health (hardware): {what}"));
                // Not lifted by the temperature check: a reset or a replacement is due.
                n.drain_automatic = false;
            }
        }
        for id in self.jobs_on_gpu(node, gpu) {
            // Kept with the job whatever the queue's reason becomes.
            self.jobs.edit(id, |s| {
                let j = &mut s.job;
                if j.warnings.len() < 20 {
                    j.warnings.push(format!("{node}: {what}"));
                }
            });
            let requeue = self
                .jobs
                .job(id)
                .map(|j| &j.spec)
                .is_some_and(|s| s.requeue);
            if requeue {
                let e = self.request_requeue(id, &format!("requeued: {what}"), None, now);
                effects.merge(e);
                continue;
            }
            let reason = format!("failed: {what}");
            let (sends, _) = self.kill_running(id, &reason, gpuctl_sched::job::JobState::Failed);
            let sent = !sends.is_empty();
            effects.sends.extend(sends);
            if !sent {
                let end = Transition::Finish {
                    state: JobState::Failed,
                    exit_code: None,
                    reason,
                };
                let _ = self.jobs.transition(id, end, now);
                self.settle_usage(id);
            }
        }
        effects
    }
}

/// What is wrong with a node by its latest heartbeat, and whether it is all clear
/// (past the hysteresis of the temperature and power checks).
fn conditions(h: &crate::config::Health, req: &crate::event::Heartbeat) -> (Vec<String>, bool) {
    let mut problems = Vec::new();
    let mut clear = true;
    for m in &req.metrics {
        if h.max_gpu_temp_c > 0 {
            if m.temp_c > h.max_gpu_temp_c {
                problems.push(format!(
                    "health (hardware): GPU {} at {} C, over health.max_gpu_temp_c {} C",
                    m.uuid, m.temp_c, h.max_gpu_temp_c
                ));
            }
            clear &= m.temp_c <= h.resume_gpu_temp_c;
        }
        if h.max_gpu_power_w > 0 {
            let max = f64::from(h.max_gpu_power_w);
            if m.power_w > max {
                problems.push(format!(
                    "health (hardware): GPU {} drawing {:.0} W, over health.max_gpu_power_w {} W",
                    m.uuid, m.power_w, h.max_gpu_power_w
                ));
            }
            clear &= m.power_w <= 0.95 * max;
        }
        if h.ecc_drain && m.ecc_uncorrected.unwrap_or(0) > 0 {
            problems.push(format!(
                "health (hardware): GPU {} has {} uncorrectable ECC error(s)",
                m.uuid,
                m.ecc_uncorrected.unwrap_or(0)
            ));
        }
        if h.remap_failure_drain && m.row_remap_failure {
            problems.push(format!(
                "health (hardware): GPU {} failed to remap a memory row; it needs service",
                m.uuid
            ));
        }
    }
    if !req.health_error.is_empty() {
        problems.push(format!("health (site check): {}", req.health_error));
    }
    clear &= problems.is_empty();
    (problems, clear)
}

impl Cluster {
    /// Drains a node that is unwell by its heartbeat (GPU temperature or power over
    /// the limit, uncorrectable ECC errors, a failed row remapping: hardware; the site's
    /// health program complaining: site check), with every reason, and lifts that
    /// drain once all is clear again. An admin's drain, and the drain of a hardware XID
    /// (a reset or replacement is due), are left alone. Returns whether the node
    /// changed.
    pub(crate) fn check_health(&mut self, req: &crate::event::Heartbeat) -> bool {
        let (problems, clear) = conditions(&self.config.health, req);
        let Some(n) = self.fleet.nodes.get_mut(&req.node) else {
            return false;
        };
        let admin_drain = n.drain_reason.is_some() && !n.drain_automatic;
        if admin_drain {
            return false;
        }
        if !problems.is_empty() {
            // Drained already: the reason changes only when there is more wrong (not
            // at every degree of a hot GPU: each change is a store write).
            let known = n
                .drain_reason
                .as_deref()
                .map_or(0, |r| r.split("; ").count());
            if n.drain_reason.is_some() && problems.len() <= known {
                return false;
            }
            let why = problems.join("; ");
            tracing::warn!(node = %req.node, "draining: {why}");
            n.drain_reason = Some(why);
            n.drain_automatic = true;
        } else if n.drain_reason.is_some() && clear {
            tracing::info!(node = %req.node, "healthy again: drain lifted");
            n.drain_reason = None;
            n.drain_automatic = false;
        } else {
            return false;
        }
        self.node_changed(&req.node);
        true
    }
}
