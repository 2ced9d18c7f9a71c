//! The scheduler core: pure and deterministic.
//!
//! `schedule(cluster, queue, config, now)` takes an immutable view of the cluster (nodes,
//! their slots, what runs where and until when) and the pending queue, and returns a
//! [`Plan`]: the jobs that start now and where, and for every other job a typed
//! [`Blocked`] reason and, where it has one, its reservation (expected start and slots).
//! No I/O, no clock, no tokio: the controller, the tests, the benchmarks and the trace
//! simulator run exactly this code.
//!
//! Stages, named the same everywhere:
//! - eligibility: node up and not drained (`NodeView::eligible`);
//! - feasibility: does a request fit a node in a time window (`Calendar::fit`), or from
//!   when on (`Calendar::tail`);
//! - ranking: multifactor priority (`priority`), then packing (`packing`) among the
//!   nodes where a job fits;
//! - plan: conservative backfill. Jobs are taken in priority order; each starts now if it
//!   fits around everything running *and every reservation made for higher-priority
//!   jobs*, and otherwise gets a reservation of its own on specific slots at the
//!   earliest time they are free for good. So no job ever delays a higher-priority
//!   job's reservation, and every pending job gets an expected start.
//!
//! Modules: `model` (resource types), `job` (job states and dependency kinds), `deps`
//! (the dependency DAG), `calendar` (per-node claims over time), `priority`,
//! `packing` (placement policies and FGD's fragmentation measure), `fairshare`
//! (decayed usage and the fair-share factor), `limits` (QoS caps), `floors` (window
//! floors), `preempt` (choosing preemption victims), `features` (node features and
//! jobs' constraints on them).

pub mod array;
mod base;
pub mod calendar;
mod check;
pub mod deps;
pub mod fairshare;
pub mod features;
mod fit;
pub mod floors;
pub mod hostlist;
pub mod job;
pub mod limits;
pub mod mig;
pub mod model;
pub mod packing;
mod plan;
pub mod preempt;
pub mod priority;
mod session;

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub use base::{Base, Refresh};
pub use calendar::Miss;
use calendar::{Calendar, GpuFree, Pick, Picks};
pub use check::{Ledger, check_plan};
pub use model::*;
use packing::{FragMemo, Policy, Workload, host_left};
use plan::plan;
use priority::PriorityWeights;
pub use session::Session;

#[derive(Debug, Clone, PartialEq)]
pub struct SchedConfig {
    pub policy: Policy,
    pub weights: PriorityWeights,
    /// Let lower-priority jobs start now when they delay no reservation. Off gives strict
    /// priority order (FIFO with `PriorityWeights::fifo`).
    pub backfill: bool,
    /// How many blocked jobs get a reservation; `None` = all of them.
    pub reservation_depth: Option<usize>,
    /// The typical workload FGD measures fragmentation against.
    pub workload: Workload,
    /// Best-fit and FGD score at most this many feasible nodes per job (in node order),
    /// like kube-scheduler's percentageOfNodesToScore; `None` scores them all.
    pub max_scored_nodes: Option<usize>,
    /// Give every pending job an expected start (the controller: `queue --start`,
    /// `explain`). Off, a pass stops reserving once no job left can start now: the
    /// same starts, for callers that need only those (the trace replay).
    pub expected_starts: bool,
    /// QoS caps per user and account, with what each holds now.
    pub caps: limits::Caps,
    /// Time-of-day windows' GPU floors (current and next openings).
    pub floors: floors::Floors,
}

impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            policy: Policy::default(),
            weights: PriorityWeights::default(),
            backfill: true,
            reservation_depth: None,
            workload: Workload::default(),
            max_scored_nodes: Some(64),
            expected_starts: true,
            caps: limits::Caps::default(),
            floors: floors::Floors::default(),
        }
    }
}

/// A placement's score (lower is better) from the fragmentation growth it causes, in
/// GPU milli. This is FGD's own scorer: the growth goes through a sigmoid into an integer
/// 0..100, truncated: a growth of 0 down to about -40 milli scores as none, any growth
/// above 0 scores below none, and large growths are told apart coarsely. Ties go to the
/// first node in node order. Measured on the Alibaba trace (docs/benchmarks.md):
/// comparing growth exactly packs worse, because tiny differences from rare shapes then
/// decide.
pub fn fgd_score(growth_milli: f64) -> f64 {
    -(100.0 / (1.0 + (growth_milli / 1000.0).exp())).trunc()
}

/// One job to start now.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Start {
    pub job: JobId,
    /// One per node (several for a gang job, in rank order).
    pub allocs: Vec<Alloc>,
}

/// Slots held for a blocked job from `start` on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reservation {
    pub start: Millis,
    pub allocs: Vec<Alloc>,
}

/// Why a pending job does not start. `Display` gives the queue's REASON column.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Blocked {
    /// Resources it needs are in use by running jobs.
    Resources,
    /// It would fit now, but a higher-priority job holds a reservation there (or, without
    /// backfill, a higher-priority job waits).
    Priority { behind: JobId },
    /// Nodes that could hold it exist but none is up and undrained.
    NodesUnavailable,
    /// No node known could ever hold it.
    Infeasible,
    /// Past `reservation_depth`: no reservation, it starts only when it fits now.
    BeyondDepth,
    /// Starting it would put its user or account over a cap of its QoS.
    Cap(limits::Over),
    /// Starting it would break a window's GPU floor for another account (now, or when
    /// the window opens while it would still run).
    WindowFloor { window: String },
}

impl Blocked {
    /// The queue's REASON for it (Slurm's names where Slurm has one).
    pub fn name(&self) -> &'static str {
        match self {
            Blocked::Resources => "Resources",
            Blocked::Priority { .. } => "Priority",
            Blocked::NodesUnavailable => "Nodes_Unavailable",
            Blocked::Infeasible => "Infeasible",
            Blocked::BeyondDepth => "Resources",
            Blocked::Cap(limits::Over::User { .. }) => "QOSMaxGpusPerUser",
            Blocked::Cap(limits::Over::Account { .. }) => "QOSMaxGpusPerAccount",
            Blocked::Cap(limits::Over::Array { .. }) => "JobArrayTaskLimit",
            Blocked::WindowFloor { .. } => "WindowFloor",
        }
    }
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Waiting {
    pub job: JobId,
    pub reason: Blocked,
    pub reservation: Option<Reservation>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Plan {
    pub starts: Vec<Start>,
    /// Every pending job not in `starts`, in rank order.
    pub waiting: Vec<Waiting>,
    /// How many of `waiting`'s last entries the pass did not plan: without expected
    /// starts it stops once no job left can start now, and lists the rest as waiting
    /// for resources, without reservations (their reasons are `Resources`, whatever a
    /// pass with expected starts would find).
    pub unplanned: usize,
}

impl Plan {
    pub fn waiting(&self, job: JobId) -> Option<&Waiting> {
        self.waiting.iter().find(|w| w.job == job)
    }

    /// The waiting jobs the pass planned (a reason of their own, a reservation where
    /// they have one), and those it did not (see `unplanned`).
    pub fn planned_and_not(&self) -> (&[Waiting], &[Waiting]) {
        self.waiting
            .split_at(self.waiting.len().saturating_sub(self.unplanned))
    }
}

/// Why one job is where it is, node by node (`gpuctl explain`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    pub job: JobId,
    /// Its place in the ranked queue (0 = first).
    pub rank: usize,
    pub priority: i64,
    /// Per node: why it does not fit now (`None`: it fits).
    pub nodes: Vec<(String, Option<Miss>)>,
    pub outcome: Result<Start, Waiting>,
}

/// One scheduling pass.
pub fn schedule(
    cluster: &ClusterView,
    queue: &[PendingJob],
    config: &SchedConfig,
    now: Millis,
) -> Plan {
    plan(Pass::new(cluster, config, now), queue, None).0
}

/// One scheduling pass from a `Base` brought to the cluster as it is now
/// (`Base::update`): the same plan as `schedule` on the base's view at its time, without
/// rebuilding the calendars of the nodes that did not change.
pub fn schedule_from(base: &Base, queue: &[PendingJob], config: &SchedConfig) -> Plan {
    let pass = Pass::with_calendars(base.view(), config, base.now(), base.calendars());
    plan(pass, queue, None).0
}

/// The pass as seen by one job: its per-node reasons at its turn, and its outcome.
pub fn explain(
    cluster: &ClusterView,
    queue: &[PendingJob],
    config: &SchedConfig,
    now: Millis,
    job: JobId,
) -> Option<Explanation> {
    plan(Pass::new(cluster, config, now), queue, Some(job)).1
}

/// GPU milli of the largest node: a job that large gets the full size factor.
pub fn size_norm(cluster: &ClusterView) -> u64 {
    cluster
        .nodes
        .iter()
        .map(|n| n.slots.iter().filter(|s| !s.is_mig()).count() as u64 * u64::from(GPU_MILLI))
        .max()
        .unwrap_or(u64::from(GPU_MILLI))
}

/// Whether `req` could ever run on `node` if the node were empty (to refuse impossible
/// jobs at submit).
pub fn fits_empty(node: &NodeView, req: &Request) -> bool {
    let up = NodeView {
        eligibility: Eligibility::Up,
        ..node.clone()
    };
    let empty = Workload::default();
    Calendar::new(&up)
        .fit(&up, req, 0, 1, Policy::FirstFit, &FragMemo::new(&empty))
        .is_ok()
}

/// The slots a job would take on one node (by node index).
type NodePicks = (usize, Picks);

/// A node that has left a `ShapeState::live` list.
const GONE: usize = usize::MAX;

/// `slot_mask` of picks it cannot tell apart (a slot index past 30).
const NO_MASK: u32 = u32::MAX;

/// The picks' slots as a bit set. Jobs of one shape take the same share of a slot, so
/// for a shape the set tells its picks apart.
fn slot_mask(picks: &[Pick]) -> u32 {
    picks
        .iter()
        .try_fold(0u32, |m, p| (p.slot < 31).then(|| m | 1 << p.slot))
        .unwrap_or(NO_MASK)
}

/// Request lookups happen once per pending job: a fast (fixed-seed, deterministic) hash.
type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::FixedState>;

/// Min-heap of (earliest time, node index, node version when computed), packed into
/// one integer (`tail_key`) that orders as the tuple: a pass pops a heap entry about
/// ten times per reservation, and one comparison of a u128 is cheaper than three.
type TailHeap = BinaryHeap<Reverse<u128>>;

/// (time, node, version) as a `TailHeap` key. The version keeps its low 32 bits: a
/// node's version grows by one per claim, and no pass makes 2^32 claims on one node.
fn tail_key(t: Millis, i: usize, v: u64) -> u128 {
    let t = (t as u64) ^ (1 << 63);
    u128::from(t) << 64 | (i as u128 & 0xffff_ffff) << 32 | u128::from(v as u32)
}

/// The (time, node, version's low 32 bits) of a `tail_key`.
fn tail_unkey(k: u128) -> (Millis, usize, u32) {
    let t = ((k >> 64) as u64 ^ (1 << 63)) as Millis;
    (t, (k >> 32) as u32 as usize, k as u32)
}

/// One tail class: its request, its heap, and per node the slots its tail takes (with
/// the calendar version they were computed at). A job of the class asks for the same
/// GPUs, so its picks are the class's; only its time can be later (CPUs, memory).
struct TailClass {
    req: Request,
    heap: TailHeap,
    picks: Vec<(u64, Picks)>,
}

impl TailClass {
    /// The node's tail for the class, recorded with its picks; `None`: never.
    fn compute(
        &mut self,
        cal: &Calendar,
        node: &NodeView,
        i: usize,
        now: Millis,
    ) -> Option<Millis> {
        let (t, picks) = cal.tail(node, &self.req, now)?;
        self.picks[i] = (cal.version, picks);
        Some(t)
    }
}

/// A node's answer to `fit` over [now, b) for one shape. It depends only on what is held
/// (`held_version`) and on the set of reservations starting before b (the window meets
/// exactly those; see `Calendar::res_starts`). Reservations are only added during a pass,
/// so the set is the same for a later window end b' when b' lies in `window` (no earlier
/// reservation starts between b and b') and as many reservations start before b' as
/// `before` (none added since does). `Reserved` stays blocked while every reservation
/// it met still starts before b'. (`Busy` and `Never` nodes leave the shape's list.)
/// Small and `Copy`: a pass keeps one per (shape, node).
#[derive(Clone, Copy)]
struct CachedFit {
    /// The node's `version` then: unchanged, the answer holds without more checks.
    version: u64,
    held_version: u64,
    before: usize,
    /// The window ends (b) that meet the same `before` reservations: (lo, hi].
    window: (Millis, Millis),
    /// The node's `NodeBase::stamp` when a `Fits` was scored.
    base_stamp: u64,
    outcome: Outcome,
}

#[derive(Clone, Copy)]
enum Outcome {
    /// It fits, with this packing score and the picks' slots (`slot_mask`; the picks are
    /// taken again for the node chosen).
    Fits(f64, u32),
    /// Only a reservation is in the way.
    Reserved(JobId),
    /// Something else is: resources held now (for good, during a pass).
    Busy,
    /// A miss no claim made during the pass can undo.
    Never,
}

/// What one pass has learnt about one request shape (jobs with equal requests), so
/// that the next job of that shape pays only for the nodes that changed since.
#[derive(Default)]
struct ShapeState {
    /// Eligible nodes where it may still fit now, in node order. What is free now only
    /// shrinks during a pass, so a node that cannot hold it now (or ever) leaves for good:
    /// its entry becomes `GONE`, and the list is compacted after a scan once an eighth of
    /// it is gone (so that a scan does not move the rest of the list each time it drops a
    /// node, nor step over many tombstones; an eighth counted fewest instructions).
    live: Vec<usize>,
    gone: usize,
    /// Per node (empty until the shape's first `fit_now`).
    fits: Vec<Option<CachedFit>>,
    /// Its tail class (see `Pass::tail_class`), found on its first reservation.
    tail_class: Option<usize>,
    /// The shortest time limit for which it fitted nowhere now, and the reservation then
    /// in the way. Claims only add up during a pass, so a job of this shape with a
    /// limit at least as long fits nowhere either (used without expected starts).
    no_fit: Option<(Millis, Option<JobId>)>,
}

/// The request whose tails order nodes for `req`'s reservations: its GPU part alone
/// (so that shapes differing only in CPUs and memory share one heap), or all of it
/// for a request without GPUs. Its tail on a node is never later than `req`'s.
fn tail_class_of(req: &Request) -> Request {
    match req.gpu {
        GpuRequest::None => Request {
            nodes: 1,
            ..req.clone()
        },
        _ => Request {
            cpu_milli: 0,
            memory_bytes: 0,
            nodes: 1,
            ..req.clone()
        },
    }
}

/// A miss that no claim made during the pass can undo.
fn permanent(m: &Miss) -> bool {
    matches!(
        m,
        Miss::Drained
            | Miss::Partition { .. }
            | Miss::NotListed
            | Miss::Features
            | Miss::Down
            | Miss::GpuModel { .. }
            | Miss::TooSmall { .. }
            | Miss::NoMigProfile { .. }
    )
}

struct Pass<'a> {
    cluster: &'a ClusterView,
    config: &'a SchedConfig,
    now: Millis,
    /// Per node, its calendar: borrowed from the pass's `Base` until the pass claims on
    /// the node.
    cals: Vec<Cow<'a, Calendar>>,
    shape_ids: FastMap<Request, usize>,
    shapes: Vec<ShapeState>,
    /// Per tail class: each eligible node's earliest "free for good" time for the
    /// class's request. Times only grow as claims are added, so a stale entry (older
    /// calendar version) is a lower bound and is recomputed when it reaches the top.
    tail_ids: FastMap<Request, usize>,
    /// The tail classes, by id.
    tail_heaps: Vec<TailClass>,
    eligible: Vec<usize>,
    /// Each node's `Calendar::free_now`, side by side (the scans read nothing else of
    /// the nodes they skip).
    frees: Vec<calendar::FreeNow>,
    /// Upper bounds of what any eligible node has free now, for a quick "cannot start".
    max_free: calendar::FreeNow,
    /// How many eligible nodes have each of `max_free`'s figures (in `parts` order): a
    /// maximum moves only when the last node that has it shrinks.
    at_max: [usize; 5],
    max_free_dirty: bool,
    frag: FragMemo<'a>,
    /// Per node, what the packing scores start from (see `NodeBase`).
    bases: Vec<NodeBase>,
    /// `fit_now`'s (score, node) buffer, kept between calls.
    found: Vec<(f64, usize)>,
    /// Each node's `Calendar::version`, side by side for `fit_now`'s scan.
    versions: Vec<u64>,
    /// `earliest_one`'s buffer of heap entries looked at, kept between calls.
    looked: Vec<Reverse<u128>>,
}

/// What packing scores need of a node as it is now: its GPUs' free milli (with any
/// reservation starting now) and, for FGD, its fragmentation. Kept up to date by
/// `Pass::claim`, so that scoring a candidate placement computes only the "after".
struct NodeBase {
    free: GpuFree,
    free_total: u64,
    frag: f64,
    /// `FragMemo::model_id` of the node.
    model_id: u32,
    /// How many times it was taken again during the pass: a score computed at the same
    /// stamp with the same picks is the same.
    stamp: u64,
}

/// `FreeNow`'s figures side by side.
fn parts(f: &calendar::FreeNow) -> [u64; 5] {
    [
        u64::from(f.whole),
        u64::from(f.max_share_milli),
        u64::from(f.mig),
        u64::from(f.cpu_milli),
        f.mem,
    ]
}

fn alloc_of(node: &NodeView, picks: &[Pick], req: &Request) -> Alloc {
    Alloc {
        node: node.name.clone(),
        slots: picks
            .iter()
            .map(|p| SlotUse {
                uuid: node.slots[p.slot].uuid.clone(),
                compute_milli: p.compute,
                memory_mib: p.mem_mib,
            })
            .collect(),
        cpu_milli: req.cpu_milli,
        memory_bytes: req.memory_bytes,
    }
}

impl<'a> Pass<'a> {
    fn refresh_max_free(&mut self) {
        if !self.max_free_dirty {
            return;
        }
        let mut m = calendar::FreeNow::default();
        for &i in &self.eligible {
            let f = self.frees[i];
            m.whole = m.whole.max(f.whole);
            m.max_share_milli = m.max_share_milli.max(f.max_share_milli);
            m.mig = m.mig.max(f.mig);
            m.cpu_milli = m.cpu_milli.max(f.cpu_milli);
            m.mem = m.mem.max(f.mem);
        }
        let top = parts(&m);
        self.at_max = [0; 5];
        for &i in &self.eligible {
            for (k, v) in parts(&self.frees[i]).into_iter().enumerate() {
                self.at_max[k] += usize::from(v == top[k]);
            }
        }
        self.max_free = m;
        self.max_free_dirty = false;
    }

    /// Could `job` (of `shape`) still start now? `false` is for good: what is free only
    /// shrinks during a pass.
    fn may_start(&self, shape: usize, job: &PendingJob) -> bool {
        let shortest_miss = self.shapes[shape].no_fit.map(|(d, _)| d);
        Self::may_fit(&self.max_free, &job.request)
            && shortest_miss.is_none_or(|d| job.duration_ms.max(1000) < d)
    }

    /// Could `req` fit now on a node with these free resources (ignoring reservations)?
    fn may_fit(f: &calendar::FreeNow, req: &Request) -> bool {
        let gpu_ok = match &req.gpu {
            GpuRequest::None => true,
            GpuRequest::Whole { count } => f.whole >= *count,
            GpuRequest::Mig { count, .. } => f.mig >= *count,
            GpuRequest::Share { compute_milli, .. } => {
                f.max_share_milli >= compute_milli.unwrap_or(1)
            }
        };
        gpu_ok && f.cpu_milli >= req.cpu_milli && f.mem >= req.memory_bytes
    }

    fn base_of(&self, i: usize) -> NodeBase {
        let node = &self.cluster.nodes[i];
        let cal = &self.cals[i];
        let free = cal.gpu_free_milli(node, self.now);
        let model_id = self.frag.model_id(node, &free);
        let frag = match self.config.policy {
            Policy::Fgd => self
                .frag
                .node_frag_of(model_id, node, &free, cal.host_free_now()),
            _ => 0.0,
        };
        NodeBase {
            free_total: free.iter().map(|x| u64::from(x.1)).sum(),
            free,
            frag,
            model_id,
            stamp: 0,
        }
    }

    fn score(&self, i: usize, req: &Request, picks: &[Pick]) -> f64 {
        let node = &self.cluster.nodes[i];
        let cal = &self.cals[i];
        let base = &self.bases[i];
        match self.config.policy {
            Policy::FirstFit => 0.0,
            Policy::BestFit => {
                let free = base.free_total;
                let used: u64 = picks.iter().map(|p| u64::from(p.compute)).sum();
                let cpu_left = cal.free_now.cpu_milli.saturating_sub(req.cpu_milli);
                (free - used.min(free)) as f64 * 1e6 + f64::from(cpu_left)
            }
            Policy::Fgd => {
                let mut after = GpuFree::from_slice(&base.free);
                let host = cal.host_free_now();
                for p in picks {
                    if let Some(f) = after.iter_mut().find(|f| f.0 == p.slot) {
                        f.1 = f.1.saturating_sub(p.compute);
                    }
                }
                let delta =
                    self.frag
                        .node_frag_of(base.model_id, node, &after, host_left(host, req))
                        - base.frag;
                fgd_score(delta)
            }
        }
    }

    /// The shape id of `req` (jobs with equal requests share what the pass learns).
    fn shape(&mut self, req: &Request) -> usize {
        if let Some(&id) = self.shape_ids.get(req) {
            return id;
        }
        let id = self.shapes.len();
        self.shape_ids.insert(req.clone(), id);
        self.shapes.push(ShapeState::default());
        id
    }

    /// `fit` on node `i` over [now, now + d).
    fn fit(&self, i: usize, req: &Request, d: Millis) -> Result<Picks, Miss> {
        self.cals[i].fit(
            &self.cluster.nodes[i],
            req,
            self.now,
            self.now.saturating_add(d),
            self.config.policy,
            &self.frag,
        )
    }

    /// `fit` and the placement's score.
    fn fit_scored(&self, i: usize, req: &Request, d: Millis) -> Result<(f64, Picks), Miss> {
        let picks = self.fit(i, req, d)?;
        Ok((self.score(i, req, &picks), picks))
    }

    /// How many nodes that fit to look at before taking the best of them.
    fn enough(&self, want: usize) -> usize {
        match self.config.policy {
            Policy::FirstFit => want,
            _ => want.max(self.config.max_scored_nodes.unwrap_or(usize::MAX)),
        }
    }

    fn claim(
        &mut self,
        job: JobId,
        i: usize,
        picks: &[Pick],
        req: &Request,
        span: (Millis, Millis),
        reserved: bool,
    ) {
        let cal = self.cals[i].to_mut();
        cal.add(job, picks, req.cpu_milli, req.memory_bytes, span, reserved);
        self.versions[i] = self.cals[i].version;
        let base_moves = span.0 <= self.now;
        if !reserved {
            let node = &self.cluster.nodes[i];
            self.cals[i].to_mut().refresh_free_now(node, self.now);
            let (old, new) = (self.frees[i], self.cals[i].free_now);
            self.frees[i] = new;
            // A maximum moves only when the last node that had it shrinks.
            let (old, new, top) = (parts(&old), parts(&new), parts(&self.max_free));
            for k in 0..5 {
                if old[k] == top[k] && new[k] < old[k] {
                    self.at_max[k] -= 1;
                    self.max_free_dirty |= self.at_max[k] == 0;
                }
            }
        }
        if base_moves {
            let stamp = self.bases[i].stamp + 1;
            self.bases[i] = NodeBase {
                stamp,
                ..self.base_of(i)
            };
        }
    }

    /// The tail heap of `shape`'s class, built on first use.
    fn tail_class(&mut self, shape: usize, req: &Request) -> usize {
        if let Some(c) = self.shapes[shape].tail_class {
            return c;
        }
        let class = tail_class_of(req);
        let c = match self.tail_ids.get(&class) {
            Some(&c) => c,
            None => {
                let mut tc = TailClass {
                    req: class.clone(),
                    heap: TailHeap::new(),
                    picks: vec![(u64::MAX, Picks::new()); self.cluster.nodes.len()],
                };
                let mut heap = Vec::with_capacity(self.eligible.len());
                for &i in &self.eligible {
                    let cal = &self.cals[i];
                    if let Some(t) = tc.compute(cal, &self.cluster.nodes[i], i, self.now) {
                        heap.push(Reverse(tail_key(t, i, cal.version)));
                    }
                }
                tc.heap = heap.into();
                self.tail_heaps.push(tc);
                self.tail_ids.insert(class, self.tail_heaps.len() - 1);
                self.tail_heaps.len() - 1
            }
        };
        self.shapes[shape].tail_class = Some(c);
        c
    }

    /// Earliest reservation for a single-node job: (time, node, picks). Nodes come off
    /// the class heap in order of the class's tail, a lower bound of the job's own; the
    /// search stops when the best found is no later than the next bound.
    fn earliest_one(
        &mut self,
        shape: usize,
        req: &Request,
        lb: Millis,
    ) -> Option<(Millis, usize, Picks)> {
        let c = self.tail_class(shape, req);
        let (cluster, cals, now) = (self.cluster, &self.cals, self.now);
        let tc = &mut self.tail_heaps[c];
        let same = tc.req == *req;
        let looked = &mut self.looked;
        looked.clear();
        let mut best: Option<(Millis, usize)> = None;
        while let Some(&Reverse(k)) = tc.heap.peek() {
            let (t, i, v) = tail_unkey(k);
            if best.is_some_and(|b| b < (t, i)) {
                break;
            }
            tc.heap.pop();
            let node = &cluster.nodes[i];
            if v != cals[i].version as u32 {
                if let Some(t2) = tc.compute(&cals[i], node, i, now) {
                    tc.heap.push(Reverse(tail_key(t2, i, cals[i].version)));
                }
                continue;
            }
            looked.push(Reverse(k));
            // The class asks for the same GPUs without CPUs or memory (or, for a job
            // without GPUs, is the job): the job's own tail is the later of the class's
            // (fresh here) and the host's.
            let own = if same {
                Some(t)
            } else {
                cals[i].host_tail_time(node, req, now).map(|h| h.max(t))
            };
            if let Some(t2) = own
                && best.is_none_or(|b| (t2, i) < b)
            {
                best = Some((t2, i));
            }
        }
        // The nodes looked at may serve later jobs: back they go, but for the one chosen,
        // which the caller claims and puts back fresh (`reserve_one`).
        let chosen = best.map(|b| b.1);
        tc.heap.extend(
            looked
                .drain(..)
                .filter(|e| Some(tail_unkey(e.0).1) != chosen),
        );
        let (t, i) = best?;
        // Every heap entry is pushed by `TailClass::compute`, which records the picks at
        // the same version: the chosen entry was fresh, so its picks are too.
        let (v, picks) = &tc.picks[i];
        debug_assert_eq!(*v, cals[i].version);
        let picks = picks.clone();
        Some((t.max(lb), i, picks))
    }

    /// Reserves the earliest slots for a single-node job (`earliest_one`), and puts the
    /// node back into its class's heap with its tail after the claim.
    fn reserve_one(
        &mut self,
        job: JobId,
        shape: usize,
        req: &Request,
        lb: Millis,
        d: Millis,
    ) -> Option<(Millis, usize, Picks)> {
        let (t, i, picks) = self.earliest_one(shape, req, lb)?;
        self.claim(job, i, &picks, req, (t, t.saturating_add(d)), true);
        let c = self.tail_class(shape, req);
        let cal = &self.cals[i];
        let tc = &mut self.tail_heaps[c];
        if let Some(t2) = tc.compute(cal, &self.cluster.nodes[i], i, self.now) {
            tc.heap.push(Reverse(tail_key(t2, i, cal.version)));
        }
        Some((t, i, picks))
    }

    /// Earliest reservation for a gang job: `n` distinct nodes free for good from T.
    fn earliest_gang(
        &self,
        req: &Request,
        n: usize,
        lb: Millis,
    ) -> Option<(Millis, Vec<NodePicks>)> {
        let mut tails: Vec<(Millis, usize, Picks)> = self
            .eligible
            .iter()
            .filter_map(|&i| {
                self.cals[i]
                    .tail(&self.cluster.nodes[i], req, lb)
                    .map(|(t, p)| (t, i, p))
            })
            .collect();
        if tails.len() < n {
            return None;
        }
        tails.sort_by_key(|x| (x.0, x.1));
        tails.truncate(n);
        let t = tails.last().map_or(lb, |x| x.0);
        // Re-take the picks at T (a node's own tail may be earlier than T).
        let picks = tails
            .into_iter()
            .map(|(_, i, _)| {
                let (_, p) = self.cals[i]
                    .tail(&self.cluster.nodes[i], req, t)
                    .expect("feasible");
                (i, p)
            })
            .collect();
        Some((t, picks))
    }
}

impl<'a> Pass<'a> {
    /// Calendars with every running job's claim from now to its expected end.
    fn new(cluster: &'a ClusterView, config: &'a SchedConfig, now: Millis) -> Pass<'a> {
        let cals = base::held_calendars(cluster, now)
            .into_iter()
            .map(Cow::Owned)
            .collect();
        Pass::with_calendars(cluster, config, now, cals)
    }

    /// A pass from calendars that hold every running job's claim and were refreshed at
    /// `now` (borrowed from a `Base`: a node's is copied when the pass first claims on it).
    fn with_calendars(
        cluster: &'a ClusterView,
        config: &'a SchedConfig,
        now: Millis,
        cals: Vec<Cow<'a, Calendar>>,
    ) -> Pass<'a> {
        debug_assert_eq!(cals.len(), cluster.nodes.len());
        let mut pass = Pass {
            cluster,
            config,
            now,
            frees: cals.iter().map(|c| c.free_now).collect(),
            versions: cals.iter().map(|c| c.version).collect(),
            cals,
            shape_ids: FastMap::default(),
            shapes: Vec::new(),
            tail_ids: FastMap::default(),
            tail_heaps: Vec::new(),
            eligible: (0..cluster.nodes.len())
                .filter(|&i| cluster.nodes[i].eligible())
                .collect(),
            max_free: calendar::FreeNow::default(),
            at_max: [0; 5],
            max_free_dirty: true,
            frag: FragMemo::new(&config.workload),
            bases: Vec::new(),
            found: Vec::new(),
            looked: Vec::new(),
        };
        pass.bases = (0..cluster.nodes.len()).map(|i| pass.base_of(i)).collect();
        pass
    }
}

#[cfg(test)]
mod tests;
