//! A replay's log applied to fresh replicas ends them in the replay's own state: the
//! property replicated controllers rest on (issue 40), over thousands of entries of a
//! real workload's shape (fractional shares, whole GPUs, gangs, ends and requeues), not
//! only the hand-made histories of `core/tests/replicas.rs`.

use gpuctl_core::log::{Change, Entry};
use gpuctl_core::{Cluster, Config};
use gpuctl_sched::packing::Policy;
use gpuctl_sched::{GpuRequest, Request};
use gpuctl_sim::replay::{self, TraceJob, parse_cluster};

/// Everything the state holds that a user or the store could see, in a fixed order.
fn digest(c: &Cluster) -> String {
    let mut jobs: Vec<String> = c.jobs().all().map(|s| format!("{s:?}")).collect();
    jobs.sort();
    let nodes: Vec<String> = (c.fleet().nodes().values())
        .map(|n| format!("{n:?}"))
        .collect();
    format!(
        "next {}\njobs {jobs:?}\nnodes {nodes:?}\nlisting {:?}\nusage {:?}",
        c.next_job_id(),
        c.list_nodes(&[]),
        c.fair_usage()
    )
}

/// `n` jobs of a seeded mix: a third fractional shares, some gangs over two nodes,
/// the rest whole GPUs; limits 1-3x their runs, arrivals bunched so that a queue forms.
fn workload(n: u64, seed: u64) -> Vec<TraceJob> {
    let mut x = seed;
    let mut next = move |m: u64| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) % m
    };
    let mut t = 0;
    (1..=n)
        .map(|id| {
            t += next(40) * 1000;
            let duration = (60 + next(3600)) as i64 * 1000;
            let (gpu, nodes, gpu_milli) = match next(9) {
                0..=2 => {
                    let m = 100 + next(800) as u32;
                    let gpu = GpuRequest::Share {
                        compute_milli: Some(m),
                        memory_mib: None,
                    };
                    (gpu, 1, u64::from(m))
                }
                3 => (GpuRequest::Whole { count: 4 }, 2, 8000),
                _ => {
                    let count = 1 + next(4) as u32;
                    (GpuRequest::Whole { count }, 1, u64::from(count) * 1000)
                }
            };
            TraceJob {
                id,
                submit: t as i64,
                duration,
                time_limit: duration * (1 + next(3) as i64),
                priority: next(3) as i32,
                request: Request {
                    gpu,
                    nodes,
                    cpu_milli: 1000,
                    ..Request::default()
                },
                gpu_milli,
                user: format!("u{}", next(4)),
                account: format!("a{}", next(2)),
                ..TraceJob::default()
            }
        })
        .collect()
}

/// Replays `jobs`, keeping its log and the state after every `EVERY`th entry and the
/// last; two fresh replicas apply the log and must pass through the same states.
fn replicas_follow_the_replay(jobs: &[TraceJob], cluster: &str, policy: &str) {
    const EVERY: usize = 97;
    let nodes = parse_cluster(cluster).unwrap();
    let base = Config::default();
    let config = replay::config_for(policy, Policy::Fgd, None, jobs, &base).unwrap();
    let mut log: Vec<Entry> = Vec::new();
    let mut states: Vec<(usize, String)> = Vec::new();
    // A snapshot midway (the replay's length is not known before: at entry 1,000).
    const SNAPSHOT_AT: usize = 1_000;
    let mut snapshot = None;
    let mut observe = |e: &Entry, c: &Cluster| {
        log.push(e.clone());
        if log.len().is_multiple_of(EVERY) {
            states.push((log.len(), digest(c)));
        }
        if log.len() == SNAPSHOT_AT {
            snapshot = Some((c.records(), e.at));
        }
    };
    let (out, end) = replay::replay_observed(
        &nodes,
        jobs,
        &config,
        &base,
        policy,
        1_700_000_000_000,
        Some(&mut observe),
    );
    states.push((log.len(), digest(&end)));
    let started = |e: &Entry| matches!(&e.change, Change::Starts(s) if !s.is_empty());
    let waited = |e: &Entry| matches!(&e.change, Change::Waiting(w) if !w.is_empty());
    assert!(
        out.summary.jobs > 0 && out.summary.wait_mean_s > 0.0,
        "no queue formed"
    );
    assert!(
        log.iter().filter(|e| started(e)).count() > 10,
        "few passes started jobs"
    );
    assert!(log.iter().any(waited), "no job ever waited");
    let replica = || {
        let mut c = replay::empty(&config, &base);
        let mut seen = Vec::new();
        let mut at = states.iter().peekable();
        for (i, e) in log.iter().enumerate() {
            let _ = c.apply(e.clone());
            if at.next_if(|(n, _)| *n == i + 1).is_some() {
                seen.push((i + 1, digest(&c)));
            }
        }
        c.check().expect("a replica's invariants hold");
        seen
    };
    let (a, b) = (replica(), replica());
    assert_eq!(a.len(), states.len());
    for ((n, mine), (_, theirs)) in a.iter().zip(&states) {
        assert_eq!(
            mine, theirs,
            "a replica differs from the replay after {n} entries"
        );
    }
    assert_eq!(a, b, "two replicas of one log differ");
    // A replica that joins late: the snapshot, then the rest of the log.
    let (records, at) = snapshot.expect("the replay logged 1,000 entries");
    let replay_config = replay::empty(&config, &base).config().clone();
    let restored = gpuctl_core::restore::restore(replay_config, records, at).cluster;
    let mut late = restored.planning_with(config.clone());
    for e in &log[SNAPSHOT_AT..] {
        let _ = late.apply(e.clone());
    }
    late.check().expect("a late replica's invariants hold");
    let end = &states.last().expect("the end's state").1;
    assert!(
        &digest(&late) == end,
        "a replica from a snapshot differs from the replay"
    );
}

#[test]
fn replicas_of_a_replay_end_like_it() {
    for seed in [1, 2] {
        replicas_follow_the_replay(&workload(400, seed), "4x8xA100-80GB", "backfill");
    }
    replicas_follow_the_replay(&workload(300, 3), "2x8xA100-80GB", "priority");
}

/// The same on the first 1,500 jobs of the Alibaba trace (the replay orders jobs by
/// submit time; an extract of the earliest pods is carried in the repository:
/// sim/data/SOURCE.md).
#[test]
fn replicas_of_an_alibaba_replay_end_like_it() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/openb_pod_list_gpushare40.earliest1600.csv");
    let mut jobs = replay::read_jobs(&path, 20.0, 2.0, 8).unwrap();
    assert!(jobs.len() >= 1500, "{} jobs in the extract", jobs.len());
    jobs.truncate(1500);
    replicas_follow_the_replay(&jobs, "8x8xG2-32GB", "backfill");
}
