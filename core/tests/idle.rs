//! The `[idle]` policy and usage on the state machine: samples from heartbeats, the
//! warn and requeue actions, a busy sample starting a new stretch, and the usage settled
//! into the record when the run ends (with the host figures of the end report).

mod common;

use gpuctl_core::operations::Operations as _;
use std::time::Duration;

use common::*;
use gpuctl_core::idle::{IdleAction, IdlePolicy};
use gpuctl_core::record::{JobState, Step};
use gpuctl_core::{Cluster, Config};

fn cluster_with(action: IdleAction) -> Cluster {
    let config = Config {
        idle: IdlePolicy {
            after: Some(Duration::from_secs(600)),
            util_below: 5.0,
            action,
            ..IdlePolicy::default()
        },
        ..Config::default()
    };
    Cluster::new(config)
}

/// A heartbeat from n1 running `id`, with its GPU 0 at `util`% at `now`.
fn beat(c: &mut Cluster, id: u64, util: u32, now: i64) -> gpuctl_core::Effects {
    let attempt = c.jobs().job(id).unwrap().attempt;
    let req = gpuctl_core::event::Heartbeat {
        node: "n1".into(),
        running: vec![gpuctl_core::event::Running {
            job_id: id,
            attempt,
            ..Default::default()
        }],
        metrics: vec![gpuctl_core::node::GpuMetrics {
            uuid: "GPU-n1-0".into(),
            util_pct: util,
            power_w: 100.0,
            time_ms: now,
            jobs: vec![gpuctl_core::node::JobGpuUse {
                job_id: id,
                mem_used_mib: 2048,
                processes: 1,
                util_pct: None,
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    c.heartbeat(&req, now).1
}

fn running_job(c: &mut Cluster) -> u64 {
    attach(c, "n1", T0);
    let id = submit(c, 1, false, T0);
    pass(c, T0);
    report(c, "n1", id, None, T0);
    assert_eq!(state(c, id), JobState::Running);
    id
}

const MIN: i64 = 60_000;

#[test]
fn an_idle_job_is_warned_once_per_stretch() {
    let mut c = cluster_with(IdleAction::Warn);
    let id = running_job(&mut c);
    for m in 1..=9 {
        beat(&mut c, id, 1, T0 + m * MIN);
    }
    assert!(c.jobs().job(id).unwrap().warnings.is_empty());
    // Ten minutes idle: warned.
    beat(&mut c, id, 1, T0 + 10 * MIN);
    let j = c.jobs().job(id).unwrap();
    assert!(
        j.reason.starts_with("idle: its GPUs were under 5% for 10m"),
        "{}",
        j.reason
    );
    assert_eq!(j.warnings.len(), 1);
    // Once per stretch.
    beat(&mut c, id, 1, T0 + 11 * MIN);
    assert_eq!(c.jobs().job(id).unwrap().warnings.len(), 1);
    // Busy again, then idle for ten more minutes: a second warning.
    beat(&mut c, id, 50, T0 + 12 * MIN);
    beat(&mut c, id, 0, T0 + 21 * MIN);
    assert_eq!(c.jobs().job(id).unwrap().warnings.len(), 1);
    beat(&mut c, id, 0, T0 + 22 * MIN);
    assert_eq!(c.jobs().job(id).unwrap().warnings.len(), 2);
    assert_eq!(state(&c, id), JobState::Running);
}

#[test]
fn an_idle_job_is_requeued_and_its_usage_kept() {
    let mut c = cluster_with(IdleAction::Requeue);
    let id = running_job(&mut c);
    let mut kills = Vec::new();
    for m in 1..=10 {
        kills.extend(commands(&beat(&mut c, id, 2, T0 + m * MIN)));
    }
    assert_eq!(kills, vec![to("n1", &format!("kill {id}"))]);
    assert!(c.jobs().get(id).unwrap().requeue_requested.contains("idle"));
    // Live usage: 10 samples at 2%, 2 GiB.
    let live = c.usage_of(c.jobs().job(id).unwrap()).unwrap();
    assert_eq!(live.slots[0].samples, 10);
    assert_eq!(live.slots[0].util_sum, 20.0);
    // The agent ends it with its cgroup's figures: back to the queue, usage kept.
    let attempt = c.jobs().job(id).unwrap().attempt;
    let end = gpuctl_core::event::Report {
        state: gpuctl_sched::job::JobState::Cancelled,
        time_ms: T0 + 11 * MIN,
        cpu_time_ms: Some(30_000),
        mem_peak_bytes: Some(1 << 30),
        ..gpuctl_core::event::Report::new("n1", id, attempt, gpuctl_core::event::ReportKind::Ended)
    };
    c.report(&end, T0 + 11 * MIN);
    let j = c.jobs().job(id).unwrap();
    assert_eq!(j.state, JobState::Pending);
    assert!(j.reason.contains("idle"), "{}", j.reason);
    let u = j.usage.as_ref().expect("the run's usage in the record");
    assert_eq!(u.slots[0].samples, 10);
    assert_eq!(u.slots[0].mem_peak_mib, 2048);
    // Nine gaps of a minute at 100 W.
    assert_eq!(u.slots[0].energy_j, 9.0 * 60.0 * 100.0);
    assert_eq!(
        (u.cpu_time_ms, u.host_mem_peak_bytes, u.host_reports),
        (30_000, 1 << 30, 1)
    );
    assert!(c.live_usage().is_empty());
}

#[test]
fn running_ranks_host_figures_show_live_and_count_when_the_node_fails() {
    let mut c = cluster_with(IdleAction::Warn);
    configure(&mut c, |cfg| cfg.idle.after = None);
    let id = running_job(&mut c);
    let attempt = c.jobs().job(id).unwrap().attempt;
    let req = gpuctl_core::event::Heartbeat {
        node: "n1".into(),
        running: vec![gpuctl_core::event::Running {
            job_id: id,
            attempt,
            cpu_time_ms: Some(90_000),
            mem_peak_bytes: Some(3 << 30),
            steps: vec![Step {
                id: 0,
                name: "python train.py".into(),
                start_ms: T0 + 1_000,
                tasks: 2,
                ..Default::default()
            }],
        }],
        ..Default::default()
    };
    c.heartbeat(&req, T0 + MIN);
    // Its step running now, from the heartbeat (memory only: not in the record).
    let steps = c.steps_of(c.jobs().job(id).unwrap());
    assert_eq!((steps.len(), steps[0].tasks), (1, 2));
    assert_eq!(steps[0].nodes, ["n1"]);
    assert!(c.jobs().job(id).unwrap().steps.is_empty());
    let live = c.usage_of(c.jobs().job(id).unwrap()).unwrap();
    assert_eq!(
        (
            live.cpu_time_ms,
            live.host_mem_peak_bytes,
            live.host_reports
        ),
        (90_000, 3 << 30, 1)
    );
    // A later heartbeat replaces the figures (they are totals so far).
    let mut later = req.clone();
    later.running[0].cpu_time_ms = Some(120_000);
    c.heartbeat(&later, T0 + 2 * MIN);
    assert_eq!(
        c.usage_of(c.jobs().job(id).unwrap()).unwrap().cpu_time_ms,
        120_000
    );
    // The node goes silent: the job ends NODE_FAIL with the last figures kept, and no
    // step runs any more.
    c.check_nodes(T0 + 10 * MIN);
    let j = c.jobs().job(id).unwrap();
    assert_eq!(j.state, JobState::NodeFail);
    assert!(c.steps_of(j).is_empty() && !c.has_live_steps(id));
    let u = j.usage.as_ref().expect("settled");
    assert_eq!(
        (u.cpu_time_ms, u.host_mem_peak_bytes, u.host_reports),
        (120_000, 3 << 30, 1)
    );
    assert!(c.live_host().is_empty() && c.live_usage().is_empty());
}
