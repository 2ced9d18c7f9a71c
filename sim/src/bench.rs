//! The scheduling benchmark's inputs, shared by `cargo bench` and `gpuctld simulate
//! bench`: a 1,000-node x 8-GPU cluster (mixed models, every tenth node with MIG GPUs),
//! half of it busy, and a pending queue drawn from the Alibaba trace's task mix.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::trace::Pod;
use gpuctl_sched::{
    Alloc, ClusterView, Eligibility, GpuRequest, Millis, NodeView, PendingJob, Request, Running,
    SlotUse, SlotView,
};

const MODELS: [&str; 4] = ["A100-80GB", "G2", "V100M32", "T4"];
const H: Millis = 3_600_000;

/// `nodes` nodes of 8 GPUs; about half of all GPUs (and MIG instances) busy with jobs
/// ending at random times within a day.
pub fn cluster(nodes: usize, seed: u64) -> ClusterView {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut c = ClusterView::default();
    let mut job = 1_000_000_000u64;
    for i in 0..nodes {
        let name = format!("node{i:04}");
        let model = MODELS[i % MODELS.len()];
        let mig = i % 10 == 0;
        let mut slots = Vec::new();
        for g in 0..8u32 {
            if mig && g < 4 {
                for (k, (p, m)) in [("3g.40gb", 40960), ("2g.20gb", 20480), ("2g.20gb", 20480)]
                    .iter()
                    .enumerate()
                {
                    slots.push(SlotView {
                        uuid: format!("MIG-{name}-{g}-{k}"),
                        gpu_index: g,
                        model: "A100-80GB".into(),
                        memory_mib: *m,
                        mig_profile: Some((*p).into()),
                    });
                }
            } else {
                slots.push(SlotView {
                    uuid: format!("GPU-{name}-{g}"),
                    gpu_index: g,
                    model: model.into(),
                    memory_mib: 81920,
                    mig_profile: None,
                });
            }
        }
        for s in &slots {
            if !rng.random_bool(0.5) {
                continue;
            }
            job += 1;
            c.running.push(Running {
                job,
                alloc: Alloc {
                    node: name.clone(),
                    slots: vec![SlotUse {
                        uuid: s.uuid.clone(),
                        compute_milli: 1000,
                        memory_mib: s.memory_mib,
                    }],
                    cpu_milli: 4000,
                    memory_bytes: 32 << 30,
                },
                end_ms: rng.random_range(60_000..24 * H),
            });
        }
        c.nodes.push(NodeView {
            name,
            eligibility: Eligibility::Up,
            slots,
            cpu_milli: 128_000,
            memory_bytes: 1 << 40,
            partitions: Vec::new(),
            features: Vec::new(),
        });
    }
    c
}

/// `n` pending jobs drawn (with replacement) from `pods`, with time limits of twice
/// their trace duration (10 minutes when unknown). Every 50th job asks for a MIG
/// instance, so that the MIG slots see work too.
pub fn queue(pods: &[Pod], n: usize, seed: u64) -> Vec<PendingJob> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let p = &pods[rng.random_range(0..pods.len())];
            let mut request: Request = p.request();
            if i % 50 == 49 {
                request.gpu = GpuRequest::Mig {
                    profile: "2g.20gb".into(),
                    count: 1,
                };
                request.models.clear();
            }
            // The benchmark cluster has no trace models other than G2/T4/V100M32.
            request
                .models
                .retain(|m| MODELS.iter().any(|x| x.contains(m.as_str())));
            request.cpu_milli = request.cpu_milli.min(64_000);
            PendingJob {
                id: i as u64 + 1,
                priority: 0,
                qos: String::new(),
                submit_ms: -(rng.random_range(0..H)),
                request,
                duration_ms: p.duration_s().unwrap_or(600).clamp(60, 7 * 24 * 3600) * 2000,
                ..PendingJob::default()
            }
        })
        .collect()
}

/// A stand-in for the trace's mix when the trace is not present: the same shares of
/// CPU-only, fractional, 1-GPU and multi-GPU tasks (SCHEMA.md).
pub fn synthetic_pods(seed: u64) -> Vec<Pod> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..8152)
        .map(|i| {
            let x = rng.random_range(0..1000);
            let (num_gpu, gpu_milli) = match x {
                0..133 => (0, 0),
                133..511 => (1, [810, 470, 320, 650, 230][rng.random_range(0..5)]),
                511..991 => (1, 1000),
                991..993 => (2, 1000),
                993..995 => (4, 1000),
                _ => (8, 1000),
            };
            Pod {
                name: format!("syn-{i}"),
                cpu_milli: [4000, 11300, 12000, 16400][rng.random_range(0..4)],
                memory_mib: [15258, 41560, 49152][rng.random_range(0..3)],
                num_gpu,
                gpu_milli,
                gpu_spec: None,
                qos: None,
                creation_time: Some(0),
                deletion_time: Some(rng.random_range(73..7764)),
                scheduled_time: Some(0),
            }
        })
        .collect()
}

/// The trace's default pod list in `$GPUCTL_TRACE_DIR`, or the synthetic stand-in when
/// it is absent.
pub fn pods() -> (Vec<Pod>, &'static str) {
    match crate::trace::default_dir() {
        Some(dir) => pods_in(&dir),
        None => (
            synthetic_pods(7),
            "synthetic mix (GPUCTL_TRACE_DIR not set)",
        ),
    }
}

/// The default pod list of the trace in `dir`, or the synthetic stand-in when it is
/// absent.
pub fn pods_in(dir: &std::path::Path) -> (Vec<Pod>, &'static str) {
    match crate::trace::read_pods(&dir.join("openb_pod_list_default.csv")) {
        Ok(p) => (p, "alibaba openb_pod_list_default.csv"),
        Err(_) => (synthetic_pods(7), "synthetic mix (trace not found)"),
    }
}

/// The benchmark's owners: job i belongs to user `u{i % 500}` in account
/// `a{i % 50}`, and the users' decayed usage is uneven (some used a lot, some nothing),
/// deterministically.
pub fn owners(queue: &mut [PendingJob]) -> gpuctl_sched::fairshare::Usage {
    for (i, j) in queue.iter_mut().enumerate() {
        j.user = format!("u{}", i % 500);
        j.account = format!("a{}", i % 50);
    }
    let mut usage = gpuctl_sched::fairshare::Usage::default();
    for u in 0..500u64 {
        let gpu_s = ((u * 7919) % 1000) as f64 * 3600.0 * (u % 3) as f64;
        usage.charge(&format!("a{}", u % 50), &format!("u{u}"), gpu_s);
    }
    usage
}

/// Each job's fair-share factor from `usage` (equal shares), as a pass gives them.
pub fn fair_share(queue: &mut [PendingJob], usage: &gpuctl_sched::fairshare::Usage) {
    let table = usage.table(
        queue.iter().map(|j| (j.account.as_str(), j.user.as_str())),
        &gpuctl_sched::fairshare::Equal,
    );
    for j in queue.iter_mut() {
        j.fair_share_milli = table.factor(&j.account, &j.user);
    }
}
