//! A job record between core's words (`gpuctl_core::record`) and protobuf. A plain
//! field is named once in core's list beside its struct (`gpuctl_core::job_spec_fields!`
//! and the like), and the conversions and the encoder here are made from those lists;
//! every field's wire number is written once, in the .proto files, and read here from
//! the constants build.rs generates from them (`crate::tags`). The controller's store and gRPC server and the CLI convert here; the
//! store's bytes are what they always were.
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

/// `$ty` built from the protobuf message `$src`: its plain fields (core's list for it,
/// `gpuctl_core::job_spec_fields` and the like) moved, the others as `special` gives them.
macro_rules! from_pb {
    ($src:ident => $($ty:ident)::+ { $($special:tt)* }; $($f:ident: $k:ident,)*) => {
        $($ty)::+ { $($f: $src.$f,)* $($special)* }
    };
}

/// The protobuf message `$ty` of core's `$src`: plain fields copied, the others as
/// `special` gives them.
macro_rules! to_pb {
    ($src:ident => $($ty:ident)::+ { $($special:tt)* }; $($f:ident: $k:ident,)*) => {
        $($ty)::+ { $($f: Clone::clone(&$src.$f),)* $($special)* }
    };
}

/// The protobuf message `$ty` of core's `$src`, taken by value: plain fields moved.
macro_rules! into_pb {
    ($src:ident => $($ty:ident)::+ { $($special:tt)* }; $($f:ident: $k:ident,)*) => {
        $($ty)::+ { $($f: $src.$f,)* $($special)* }
    };
}

impl From<PbGpu> for core::GpuPart {
    fn from(g: PbGpu) -> core::GpuPart {
        match g {
            PbGpu::Gpus(n) => core::GpuPart::Gpus(n),
            PbGpu::Share(s) => core::GpuPart::Share(gpuctl_core::gpu_share_fields!(
                from_pb!(s => core::GpuShare {})
            )),
            PbGpu::Mig(m) => core::GpuPart::Mig(gpuctl_core::mig_fields!(
                from_pb!(m => core::MigInstances {})
            )),
        }
    }
}

impl From<&core::GpuPart> for PbGpu {
    fn from(g: &core::GpuPart) -> PbGpu {
        match g {
            core::GpuPart::Gpus(n) => PbGpu::Gpus(*n),
            core::GpuPart::Share(s) => {
                PbGpu::Share(gpuctl_core::gpu_share_fields!(to_pb!(s => GpuShare {})))
            }
            core::GpuPart::Mig(m) => {
                PbGpu::Mig(gpuctl_core::mig_fields!(to_pb!(m => MigInstances {})))
            }
        }
    }
}

impl From<Resources> for core::Resources {
    /// The flat fields of an older layout are upgraded first (a request's were refused
    /// before it got here).
    fn from(mut r: Resources) -> core::Resources {
        upgrade(&mut r);
        gpuctl_core::resources_fields!(from_pb!(r => core::Resources {
            gpu: r.gpu.map(core::GpuPart::from),
        }))
    }
}

impl From<&core::Resources> for Resources {
    fn from(r: &core::Resources) -> Resources {
        gpuctl_core::resources_fields!(to_pb!(r => Resources {
            gpu: r.gpu.as_ref().map(PbGpu::from),
            ..Resources::default()
        }))
    }
}

/// A dependency kind's wire number as core's kind: unspecified (and a number of a newer
/// version) means "after the job ended, however", as `--dependency=JOBID` does.
pub fn dependency_kind(n: i32) -> core::DependencyKind {
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

impl From<Dependency> for core::Dependency {
    fn from(d: Dependency) -> core::Dependency {
        gpuctl_core::dependency_fields!(from_pb!(d => core::Dependency {
            kind: dependency_kind(d.kind),
        }))
    }
}

impl From<&core::Dependency> for Dependency {
    fn from(d: &core::Dependency) -> Dependency {
        gpuctl_core::dependency_fields!(to_pb!(d => Dependency {
            kind: dependency_number(d.kind),
        }))
    }
}

impl From<JobSpec> for core::JobSpec {
    fn from(s: JobSpec) -> core::JobSpec {
        gpuctl_core::job_spec_fields!(from_pb!(s => core::JobSpec {
            env: s.env,
            resources: s.resources.map(Into::into).unwrap_or_default(),
            dependencies: s.dependencies.into_iter().map(Into::into).collect(),
        }))
    }
}

impl From<core::JobSpec> for JobSpec {
    /// A spec the controller sends on (a start's): moved, not copied.
    fn from(s: core::JobSpec) -> JobSpec {
        let resources = Some((&s.resources).into());
        let dependencies = s.dependencies.iter().map(Into::into).collect();
        gpuctl_core::job_spec_fields!(into_pb!(s => JobSpec {
            env: s.env,
            resources,
            dependencies,
        }))
    }
}

impl From<&core::JobSpec> for JobSpec {
    fn from(s: &core::JobSpec) -> JobSpec {
        gpuctl_core::job_spec_fields!(to_pb!(s => JobSpec {
            env: s.env.clone(),
            resources: Some((&s.resources).into()),
            dependencies: s.dependencies.iter().map(Into::into).collect(),
        }))
    }
}

impl From<SlotUse> for core::SlotUse {
    fn from(s: SlotUse) -> core::SlotUse {
        gpuctl_core::slot_use_fields!(from_pb!(s => core::SlotUse {}))
    }
}

impl From<&core::SlotUse> for SlotUse {
    fn from(s: &core::SlotUse) -> SlotUse {
        gpuctl_core::slot_use_fields!(to_pb!(s => SlotUse {}))
    }
}

impl From<Allocation> for core::Allocation {
    /// A part's end state is `None` while it runs (and for a number this version does
    /// not know).
    fn from(a: Allocation) -> core::Allocation {
        gpuctl_core::allocation_fields!(from_pb!(a => core::Allocation {
            slots: a.slots.into_iter().map(Into::into).collect(),
            state: state_of(a.state).ok(),
        }))
    }
}

impl From<&core::Allocation> for Allocation {
    fn from(a: &core::Allocation) -> Allocation {
        gpuctl_core::allocation_fields!(to_pb!(a => Allocation {
            slots: a.slots.iter().map(Into::into).collect(),
            state: a.state.map_or(0, state_number),
        }))
    }
}

impl From<Step> for core::Step {
    fn from(s: Step) -> core::Step {
        gpuctl_core::step_fields!(from_pb!(s => core::Step {}))
    }
}

impl From<&core::Step> for Step {
    fn from(s: &core::Step) -> Step {
        gpuctl_core::step_fields!(to_pb!(s => Step {}))
    }
}

impl From<SlotUsage> for core::SlotUsage {
    fn from(s: SlotUsage) -> core::SlotUsage {
        gpuctl_core::slot_usage_fields!(from_pb!(s => core::SlotUsage {}))
    }
}

impl From<&core::SlotUsage> for SlotUsage {
    fn from(s: &core::SlotUsage) -> SlotUsage {
        gpuctl_core::slot_usage_fields!(to_pb!(s => SlotUsage {}))
    }
}

impl From<JobUsage> for core::JobUsage {
    fn from(u: JobUsage) -> core::JobUsage {
        gpuctl_core::job_usage_fields!(from_pb!(u => core::JobUsage {
            slots: u.slots.into_iter().map(Into::into).collect(),
        }))
    }
}

impl From<&core::JobUsage> for JobUsage {
    fn from(u: &core::JobUsage) -> JobUsage {
        gpuctl_core::job_usage_fields!(to_pb!(u => JobUsage {
            slots: u.slots.iter().map(Into::into).collect(),
        }))
    }
}

impl TryFrom<Job> for core::Job {
    type Error = UnknownState;
    /// Refused when its state is unknown (a job without a state is not one).
    fn try_from(j: Job) -> Result<core::Job, UnknownState> {
        let state = state_of(j.state)?;
        Ok(gpuctl_core::job_fields!(from_pb!(j => core::Job {
            state,
            spec: j.spec.map(Into::into).unwrap_or_default(),
            allocations: j.allocations.into_iter().map(Into::into).collect(),
            usage: j.usage.map(Into::into),
            steps: j.steps.into_iter().map(Into::into).collect(),
        })))
    }
}

impl From<&core::Job> for Job {
    fn from(j: &core::Job) -> Job {
        gpuctl_core::job_fields!(to_pb!(j => Job {
            spec: Some((&j.spec).into()),
            state: state_number(j.state),
            allocations: j.allocations.iter().map(Into::into).collect(),
            usage: j.usage.as_ref().map(Into::into),
            steps: j.steps.iter().map(Into::into).collect(),
        }))
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
        let job = s.job.ok_or(BadRecord::NoJob)?.try_into()?;
        let requeued_from = s.requeued_from.map(TryInto::try_into).transpose()?;
        Ok(gpuctl_core::record_fields!(from_pb!(s => core::Record {
            job,
            requeued_from,
        })))
    }
}

impl From<&core::Record> for StoredJob {
    fn from(s: &core::Record) -> StoredJob {
        gpuctl_core::record_fields!(to_pb!(s => StoredJob {
            job: Some((&s.job).into()),
            requeued_from: s.requeued_from.as_ref().map(Into::into),
        }))
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
