//! What the state machine tells an agent to do (`Effects::sends`): start a job's part
//! on its node, or kill a job's instance. The daemon turns each into the signed
//! protobuf command of the node's stream (`proto/src/wire.rs`); the tests and the
//! simulator read them as they are.

use crate::record::{JobSpec, JobState, SlotUse};

/// One command for one node's agent.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Start(Box<Start>),
    Kill(Kill),
    /// A running instance's new time limit (`scontrol update TimeLimit=`).
    Limit(Limit),
    /// A GPU's new MIG layout (dynamic MIG, `crate::mig`): the GPU holds no job.
    Mig(MigLayout),
}

/// Reconfigure a GPU that holds no job to `layout` (MIG profiles; empty: whole).
#[derive(Debug, Clone, PartialEq)]
pub struct MigLayout {
    pub gpu: String,
    pub layout: Vec<String>,
}

/// Start a job's part (one rank) on the node.
#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    pub job_id: u64,
    /// Which start of the job this is (1 for the first; a requeue starts another).
    pub attempt: u32,
    /// The job as submitted (the job record's vocabulary).
    pub spec: JobSpec,
    pub time_limit_secs: u64,
    /// From a kill's TERM to its KILL.
    pub kill_grace_secs: u64,
    /// The GPU slots of this rank.
    pub slots: Vec<SlotUse>,
    pub rank: u32,
    /// Every node of the job, in rank order, and where each is reached.
    pub nodelist: Vec<String>,
    pub addresses: Vec<String>,
    /// The node's session (its attach's generation) the start was decided under: it
    /// goes out on that session only. An agent that attached again since was
    /// reconciled without it (its job requeued as never delivered), so delivering it
    /// on the new session would run the job twice.
    pub session_generation: u64,
}

/// Kill a job's instance on the node.
#[derive(Debug, Clone, PartialEq)]
pub struct Kill {
    pub job_id: u64,
    /// The instance (0: whichever runs there).
    pub attempt: u32,
    /// The state the job's part ends in.
    pub as_state: JobState,
    /// From the first signal to KILL.
    pub kill_grace_secs: u64,
    pub reason: String,
    /// The first signal by name (empty: TERM), like a preemption's checkpoint signal.
    pub signal: String,
    /// Deliver `signal` alone: the instance keeps running (`Cluster::signal_jobs`).
    pub signal_only: bool,
}

/// Set a running instance's time limit: counted from its start, like the first one.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    pub job_id: u64,
    pub attempt: u32,
    pub time_limit_secs: u64,
}

impl Command {
    /// The job this command is about.
    pub fn job_id(&self) -> u64 {
        match self {
            Command::Start(s) => s.job_id,
            Command::Kill(k) => k.job_id,
            Command::Limit(l) => l.job_id,
            Command::Mig(_) => 0,
        }
    }
}
