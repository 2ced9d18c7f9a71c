//! A node as the controller keeps it, in its own words: the record (`Node`), its GPUs
//! and MIG instances as the agent discovered them, and the GPU samples its heartbeats
//! carry. The daemon converts these from and to protobuf at its edges (its gRPC server
//! and its store: `proto/src/wire.rs`); nothing here knows the wire.

/// A node: what its agent reported when it attached, and what the controller decided
/// about it (a drain). Kept on disk; the listings add what runs where.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Node {
    pub name: String,
    pub gpus: Vec<Gpu>,
    pub cpus: u32,
    pub memory_bytes: u64,
    /// Why no new jobs go here (`gpuctl node drain`, or a health check's drain).
    pub drain_reason: Option<String>,
    /// `nvml` or `fake`.
    pub gpu_backend: String,
    /// When its agent was last heard from (Unix ms).
    pub last_seen_ms: i64,
    /// The identity of the agent that holds the name (its state dir's agent-id).
    pub agent_id: String,
    /// Where the node's peers reach it (multi-node jobs' MASTER_ADDR).
    pub address: String,
    pub allow_root_jobs: bool,
    /// The drain is the controller's (health), lifted when the node is well again.
    pub drain_automatic: bool,
    /// The newest hardware XID already acted on (Unix ms of its sample).
    pub xid_handled_ms: i64,
    pub features: Vec<String>,
    /// Its agent lets the controller change its GPUs' MIG layouts (`crate::mig`).
    pub mig_dynamic: bool,
}

/// One GPU of a node as discovered, with its MIG instances if it is partitioned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gpu {
    pub uuid: String,
    pub model: String,
    pub memory_mib: u64,
    pub index: u32,
    pub pci_bus_id: String,
    pub mig: Vec<MigInstance>,
}

/// A MIG instance of a partitioned GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MigInstance {
    pub uuid: String,
    /// Its profile, like `1g.10gb`.
    pub profile: String,
    pub memory_mib: u64,
}

/// One GPU's sample from a heartbeat.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuMetrics {
    pub uuid: String,
    pub util_pct: u32,
    pub mem_util_pct: u32,
    pub mem_used_mib: u64,
    pub temp_c: u32,
    pub fan_pct: Option<u32>,
    pub power_w: f64,
    pub power_limit_w: f64,
    pub ecc_uncorrected: Option<u64>,
    /// The jobs' processes on this GPU.
    pub jobs: Vec<JobGpuUse>,
    /// When it was taken (Unix ms).
    pub time_ms: i64,
    /// The newest XID error the driver logged for this GPU, and when.
    pub last_xid: Option<u32>,
    pub last_xid_ms: i64,
    pub row_remap_failure: bool,
}

/// What one job's processes hold on one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobGpuUse {
    pub job_id: u64,
    pub mem_used_mib: u64,
    pub processes: u32,
    /// Its processes' share of the GPU's time (percent of the GPU), where the driver
    /// samples it per process.
    pub util_pct: Option<u32>,
}

impl Node {
    /// Its slots as the scheduler sees them: whole GPUs, or the MIG instances of a GPU
    /// in MIG mode.
    pub fn slots(&self) -> Vec<gpuctl_sched::SlotView> {
        let mut slots = Vec::new();
        for g in &self.gpus {
            if g.mig.is_empty() {
                slots.push(g.whole_slot());
            }
            for m in &g.mig {
                slots.push(g.instance_slot(&m.uuid, &m.profile, m.memory_mib));
            }
        }
        slots
    }
}

impl Gpu {
    /// The GPU as one whole slot of the scheduler's.
    pub fn whole_slot(&self) -> gpuctl_sched::SlotView {
        gpuctl_sched::SlotView {
            uuid: self.uuid.clone(),
            gpu_index: self.index,
            model: self.model.clone(),
            memory_mib: self.memory_mib,
            mig_profile: None,
        }
    }

    /// A MIG instance of the GPU as a slot of the scheduler's.
    pub fn instance_slot(
        &self,
        uuid: &str,
        profile: &str,
        memory_mib: u64,
    ) -> gpuctl_sched::SlotView {
        gpuctl_sched::SlotView {
            uuid: uuid.to_string(),
            gpu_index: self.index,
            model: self.model.clone(),
            memory_mib,
            mig_profile: Some(profile.to_string()),
        }
    }
}

/// A node's state in the listings (`sinfo`'s words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeState {
    /// Up, nothing allocated.
    #[default]
    Idle,
    /// Up, some of it allocated.
    Mixed,
    /// Up, every GPU fully allocated.
    Allocated,
    /// Drained with jobs still running.
    Draining,
    /// Drained, nothing running.
    Drained,
    /// Its agent is not connected.
    Down,
}

/// One node as the listings show it (`Cluster::node_row`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeRow {
    pub node: Node,
    pub state: NodeState,
    /// Why it is drained or down; empty otherwise.
    pub reason: String,
    pub gpus: Vec<GpuRow>,
    pub cpus_allocated: u32,
    pub memory_allocated: u64,
    pub partitions: Vec<String>,
}

/// One GPU of a listed node: what is allocated on it and to whom.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuRow {
    pub gpu: Gpu,
    /// Over its MIG instances too.
    pub compute_allocated_milli: u32,
    pub memory_allocated_mib: u64,
    /// The lowest job id holding any of it; 0: none.
    pub allocated_to: u64,
    /// Every job holding any of it, ascending.
    pub jobs: Vec<u64>,
    /// The job holding each MIG instance (as in `gpu.mig`), 0: free.
    pub mig_allocated_to: Vec<u64>,
    /// Its latest sample, while its agent is connected.
    pub metrics: Option<GpuMetrics>,
    /// The MIG layout it is being changed to (dynamic MIG; `Some(empty)`: to whole).
    pub mig_changing_to: Option<Vec<String>>,
}

/// Every node listed, with the cluster's fragmentation when all were asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeListing {
    pub nodes: Vec<NodeRow>,
    /// Expected GPU capacity (in GPUs) the typical job mix could not use, over all up
    /// nodes (FGD's fragmentation measure).
    pub fragmentation_gpus: f64,
    /// The same as a share of the idle GPU capacity, in percent.
    pub fragmentation_pct_of_idle: f64,
}
