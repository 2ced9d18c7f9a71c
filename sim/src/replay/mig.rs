//! MIG in the replay (issue 58): a trace's GPU shares asked as MIG instances, on
//! GPUs cut once by hand (`static`, half of each node's GPUs) or laid out by the
//! controller as the queue needs (`dynamic`, `gpud --mig dynamic`: the simulated
//! agents carry out its layout changes and attach again with the new inventory).
//!
//! A share becomes the smallest instance of the node model that holds it: compute
//! in sevenths (`ceil(milli x 7 / 1000)` slices) and its GPU memory when it asks for
//! some; one that needs all seven asks for a whole GPU instead (what a user would
//! ask: the same GPU, without MIG mode). Such a job holds the instance's sevenths of
//! its GPU (what `gpu_milli` counts), more than the share it asked. The trace's GPU
//! model constraints are dropped: the rung asks what the same pods would get on
//! MIG-capable GPUs.

use gpuctl_sched::fairshare::mig_fraction;
use gpuctl_sched::mig::{Model, dynamic_slots, model_of, profile_memory_mib};
use gpuctl_sched::{GpuRequest, NodeView, SlotView};

use super::TraceJob;

/// How the replay's GPUs are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MigMode {
    /// Three GPUs in eight cut by hand (`STATIC_LAYOUTS`), the rest whole.
    Static,
    /// Every GPU whole at first; the controller changes layouts as jobs wait.
    Dynamic,
}

/// The hand-made layouts of `static`, in turn on the first three GPUs in every eight:
/// sized to the Alibaba trace's mix of shares as instances (in its 40%-shares file,
/// 875 need 4 sevenths, 418 need 3, 280 need 2 and 42 need 1).
pub const STATIC_LAYOUTS: [&[&str]; 3] = [
    &["4g.40gb", "3g.40gb"],
    &["4g.40gb", "3g.40gb"],
    &["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"],
];

/// Compute slices of a profile, in sevenths of its GPU ("3g.40gb" -> 3).
fn slices(profile: &str) -> u32 {
    (mig_fraction(profile) * 7.0).round() as u32
}

/// The smallest instance of `model` that holds a share of `milli` compute and `mib`
/// GPU memory: its profile.
pub fn profile_for(model: &Model, milli: u32, mib: Option<u64>) -> Option<&'static str> {
    let need = (u64::from(milli) * 7).div_ceil(1000).max(1) as u32;
    model
        .profiles
        .iter()
        .filter(|p| slices(p.name) >= need)
        .filter(|p| mib.is_none_or(|m| profile_memory_mib(p.name).is_some_and(|x| x >= m)))
        .min_by_key(|p| (slices(p.name), p.size))
        .map(|p| p.name)
}

/// The trace's shares asked as MIG instances of `model`'s GPUs. Answers how many jobs
/// changed; a share no instance holds stays a share (none does, on an 80 GB model).
pub fn as_mig(jobs: &mut [TraceJob], gpu_model: &str) -> anyhow::Result<usize> {
    let model = model_of(gpu_model).ok_or_else(|| {
        anyhow::anyhow!(
            "{gpu_model} has no MIG profiles: --mig needs an A100, A30, H100 or H200 cluster"
        )
    })?;
    let mut changed = 0;
    for j in jobs.iter_mut() {
        j.request.models.clear();
        if let GpuRequest::Share {
            compute_milli,
            memory_mib,
        } = j.request.gpu
        {
            let milli = compute_milli.unwrap_or(500);
            match profile_for(model, milli, memory_mib) {
                Some(p) if slices(p) >= 7 => {
                    j.request.gpu = GpuRequest::Whole { count: 1 };
                    j.gpu_milli = 1000;
                }
                Some(p) => {
                    j.request.gpu = GpuRequest::Mig {
                        profile: p.to_string(),
                        count: 1,
                    };
                    j.gpu_milli = u64::from(slices(p)) * 1000 / 7;
                    changed += 1;
                }
                None => {}
            }
        }
    }
    Ok(changed)
}

/// Cuts the first three GPUs in every eight of each node into `STATIC_LAYOUTS`
/// (instances named after their GPU).
pub fn static_layout(nodes: &mut [NodeView]) {
    for n in nodes.iter_mut() {
        let mut slots = Vec::new();
        for (i, s) in n.slots.drain(..).enumerate() {
            let Some(layout) = STATIC_LAYOUTS.get(i % 8) else {
                slots.push(s);
                continue;
            };
            for (k, p) in layout.iter().enumerate() {
                slots.push(SlotView {
                    uuid: format!("{}-mig{k}", s.uuid),
                    gpu_index: s.gpu_index,
                    model: s.model.clone(),
                    memory_mib: profile_memory_mib(p).unwrap_or(0),
                    mig_profile: Some((*p).to_string()),
                });
            }
        }
        n.slots = slots;
    }
}

/// Whether `req` can ever run on a node of these GPUs if it is dynamic-MIG: on the
/// instances they could be laid out as (`sched::mig::dynamic_slots`, what the
/// controller admits by).
pub fn fits_dynamic(n: &NodeView, req: &gpuctl_sched::Request) -> bool {
    let laid_out = NodeView {
        slots: dynamic_slots(&n.slots, &req.gpu),
        ..n.clone()
    };
    gpuctl_sched::fits_empty(&laid_out, req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_gets_the_smallest_instance_that_holds_it() {
        let a100 = model_of("A100-80GB").unwrap();
        assert_eq!(profile_for(a100, 100, None), Some("1g.10gb"));
        assert_eq!(profile_for(a100, 143, None), Some("2g.20gb"));
        assert_eq!(profile_for(a100, 500, None), Some("4g.40gb"));
        assert_eq!(profile_for(a100, 100, Some(15 << 10)), Some("1g.20gb"));
        assert_eq!(profile_for(a100, 900, None), Some("7g.80gb"));
        let share = |milli| TraceJob {
            request: gpuctl_sched::Request {
                gpu: GpuRequest::Share {
                    compute_milli: Some(milli),
                    memory_mib: None,
                },
                ..gpuctl_sched::Request::default()
            },
            gpu_milli: u64::from(milli),
            ..TraceJob::default()
        };
        let mut jobs = vec![share(500), share(900)];
        assert_eq!(as_mig(&mut jobs, "A100-80GB").unwrap(), 1);
        assert_eq!(jobs[0].gpu_milli, 571);
        assert_eq!(jobs[1].request.gpu, GpuRequest::Whole { count: 1 });
        assert!(as_mig(&mut jobs, "V100-32GB").is_err());
        assert_eq!(profile_for(a100, 100, Some(90 << 10)), None);
    }

    #[test]
    fn the_static_layout_is_one_the_placement_rules_allow() {
        let a100 = model_of("A100-80GB").unwrap();
        for layout in STATIC_LAYOUTS {
            assert!(a100.place(layout).is_ok(), "{layout:?}");
        }
        let mut nodes = crate::replay::parse_cluster("1x8xA100-80GB").unwrap();
        static_layout(&mut nodes);
        let mig = nodes[0].slots.iter().filter(|s| s.is_mig()).count();
        assert_eq!((mig, nodes[0].slots.len()), (8, 13));
    }
}
