//! XID errors on the state machine: a hardware XID drains the node and requeues the job
//! on that GPU (only that GPU's), once; a job-caused XID warns the job; an admin's drain
//! reason is kept.

mod common;

use common::*;
use gpuctl_core::Cluster;
use gpuctl_proto::{self as pb, JobState};

/// A heartbeat from n1 running `jobs`, with `xids` as (GPU index, XID, when).
fn beat(c: &mut Cluster, jobs: &[u64], xids: &[(u32, u32, i64)], now: i64) -> gpuctl_core::Effects {
    let running = jobs
        .iter()
        .map(|&id| pb::RunningJob {
            job_id: id,
            attempt: c.jobs.job(id).unwrap().attempt,
            ..Default::default()
        })
        .collect();
    let metrics = (0..2)
        .map(|i| {
            let x = xids.iter().find(|x| x.0 == i);
            pb::GpuMetrics {
                uuid: format!("GPU-n1-{i}"),
                temp_c: 50,
                last_xid: x.map(|x| x.1),
                last_xid_ms: x.map_or(0, |x| x.2),
                time_ms: now,
                ..Default::default()
            }
        })
        .collect();
    let req = pb::HeartbeatRequest {
        node: "n1".into(),
        running,
        metrics,
        ..Default::default()
    };
    c.heartbeat(&req, now).1
}

fn gpu_of(c: &Cluster, id: u64) -> u32 {
    let uuid = &c.jobs.job(id).unwrap().allocations[0].slots[0].uuid;
    uuid.rsplit('-').next().unwrap().parse().unwrap()
}

#[test]
fn a_hardware_xid_drains_the_node_and_requeues_the_job_on_that_gpu_once() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let requeueable = submit(&mut c, 1, true, T0);
    let other = submit(&mut c, 1, false, T0);
    pass(&mut c, T0);
    for id in [requeueable, other] {
        report(&mut c, "n1", id, None, T0);
        assert_eq!(state(&c, id), JobState::Running);
    }
    let broken = gpu_of(&c, requeueable);
    let effects = beat(
        &mut c,
        &[requeueable, other],
        &[(broken, 79, T0 + 500)],
        T0 + 1000,
    );
    assert_eq!(
        commands(&effects),
        vec![to("n1", &format!("kill {requeueable}"))]
    );
    let reason = c.nodes["n1"].drain_reason.clone().unwrap();
    assert!(
        reason.contains("XID 79 (GPU has fallen off the bus)"),
        "{reason}"
    );
    assert!(reason.starts_with("health (hardware)"), "{reason}");
    assert!(
        c.jobs
            .get(requeueable)
            .unwrap()
            .requeue_requested
            .contains("XID 79")
    );
    assert!(c.jobs.get(other).unwrap().requeue_requested.is_empty());
    // The same XID again (the agent keeps reporting its latest): nothing more.
    let again = beat(
        &mut c,
        &[requeueable, other],
        &[(broken, 79, T0 + 500)],
        T0 + 2000,
    );
    assert!(commands(&again).is_empty());
    // A job-caused XID on the other job's GPU, later: a warning, the reason kept.
    let fine = gpu_of(&c, other);
    beat(
        &mut c,
        &[requeueable, other],
        &[(broken, 79, T0 + 500), (fine, 13, T0 + 2500)],
        T0 + 3000,
    );
    let w = &c.jobs.job(other).unwrap().warnings;
    assert!(
        w.iter()
            .any(|w| w.contains("XID 13 (graphics engine exception)")),
        "{w:?}"
    );
    assert_eq!(c.nodes["n1"].drain_reason.as_deref(), Some(reason.as_str()));
}

#[test]
fn a_job_that_may_not_requeue_ends_failed_with_the_xid() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let id = submit(&mut c, 1, false, T0);
    pass(&mut c, T0);
    report(&mut c, "n1", id, None, T0);
    let gpu = gpu_of(&c, id);
    let effects = beat(&mut c, &[id], &[(gpu, 48, T0 + 10)], T0 + 1000);
    let kill = effects
        .sends
        .iter()
        .find_map(|(_, cmd)| match cmd.command.as_ref() {
            Some(pb::agent_command::Command::Kill(k)) => Some(k.clone()),
            _ => None,
        });
    let kill = kill.expect("a kill");
    assert_eq!(kill.as_state, JobState::Failed as i32);
    assert!(
        kill.reason.contains("XID 48 (double-bit ECC error)"),
        "{}",
        kill.reason
    );
}
