//! The opportunistic class in the simulator, end to end through the controller's own
//! state machine: heartbeats of GPU use from the simulated agents, the lend pass, and
//! the interference model's rates (work conserved), on a hand-computed case.

use std::collections::HashMap;

use gpuctl_core::Config;
use gpuctl_sched::packing::Policy;
use gpuctl_sched::{GpuRequest, Request};
use gpuctl_sim::replay::agents::{Profile, Usage};
use gpuctl_sim::replay::{self, TraceJob, parse_cluster};

const S: i64 = 1000;

fn jobs() -> Vec<TraceJob> {
    let holder = TraceJob {
        id: 1,
        submit: 0,
        duration: 7200 * S,
        time_limit: 20_000 * S,
        request: Request::whole(1),
        gpu_milli: 1000,
        account: "training".into(),
        user: "training".into(),
        ..TraceJob::default()
    };
    let borrower = TraceJob {
        id: 2,
        submit: 10 * S,
        duration: 3600 * S,
        time_limit: 20_000 * S,
        request: Request {
            gpu: GpuRequest::Share {
                compute_milli: Some(500),
                memory_mib: Some(8192),
            },
            ..Request::default()
        },
        gpu_milli: 500,
        account: "research".into(),
        user: "research".into(),
        requeue: true,
        signal: "USR1@60".into(),
        opportunistic: true,
        ..TraceJob::default()
    };
    vec![holder, borrower]
}

fn usage(heartbeats: bool) -> Usage {
    let profiles: HashMap<u64, Profile> = [
        // Training 40% busy of its whole GPU, 30 GiB of its memory.
        (
            1,
            Profile {
                phases: vec![(7200 * S, 0.4)],
                memory_mib: 30 * 1024,
            },
        ),
        // The borrower alone would keep its half share fully busy (half the GPU).
        (
            2,
            Profile {
                phases: vec![(3600 * S, 1.0)],
                memory_mib: 8192,
            },
        ),
    ]
    .into();
    Usage {
        profiles,
        priority: true,
        heartbeat_ms: heartbeats.then_some(30 * S),
        mig_dynamic: false,
        full_pass: false,
    }
}

#[test]
fn a_borrower_runs_in_the_holders_idle_and_slows_it_as_modelled() {
    let nodes = parse_cluster("1x1xA100-80GB").unwrap();
    let base = Config::default();
    let jobs = jobs();
    let config = replay::config_for("backfill", Policy::BestFit, None, &jobs, &base).unwrap();
    let out = replay::replay_with(&nodes, &jobs, &config, &base, "backfill", 0, usage(true));
    let run = |trace: u64| {
        let r: Vec<_> = out.runs.iter().filter(|r| r.trace_id == trace).collect();
        assert_eq!(r.len(), 1, "{:?}", out.runs);
        r[0].clone()
    };
    let (h, b) = (run(1), run(2));
    assert!(h.completed && b.completed);
    assert!(b.opportunistic && !h.opportunistic);
    assert_eq!(b.slots[0].0, h.slots[0].0);
    // Lent after the holder was measured for `measure` (5 min), at a heartbeat.
    assert!(
        (300 * S..=331 * S).contains(&b.start),
        "borrower started at {} ms",
        b.start
    );
    // The holder leaves 60% idle; the borrower fills 80% of it (0.48 of the GPU) of
    // the 0.5 it wants: rate 0.96, so its hour of work takes 3750 s.
    let b_wall = (b.end - b.start) as f64 / 1000.0;
    assert!((b_wall - 3750.0).abs() < 2.0, "borrower ran {b_wall} s");
    assert_eq!(b.work_ms, 3600 * S);
    // Filling all it may, it slows the holder by 7.2% while they share: over those
    // 3750 s the holder does 3750 / 1.072 s of work, and its 2 h take the rest longer.
    let h_wall = (h.end - h.start) as f64 / 1000.0;
    let expected = 7200.0 + 3750.0 - 3750.0 / 1.072;
    assert!(
        (h_wall - expected).abs() < 3.0,
        "holder ran {h_wall} s, not {expected}"
    );
    assert_eq!(h.work_ms, 7200 * S);
    // What it kept busy: its 0.4 of the GPU as it went, slowed.
    let hb = h.busy.unwrap();
    assert!((hb - 0.4 * 7200.0 / h_wall).abs() < 1e-3, "{hb}");
}

#[test]
fn without_heartbeats_nothing_is_lent_and_the_borrower_waits() {
    let nodes = parse_cluster("1x2xA100-80GB").unwrap();
    let base = Config::default();
    let jobs = jobs();
    let config = replay::config_for("backfill", Policy::BestFit, None, &jobs, &base).unwrap();
    let out = replay::replay_with(&nodes, &jobs, &config, &base, "backfill", 0, usage(false));
    assert!(out.runs.iter().all(|r| !r.opportunistic), "{:?}", out.runs);
    let h = &out.runs[0];
    // Alone, the holder runs its two hours exactly.
    assert_eq!(h.end - h.start, 7200 * S);
}

#[test]
fn a_free_gpu_is_lent_after_a_minute_and_a_guaranteed_job_takes_it_back_after_the_yield() {
    // One GPU. The borrower arrives first and nobody holds the GPU; at 1000 s a
    // guaranteed job asks for the whole GPU.
    let nodes = parse_cluster("1x1xA100-80GB").unwrap();
    let base = Config::default();
    let mut jobs = jobs();
    jobs[0].submit = 1000 * S;
    jobs[1].submit = 0;
    jobs.sort_by_key(|j| j.submit);
    let config = replay::config_for("backfill", Policy::BestFit, None, &jobs, &base).unwrap();
    let out = replay::replay_with(&nodes, &jobs, &config, &base, "backfill", 0, usage(true));
    let runs = |trace: u64| -> Vec<_> {
        out.runs
            .iter()
            .filter(|r| r.trace_id == trace)
            .cloned()
            .collect()
    };
    let (b, h) = (runs(2), runs(1));
    // Lent once free for `free_after` (1 min), at a heartbeat.
    assert!((60 * S..=91 * S).contains(&b[0].start), "{:?}", b[0]);
    // The guaranteed job waits for the borrower to yield: its signal's lead (60 s)
    // and no more; the borrower is not lent the GPU again in between.
    assert!(!b[0].completed);
    assert!((b[0].end - 1000 * S - 60 * S).abs() <= 1000, "{:?}", b[0]);
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].start, b[0].end, "{:?}", h[0]);
    assert!(h[0].completed);
    // It saved its work at the signal and finishes it after the holder, beside it or
    // once it is gone; nothing it did is done twice.
    let last = b.last().unwrap();
    assert!(last.completed, "{b:?}");
    let done: i64 = b
        .iter()
        .map(|r| if r.completed { r.work_ms } else { r.saved_ms })
        .sum();
    assert!(
        (done - 3600 * S).abs() <= 2000,
        "{done} ms of work in {b:?}"
    );
}
