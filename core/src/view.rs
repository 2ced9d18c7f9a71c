//! What the state answers users, in its own words: why a job waits (`Explanation`),
//! what a cancel did (`CancelResult`), the partitions (`PartitionRow`), the windows in
//! force (`Windows`), fair share (`Share`). The daemon renders them as protobuf at its
//! gRPC server (`proto/src/wire.rs`); core's tests read them as they are.

use std::collections::BTreeMap;

use gpuctl_sched::job::JobState;

/// Why a job waits (`gpuctl explain`).
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub job_id: u64,
    pub state: JobState,
    /// Its reason code (`squeue`'s REASON).
    pub reason: String,
    /// The reason in words.
    pub summary: String,
    /// When a pass expects it to start (Unix ms); 0: not known.
    pub expected_start_ms: i64,
    /// Its place in the queue (1 first), and its priority, from a pass.
    pub rank: u32,
    pub priority: i64,
    /// Node by node: what keeps it off (empty: it would fit there).
    pub nodes: Vec<NodeExplain>,
}

impl Explanation {
    /// An answer about job `id`, in `state`, with nothing found yet.
    pub fn new(job_id: u64, state: JobState, reason: &str) -> Explanation {
        Explanation {
            job_id,
            state,
            reason: reason.to_string(),
            summary: String::new(),
            expected_start_ms: 0,
            rank: 0,
            priority: 0,
            nodes: Vec::new(),
        }
    }
}

/// What keeps a job off one node (empty: nothing).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeExplain {
    pub node: String,
    pub reason: String,
}

/// What a cancel did to one job.
#[derive(Debug, Clone, PartialEq)]
pub struct CancelResult {
    pub job_id: u64,
    pub ok: bool,
    pub message: String,
}

/// A task of an array by its index (`scancel 12_3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskRef {
    pub array_job_id: u64,
    pub task_id: u32,
}

/// One partition (`gpuctl partitions`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PartitionRow {
    pub name: String,
    pub is_default: bool,
    /// `up`, `down`, `drain` or `inactive`.
    pub state: String,
    /// The nodes it holds now, and the patterns it names them by.
    pub nodes: Vec<String>,
    pub node_patterns: Vec<String>,
    /// 0: none.
    pub default_time_secs: u64,
    pub max_time_secs: u64,
    /// Empty: every account.
    pub allowed_accounts: Vec<String>,
    pub default_qos: String,
    pub gpus: u32,
    pub pending_jobs: u32,
    pub running_jobs: u32,
}

/// The windows in force (`gpuctl windows`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Windows {
    pub timezone: String,
    pub windows: Vec<WindowRow>,
    /// Whether preemption is allowed now.
    pub preemption_allowed: bool,
    /// The time of the answer (the config's test clock offset applied), Unix ms.
    pub now_ms: i64,
}

/// One window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowRow {
    pub name: String,
    pub open: bool,
    /// When it opens or closes next (Unix ms); 0: never.
    pub next_change_ms: i64,
    pub days: Vec<String>,
    pub start: String,
    pub end: String,
    /// Floors by user or account (a partition's as `partition:NAME`).
    pub floor: BTreeMap<String, f64>,
    pub qos_priority: BTreeMap<String, i64>,
    /// `on`, `off`, or empty (the global setting).
    pub preemption: String,
}

/// One pending job's priority and its factors (`gpuctl priority`, like `sprio`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobPriority {
    pub job_id: u64,
    pub user: String,
    pub total: i64,
    /// Each factor's weighted part, by its name (`age`, `fairshare`, ...).
    pub factors: BTreeMap<String, i64>,
}

/// Fair share per account and user (`gpuctl share`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Share {
    pub rows: Vec<ShareRow>,
    /// The usage's half-life, in words.
    pub half_life: String,
}

/// One account's or user's line.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ShareRow {
    pub account: String,
    /// Empty: the account's own line.
    pub user: String,
    pub norm_shares: f64,
    pub account_shares: f64,
    pub usage_gpu_hours: f64,
    pub effective_usage: f64,
    pub fair_share: f64,
}
