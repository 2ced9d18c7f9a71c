//! A job record between core's words (`gpuctl_core::record`) and protobuf: the one
//! place each field meets its wire number. The controller's store and gRPC server and
//! the CLI convert here; the store's bytes are what they always were.
//!
//! Conversions are `From` (and `TryFrom` where a state must be known) both ways. A
//! record's older layouts are upgraded on the way in (`upgrade_record`); a request's
//! are refused first (`legacy_fields`). Listings encode jobs straight from the records
//! (`encode_job`), without building the protobuf message first.

use gpuctl_core::record as core;
use gpuctl_sched::job::JobState as State;

use crate::convert::{UnknownState, upgrade};
use crate::resources::Gpu as PbGpu;
use crate::store::{StoredJob, StoredUsage, UsageEntry as PbUsageEntry};
use crate::{
    Allocation, Dependency, GpuShare, Job, JobSpec, JobState, JobUsage, MigInstances, Resources,
    SlotUsage, SlotUse, Step, dependency,
};

mod encode;

pub use encode::{encode_job, encode_record, encode_usage_field, job_encoded_len, usage_field_len};

/// A state as its wire number.
pub fn state_number(s: State) -> i32 {
    JobState::from(s) as i32
}

/// A state's wire number as core's state; `JOB_STATE_UNSPECIFIED` and numbers of a
/// newer version are refused.
pub fn state_of(n: i32) -> Result<State, UnknownState> {
    let wire = JobState::try_from(n).map_err(|_| UnknownState(n))?;
    State::try_from(wire)
}

/// Whether a request still uses the flat share and MIG fields of before the `gpu`
/// oneof (refused on the API; a record's are upgraded).
#[allow(deprecated)]
pub fn legacy_fields(r: &Resources) -> bool {
    r.legacy_gpu_milli > 0
        || r.legacy_gpu_memory_mib > 0
        || !r.legacy_mig_profile.is_empty()
        || r.legacy_mig_count > 0
}

/// Upgrades a job record of an older layout in place (the flat GPU fields before the
/// `gpu` oneof); answers whether it changed, so that the controller writes it back.
pub fn upgrade_record(s: &mut StoredJob) -> bool {
    let jobs = s.job.iter_mut().chain(s.requeued_from.iter_mut());
    let mut changed = false;
    for r in jobs.filter_map(|j| j.spec.as_mut()?.resources.as_mut()) {
        changed |= upgrade(r);
    }
    changed
}

impl From<PbGpu> for core::GpuPart {
    fn from(g: PbGpu) -> core::GpuPart {
        match g {
            PbGpu::Gpus(n) => core::GpuPart::Gpus(n),
            PbGpu::Share(s) => core::GpuPart::Share(core::GpuShare {
                compute_milli: s.compute_milli,
                memory_mib: s.memory_mib,
            }),
            PbGpu::Mig(m) => core::GpuPart::Mig(core::MigInstances {
                profile: m.profile,
                count: m.count,
            }),
        }
    }
}

impl From<&core::GpuPart> for PbGpu {
    fn from(g: &core::GpuPart) -> PbGpu {
        match g {
            core::GpuPart::Gpus(n) => PbGpu::Gpus(*n),
            core::GpuPart::Share(s) => PbGpu::Share(GpuShare {
                compute_milli: s.compute_milli,
                memory_mib: s.memory_mib,
            }),
            core::GpuPart::Mig(m) => PbGpu::Mig(MigInstances {
                profile: m.profile.clone(),
                count: m.count,
            }),
        }
    }
}

impl From<Resources> for core::Resources {
    /// The flat fields of an older layout are upgraded first (a request's were refused
    /// before it got here).
    fn from(mut r: Resources) -> core::Resources {
        upgrade(&mut r);
        core::Resources {
            gpu: r.gpu.map(core::GpuPart::from),
            cpus: r.cpus,
            memory_bytes: r.memory_bytes,
            time_limit_secs: r.time_limit_secs,
            gpu_models: r.gpu_models,
            nodes: r.nodes,
            cpu_milli: r.cpu_milli,
            nodelist: r.nodelist,
            exclude: r.exclude,
            constraint: r.constraint,
            tasks_per_node: r.tasks_per_node,
            exclusive: r.exclusive,
        }
    }
}

impl From<&core::Resources> for Resources {
    fn from(r: &core::Resources) -> Resources {
        Resources {
            gpu: r.gpu.as_ref().map(PbGpu::from),
            cpus: r.cpus,
            memory_bytes: r.memory_bytes,
            time_limit_secs: r.time_limit_secs,
            gpu_models: r.gpu_models.clone(),
            nodes: r.nodes,
            cpu_milli: r.cpu_milli,
            nodelist: r.nodelist.clone(),
            exclude: r.exclude.clone(),
            constraint: r.constraint.clone(),
            tasks_per_node: r.tasks_per_node,
            exclusive: r.exclusive,
            ..Resources::default()
        }
    }
}

/// A dependency kind's wire number as core's kind: unspecified (and a number of a newer
/// version) means "after the job ended, however", as `--dependency=JOBID` does.
fn dependency_kind(n: i32) -> core::DependencyKind {
    match dependency::Kind::try_from(n) {
        Ok(dependency::Kind::AfterOk) => core::DependencyKind::AfterOk,
        Ok(dependency::Kind::AfterNotOk) => core::DependencyKind::AfterNotOk,
        Ok(dependency::Kind::Singleton) => core::DependencyKind::Singleton,
        _ => core::DependencyKind::AfterAny,
    }
}

fn dependency_number(k: core::DependencyKind) -> i32 {
    let kind = match k {
        core::DependencyKind::AfterAny => dependency::Kind::AfterAny,
        core::DependencyKind::AfterOk => dependency::Kind::AfterOk,
        core::DependencyKind::AfterNotOk => dependency::Kind::AfterNotOk,
        core::DependencyKind::Singleton => dependency::Kind::Singleton,
    };
    kind as i32
}

impl From<JobSpec> for core::JobSpec {
    fn from(s: JobSpec) -> core::JobSpec {
        core::JobSpec {
            name: s.name,
            command: s.command,
            script: s.script,
            workdir: s.workdir,
            stdout: s.stdout,
            stderr: s.stderr,
            env: s.env,
            priority: s.priority,
            resources: s.resources.map(Into::into).unwrap_or_default(),
            user: s.user,
            uid: s.uid,
            gid: s.gid,
            qos: s.qos,
            requeue: s.requeue,
            dependencies: (s.dependencies.into_iter())
                .map(|d| core::Dependency {
                    kind: dependency_kind(d.kind),
                    job_id: d.job_id,
                })
                .collect(),
            account: s.account,
            signal: s.signal,
            array: s.array,
            array_job_id: s.array_job_id,
            array_task_id: s.array_task_id,
            begin_ms: s.begin_ms,
            partition: s.partition,
            right_size: s.right_size,
            colocate: s.colocate,
            max_restarts: s.max_restarts,
            interactive: s.interactive,
        }
    }
}

impl From<&core::JobSpec> for JobSpec {
    fn from(s: &core::JobSpec) -> JobSpec {
        JobSpec {
            name: s.name.clone(),
            command: s.command.clone(),
            script: s.script.clone(),
            workdir: s.workdir.clone(),
            stdout: s.stdout.clone(),
            stderr: s.stderr.clone(),
            env: s.env.clone(),
            priority: s.priority,
            resources: Some((&s.resources).into()),
            user: s.user.clone(),
            uid: s.uid,
            gid: s.gid,
            qos: s.qos.clone(),
            requeue: s.requeue,
            dependencies: (s.dependencies.iter())
                .map(|d| Dependency {
                    kind: dependency_number(d.kind),
                    job_id: d.job_id,
                })
                .collect(),
            account: s.account.clone(),
            signal: s.signal.clone(),
            array: s.array.clone(),
            array_job_id: s.array_job_id,
            array_task_id: s.array_task_id,
            begin_ms: s.begin_ms,
            partition: s.partition.clone(),
            right_size: s.right_size,
            colocate: s.colocate,
            max_restarts: s.max_restarts,
            interactive: s.interactive,
        }
    }
}

impl From<SlotUse> for core::SlotUse {
    fn from(s: SlotUse) -> core::SlotUse {
        core::SlotUse {
            uuid: s.uuid,
            compute_milli: s.compute_milli,
            memory_mib: s.memory_mib,
        }
    }
}

impl From<&core::SlotUse> for SlotUse {
    fn from(s: &core::SlotUse) -> SlotUse {
        SlotUse {
            uuid: s.uuid.clone(),
            compute_milli: s.compute_milli,
            memory_mib: s.memory_mib,
        }
    }
}

impl From<Allocation> for core::Allocation {
    /// A part's end state is `None` while it runs (and for a number this version does
    /// not know).
    fn from(a: Allocation) -> core::Allocation {
        core::Allocation {
            node: a.node,
            slots: a.slots.into_iter().map(Into::into).collect(),
            cpu_milli: a.cpu_milli,
            memory_bytes: a.memory_bytes,
            rank: a.rank,
            ended: a.ended,
            state: state_of(a.state).ok(),
            exit_code: a.exit_code,
            reason: a.reason,
        }
    }
}

impl From<&core::Allocation> for Allocation {
    fn from(a: &core::Allocation) -> Allocation {
        Allocation {
            node: a.node.clone(),
            slots: a.slots.iter().map(Into::into).collect(),
            cpu_milli: a.cpu_milli,
            memory_bytes: a.memory_bytes,
            rank: a.rank,
            ended: a.ended,
            state: a.state.map_or(0, state_number),
            exit_code: a.exit_code,
            reason: a.reason.clone(),
        }
    }
}

impl From<Step> for core::Step {
    fn from(s: Step) -> core::Step {
        core::Step {
            id: s.id,
            name: s.name,
            start_ms: s.start_ms,
            end_ms: s.end_ms,
            exit_code: s.exit_code,
            tasks: s.tasks,
            nodes: s.nodes,
        }
    }
}

impl From<&core::Step> for Step {
    fn from(s: &core::Step) -> Step {
        Step {
            id: s.id,
            name: s.name.clone(),
            start_ms: s.start_ms,
            end_ms: s.end_ms,
            exit_code: s.exit_code,
            tasks: s.tasks,
            nodes: s.nodes.clone(),
        }
    }
}

impl From<SlotUsage> for core::SlotUsage {
    fn from(s: SlotUsage) -> core::SlotUsage {
        core::SlotUsage {
            node: s.node,
            uuid: s.uuid,
            share_milli: s.share_milli,
            memory_mib: s.memory_mib,
            samples: s.samples,
            util_sum: s.util_sum,
            util_max: s.util_max,
            mem_peak_mib: s.mem_peak_mib,
            mem_sum_mib: s.mem_sum_mib,
            energy_j: s.energy_j,
            last_sample_ms: s.last_sample_ms,
        }
    }
}

impl From<&core::SlotUsage> for SlotUsage {
    fn from(s: &core::SlotUsage) -> SlotUsage {
        SlotUsage {
            node: s.node.clone(),
            uuid: s.uuid.clone(),
            share_milli: s.share_milli,
            memory_mib: s.memory_mib,
            samples: s.samples,
            util_sum: s.util_sum,
            util_max: s.util_max,
            mem_peak_mib: s.mem_peak_mib,
            mem_sum_mib: s.mem_sum_mib,
            energy_j: s.energy_j,
            last_sample_ms: s.last_sample_ms,
        }
    }
}

impl From<JobUsage> for core::JobUsage {
    fn from(u: JobUsage) -> core::JobUsage {
        core::JobUsage {
            slots: u.slots.into_iter().map(Into::into).collect(),
            cpu_time_ms: u.cpu_time_ms,
            host_mem_peak_bytes: u.host_mem_peak_bytes,
            host_reports: u.host_reports,
        }
    }
}

impl From<&core::JobUsage> for JobUsage {
    fn from(u: &core::JobUsage) -> JobUsage {
        JobUsage {
            slots: u.slots.iter().map(Into::into).collect(),
            cpu_time_ms: u.cpu_time_ms,
            host_mem_peak_bytes: u.host_mem_peak_bytes,
            host_reports: u.host_reports,
        }
    }
}

impl TryFrom<Job> for core::Job {
    type Error = UnknownState;
    /// Refused when its state is unknown (a job without a state is not one).
    fn try_from(j: Job) -> Result<core::Job, UnknownState> {
        Ok(core::Job {
            id: j.id,
            state: state_of(j.state)?,
            spec: j.spec.map(Into::into).unwrap_or_default(),
            node: j.node,
            gpus: j.gpus,
            reason: j.reason,
            exit_code: j.exit_code,
            submit_time_ms: j.submit_time_ms,
            start_time_ms: j.start_time_ms,
            end_time_ms: j.end_time_ms,
            time_limit_secs: j.time_limit_secs,
            allocations: j.allocations.into_iter().map(Into::into).collect(),
            expected_start_ms: j.expected_start_ms,
            attempt: j.attempt,
            warnings: j.warnings,
            hold: j.hold,
            usage: j.usage.map(Into::into),
            launch_time_ms: j.launch_time_ms,
            restarts: j.restarts,
            steps: j.steps.into_iter().map(Into::into).collect(),
        })
    }
}

impl From<&core::Job> for Job {
    fn from(j: &core::Job) -> Job {
        Job {
            id: j.id,
            spec: Some((&j.spec).into()),
            state: state_number(j.state),
            node: j.node.clone(),
            gpus: j.gpus.clone(),
            reason: j.reason.clone(),
            exit_code: j.exit_code,
            submit_time_ms: j.submit_time_ms,
            start_time_ms: j.start_time_ms,
            end_time_ms: j.end_time_ms,
            time_limit_secs: j.time_limit_secs,
            allocations: j.allocations.iter().map(Into::into).collect(),
            expected_start_ms: j.expected_start_ms,
            attempt: j.attempt,
            warnings: j.warnings.clone(),
            hold: j.hold.clone(),
            usage: j.usage.as_ref().map(Into::into),
            launch_time_ms: j.launch_time_ms,
            restarts: j.restarts,
            steps: j.steps.iter().map(Into::into).collect(),
        }
    }
}

/// A stored record that holds no job, or one in a state this version does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRecord {
    #[error("a job record without its job")]
    NoJob,
    #[error(transparent)]
    State(#[from] UnknownState),
}

impl TryFrom<StoredJob> for core::Record {
    type Error = BadRecord;
    fn try_from(s: StoredJob) -> Result<core::Record, BadRecord> {
        Ok(core::Record {
            job: s.job.ok_or(BadRecord::NoJob)?.try_into()?,
            cancel_requested: s.cancel_requested,
            start_confirmed: s.start_confirmed,
            requeued_from: s.requeued_from.map(TryInto::try_into).transpose()?,
            request_id: s.request_id,
            requeue_requested: s.requeue_requested,
            preempted_by: s.preempted_by,
            vacate_by_ms: s.vacate_by_ms,
        })
    }
}

impl From<&core::Record> for StoredJob {
    fn from(s: &core::Record) -> StoredJob {
        StoredJob {
            job: Some((&s.job).into()),
            cancel_requested: s.cancel_requested,
            start_confirmed: s.start_confirmed,
            requeued_from: s.requeued_from.as_ref().map(Into::into),
            request_id: s.request_id.clone(),
            requeue_requested: s.requeue_requested.clone(),
            preempted_by: s.preempted_by,
            vacate_by_ms: s.vacate_by_ms,
        }
    }
}

impl From<StoredUsage> for core::UsageRecord {
    fn from(u: StoredUsage) -> core::UsageRecord {
        core::UsageRecord {
            as_of_ms: u.as_of_ms,
            entries: (u.entries.into_iter())
                .map(|e| core::UsageEntry {
                    account: e.account,
                    user: e.user,
                    gpu_seconds: e.gpu_seconds,
                })
                .collect(),
        }
    }
}

impl From<&core::UsageRecord> for StoredUsage {
    fn from(u: &core::UsageRecord) -> StoredUsage {
        StoredUsage {
            as_of_ms: u.as_of_ms,
            entries: (u.entries.iter())
                .map(|e| PbUsageEntry {
                    account: e.account.clone(),
                    user: e.user.clone(),
                    gpu_seconds: e.gpu_seconds,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests;
