//! The plan's checks: `Ledger`, the controller's constant-time re-check of each start
//! against the state at commit time, and `check_plan`, the sanity check tests run after
//! every plan (nothing over-allocated, now or in any reservation).

use std::collections::HashMap;

use super::*;

/// What is taken right now, slot by slot and node by node: the controller re-checks each
/// planned start against it (and takes it) in constant time per slot before it commits.
pub struct Ledger {
    /// uuid -> (used compute milli, used memory MiB, memory MiB of the slot)
    slots: HashMap<String, (u32, u64, u64)>,
    /// node -> (used CPU milli, used memory, CPU milli, memory, eligible)
    nodes: HashMap<String, (u32, u64, u32, u64, bool)>,
}

impl Ledger {
    pub fn new(cluster: &ClusterView) -> Ledger {
        let mut l = Ledger {
            slots: HashMap::new(),
            nodes: HashMap::new(),
        };
        for n in &cluster.nodes {
            l.nodes.insert(
                n.name.clone(),
                (0, 0, n.cpu_milli, n.memory_bytes, n.eligible()),
            );
            for s in &n.slots {
                l.slots.insert(s.uuid.clone(), (0, 0, s.memory_mib));
            }
        }
        for r in &cluster.running {
            l.add(&r.alloc);
        }
        l
    }

    fn add(&mut self, a: &Alloc) {
        if let Some(n) = self.nodes.get_mut(&a.node) {
            n.0 += a.cpu_milli;
            n.1 += a.memory_bytes;
        }
        for u in &a.slots {
            if let Some(s) = self.slots.get_mut(&u.uuid) {
                s.0 += u.compute_milli;
                s.1 += u.memory_mib;
            }
        }
    }

    /// Takes `start` if everything it needs is free now; otherwise says why.
    pub fn take(&mut self, start: &Start) -> Result<(), String> {
        for a in &start.allocs {
            let &(cpu, mem, cpu_cap, mem_cap, eligible) = self
                .nodes
                .get(&a.node)
                .ok_or_else(|| format!("unknown node {}", a.node))?;
            if !eligible {
                return Err(format!("node {} is not eligible", a.node));
            }
            if cpu + a.cpu_milli > cpu_cap || mem + a.memory_bytes > mem_cap {
                return Err(format!("node {} has no room for the CPUs/memory", a.node));
            }
            for u in &a.slots {
                let &(c, m, cap) = self
                    .slots
                    .get(&u.uuid)
                    .ok_or_else(|| format!("unknown slot {}", u.uuid))?;
                if c + u.compute_milli > GPU_MILLI || m + u.memory_mib > cap {
                    return Err(format!("slot {} is taken", u.uuid));
                }
            }
        }
        for a in &start.allocs {
            self.add(a);
        }
        Ok(())
    }
}

/// Checks a plan against the cluster: over time, no slot and no node is ever used beyond
/// its capacity by running jobs, starts and reservations together; whole GPUs and MIG
/// instances are never shared; shares never land on MIG instances; starts are on
/// eligible nodes. Run after every plan in tests (HyperQueue's `sanity_check`).
pub fn check_plan(
    cluster: &ClusterView,
    queue: &[PendingJob],
    plan: &Plan,
    now: Millis,
) -> Result<(), String> {
    let duration: HashMap<JobId, &PendingJob> = queue.iter().map(|j| (j.id, j)).collect();
    // (node, slot) -> intervals (start, end, compute, mem, exclusive, job)
    type Use = (Millis, Millis, u32, u64, bool, JobId);
    let mut slot_use: HashMap<(usize, usize), Vec<Use>> = HashMap::new();
    let mut host_use: HashMap<usize, Vec<(Millis, Millis, u32, u64)>> = HashMap::new();
    let mut add = |alloc: &Alloc,
                   a: Millis,
                   b: Millis,
                   job: JobId,
                   req: Option<&Request>|
     -> Result<(), String> {
        let i = cluster
            .nodes
            .iter()
            .position(|n| n.name == alloc.node)
            .ok_or_else(|| format!("job {job} on unknown node {}", alloc.node))?;
        let node = &cluster.nodes[i];
        for u in &alloc.slots {
            let s = node
                .slots
                .iter()
                .position(|s| s.uuid == u.uuid)
                .ok_or_else(|| format!("job {job} on unknown slot {}", u.uuid))?;
            let exclusive = match req.map(|r| &r.gpu) {
                Some(GpuRequest::Share { .. }) => {
                    if node.slots[s].is_mig() {
                        return Err(format!("share of job {job} on MIG instance {}", u.uuid));
                    }
                    false
                }
                Some(GpuRequest::Whole { .. }) if node.slots[s].is_mig() => {
                    return Err(format!("whole-GPU job {job} on MIG instance {}", u.uuid));
                }
                Some(GpuRequest::Mig { .. }) if !node.slots[s].is_mig() => {
                    return Err(format!("MIG job {job} on a whole GPU {}", u.uuid));
                }
                _ => u.compute_milli >= GPU_MILLI,
            };
            slot_use.entry((i, s)).or_default().push((
                a,
                b,
                u.compute_milli,
                u.memory_mib,
                exclusive,
                job,
            ));
        }
        host_use
            .entry(i)
            .or_default()
            .push((a, b, alloc.cpu_milli, alloc.memory_bytes));
        Ok(())
    };
    for r in &cluster.running {
        add(
            &r.alloc,
            now,
            r.end_ms.max(now.saturating_add(1000)),
            r.job,
            None,
        )?;
    }
    for s in &plan.starts {
        let j = duration
            .get(&s.job)
            .ok_or_else(|| format!("start of unknown job {}", s.job))?;
        for a in &s.allocs {
            let node = cluster.nodes.iter().find(|n| n.name == a.node);
            if !node.is_some_and(NodeView::eligible) {
                return Err(format!(
                    "job {} started on ineligible node {}",
                    s.job, a.node
                ));
            }
            add(
                a,
                now,
                now.saturating_add(j.duration_ms.max(1000)),
                s.job,
                Some(&j.request),
            )?;
        }
    }
    for w in &plan.waiting {
        if let Some(r) = &w.reservation {
            let j = duration[&w.job];
            if r.start < now {
                return Err(format!("job {} reserved in the past", w.job));
            }
            for a in &r.allocs {
                add(
                    a,
                    r.start,
                    r.start.saturating_add(j.duration_ms.max(1000)),
                    w.job,
                    Some(&j.request),
                )?;
            }
        }
    }
    for ((i, s), uses) in &slot_use {
        let slot = &cluster.nodes[*i].slots[*s];
        for &(a, _, _, _, _, _) in uses {
            let live: Vec<&Use> = uses.iter().filter(|u| u.0 <= a && a < u.1).collect();
            let c: u32 = live.iter().map(|u| u.2).sum();
            let m: u64 = live.iter().map(|u| u.3).sum();
            if c > GPU_MILLI || m > slot.memory_mib || (live.len() > 1 && live.iter().any(|u| u.4))
            {
                return Err(format!(
                    "slot {} over-allocated at {a}: jobs {:?}",
                    slot.uuid,
                    live.iter().map(|u| u.5).collect::<Vec<_>>()
                ));
            }
        }
    }
    for (i, uses) in &host_use {
        let node = &cluster.nodes[*i];
        for &(a, _, _, _) in uses {
            let c: u32 = uses
                .iter()
                .filter(|u| u.0 <= a && a < u.1)
                .map(|u| u.2)
                .sum();
            let m: u64 = uses
                .iter()
                .filter(|u| u.0 <= a && a < u.1)
                .map(|u| u.3)
                .sum();
            if c > node.cpu_milli || m > node.memory_bytes {
                return Err(format!(
                    "node {} CPU/memory over-allocated at {a}",
                    node.name
                ));
            }
        }
    }
    Ok(())
}
