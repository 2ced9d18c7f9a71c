//! The resource model: what nodes offer (slots), what jobs ask for, what they hold.
//!
//! A *slot* is a unit a job can be placed on: a whole GPU (which can also hold
//! fractional shares) or one MIG instance. A GPU in MIG mode is never a slot itself, so
//! it is never handed out whole or as a share. Shares are tracked in integer units:
//! compute in milli-GPUs (1000 = the whole GPU) and memory in MiB.

pub type JobId = u64;
/// Unix time in milliseconds; passed in, never read from a clock here.
pub type Millis = i64;

/// One whole GPU, in compute units.
pub const GPU_MILLI: u32 = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eligibility {
    Up,
    Drained,
    Down,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotView {
    pub uuid: String,
    /// Index of the physical GPU on its node (MIG instances share their GPU's index).
    pub gpu_index: u32,
    pub model: String,
    pub memory_mib: u64,
    /// `Some(profile)` for a MIG instance, e.g. "3g.40gb".
    pub mig_profile: Option<String>,
}

impl SlotView {
    pub fn is_mig(&self) -> bool {
        self.mig_profile.is_some()
    }

    /// A MIG instance of `profile` (names compared without case).
    pub fn is_profile(&self, profile: &str) -> bool {
        self.mig_profile
            .as_ref()
            .is_some_and(|p| p.eq_ignore_ascii_case(profile))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub eligibility: Eligibility,
    pub slots: Vec<SlotView>,
    /// CPUs in milli-CPUs (1000 = one CPU), so that traces with fractional CPUs fit.
    pub cpu_milli: u32,
    pub memory_bytes: u64,
    /// The partitions it is in (names from the controller's config).
    pub partitions: Vec<String>,
    /// What its agent says it has (`gpud --features`), for constraints.
    pub features: Vec<String>,
}

impl NodeView {
    pub fn eligible(&self) -> bool {
        self.eligibility == Eligibility::Up
    }

    /// Whether a job of `req` may use this node at all: its partition holds it, its
    /// node list names it (`listed`) and it has the features asked for.
    pub fn admits(&self, req: &Request) -> bool {
        req.partition
            .as_ref()
            .is_none_or(|p| self.partitions.iter().any(|x| x == p))
            && self.listed(req)
            && self.has_features(req)
    }

    /// Whether this node meets `req`'s constraint (`features::met`).
    pub fn has_features(&self, req: &Request) -> bool {
        crate::features::met(&req.constraint, &self.features)
    }

    /// Whether `req`'s node list allows this node: named by `nodelist` (when it has
    /// one) and not by `exclude`.
    pub fn listed(&self, req: &Request) -> bool {
        let named = |p: &String| crate::hostlist::hostlist_match(p, &self.name);
        (req.nodelist.is_empty() || req.nodelist.iter().any(named))
            && !req.exclude.iter().any(named)
    }
}

/// What a job holds on one slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SlotUse {
    pub uuid: String,
    pub compute_milli: u32,
    pub memory_mib: u64,
}

/// What a job holds on one node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Alloc {
    pub node: String,
    pub slots: Vec<SlotUse>,
    pub cpu_milli: u32,
    pub memory_bytes: u64,
}

/// A running job's allocation on one node, with the time it is expected to end (start
/// plus time limit): backfill plans around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub job: JobId,
    pub alloc: Alloc,
    pub end_ms: Millis,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// In a stable order (the controller sorts by name); first fit follows it.
    pub nodes: Vec<NodeView>,
    pub running: Vec<Running>,
}

/// The GPU part of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuRequest {
    #[default]
    None,
    /// Whole GPUs (per node).
    Whole { count: u32 },
    /// A share of one GPU: compute in milli-GPUs and/or memory in MiB. A missing part is
    /// derived from the other in proportion to the GPU it lands on.
    Share {
        compute_milli: Option<u32>,
        memory_mib: Option<u64>,
    },
    /// MIG instances of one profile (per node).
    Mig { profile: String, count: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Request {
    pub gpu: GpuRequest,
    /// Allowed GPU models (case-insensitive substrings of the model name); empty = any.
    pub models: Vec<String>,
    /// Per node, in milli-CPUs.
    pub cpu_milli: u32,
    /// Per node; 0 = no reservation.
    pub memory_bytes: u64,
    /// Nodes for a gang job; 1 for everything else.
    pub nodes: u32,
    /// Only nodes of this partition (`NodeView::partitions`); `None` = any node.
    pub partition: Option<String>,
    /// Only nodes matching one of these patterns (`hostlist`); empty = any.
    pub nodelist: Vec<String>,
    /// Never nodes matching one of these patterns.
    pub exclude: Vec<String>,
    /// Node features: any one of these terms, each all of its features (`features`);
    /// empty = any node.
    pub constraint: Vec<Vec<String>>,
}

impl Default for Request {
    fn default() -> Self {
        Request {
            gpu: GpuRequest::None,
            models: Vec::new(),
            cpu_milli: 1000,
            memory_bytes: 0,
            nodes: 1,
            partition: None,
            nodelist: Vec::new(),
            exclude: Vec::new(),
            constraint: Vec::new(),
        }
    }
}

impl Request {
    pub fn whole(count: u32) -> Request {
        Request {
            gpu: if count == 0 {
                GpuRequest::None
            } else {
                GpuRequest::Whole { count }
            },
            ..Request::default()
        }
    }

    pub fn model_ok(&self, model: &str) -> bool {
        models_allow(&self.models, model)
    }

    /// GPU milli over all nodes (for the size factor and for accounting).
    pub fn gpu_milli_total(&self) -> u64 {
        let per_node = match &self.gpu {
            GpuRequest::None => 0,
            GpuRequest::Whole { count } => u64::from(*count) * u64::from(GPU_MILLI),
            GpuRequest::Share { compute_milli, .. } => u64::from(compute_milli.unwrap_or(0)),
            GpuRequest::Mig { count, .. } => u64::from(*count) * u64::from(GPU_MILLI),
        };
        per_node * u64::from(self.nodes.max(1))
    }

    /// What a share takes on `slot`, or `None` if the slot can never hold it.
    pub fn share_on(&self, slot: &SlotView) -> Option<(u32, u64)> {
        let GpuRequest::Share {
            compute_milli,
            memory_mib,
        } = &self.gpu
        else {
            return None;
        };
        if slot.is_mig() || slot.memory_mib == 0 {
            return None;
        }
        let total = slot.memory_mib;
        let (c, m) = match (compute_milli, memory_mib) {
            (Some(c), Some(m)) => (*c, *m),
            (Some(c), None) => (*c, (total * u64::from(*c)).div_ceil(u64::from(GPU_MILLI))),
            (None, Some(m)) => (
                (m * u64::from(GPU_MILLI))
                    .div_ceil(total)
                    .min(u64::from(GPU_MILLI)) as u32,
                *m,
            ),
            (None, None) => return None,
        };
        ((1..=GPU_MILLI).contains(&c) && m <= total).then_some((c, m))
    }
}

/// Whether `model` matches one of `wanted` (case-insensitive substrings; none = any).
/// Allocation-free: it runs for every slot the scheduler looks at.
pub fn models_allow(wanted: &[String], model: &str) -> bool {
    let m = model.as_bytes();
    wanted.is_empty()
        || wanted.iter().any(|w| {
            let w = w.as_bytes();
            w.is_empty() || m.windows(w.len()).any(|x| x.eq_ignore_ascii_case(w))
        })
}

/// A job waiting to be scheduled. Build one with `..PendingJob::default()`, so that a
/// new field costs its constructors nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingJob {
    pub id: JobId,
    /// The user's own priority from the job file.
    pub priority: i32,
    pub qos: String,
    /// The account the job is charged to (fair share counts usage per account).
    pub account: String,
    /// Who submitted it.
    pub user: String,
    /// Its partition's name (window floors may keep GPUs for a partition).
    pub partition: String,
    /// Its owner's fair-share factor in milli (`fairshare`: 1000 = nothing used).
    pub fair_share_milli: u32,
    /// A task of a job array: (the array's id, most tasks running at once; 0 = any).
    pub array: Option<(JobId, u32)>,
    pub submit_ms: Millis,
    pub request: Request,
    /// The time limit: how long the job is planned to hold its slots.
    pub duration_ms: Millis,
    /// It gives its GPUs back when asked (it checkpoints on a signal and is requeued):
    /// it may borrow a window's floor that lends (`floors`), and the floor's owner
    /// takes it back (`preempt`).
    pub reclaimable: bool,
}
