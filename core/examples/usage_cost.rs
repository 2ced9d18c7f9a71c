//! What the efficiency loop costs the controller: heartbeats of 1,000 nodes x 8 GPUs,
//! one a second each, with every GPU's sample folded into its jobs' usage (half the
//! nodes run a job per whole GPU, half four quarter shares per GPU: 20,000 jobs).
//! Prints the CPU time per simulated second of heartbeats (each a `Heartbeat` entry
//! applied; the folding is what the same heartbeats without samples save), and the
//! memory the live usage takes.
//!
//! cargo run --release -p gpuctl-core --example usage_cost -- [NODES] [SECONDS]

use gpuctl_core::operations::Operations as _;
use std::time::Instant;

use gpuctl_core::ops::Admission;
use gpuctl_core::record::{GpuPart, GpuShare, JobSpec, JobUsage, Resources, SlotUsage};
use gpuctl_core::{Actor, Cluster, Config};

const T0: i64 = 1_800_000_000_000;

/// The cluster with every job started: (state, node names, whole-GPU jobs, shares).
fn running_cluster(nodes: usize) -> (Cluster, Vec<String>, usize, usize) {
    let mut config = Config::default();
    config.limits.max_pending_per_user = 1_000_000;
    let mut c = Cluster::new(config);
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i:04}")).collect();
    for (k, n) in names.iter().enumerate() {
        let nonce = format!("nonce-{k}").into_bytes();
        c.leader().challenge(n, nonce.clone(), T0);
        let req = gpuctl_core::event::Register {
            node: n.clone(),
            gpus: (0..8)
                .map(|i| gpuctl_core::node::Gpu {
                    index: i,
                    uuid: format!("GPU-{n}-{i}"),
                    model: "A100-80GB".into(),
                    memory_mib: 81920,
                    ..Default::default()
                })
                .collect(),
            cpus: 256,
            memory_bytes: 2 << 40,
            gpu_backend: "fake".into(),
            nonce,
            agent_id: format!("agent-{n}"),
            ..Default::default()
        };
        c.attach(&req, None, T0).expect("attach");
    }
    let actor = Actor {
        user: "alice".into(),
        admin: false,
    };
    let spec = |gpu: GpuPart| JobSpec {
        user: "alice".into(),
        name: "j".into(),
        command: vec!["true".into()],
        workdir: "/tmp".into(),
        resources: Resources {
            gpu: Some(gpu),
            cpus: 1,
            time_limit_secs: 3600,
            ..Default::default()
        },
        ..Default::default()
    };
    let whole = nodes / 2 * 8;
    let shares = (nodes - nodes / 2) * 8 * 4;
    let jobs = (0..whole)
        .map(|_| GpuPart::Gpus(1))
        .chain((0..shares).map(|_| {
            GpuPart::Share(GpuShare {
                compute_milli: 250,
                memory_mib: None,
            })
        }));
    for gpu in jobs {
        match c.admit(&actor, spec(gpu), "", T0).expect("admitted") {
            Admission::New(s) => {
                c.commit_submit(*s);
            }
            _ => unreachable!(),
        }
    }
    let (view, queue, cfg) = c.pass_input(T0);
    let plan = gpuctl_sched::schedule(&view, &queue, &cfg, T0);
    c.apply_plan(&plan, T0);
    (c, names, whole, shares)
}

fn main() {
    let nodes: usize = std::env::args().nth(1).map_or(1000, |s| s.parse().unwrap());
    let seconds: i64 = std::env::args().nth(2).map_or(30, |s| s.parse().unwrap());
    let (mut c, names, whole, shares) = running_cluster(nodes);
    // What each node runs, as its agent would say.
    let mut running: std::collections::HashMap<String, Vec<gpuctl_core::event::Running>> =
        Default::default();
    let mut on_gpu: std::collections::HashMap<String, Vec<u64>> = Default::default();
    for s in c.jobs().active() {
        let j = &s.job;
        for a in &j.allocations {
            running
                .entry(a.node.clone())
                .or_default()
                .push(gpuctl_core::event::Running {
                    job_id: j.id,
                    attempt: j.attempt,
                    ..Default::default()
                });
            for sl in &a.slots {
                on_gpu.entry(sl.uuid.clone()).or_default().push(j.id);
            }
        }
    }
    let started: usize = running.values().map(Vec::len).sum();
    println!(
        "{nodes} nodes x 8 GPUs, {started} running jobs ({whole} whole GPUs, {shares} quarter shares)"
    );
    let heartbeat = |n: &str, t: i64| gpuctl_core::event::Heartbeat {
        node: n.to_string(),
        running: running.get(n).cloned().unwrap_or_default(),
        metrics: (0..8)
            .map(|i| {
                let uuid = format!("GPU-{n}-{i}");
                gpuctl_core::node::GpuMetrics {
                    jobs: on_gpu
                        .get(&uuid)
                        .map(|js| {
                            js.iter()
                                .map(|&job_id| gpuctl_core::node::JobGpuUse {
                                    job_id,
                                    mem_used_mib: 4000 + (t as u64 / 1000 % 100),
                                    processes: 1,
                                    util_pct: None,
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    uuid,
                    util_pct: (t / 1000 % 100) as u32,
                    power_w: 300.0,
                    time_ms: t,
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    };
    let (mut all_ms, mut bare_ms) = (Vec::new(), Vec::new());
    for s in 1..=seconds {
        let t = T0 + s * 1000;
        let reqs: Vec<_> = names.iter().map(|n| heartbeat(n, t)).collect();
        let start = Instant::now();
        for r in &reqs {
            c.heartbeat(r, t);
        }
        all_ms.push(start.elapsed().as_secs_f64() * 1e3);
        // The same heartbeats without samples: what is left is the folding.
        let reqs: Vec<_> = (names.iter())
            .map(|n| gpuctl_core::event::Heartbeat {
                metrics: Vec::new(),
                ..heartbeat(n, t + 500)
            })
            .collect();
        let start = Instant::now();
        for r in &reqs {
            c.heartbeat(r, t + 500);
        }
        bare_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let slots: usize = c.live_usage().values().map(|u| u.slots.len()).sum();
    let bytes: usize = c
        .live_usage()
        .values()
        .map(|u| {
            std::mem::size_of::<JobUsage>()
                + 16
                + u.slots
                    .iter()
                    .map(|s| {
                        std::mem::size_of::<SlotUsage>() + s.node.capacity() + s.uuid.capacity()
                    })
                    .sum::<usize>()
        })
        .sum();
    let (all, bare) = (median(&mut all_ms), median(&mut bare_ms));
    println!(
        "per second of heartbeats: heartbeat() median {all:.1} ms, without samples {bare:.1} ms: folding usage about {:.1} ms (CPU of one core: {:.1}% and {:.1}%)",
        all - bare,
        all / 10.0,
        (all - bare) / 10.0
    );
    println!(
        "live usage: {} jobs, {slots} slots, about {:.1} MiB ({} bytes per job)",
        c.live_usage().len(),
        bytes as f64 / (1 << 20) as f64,
        bytes / c.live_usage().len().max(1)
    );
}
