//! A job as the controller keeps it: what was asked (`JobSpec` and its `Resources`),
//! where it is in its life (`Job`), what it holds (`Allocation`), what it ran (`Step`)
//! and used (`JobUsage`), and the controller's own notes beside it (`Record`). These are
//! core's words; the wire and the store convert to and from them at their edges
//! (`gpuctl_proto::record`), and the store's bytes are what they always were.

use std::collections::HashMap;

pub use gpuctl_sched::job::JobState;

/// A state's name as users read it (`PENDING`, `NODE_FAIL`), as Slurm writes it.
pub fn state_name(s: JobState) -> &'static str {
    match s {
        JobState::Pending => "PENDING",
        JobState::Running => "RUNNING",
        JobState::Completed => "COMPLETED",
        JobState::Failed => "FAILED",
        JobState::Cancelled => "CANCELLED",
        JobState::Timeout => "TIMEOUT",
        JobState::NodeFail => "NODE_FAIL",
        JobState::Preempted => "PREEMPTED",
    }
}

/// The GPU part of a request: whole GPUs, a share of one GPU, or MIG instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuPart {
    /// Whole GPUs on each node (0: none, as written).
    Gpus(u32),
    Share(GpuShare),
    Mig(MigInstances),
}

/// A share of one GPU: compute in milli-GPUs (1000 = whole) and/or memory. A part not
/// given (compute 0, memory `None`) is derived from the other in proportion to the GPU
/// it lands on; memory `Some(0)` means none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuShare {
    pub compute_milli: u32,
    pub memory_mib: Option<u64>,
}

/// `GpuShare`'s fields and their kinds (see `job_spec_fields`).
#[doc(hidden)]
#[macro_export]
macro_rules! gpu_share_fields {
    ($cb:ident!($($args:tt)*)) => {
        $cb!($($args)*;
            compute_milli: u32,
            memory_mib: opt_u64,
        )
    };
}

/// MIG instances of one profile (e.g. "3g.40gb").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigInstances {
    pub profile: String,
    pub count: u32,
}

/// `MigInstances`' fields and their kinds.
#[doc(hidden)]
#[macro_export]
macro_rules! mig_fields {
    ($cb:ident!($($args:tt)*)) => {
        $cb!($($args)*;
            profile: string,
            count: u32,
        )
    };
}

/// What a job asks for on each node it runs on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// None: no GPU.
    pub gpu: Option<GpuPart>,
    pub cpus: u32,
    /// Host memory in bytes; 0 = no reservation.
    pub memory_bytes: u64,
    /// 0 = the controller's default.
    pub time_limit_secs: u64,
    /// Allowed GPU models (substrings, case-insensitive); empty = any.
    pub gpu_models: Vec<String>,
    /// Nodes of a gang job (0 or 1 = one node).
    pub nodes: u32,
    /// CPUs in milli-CPUs when the request is not whole CPUs; `cpus` is then its
    /// rounding up.
    pub cpu_milli: u32,
    /// Only nodes matching one of these patterns (sbatch -w).
    pub nodelist: Vec<String>,
    /// Never nodes matching one of these patterns (sbatch -x).
    pub exclude: Vec<String>,
    /// Node features the job needs (sbatch -C).
    pub constraint: String,
    /// Tasks on each node (sbatch --ntasks-per-node); 0 or 1: one.
    pub tasks_per_node: u32,
    /// The whole of each node (sbatch --exclusive), resolved at submit.
    pub exclusive: bool,
}

/// `Resources`' plain fields (all but the `gpu` oneof) and their kinds.
#[doc(hidden)]
#[macro_export]
macro_rules! resources_fields {
    ($cb:ident!($($args:tt)*)) => {
        $cb!($($args)*;
            cpus: u32,
            memory_bytes: u64,
            time_limit_secs: u64,
            gpu_models: strings,
            nodes: u32,
            cpu_milli: u32,
            nodelist: strings,
            exclude: strings,
            constraint: string,
            tasks_per_node: u32,
            exclusive: bool,
        )
    };
}

impl Resources {
    /// The GPUs asked for, as a listing shows them: `2`, `0.25` (a share), `1 x
    /// 3g.40gb` (MIG instances), `3 x 2` over three nodes; `-` for none.
    pub fn gpu_summary(&self) -> String {
        let per_node = match &self.gpu {
            Some(GpuPart::Gpus(0)) | None => return "-".into(),
            Some(GpuPart::Gpus(n)) => n.to_string(),
            Some(GpuPart::Share(s)) => format!("{}", f64::from(s.compute_milli) / 1000.0),
            Some(GpuPart::Mig(m)) => format!("{} x {}", m.count.max(1), m.profile),
        };
        match self.nodes {
            0 | 1 => per_node,
            n => format!("{n} x {per_node}"),
        }
    }
}

/// What a dependency waits for (`sbatch --dependency`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DependencyKind {
    /// After the job ended, however (`--dependency=JOBID` alone means this).
    #[default]
    AfterAny,
    /// After the job completed successfully.
    AfterOk,
    /// After the job ended without success.
    AfterNotOk,
    /// Once no other job of the same user and name runs, nor an earlier one waits; names
    /// no job.
    Singleton,
}

impl DependencyKind {
    /// Its name in Slurm's `--dependency` (`afterok`, `singleton`).
    pub fn slurm_name(self) -> &'static str {
        match self {
            DependencyKind::AfterAny => "afterany",
            DependencyKind::AfterOk => "afterok",
            DependencyKind::AfterNotOk => "afternotok",
            DependencyKind::Singleton => "singleton",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dependency {
    pub kind: DependencyKind,
    pub job_id: u64,
}

/// `Dependency`'s plain fields (all but its kind).
#[doc(hidden)]
#[macro_export]
macro_rules! dependency_fields {
    ($cb:ident!($($args:tt)*)) => {
        $cb!($($args)*;
            job_id: u64,
        )
    };
}

/// What a job asks: its program, who runs it, its resources and its rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobSpec {
    pub name: String,
    /// Either command (argv) or script (shell text) is set.
    pub command: Vec<String>,
    pub script: String,
    pub workdir: String,
    pub stdout: String,
    pub stderr: String,
    pub env: HashMap<String, String>,
    pub priority: i32,
    pub resources: Resources,
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub qos: String,
    /// Queued again (instead of NODE_FAIL) when its node fails.
    pub requeue: bool,
    pub dependencies: Vec<Dependency>,
    pub account: String,
    /// The checkpoint signal before a preemption ("USR1@120").
    pub signal: String,
    /// A job array's task ranges ("0-99%8").
    pub array: String,
    /// Set by the controller on each task of an array: the array's id and the index.
    pub array_job_id: u64,
    pub array_task_id: Option<u32>,
    /// Not before this time (Unix ms; 0 = as soon as it can).
    pub begin_ms: i64,
    pub partition: String,
    pub right_size: bool,
    pub colocate: bool,
    /// Queued again after a failure at most this many times.
    pub max_restarts: u32,
    /// An allocation with no program of its own (`gpuctl alloc`).
    pub interactive: bool,
    /// The opportunistic class (`crate::opportunistic`): runs only in the idle of GPUs
    /// that guaranteed jobs hold, and yields when they need it.
    pub opportunistic: bool,
    /// Free text kept with the job (`sbatch --comment`).
    pub comment: String,
    /// Slurm's workload characterization key (`sbatch --wckey`), kept and shown.
    pub wckey: String,
    /// When to mail about the job (`--mail-type`, normalised: `BEGIN,END`).
    pub mail_type: String,
    /// Whom (`--mail-user`; empty: the job's user).
    pub mail_user: String,
}

/// `JobSpec`'s plain fields, each with its kind (`string`, `strings`, `u32`, `u64`,
/// `i32`, `i64`, `bool`, `f64`, `opt_u32`, ...), named as in `gpuctl.proto` (whose field
/// numbers `gpuctl-proto` generates as `tags::job_spec::NAME`: core knows no number), handed to
/// the macro `$cb`: the one list from which `gpuctl-proto` converts the record to and
/// from protobuf, encodes it and tests it (`proto/src/record.rs`), so that a plain
/// field is this struct's line and this list's. The others (`env`, `resources`,
/// `dependencies`) are converted by hand there. A field missing here fails to compile
/// (the conversions name every field of both structs).
#[doc(hidden)]
#[macro_export]
macro_rules! job_spec_fields {
    ($cb:ident!($($args:tt)*)) => {
        $cb!($($args)*;
            name: string,
            command: strings,
            script: string,
            workdir: string,
            stdout: string,
            stderr: string,
            priority: i32,
            user: string,
            uid: u32,
            gid: u32,
            qos: string,
            requeue: bool,
            account: string,
            signal: string,
            array: string,
            array_job_id: u64,
            array_task_id: opt_u32,
            partition: string,
            right_size: bool,
            begin_ms: i64,
            colocate: bool,
            max_restarts: u32,
            interactive: bool,
            opportunistic: bool,
            comment: string,
            wckey: string,
            mail_type: string,
            mail_user: string,
        )
    };
}

/// What a job holds on one slot (a GPU or a MIG instance).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotUse {
    pub uuid: String,
    pub compute_milli: u32,
    pub memory_mib: u64,
}

/// `SlotUse`'s fields and their kinds.
#[doc(hidden)]
#[macro_export]
macro_rules! slot_use_fields {
    ($cb:ident!($($args:tt)*)) => {
        $cb!($($args)*;
            uuid: string,
            compute_milli: u32,
            memory_mib: u64,
        )
    };
}

/// What a job holds on one node, and how that part ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocation {
    pub node: String,
    pub slots: Vec<SlotUse>,
    pub cpu_milli: u32,
    pub memory_bytes: u64,
    /// Rank within a gang job.
    pub rank: u32,
    pub ended: bool,
    /// How the part ended; `None` until it did.
    pub state: Option<JobState>,
    pub exit_code: Option<i32>,
    pub reason: String,
}

/// `Allocation`'s plain fields (all but `slots` and `state`).
#[doc(hidden)]
#[macro_export]
macro_rules! allocation_fields {
    ($cb:ident!($($args:tt)*)) => {
        $cb!($($args)*;
            node: string,
            cpu_milli: u32,
            memory_bytes: u64,
            rank: u32,
            ended: bool,
            exit_code: opt_i32,
            reason: string,
        )
    };
}

/// A job step: one `srun` (`gpuctl run`) of a job's script, over the nodes that ran it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Step {
    /// 0, 1, ... in the order the script started them.
    pub id: u32,
    /// Its command line, cleaned (`Step::clean_name`).
    pub name: String,
    pub start_ms: i64,
    /// 0: it had not ended when its node's part of the job did.
    pub end_ms: i64,
    /// The worst of its tasks' exit codes; `None`: not ended.
    pub exit_code: Option<i32>,
    pub tasks: u32,
    pub nodes: Vec<String>,
}

/// `Step`'s fields and their kinds.
#[doc(hidden)]
#[macro_export]
macro_rules! step_fields {
    ($cb:ident!($($args:tt)*)) => {
        $cb!($($args)*;
            id: u32,
            name: string,
            start_ms: i64,
            end_ms: i64,
            exit_code: opt_i32,
            tasks: u32,
            nodes: strings,
        )
    };
}

impl Step {
    /// The most steps a job's record keeps, and an agent reads from a job.
    pub const MAX_PER_JOB: usize = gpuctl_base::step::MAX_PER_JOB;
    /// The longest step name kept, in bytes.
    pub const MAX_NAME: usize = gpuctl_base::step::MAX_NAME;

    /// A step's name made safe to keep and show (`gpuctl_base::step::clean_name`).
    pub fn clean_name(name: &str) -> String {
        gpuctl_base::step::clean_name(name)
    }
}

/// What a job used, per allocated GPU or slice and on its hosts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobUsage {
    pub slots: Vec<SlotUsage>,
    /// CPU time of the job's cgroups, summed over its nodes.
    pub cpu_time_ms: u64,
    pub host_mem_peak_bytes: u64,
    pub host_reports: u32,
}

/// `JobUsage`'s plain fields (all but `slots`).
#[doc(hidden)]
#[macro_export]
macro_rules! job_usage_fields {
    ($cb:ident!($($args:tt)*)) => {
        $cb!($($args)*;
            cpu_time_ms: u64,
            host_mem_peak_bytes: u64,
            host_reports: u32,
        )
    };
}

/// What a job used of one slot, from its node's samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlotUsage {
    pub node: String,
    pub uuid: String,
    pub share_milli: u32,
    pub memory_mib: u64,
    pub samples: u64,
    pub util_sum: f64,
    pub util_max: f64,
    pub mem_peak_mib: u64,
    pub mem_sum_mib: f64,
    pub energy_j: f64,
    pub last_sample_ms: i64,
}

/// `SlotUsage`'s fields and their kinds.
#[doc(hidden)]
#[macro_export]
macro_rules! slot_usage_fields {
    ($cb:ident!($($args:tt)*)) => {
        $cb!($($args)*;
            node: string,
            uuid: string,
            share_milli: u32,
            memory_mib: u64,
            samples: u64,
            util_sum: f64,
            util_max: f64,
            mem_peak_mib: u64,
            mem_sum_mib: f64,
            energy_j: f64,
            last_sample_ms: i64,
        )
    };
}

/// A job: its spec and its life so far.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: u64,
    pub spec: JobSpec,
    pub state: JobState,
    pub node: String,
    pub gpus: Vec<String>,
    pub reason: String,
    pub exit_code: Option<i32>,
    /// Unix milliseconds; 0 = not yet.
    pub submit_time_ms: i64,
    pub start_time_ms: i64,
    pub end_time_ms: i64,
    /// The time limit applied (its own or the controller's default).
    pub time_limit_secs: u64,
    pub allocations: Vec<Allocation>,
    /// For a pending job: when its reservation starts; 0 = unknown.
    pub expected_start_ms: i64,
    /// How many times it was started; reports carry it (fencing).
    pub attempt: u32,
    /// Warnings agents reported while it ran, oldest first.
    pub warnings: Vec<String>,
    /// "user" or "admin" while held; empty otherwise.
    pub hold: String,
    /// What it used (live while it runs; its last run's after).
    pub usage: Option<JobUsage>,
    /// When its processes were running on the node (the agent's report); 0 until then.
    pub launch_time_ms: i64,
    /// How many times it was queued again after a failure.
    pub restarts: u32,
    /// Its steps as its nodes reported them; the last run's.
    pub steps: Vec<Step>,
}

/// `Job`'s plain fields (all but `spec`, `state`, `allocations`, `usage` and `steps`).
#[doc(hidden)]
#[macro_export]
macro_rules! job_fields {
    ($cb:ident!($($args:tt)*)) => {
        $cb!($($args)*;
            id: u64,
            node: string,
            gpus: strings,
            reason: string,
            exit_code: opt_i32,
            submit_time_ms: i64,
            start_time_ms: i64,
            end_time_ms: i64,
            time_limit_secs: u64,
            expected_start_ms: i64,
            attempt: u32,
            warnings: strings,
            hold: string,
            launch_time_ms: i64,
            restarts: u32,
        )
    };
}

impl Default for Job {
    fn default() -> Job {
        Job {
            id: 0,
            spec: JobSpec::default(),
            state: JobState::Pending,
            node: String::new(),
            gpus: Vec::new(),
            reason: String::new(),
            exit_code: None,
            submit_time_ms: 0,
            start_time_ms: 0,
            end_time_ms: 0,
            time_limit_secs: 0,
            allocations: Vec::new(),
            expected_start_ms: 0,
            attempt: 0,
            warnings: Vec::new(),
            hold: String::new(),
            usage: None,
            launch_time_ms: 0,
            restarts: 0,
            steps: Vec::new(),
        }
    }
}

/// A job's record: the job, and what the controller notes beside it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    pub job: Job,
    /// A cancel was asked for while the job ran; it ends as CANCELLED.
    pub cancel_requested: bool,
    /// The agent said the process started (an unconfirmed start can be requeued safely).
    pub start_confirmed: bool,
    /// The job as it ran before its node failed and it was requeued: if that node's
    /// agent comes back still running this start (or with its end), the job is adopted
    /// again instead of running twice. Cleared when the job starts again.
    pub requeued_from: Option<Job>,
    /// The client's request id of the submit, if it gave one.
    pub request_id: String,
    /// A requeue was asked for while the job ran: when its instances end it goes back
    /// to the queue with this reason instead of ending.
    pub requeue_requested: String,
    /// The job whose preemption stops this one (0: none), and when its instances will
    /// be gone at the latest (Unix ms; 0: no stop asked).
    pub preempted_by: u64,
    pub vacate_by_ms: i64,
}

/// `Record`'s plain fields (all but `job` and `requeued_from`), as `StoredJob` names them.
#[doc(hidden)]
#[macro_export]
macro_rules! record_fields {
    ($cb:ident!($($args:tt)*)) => {
        $cb!($($args)*;
            cancel_requested: bool,
            start_confirmed: bool,
            request_id: string,
            requeue_requested: string,
            preempted_by: u64,
            vacate_by_ms: i64,
        )
    };
}

/// One owner's decayed usage, as written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageEntry {
    pub account: String,
    pub user: String,
    pub gpu_seconds: f64,
}

/// Fair share's decayed usage, as written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageRecord {
    pub as_of_ms: i64,
    pub entries: Vec<UsageEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_summaries_name_each_kind() {
        let r = |gpu, nodes| Resources {
            gpu,
            nodes,
            ..Resources::default()
        };
        assert_eq!(r(None, 0).gpu_summary(), "-");
        assert_eq!(r(Some(GpuPart::Gpus(0)), 2).gpu_summary(), "-");
        assert_eq!(r(Some(GpuPart::Gpus(2)), 3).gpu_summary(), "3 x 2");
        let share = GpuPart::Share(GpuShare {
            compute_milli: 250,
            memory_mib: None,
        });
        assert_eq!(r(Some(share), 1).gpu_summary(), "0.25");
        let mig = GpuPart::Mig(MigInstances {
            profile: "3g.40gb".into(),
            count: 1,
        });
        assert_eq!(r(Some(mig), 1).gpu_summary(), "1 x 3g.40gb");
    }

    #[test]
    fn step_names_are_cleaned_and_cut_at_a_character() {
        assert_eq!(Step::clean_name("a\tb\u{202e}c"), "a b c");
        let long = "é".repeat(100);
        let cut = Step::clean_name(&long);
        assert!(cut.len() <= Step::MAX_NAME && cut.chars().all(|c| c == 'é'));
        assert_eq!(cut.len(), 128);
    }
}
