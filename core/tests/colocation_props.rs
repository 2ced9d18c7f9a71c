//! Co-location by measured use, through the state machine: jobs run once on a whole
//! GPU with sampled use (utilisation, GPU memory), then ask for co-location under the
//! same names. Whatever they used, the co-located jobs on one GPU never hold more GPU
//! memory than it has, nor more compute than all of it, and each is given at least
//! the memory its earlier run peaked at (so that a job doing what it did before is
//! never ended for it).

mod common;

use gpuctl_core::operations::Operations as _;
use std::collections::HashMap;

use common::*;
use gpuctl_core::record::{GpuPart, JobState};
use proptest::prelude::*;

const GPU_MIB: u64 = 81920;

/// Runs a whole-GPU job named `name` for two minutes with samples every 10 s at
/// `util`% and `mem` MiB; it ends completed or (`failed`) with exit 1. Returns the time
/// after it.
fn measured_run(
    c: &mut gpuctl_core::Cluster,
    name: &str,
    util: u32,
    mem: u64,
    failed: bool,
    t: i64,
) -> i64 {
    let mut s = spec(1, false);
    s.name = name.into();
    let id = submit_spec(c, s, t);
    pass(c, t);
    assert_eq!(state(c, id), JobState::Running, "{name}");
    report(c, "n1", id, None, t);
    let job = c.jobs().job(id).unwrap().clone();
    let uuid = job.allocations[0].slots[0].uuid.clone();
    let running = [gpuctl_core::event::Running {
        job_id: id,
        attempt: job.attempt,
        ..Default::default()
    }];
    for k in 1..=12 {
        let at = t + k * 10_000;
        let sample = gpuctl_core::node::GpuMetrics {
            uuid: uuid.clone(),
            util_pct: util,
            mem_used_mib: mem,
            time_ms: at,
            jobs: vec![gpuctl_core::node::JobGpuUse {
                job_id: id,
                mem_used_mib: mem,
                processes: 1,
                util_pct: None,
            }],
            ..Default::default()
        };
        let hb = gpuctl_core::event::Heartbeat {
            node: "n1".into(),
            running: running.to_vec(),
            metrics: vec![sample],
            ..Default::default()
        };
        c.heartbeat(&hb, at);
    }
    let end = if failed {
        (JobState::Failed, 1)
    } else {
        (JobState::Completed, 0)
    };
    report(c, "n1", id, Some(end), t + 130_000);
    assert!(state(c, id).is_final());
    t + 140_000
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn colocation_never_overcommits_gpu_memory(
        runs in prop::collection::vec((0u32..=100, 100u64..GPU_MIB, any::<bool>()), 1..4),
        asks in prop::collection::vec(0usize..4, 1..10),
    ) {
        let mut c = cluster();
        let mut t = T0;
        attach(&mut c, "n1", t);
        let mut peak: HashMap<String, u64> = HashMap::new();
        for (k, &(util, mem, failed)) in runs.iter().enumerate() {
            let name = format!("model-{k}");
            t = measured_run(&mut c, &name, util, mem, failed, t);
            peak.insert(name, mem);
        }
        let mut ids = Vec::new();
        for &k in &asks {
            let mut s = spec(1, false);
            s.name = format!("model-{}", k % runs.len());
            s.colocate = true;
            ids.push((submit_spec(&mut c, s.clone(), t), s.name));
        }
        pass(&mut c, t);
        // Per GPU: (compute, memory) held by running jobs.
        let mut held: HashMap<String, (u32, u64)> = HashMap::new();
        let mut shared = 0;
        for (id, name) in &ids {
            let j = c.jobs().job(*id).unwrap();
            let asked = &j.spec.resources;
            if let Some(GpuPart::Share(s)) = &asked.gpu {
                shared += 1;
                let m = s.memory_mib.unwrap_or(0);
                prop_assert!(m >= peak[name].min(GPU_MIB), "job {id}: {m} MiB for a peak of {}", peak[name]);
                prop_assert!(m <= GPU_MIB && s.compute_milli <= 1000);
            }
            if j.state != JobState::Running {
                continue;
            }
            for a in &j.allocations {
                for s in &a.slots {
                    let h = held.entry(s.uuid.clone()).or_default();
                    h.0 += s.compute_milli;
                    h.1 += s.memory_mib;
                }
            }
        }
        for (uuid, (compute, memory)) in &held {
            prop_assert!(*compute <= 1000, "{uuid}: compute {compute}");
            prop_assert!(*memory <= GPU_MIB, "{uuid}: memory {memory} MiB");
        }
        // A run that kept its GPU under 40% busy is charged less than a GPU: co-located.
        if runs.iter().all(|r| r.0 < 40) {
            prop_assert_eq!(shared, ids.len());
        }
    }
}
