//! The scheduler core: pure and deterministic.
//!
//! `schedule(cluster, queue, config, now)` takes an immutable view of the cluster and the
//! pending queue and returns a [`Plan`]: which jobs start where, and a typed [`Blocked`]
//! reason for every job that does not. No I/O, no clock, no tokio: the controller, the
//! tests and (later) the trace simulator run exactly this code.
//!
//! Stages, named the same everywhere:
//! - eligibility: is the node up and not drained ([`NodeView::eligible`]);
//! - feasibility: does the request fit the node's free slices ([`fit`]);
//! - ranking: job order by priority ([`rank`]) and node order (first fit for now);
//! - plan: the placements and the reasons.

use std::cmp::Reverse;

pub type JobId = u64;
/// Unix time in milliseconds; passed in, never read from a clock here.
pub type Millis = i64;

/// Why a node cannot take any job right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eligibility {
    Up,
    Drained,
    Down,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSlot {
    pub uuid: String,
    pub model: String,
    pub memory_mib: u64,
    /// The job holding this GPU, if any.
    pub holder: Option<JobId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub eligibility: Eligibility,
    pub gpus: Vec<GpuSlot>,
    pub cpus: u32,
    pub cpus_used: u32,
    pub memory_bytes: u64,
    pub memory_used: u64,
}

impl NodeView {
    pub fn eligible(&self) -> bool {
        self.eligibility == Eligibility::Up
    }

    pub fn free_gpus(&self) -> impl Iterator<Item = &GpuSlot> {
        self.gpus.iter().filter(|g| g.holder.is_none())
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// In a stable order (the controller sorts by name); first fit follows it.
    pub nodes: Vec<NodeView>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Request {
    /// Whole GPUs on one node.
    pub gpus: u32,
    pub cpus: u32,
    /// 0 = no host memory reservation.
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingJob {
    pub id: JobId,
    pub priority: i32,
    pub submit_ms: Millis,
    pub request: Request,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedConfig {}

/// One job to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub job: JobId,
    pub node: String,
    /// UUIDs of the GPUs given to the job.
    pub gpus: Vec<String>,
}

/// Why a pending job does not start. `Display` gives the queue's REASON column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// No eligible node has the free resources now.
    Resources,
    /// A higher-priority job is waiting and this one may not pass it.
    Priority { behind: JobId },
    /// No node at all is up and schedulable.
    NoEligibleNodes,
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocked::Resources => f.write_str("Resources"),
            Blocked::Priority { .. } => f.write_str("Priority"),
            Blocked::NoEligibleNodes => f.write_str("Nodes_Unavailable"),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub starts: Vec<Start>,
    /// Every pending job not in `starts`, in rank order.
    pub blocked: Vec<(JobId, Blocked)>,
}

/// Ranking of jobs: higher priority first, then earlier submit, then lower id.
pub fn rank(queue: &[PendingJob]) -> Vec<&PendingJob> {
    let mut order: Vec<&PendingJob> = queue.iter().collect();
    order.sort_by_key(|j| (Reverse(j.priority), j.submit_ms, j.id));
    order
}

/// Feasibility: the GPUs on `node` that `req` would take now, or `None` if it does not fit.
pub fn fit<'a>(node: &'a NodeView, req: &Request) -> Option<Vec<&'a GpuSlot>> {
    if node.cpus.saturating_sub(node.cpus_used) < req.cpus
        || node.memory_bytes.saturating_sub(node.memory_used) < req.memory_bytes
    {
        return None;
    }
    let gpus: Vec<&GpuSlot> = node.free_gpus().take(req.gpus as usize).collect();
    (gpus.len() == req.gpus as usize).then_some(gpus)
}

/// Whether `req` could ever run on `node` if the node were empty (used to refuse
/// impossible jobs at submit).
pub fn fits_empty(node: &NodeView, req: &Request) -> bool {
    node.gpus.len() as u64 >= u64::from(req.gpus)
        && node.cpus >= req.cpus
        && node.memory_bytes >= req.memory_bytes
}

/// One scheduling pass: strict priority order, whole GPUs, first fit.
///
/// The first job that does not fit blocks every job ranked below it (`Priority`), so a
/// large job is never starved by a stream of small ones. Backfill replaces this rule.
pub fn schedule(
    cluster: &ClusterView,
    queue: &[PendingJob],
    _config: &SchedConfig,
    _now: Millis,
) -> Plan {
    let mut nodes = cluster.nodes.clone();
    let mut plan = Plan::default();
    let any_eligible = nodes.iter().any(NodeView::eligible);
    let mut first_blocked: Option<JobId> = None;

    for job in rank(queue) {
        if let Some(behind) = first_blocked {
            plan.blocked.push((job.id, Blocked::Priority { behind }));
            continue;
        }
        if !any_eligible {
            plan.blocked.push((job.id, Blocked::NoEligibleNodes));
            first_blocked = Some(job.id);
            continue;
        }
        let placed = nodes.iter_mut().filter(|n| n.eligible()).find_map(|node| {
            let uuids: Vec<String> = fit(node, &job.request)?
                .into_iter()
                .map(|g| g.uuid.clone())
                .collect();
            take(node, job.id, &job.request, &uuids);
            Some(Start {
                job: job.id,
                node: node.name.clone(),
                gpus: uuids,
            })
        });
        match placed {
            Some(start) => plan.starts.push(start),
            None => {
                plan.blocked.push((job.id, Blocked::Resources));
                first_blocked = Some(job.id);
            }
        }
    }
    plan
}

fn take(node: &mut NodeView, job: JobId, req: &Request, uuids: &[String]) {
    for g in node.gpus.iter_mut().filter(|g| uuids.contains(&g.uuid)) {
        g.holder = Some(job);
    }
    node.cpus_used += req.cpus;
    node.memory_used += req.memory_bytes;
}

/// Checks that `plan` over-allocates nothing on `cluster`: every GPU goes to at most one
/// job and only when free, and CPU/memory stay within capacity. Used after every round
/// in tests (HyperQueue's `sanity_check`).
pub fn check_plan(cluster: &ClusterView, plan: &Plan) -> Result<(), String> {
    let mut nodes = cluster.nodes.clone();
    for s in &plan.starts {
        let node = nodes
            .iter_mut()
            .find(|n| n.name == s.node)
            .ok_or_else(|| format!("job {} placed on unknown node {}", s.job, s.node))?;
        if !node.eligible() {
            return Err(format!(
                "job {} placed on ineligible node {}",
                s.job, s.node
            ));
        }
        for uuid in &s.gpus {
            let g = node
                .gpus
                .iter_mut()
                .find(|g| &g.uuid == uuid)
                .ok_or_else(|| format!("job {} given unknown GPU {uuid}", s.job))?;
            if let Some(other) = g.holder {
                return Err(format!(
                    "GPU {uuid} given to job {} but held by {other}",
                    s.job
                ));
            }
            g.holder = Some(s.job);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
