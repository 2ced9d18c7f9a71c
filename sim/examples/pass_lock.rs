//! What a scheduling pass costs the controller's lock at scale: the parts of a pass the
//! controller runs under its lock, each a hold of its own (`pass_prepare`, the view in
//! parts,
//! `queue`, `pass_config`; `apply_plan`: placements, reasons, expected starts) next to
//! the room a GPU job has after it (`gpu_room`, outside the lock) and
//! the pass itself (which runs outside it). NODES x 8 GPUs, jobs of 1, 2, 4 and 8 GPUs until PENDING wait
//! after the cluster is full, as the scale harness (tests/benches/scale.rs) sets up.
//!
//! cargo run --release -p gpuctl-sim --example pass_lock -- [NODES] [PENDING] [PASSES]

use gpuctl_core::operations::Operations as _;
use std::time::Instant;

use gpuctl_core::ops::Admission;
use gpuctl_core::record::{GpuPart, JobSpec, Resources};
use gpuctl_core::{Actor, Cluster, Config};

const T0: i64 = 1_800_000_000_000;

/// The allocator of the daemon (see gpuctld's main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn cluster(nodes: usize, jobs: usize) -> Cluster {
    let mut config = Config::default();
    config.limits.max_pending_per_user = 10_000_000;
    let mut c = Cluster::new(config);
    for k in 0..nodes {
        let n = format!("sim{k:05}");
        let nonce = format!("nonce-{k}").into_bytes();
        c.leader().challenge(&n, nonce.clone(), T0);
        let req = gpuctl_core::event::Register {
            node: n.clone(),
            gpus: (0..8)
                .map(|i| gpuctl_core::node::Gpu {
                    index: i,
                    uuid: format!("GPU-{n}-{i}"),
                    model: "H100-80GB".into(),
                    memory_mib: 81920,
                    ..Default::default()
                })
                .collect(),
            cpus: 128,
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
    for i in 0..jobs {
        let spec = JobSpec {
            user: "alice".into(),
            name: "j".into(),
            command: vec!["python".into(), "train.py".into(), format!("--seed={i}")],
            workdir: "/tmp".into(),
            resources: Resources {
                gpu: Some(GpuPart::Gpus([1, 2, 4, 8][i % 4])),
                cpus: 8,
                time_limit_secs: 3600,
                ..Default::default()
            },
            ..Default::default()
        };
        match c.admit(&actor, spec, "", T0).expect("admitted") {
            Admission::New(s) => {
                c.commit_submit(*s);
            }
            _ => unreachable!(),
        }
    }
    c
}

fn main() {
    gpuctl_sim::alloc::tune();
    let arg = |i: usize, d: usize| std::env::args().nth(i).map_or(d, |s| s.parse().unwrap());
    let (nodes, pending, passes) = (arg(1, 10_000), arg(2, 100_000), arg(3, 5));
    let capacity = nodes * 8 * 4 / 15;
    let t = Instant::now();
    let mut c = cluster(nodes, pending + capacity);
    println!(
        "{nodes} nodes x 8 GPUs, {} jobs submitted in {:.1} s",
        pending + capacity,
        t.elapsed().as_secs_f64()
    );
    let mut base = gpuctl_sched::Base::default();
    // The daemon's way: every node read, then the claims of the jobs changed since the
    // last pass's read (`Jobs::touched_since`), onto a base of its own.
    let mut touched_base = gpuctl_sched::Base::default();
    let mut cursor: Option<gpuctl_core::jobs::JobsCursor> = None;
    for k in 0..passes {
        let now = T0 + 1000 * (k as i64 + 1);
        // As the daemon takes it: four holds of its lock.
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let waiting = c.pass_prepare(now);
        let prepare = ms(t);
        // The view in parts, as the daemon takes it: 5,000 nodes (`NODE_PART`), then
        // 20,000 active jobs' allocations (`PART`), at a time; each a hold.
        let mut view = gpuctl_sched::ClusterView::default();
        let mut at = gpuctl_core::ViewCursor::default();
        let mut view_holds = Vec::new();
        loop {
            let t = Instant::now();
            let more = c.view_part(&mut at, &mut view, 5_000, 20_000);
            view_holds.push(ms(t));
            if !more {
                break;
            }
        }
        debug_assert_eq!(view, c.view());
        let t = Instant::now();
        let mut nodes = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let (part, next) = c.node_views_part(after.as_deref(), 5_000);
            nodes.extend(part);
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        let nodes_ms = ms(t);
        let t = Instant::now();
        let touched = cursor.and_then(|at| c.jobs().touched_since(at));
        let claims = touched.as_ref().map(|ids| c.running_of(ids));
        let touched_ms = ms(t);
        cursor = Some(c.jobs().cursor());
        let t = Instant::now();
        match (touched, claims) {
            (Some(ids), Some(claims)) => {
                let n = ids.len();
                let r = touched_base.update_touched(nodes, &ids, claims, now);
                println!(
                    "pass {k}: every node {nodes_ms:.0} ms, then {n} jobs touched since the last read, their claims {touched_ms:.1} ms; \
                     the base's update from them {:.1} ms ({r:?})",
                    ms(t)
                );
            }
            _ => {
                touched_base.update(view.clone(), now);
                println!("pass {k}: every node {nodes_ms:.0} ms; no earlier read: the whole view");
            }
        }
        assert_eq!(
            touched_base.view(),
            &view,
            "the base carried from changes alone"
        );
        let view_ms: f64 = view_holds.iter().sum();
        let view_longest = view_holds.iter().copied().fold(0.0, f64::max);
        let t = Instant::now();
        let queue = c.queue(&waiting);
        let queue_ms = ms(t);
        let t = Instant::now();
        let cfg = c.pass_config(now);
        let config_ms = ms(t);
        let n = queue.len();
        let t = Instant::now();
        let plan = gpuctl_sched::schedule(&view, &queue, &cfg, now);
        let pass = t.elapsed();
        // The same pass without expected starts: it stops reserving once no job left
        // can start now (the same starts).
        let quick_cfg = gpuctl_sched::SchedConfig {
            expected_starts: false,
            ..cfg.clone()
        };
        let t = Instant::now();
        let quick = gpuctl_sched::schedule(&view, &queue, &quick_cfg, now);
        let quick_ms = ms(t);
        assert_eq!(quick.starts, plan.starts);
        // From the base carried since the last pass (brought to this view), with and
        // without expected starts: the same plans.
        // (The daemon hands its view over; the copy is not timed.)
        let copy = view.clone();
        let t = Instant::now();
        let refresh = base.update(copy, now);
        let update_ms = ms(t);
        let b = &base;
        let t = Instant::now();
        let carried = gpuctl_sched::schedule_from(b, &queue, &cfg);
        let carried_ms = ms(t);
        let t = Instant::now();
        let carried_quick = gpuctl_sched::schedule_from(b, &queue, &quick_cfg);
        let carried_quick_ms = ms(t);
        assert_eq!(carried, plan);
        assert_eq!(carried_quick, quick);
        println!(
            "pass {k}: from the carried base (update {update_ms:.1} ms, {refresh:?}): {carried_ms:.0} ms, \
             starts only {carried_quick_ms:.0} ms; a fresh build: {:.0} ms, starts only {quick_ms:.0} ms",
            pass.as_secs_f64() * 1e3
        );
        // Applied as the daemon applies it: starts 2,000 at a time (`START_PART`), the
        // waiting jobs' reasons 20,000 at a time (`PART`), then preemption; each a hold.
        let mut holds = Vec::new();
        let mut effects = gpuctl_core::Effects::default();
        for part in plan.starts.chunks(2_000) {
            let t = Instant::now();
            let part = c.apply_starts(part, now);
            holds.push(ms(t));
            // Outside the lock in the daemon.
            effects.merge(part);
        }
        for part in gpuctl_core::log::Wait::parts_of(&plan, 20_000) {
            let t = Instant::now();
            c.annotate_waiting(&part);
            holds.push(ms(t));
        }
        let t = Instant::now();
        c.preempt(&plan, now, &mut effects);
        holds.push(ms(t));
        // Outside the lock, as the daemon computes it: the room submits are measured
        // against.
        let t = Instant::now();
        let room = gpuctl_core::policy::gpu_room(&view, &plan);
        let room_ms = ms(t);
        let _ = c.take_changes();
        println!(
            "pass {k}: holds {holds:.1?}; {n} queued, {} started; under the lock: prepare {prepare:.0} ms, view {view_ms:.0} ms in {} holds (longest {view_longest:.0} ms), \
             queue {queue_ms:.0} ms, config {config_ms:.0} ms, apply {:.0} ms in {} holds (longest {:.0} ms); \
             the pass itself {:.0} ms; after it, outside the lock, the room {room_ms:.1} ms ({room:?})",
            plan.starts.len(),
            view_holds.len(),
            holds.iter().sum::<f64>(),
            holds.len(),
            holds.iter().copied().fold(0.0, f64::max),
            pass.as_secs_f64() * 1e3
        );
    }
}
