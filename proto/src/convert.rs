//! Where protobuf meets the domain model (`gpuctl-sched`): every conversion between a
//! wire or stored message and a domain type is here, so that the scheduler core never
//! sees protobuf and the programs convert at their edges only.

use gpuctl_sched::job::{DepKind, JobState as State};
use gpuctl_sched::{Alloc, GpuRequest, Request, SlotUse as DomainSlotUse, SlotView};

use crate::{Allocation, Gpu, JobState, Resources, SlotUse, dependency};

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
        }
    }
}

impl From<dependency::Kind> for DepKind {
    /// An unspecified kind means "after the job ended, however", as `--dependency=JOBID`
    /// does in Slurm.
    fn from(k: dependency::Kind) -> DepKind {
        match k {
            dependency::Kind::AfterOk => DepKind::AfterOk,
            dependency::Kind::AfterNotOk => DepKind::AfterNotOk,
            dependency::Kind::AfterAny | dependency::Kind::Unspecified => DepKind::AfterAny,
        }
    }
}

impl From<&Resources> for Request {
    /// The scheduler's view of a request. The controller has validated the message
    /// before it is queued (at most one GPU form set); a MIG profile wins over a
    /// share, a share over whole GPUs.
    fn from(r: &Resources) -> Request {
        let gpu = if !r.mig_profile.is_empty() {
            GpuRequest::Mig {
                profile: r.mig_profile.clone(),
                count: r.mig_count.max(1),
            }
        } else if r.gpu_milli > 0 || r.gpu_memory_mib > 0 {
            GpuRequest::Share {
                compute_milli: (r.gpu_milli > 0).then_some(r.gpu_milli),
                memory_mib: (r.gpu_memory_mib > 0).then_some(r.gpu_memory_mib),
            }
        } else if r.gpus > 0 {
            GpuRequest::Whole { count: r.gpus }
        } else {
            GpuRequest::None
        };
        Request {
            gpu,
            models: r.gpu_models.clone(),
            cpu_milli: cpu_milli(r),
            memory_bytes: r.memory_bytes,
            nodes: r.nodes.max(1),
        }
    }
}

/// A request no node could be asked for as it is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// The request checked, then as the scheduler sees it. The one place where the rules of
/// a request's shape live: the controller refuses a job with this message, and `gpuctl`
/// checks what it is about to send (a job file, a script, the command line's overrides)
/// with the same function.
pub fn checked_request(r: &Resources) -> Result<Request, BadRequest> {
    let bad = |m: &str| Err(BadRequest(m.to_string()));
    if r.cpus == 0 && r.cpu_milli == 0 {
        return bad("cpus must be at least 1");
    }
    if r.cpu_milli > 0 && r.cpus != r.cpu_milli.div_ceil(1000) {
        return bad("cpus must be cpu_milli rounded up to whole CPUs");
    }
    let share = r.gpu_milli > 0 || r.gpu_memory_mib > 0;
    let mig = !r.mig_profile.is_empty();
    if u32::from(share) + u32::from(mig) + u32::from(r.gpus > 0) > 1 {
        return bad(
            "ask for one of: whole GPUs (`gpus`), a share (`gpus` < 1, `gpu_memory`), or MIG (`mig`)",
        );
    }
    if r.gpu_milli > 1000 {
        return bad("a GPU share is at most one GPU");
    }
    if r.mig_count > 0 && !mig {
        return bad("`mig_count` needs a MIG profile (`mig`)");
    }
    if r.gpus > 1024 || r.mig_count > 1024 {
        return bad("at most 1024 GPUs or MIG instances per node");
    }
    if r.nodes > 1 && (share || mig) {
        return bad("multi-node jobs take whole GPUs");
    }
    if r.nodes > 1024 {
        return bad("at most 1024 nodes");
    }
    Ok(Request::from(r))
}

/// The CPUs a request asks for, in milli-CPUs: `cpu_milli` when set, else `cpus`.
pub fn cpu_milli(r: &Resources) -> u32 {
    if r.cpu_milli > 0 {
        r.cpu_milli
    } else {
        r.cpus.saturating_mul(1000)
    }
}

/// A node's slots: whole GPUs, or the MIG instances of a GPU in MIG mode.
pub fn slots_of(gpus: &[Gpu]) -> Vec<SlotView> {
    let mut slots = Vec::new();
    for g in gpus {
        if g.mig.is_empty() {
            slots.push(SlotView {
                uuid: g.uuid.clone(),
                gpu_index: g.index,
                model: g.model.clone(),
                memory_mib: g.memory_mib,
                mig_profile: None,
            });
        } else {
            for m in &g.mig {
                slots.push(SlotView {
                    uuid: m.uuid.clone(),
                    gpu_index: g.index,
                    model: g.model.clone(),
                    memory_mib: m.memory_mib,
                    mig_profile: Some(m.profile.clone()),
                });
            }
        }
    }
    slots
}

impl From<&Allocation> for Alloc {
    fn from(a: &Allocation) -> Alloc {
        Alloc {
            node: a.node.clone(),
            slots: a
                .slots
                .iter()
                .map(|s| DomainSlotUse {
                    uuid: s.uuid.clone(),
                    compute_milli: s.compute_milli,
                    memory_mib: s.memory_mib,
                })
                .collect(),
            cpu_milli: a.cpu_milli,
            memory_bytes: a.memory_bytes,
        }
    }
}

/// A new, live allocation record of rank `rank` for a planned placement.
pub fn allocation(a: &Alloc, rank: u32) -> Allocation {
    Allocation {
        node: a.node.clone(),
        slots: a
            .slots
            .iter()
            .map(|s| SlotUse {
                uuid: s.uuid.clone(),
                compute_milli: s.compute_milli,
                memory_mib: s.memory_mib,
            })
            .collect(),
        cpu_milli: a.cpu_milli,
        memory_bytes: a.memory_bytes,
        rank,
        ..Allocation::default()
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
    fn gpu_forms_map_to_one_request() {
        let share = Resources {
            gpu_milli: 250,
            ..Resources::default()
        };
        assert_eq!(
            Request::from(&share).gpu,
            GpuRequest::Share {
                compute_milli: Some(250),
                memory_mib: None
            }
        );
        let mig = Resources {
            mig_profile: "1g.10gb".into(),
            ..Resources::default()
        };
        assert_eq!(
            Request::from(&mig).gpu,
            GpuRequest::Mig {
                profile: "1g.10gb".into(),
                count: 1
            }
        );
        let whole = Resources {
            gpus: 2,
            nodes: 0,
            ..Resources::default()
        };
        let r = Request::from(&whole);
        assert_eq!((r.gpu, r.nodes), (GpuRequest::Whole { count: 2 }, 1));
    }

    #[test]
    fn request_shapes_are_checked_in_one_place() {
        let r = |f: &dyn Fn(&mut Resources)| {
            let mut r = Resources {
                cpus: 1,
                ..Resources::default()
            };
            f(&mut r);
            checked_request(&r)
        };
        assert!(r(&|r| r.gpus = 2).is_ok());
        assert!(r(&|r| r.gpu_milli = 250).is_ok());
        let refused = [
            (r(&|r| r.cpus = 0), "cpus must be at least 1"),
            (
                r(&|r| {
                    r.gpus = 1;
                    r.gpu_milli = 500;
                }),
                "ask for one of",
            ),
            (r(&|r| r.gpu_milli = 1500), "at most one GPU"),
            (r(&|r| r.mig_count = 2), "needs a MIG profile"),
            (
                r(&|r| {
                    r.gpu_milli = 500;
                    r.nodes = 2;
                }),
                "multi-node jobs take whole GPUs",
            ),
            (r(&|r| r.nodes = 2000), "at most 1024 nodes"),
            (
                r(&|r| {
                    r.cpu_milli = 3152;
                    r.cpus = 1;
                }),
                "rounded up",
            ),
        ];
        for (got, want) in refused {
            let e = got.unwrap_err();
            assert!(e.0.contains(want), "{e} lacks {want:?}");
        }
        let fractional = r(&|r| {
            r.cpu_milli = 3152;
            r.cpus = 4;
        });
        assert_eq!(fractional.unwrap().cpu_milli, 3152);
    }

    #[test]
    fn allocations_round_trip() {
        let a = Alloc {
            node: "n1".into(),
            slots: vec![DomainSlotUse {
                uuid: "GPU-1".into(),
                compute_milli: 1000,
                memory_mib: 0,
            }],
            cpu_milli: 2000,
            memory_bytes: 1 << 30,
        };
        let pb = allocation(&a, 3);
        assert_eq!(pb.rank, 3);
        assert!(!pb.ended);
        assert_eq!(Alloc::from(&pb), a);
    }
}
