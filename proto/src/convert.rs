//! Where protobuf meets the domain model (`gpuctl-sched`, `gpuctl-core`): job states,
//! the upgrade of an older record's request, and a request on the wire read as the
//! scheduler does (the rules of a request's shape are core's: `gpuctl_core::request`;
//! re-exported here with the `core` feature; the signal names are `gpuctl_base`'s).
//! The job record's conversions are in `record`, the other state machine words' in
//! `wire`.

use gpuctl_sched::job::JobState as State;

pub use gpuctl_base::signal::{SIGNALS, parse_signal, parse_signal_spec};
#[cfg(feature = "core")]
pub use gpuctl_core::request::{
    BadRequest, MAX_NODE_PATTERNS, MAX_PRIORITY_ADJUST, MAX_TASKS_PER_NODE, check_node_patterns,
};

use crate::resources::Gpu as GpuPart;
use crate::{GpuShare, JobState, MigInstances, Resources};

/// A stored or received job state the domain does not know (`JOB_STATE_UNSPECIFIED` or
/// a number from a newer version).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown job state {0}")]
pub struct UnknownState(pub i32);

impl TryFrom<JobState> for State {
    type Error = UnknownState;
    fn try_from(s: JobState) -> Result<State, UnknownState> {
        Ok(match s {
            JobState::Pending => State::Pending,
            JobState::Running => State::Running,
            JobState::Completed => State::Completed,
            JobState::Failed => State::Failed,
            JobState::Cancelled => State::Cancelled,
            JobState::Timeout => State::Timeout,
            JobState::NodeFail => State::NodeFail,
            JobState::Preempted => State::Preempted,
            JobState::Unspecified => return Err(UnknownState(s as i32)),
        })
    }
}

impl From<State> for JobState {
    fn from(s: State) -> JobState {
        match s {
            State::Pending => JobState::Pending,
            State::Running => JobState::Running,
            State::Completed => JobState::Completed,
            State::Failed => JobState::Failed,
            State::Cancelled => JobState::Cancelled,
            State::Timeout => JobState::Timeout,
            State::NodeFail => JobState::NodeFail,
            State::Preempted => JobState::Preempted,
        }
    }
}

/// Moves the flat share and MIG fields of a record written before the `gpu` oneof into
/// it. Returns whether anything moved.
#[allow(deprecated)]
pub fn upgrade(r: &mut Resources) -> bool {
    let legacy = (
        std::mem::take(&mut r.legacy_gpu_milli),
        std::mem::take(&mut r.legacy_gpu_memory_mib),
        std::mem::take(&mut r.legacy_mig_profile),
        std::mem::take(&mut r.legacy_mig_count),
    );
    match legacy {
        (0, 0, p, _) if p.is_empty() => false,
        (milli, mib, p, _) if p.is_empty() => {
            r.gpu = Some(GpuPart::Share(GpuShare {
                compute_milli: milli,
                memory_mib: (mib > 0).then_some(mib),
            }));
            true
        }
        (_, _, profile, count) => {
            r.gpu = Some(GpuPart::Mig(MigInstances {
                profile,
                count: count.max(1),
            }));
            true
        }
    }
}

/// The GPU part of a request on the wire as the scheduler sees it.
#[cfg(feature = "core")]
pub fn gpu_request(g: Option<&GpuPart>) -> gpuctl_sched::GpuRequest {
    gpuctl_core::request::gpu_request(g.cloned().map(Into::into).as_ref())
}

/// The CPUs a request on the wire asks for, in milli-CPUs: `cpu_milli` when set, else
/// `cpus`.
pub fn cpu_milli(r: &Resources) -> u32 {
    if r.cpu_milli > 0 {
        r.cpu_milli
    } else {
        r.cpus.saturating_mul(1000)
    }
}

/// A listing's (or a cancel's) filter. Asking for a final state asks for finished jobs.
/// A state the domain does not know is refused: left out, it would widen the filter.
#[cfg(feature = "core")]
impl TryFrom<&crate::ListJobsRequest> for gpuctl_core::filter::JobFilter {
    type Error = UnknownState;
    fn try_from(r: &crate::ListJobsRequest) -> Result<Self, UnknownState> {
        let states = (r.states.iter())
            .map(|&s| {
                let known = JobState::try_from(s).ok();
                known.map_or(Err(UnknownState(s)), State::try_from)
            })
            .collect::<Result<Vec<State>, UnknownState>>()?;
        Ok(gpuctl_core::filter::JobFilter {
            all: r.all || states.iter().any(|s| s.is_final()),
            users: r.users.clone(),
            states,
            names: r.names.clone(),
            accounts: r.accounts.clone(),
            partitions: r.partitions.clone(),
        })
    }
}

#[cfg(feature = "core")]
impl From<gpuctl_core::view::ShareRow> for crate::ShareRow {
    fn from(r: gpuctl_core::view::ShareRow) -> crate::ShareRow {
        crate::ShareRow {
            account: r.account,
            user: r.user,
            norm_shares: r.norm_shares,
            account_shares: r.account_shares,
            usage_gpu_hours: r.usage_gpu_hours,
            effective_usage: r.effective_usage,
            fair_share: r.fair_share,
        }
    }
}

#[cfg(feature = "core")]
impl From<crate::ShareRow> for gpuctl_core::view::ShareRow {
    fn from(r: crate::ShareRow) -> gpuctl_core::view::ShareRow {
        gpuctl_core::view::ShareRow {
            account: r.account,
            user: r.user,
            norm_shares: r.norm_shares,
            account_shares: r.account_shares,
            usage_gpu_hours: r.usage_gpu_hours,
            effective_usage: r.effective_usage,
            fair_share: r.fair_share,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_unspecified_is_refused() {
        for s in [
            State::Pending,
            State::Running,
            State::Completed,
            State::Failed,
            State::Cancelled,
            State::Timeout,
            State::NodeFail,
        ] {
            let wire = JobState::from(s);
            assert_eq!(State::try_from(wire), Ok(s));
            assert_eq!(wire.is_final(), s.is_final());
        }
        assert_eq!(State::try_from(JobState::Unspecified), Err(UnknownState(0)));
    }

    #[test]
    #[cfg(feature = "core")]
    #[allow(deprecated)]
    fn records_of_the_flat_fields_are_upgraded() {
        let mut r = Resources {
            legacy_gpu_milli: 500,
            legacy_gpu_memory_mib: 2048,
            ..Resources::default()
        };
        assert!(crate::record::legacy_fields(&r), "refused on the API");
        assert!(upgrade(&mut r));
        assert_eq!(
            r.gpu,
            Some(GpuPart::Share(GpuShare {
                compute_milli: 500,
                memory_mib: Some(2048)
            }))
        );
        let mut r = Resources {
            legacy_mig_profile: "1g.10gb".into(),
            legacy_mig_count: 2,
            ..Resources::default()
        };
        assert!(upgrade(&mut r));
        assert!(matches!(r.gpu, Some(GpuPart::Mig(ref m)) if m.count == 2));
        let mut whole = Resources {
            gpu: Some(GpuPart::Gpus(4)),
            ..Resources::default()
        };
        assert!(!upgrade(&mut whole), "whole GPUs kept their field number");
        // A record of the old layout decodes as the new: field 1 is `gpus` in both.
        use prost::Message as _;
        let old = Resources {
            gpu: Some(GpuPart::Gpus(4)),
            legacy_gpu_milli: 0,
            ..Resources::default()
        }
        .encode_to_vec();
        assert_eq!(
            Resources::decode(&old[..]).unwrap().gpu,
            Some(GpuPart::Gpus(4))
        );
    }
}
