//! What a job asks for, checked, and as the scheduler sees it: the rules of a request's
//! shape (the controller refuses a job with their messages, and `gpuctl` checks what it
//! is about to send with the same functions), the allocation records of a placement, and
//! the signals a job may ask for.

use gpuctl_sched::job::DepKind;
use gpuctl_sched::{Alloc, GpuRequest, Request, SlotUse as SchedSlotUse};

use crate::record::{
    Allocation, DependencyKind, GpuPart, GpuShare, MigInstances, Resources, SlotUse,
};

impl From<DependencyKind> for DepKind {
    /// A singleton names no job: the controller turns it into "after any" on each job
    /// it waits for.
    fn from(k: DependencyKind) -> DepKind {
        match k {
            DependencyKind::AfterOk => DepKind::AfterOk,
            DependencyKind::AfterNotOk => DepKind::AfterNotOk,
            DependencyKind::AfterAny | DependencyKind::Singleton => DepKind::AfterAny,
        }
    }
}

/// The largest priority adjustment a job may carry either way (`nice`, `priority` in
/// a job file): well past every weight the scheduler adds, far from `i32`'s ends.
pub const MAX_PRIORITY_ADJUST: u32 = 1_000_000;

impl From<&Resources> for Request {
    /// The scheduler's view of a request (checked by `checked_request` before a job is
    /// queued).
    fn from(r: &Resources) -> Request {
        Request {
            gpu: gpu_request(r.gpu.as_ref()),
            models: r.gpu_models.clone(),
            cpu_milli: cpu_milli(r),
            memory_bytes: r.memory_bytes,
            nodes: r.nodes.max(1),
            partition: None,
            nodelist: r.nodelist.clone(),
            exclude: r.exclude.clone(),
            // Checked at submit; a record's constraint parses as it did then.
            constraint: gpuctl_sched::features::parse(&r.constraint).unwrap_or_default(),
        }
    }
}

/// The GPU part of a request as the scheduler sees it.
pub fn gpu_request(g: Option<&GpuPart>) -> GpuRequest {
    match g {
        None | Some(GpuPart::Gpus(0)) => GpuRequest::None,
        Some(GpuPart::Gpus(n)) => GpuRequest::Whole { count: *n },
        Some(GpuPart::Share(s)) => GpuRequest::Share {
            compute_milli: (s.compute_milli > 0).then_some(s.compute_milli),
            memory_mib: s.memory_mib,
        },
        Some(GpuPart::Mig(m)) => GpuRequest::Mig {
            profile: m.profile.clone(),
            count: m.count.max(1),
        },
    }
}

/// The wire form of the GPU part of a request.
pub fn gpu_part(g: &GpuRequest) -> Option<GpuPart> {
    match g {
        GpuRequest::None => None,
        GpuRequest::Whole { count } => Some(GpuPart::Gpus(*count)),
        GpuRequest::Share {
            compute_milli,
            memory_mib,
        } => Some(GpuPart::Share(GpuShare {
            compute_milli: compute_milli.unwrap_or(0),
            memory_mib: *memory_mib,
        })),
        GpuRequest::Mig { profile, count } => Some(GpuPart::Mig(MigInstances {
            profile: profile.clone(),
            count: *count,
        })),
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
    let (share, mig) = match &r.gpu {
        None => (false, false),
        Some(GpuPart::Gpus(n)) => {
            if *n > 1024 {
                return bad("at most 1024 GPUs per node");
            }
            (false, false)
        }
        Some(GpuPart::Share(s)) => {
            if s.compute_milli > 1000 {
                return bad("a GPU share is at most one GPU");
            }
            if s.compute_milli == 0 && s.memory_mib.is_none_or(|m| m == 0) {
                return bad("a GPU share needs compute or memory");
            }
            (true, false)
        }
        Some(GpuPart::Mig(m)) => {
            if m.profile.is_empty() {
                return bad("MIG instances need a profile (`mig`)");
            }
            if m.count > 1024 {
                return bad("at most 1024 MIG instances per node");
            }
            (false, true)
        }
    };
    if r.nodes > 1 && (share || mig) {
        return bad("multi-node jobs take whole GPUs");
    }
    if r.nodes > 1024 {
        return bad("at most 1024 nodes");
    }
    check_node_patterns("nodelist", &r.nodelist)?;
    check_node_patterns("exclude", &r.exclude)?;
    if r.constraint.len() > 1024 {
        return bad("a constraint is at most 1024 bytes");
    }
    gpuctl_sched::features::parse(&r.constraint).map_err(BadRequest)?;
    check_tasks(r).map_err(BadRequest)?;
    Ok(Request::from(r))
}

/// The most tasks a job may start on one node.
pub const MAX_TASKS_PER_NODE: u32 = 256;

/// A job's tasks per node: at most [`MAX_TASKS_PER_NODE`], and its node's whole GPUs
/// (or MIG instances) split evenly over them, each task its own.
pub fn check_tasks(r: &Resources) -> Result<(), String> {
    let t = r.tasks_per_node;
    if t > MAX_TASKS_PER_NODE {
        return Err(format!("{t} tasks per node: at most {MAX_TASKS_PER_NODE}"));
    }
    if t > 1 && r.cpus < t && r.cpu_milli == 0 {
        return Err(format!(
            "{t} tasks per node need at least {t} CPUs per node (cpus = {}): a task has at least one",
            r.cpus
        ));
    }
    let devices = match &r.gpu {
        Some(GpuPart::Gpus(n)) => Some((*n, "GPUs")),
        Some(GpuPart::Mig(m)) => Some((m.count, "MIG instances")),
        _ => None,
    };
    match devices {
        Some((n, what)) if t > 1 && n > 0 && !n.is_multiple_of(t) => Err(format!(
            "{n} {what} per node do not split over {t} tasks per node: give each task the same number (gpus = tasks x gpus per task)"
        )),
        _ => Ok(()),
    }
}

/// The most patterns a job's `nodelist` or `exclude` may hold.
pub const MAX_NODE_PATTERNS: usize = 64;

/// A job's `nodelist` or `exclude` (`what`): at most `MAX_NODE_PATTERNS` patterns of
/// at most 256 bytes, node-name characters only, each a valid node pattern.
pub fn check_node_patterns(what: &str, list: &[String]) -> Result<(), BadRequest> {
    if list.len() > MAX_NODE_PATTERNS {
        return Err(BadRequest(format!(
            "{what}: {} patterns, at most {MAX_NODE_PATTERNS}",
            list.len()
        )));
    }
    for p in list {
        if p.len() > 256 {
            return Err(BadRequest(format!(
                "{what}: a node pattern of {} bytes, at most 256",
                p.len()
            )));
        }
        let odd = |c: char| !gpuctl_sched::hostlist::is_name_char(c) && !"*[],-".contains(c);
        if p.chars().any(odd) {
            return Err(BadRequest(format!(
                "{what}: {:?} has a character no node name has",
                p.chars().take(64).collect::<String>()
            )));
        }
        gpuctl_sched::hostlist::check_hostlist(p)
            .map_err(|why| BadRequest(format!("{what} {p:?}: {why}")))?;
    }
    Ok(())
}

/// The CPUs a request asks for, in milli-CPUs: `cpu_milli` when set, else `cpus`.
pub fn cpu_milli(r: &Resources) -> u32 {
    if r.cpu_milli > 0 {
        r.cpu_milli
    } else {
        r.cpus.saturating_mul(1000)
    }
}

impl From<&Allocation> for Alloc {
    fn from(a: &Allocation) -> Alloc {
        Alloc {
            node: a.node.clone(),
            slots: a.slots.iter().map(Into::into).collect(),
            cpu_milli: a.cpu_milli,
            memory_bytes: a.memory_bytes,
        }
    }
}

impl From<&SlotUse> for SchedSlotUse {
    fn from(s: &SlotUse) -> SchedSlotUse {
        SchedSlotUse {
            uuid: s.uuid.clone(),
            compute_milli: s.compute_milli,
            memory_mib: s.memory_mib,
        }
    }
}

impl From<&SchedSlotUse> for SlotUse {
    fn from(s: &SchedSlotUse) -> SlotUse {
        SlotUse {
            uuid: s.uuid.clone(),
            compute_milli: s.compute_milli,
            memory_mib: s.memory_mib,
        }
    }
}

/// A new, live allocation record of rank `rank` for a planned placement.
pub fn allocation(a: &Alloc, rank: u32) -> Allocation {
    Allocation {
        node: a.node.clone(),
        slots: a.slots.iter().map(Into::into).collect(),
        cpu_milli: a.cpu_milli,
        memory_bytes: a.memory_bytes,
        rank,
        ..Allocation::default()
    }
}

pub use gpuctl_base::signal::{SIGNALS, parse_signal, parse_signal_spec};

#[cfg(test)]
mod tests {
    use super::*;

    /// Tasks per node: bounded, one CPU each at least, the node's GPUs or MIG instances
    /// split evenly (a share is every task's).
    #[test]
    fn tasks_split_a_nodes_gpus_evenly() {
        let r = |tasks: u32, cpus: u32, gpu: Option<GpuPart>| Resources {
            tasks_per_node: tasks,
            cpus,
            gpu,
            ..Resources::default()
        };
        let ok = |r: Resources| check_tasks(&r).map(drop);
        assert!(ok(r(4, 4, Some(GpuPart::Gpus(8)))).is_ok());
        assert!(ok(r(1, 1, Some(GpuPart::Gpus(3)))).is_ok());
        assert!(ok(r(4, 4, None)).is_ok());
        assert!(ok(r(2, 2, Some(GpuPart::Gpus(0)))).is_ok());
        let share = GpuPart::Share(GpuShare {
            compute_milli: 500,
            memory_mib: None,
        });
        assert!(ok(r(2, 2, Some(share))).is_ok());
        let e = ok(r(3, 3, Some(GpuPart::Gpus(8)))).unwrap_err();
        assert!(
            e.contains("8 GPUs per node do not split over 3 tasks"),
            "{e}"
        );
        let mig = GpuPart::Mig(MigInstances {
            profile: "1g.10gb".into(),
            count: 3,
        });
        assert!(
            ok(r(2, 2, Some(mig)))
                .unwrap_err()
                .contains("MIG instances")
        );
        assert!(ok(r(4, 2, None)).unwrap_err().contains("at least 4 CPUs"));
        assert!(ok(r(257, 512, None)).unwrap_err().contains("at most 256"));
        assert!(checked_request(&r(3, 3, Some(GpuPart::Gpus(4)))).is_err());
    }

    #[test]
    fn gpu_forms_map_to_one_request() {
        let share = Resources {
            gpu: Some(GpuPart::Share(GpuShare {
                compute_milli: 250,
                memory_mib: None,
            })),
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
            gpu: Some(GpuPart::Mig(MigInstances {
                profile: "1g.10gb".into(),
                count: 0,
            })),
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
            gpu: Some(GpuPart::Gpus(2)),
            nodes: 0,
            ..Resources::default()
        };
        let r = Request::from(&whole);
        assert_eq!((r.gpu, r.nodes), (GpuRequest::Whole { count: 2 }, 1));
        // Every form goes to the wire and back unchanged, a share of no memory too.
        for g in [
            GpuRequest::None,
            GpuRequest::Whole { count: 3 },
            GpuRequest::Share {
                compute_milli: Some(350),
                memory_mib: Some(0),
            },
            GpuRequest::Share {
                compute_milli: None,
                memory_mib: Some(1024),
            },
            GpuRequest::Mig {
                profile: "3g.40gb".into(),
                count: 2,
            },
        ] {
            assert_eq!(gpu_request(gpu_part(&g).as_ref()), g);
        }
    }

    #[test]
    fn allocations_round_trip() {
        let a = Alloc {
            node: "n1".into(),
            slots: vec![SchedSlotUse {
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

    #[test]
    fn signal_specs() {
        assert_eq!(parse_signal_spec(""), Ok(None));
        assert_eq!(
            parse_signal_spec("USR1@120"),
            Ok(Some(("USR1".into(), Some(120))))
        );
        assert_eq!(
            parse_signal_spec("sigusr2"),
            Ok(Some(("USR2".into(), None)))
        );
        assert!(parse_signal_spec("KILL@5").is_err());
        assert!(parse_signal_spec("USR1@soon").is_err());
        assert!(parse_signal_spec("USR1@99999").is_err());
    }
}
