//! The job's life as the scheduler sees it: its state and what it waits for. The wire
//! and on-disk forms (protobuf) are converted to these at the controller's edges.

/// Where a job is in its life. Final states never change again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobState {
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    /// The node stopped responding while the job ran.
    NodeFail,
    /// Preempted and not requeueable.
    Preempted,
}

impl JobState {
    /// Whether the job has reached a final state.
    pub fn is_final(self) -> bool {
        !matches!(self, JobState::Pending | JobState::Running)
    }
}

/// What a dependency waits for (`sbatch --dependency`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DepKind {
    /// Start after the job completed successfully (COMPLETED).
    AfterOk,
    /// Start after the job ended, however.
    AfterAny,
    /// Start after the job ended without success.
    AfterNotOk,
}
