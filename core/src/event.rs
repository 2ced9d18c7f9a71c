//! What agents tell the controller, in the state machine's words: an agent attaching
//! (`Register`), its heartbeats (`Heartbeat`) and its reports of a job's start, end or
//! warning (`Report`); and what the state answers them. The daemon converts these from
//! the RPC messages, and the answers back, at its gRPC server (`proto/src/wire.rs`);
//! the simulator builds them directly.

use gpuctl_sched::job::JobState;

use crate::node::{Gpu, GpuMetrics};

/// A job step as an agent reports it (kept with the job's record).
pub use crate::record::Step;

/// An agent attaching (or attaching again after a disconnect or a controller restart).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Register {
    pub node: String,
    pub gpus: Vec<Gpu>,
    pub cpus: u32,
    pub memory_bytes: u64,
    pub gpu_backend: String,
    /// The job instances it runs.
    pub running: Vec<Running>,
    /// Reports it sent that were not acknowledged (applied before reconciling).
    pub unacked_reports: Vec<Report>,
    /// The challenge's nonce this attach answers.
    pub nonce: Vec<u8>,
    pub agent_id: String,
    /// Where peers reach the node; empty: the connection's peer address.
    pub address: String,
    pub allow_root_jobs: bool,
    pub features: Vec<String>,
    /// The session this agent process was attached under before (empty: none): the
    /// same agent coming back (after a failover, a dropped connection) takes over its
    /// own connection, which a copy of its state dir elsewhere could not name.
    pub previous_session: Vec<u8>,
    /// The controller may change its GPUs' MIG layouts (`gpud --mig dynamic`).
    pub mig_dynamic: bool,
}

/// A job instance an agent runs, with its host figures so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Running {
    pub job_id: u64,
    pub attempt: u32,
    pub cpu_time_ms: Option<u64>,
    pub mem_peak_bytes: Option<u64>,
    pub steps: Vec<Step>,
}

impl Running {
    /// An instance with no figures.
    pub fn new(job_id: u64, attempt: u32) -> Running {
        Running {
            job_id,
            attempt,
            ..Running::default()
        }
    }
}

/// A heartbeat of a live session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Heartbeat {
    pub node: String,
    pub running: Vec<Running>,
    pub metrics: Vec<GpuMetrics>,
    /// The number of the last command the agent handled.
    pub commands_handled: u64,
    /// Instances that ended and whose end report is on its way.
    pub reporting: Vec<Running>,
    /// What the site's health program said, if it failed.
    pub health_error: String,
}

/// The state's answer to a heartbeat.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeartbeatAnswer {
    /// Whether the node has a live session (if not, the agent attaches again).
    pub known: bool,
    /// Instances the agent runs that the cluster holds as ended or replaced: the
    /// agent kills them.
    pub stale: Vec<Running>,
    /// The power caps of the windows open now for the node (`Cluster::power_caps`).
    pub power_caps: Vec<crate::power::PowerCap>,
}

/// What a report says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportKind {
    /// The job's process started.
    Started,
    /// The job's part on the node ended (`state`, `exit_code`).
    Ended,
    /// Something the job's owner should know (`reason`), the job still running.
    Warning,
}

/// An agent's report of one job instance on its node.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub node: String,
    pub job_id: u64,
    pub attempt: u32,
    pub kind: ReportKind,
    /// For an end: how it ended (a state that is not final reads as FAILED).
    pub state: JobState,
    pub exit_code: Option<i32>,
    pub reason: String,
    /// When it happened on the node (Unix ms); 0: when it arrives.
    pub time_ms: i64,
    pub cpu_time_ms: Option<u64>,
    pub mem_peak_bytes: Option<u64>,
    pub steps: Vec<Step>,
    /// For an end: the node refused the launch for a reason of its own (its options,
    /// its users), not of the job's: the job is requeued and the node drained.
    pub node_fault: bool,
}

impl Report {
    /// A report of `kind` with nothing else said.
    pub fn new(node: &str, job_id: u64, attempt: u32, kind: ReportKind) -> Report {
        Report {
            node: node.to_string(),
            job_id,
            attempt,
            kind,
            state: JobState::Failed,
            exit_code: None,
            reason: String::new(),
            time_ms: 0,
            cpu_time_ms: None,
            mem_peak_bytes: None,
            steps: Vec::new(),
            node_fault: false,
        }
    }
}
