//! XID errors on the state machine: a hardware XID drains the node and requeues the job
//! on that GPU (only that GPU's), once; a job-caused XID warns the job; an admin's drain
//! reason is kept.

mod common;

use common::*;
use gpuctl_core::Cluster;
use gpuctl_core::operations::Operations as _;
use gpuctl_core::record::JobState;

/// A heartbeat from n1 running `jobs`, with `xids` as (GPU index, XID, when).
fn beat(c: &mut Cluster, jobs: &[u64], xids: &[(u32, u32, i64)], now: i64) -> gpuctl_core::Effects {
    let running = jobs
        .iter()
        .map(|&id| gpuctl_core::event::Running {
            job_id: id,
            attempt: c.jobs().job(id).unwrap().attempt,
            ..Default::default()
        })
        .collect();
    let metrics = (0..2)
        .map(|i| {
            let x = xids.iter().find(|x| x.0 == i);
            gpuctl_core::node::GpuMetrics {
                uuid: format!("GPU-n1-{i}"),
                temp_c: 50,
                last_xid: x.map(|x| x.1),
                last_xid_ms: x.map_or(0, |x| x.2),
                time_ms: now,
                ..Default::default()
            }
        })
        .collect();
    let req = gpuctl_core::event::Heartbeat {
        node: "n1".into(),
        running,
        metrics,
        ..Default::default()
    };
    c.heartbeat(&req, now).1
}

fn gpu_of(c: &Cluster, id: u64) -> u32 {
    let uuid = &c.jobs().job(id).unwrap().allocations[0].slots[0].uuid;
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
    let reason = c.fleet().nodes()["n1"].drain_reason.clone().unwrap();
    assert!(
        reason.contains("XID 79 (GPU has fallen off the bus)"),
        "{reason}"
    );
    assert!(reason.starts_with("health (hardware)"), "{reason}");
    assert!(
        c.jobs()
            .get(requeueable)
            .unwrap()
            .requeue_requested
            .contains("XID 79")
    );
    assert!(c.jobs().get(other).unwrap().requeue_requested.is_empty());
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
    let w = &c.jobs().job(other).unwrap().warnings;
    assert!(
        w.iter()
            .any(|w| w.contains("XID 13 (graphics engine exception)")),
        "{w:?}"
    );
    assert_eq!(
        c.fleet().nodes()["n1"].drain_reason.as_deref(),
        Some(reason.as_str())
    );
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
    let kill = effects.sends.iter().find_map(|(_, cmd)| match cmd {
        gpuctl_core::command::Command::Kill(k) => Some(k.clone()),
        _ => None,
    });
    let kill = kill.expect("a kill");
    assert_eq!(kill.as_state, gpuctl_sched::job::JobState::Failed);
    assert!(
        kill.reason.contains("XID 48 (double-bit ECC error)"),
        "{}",
        kill.reason
    );
}

/// A heartbeat of two GPUs with the given metrics and the health program's complaint.
fn beat_with(c: &mut Cluster, gpus: [gpuctl_core::node::GpuMetrics; 2], site: &str, now: i64) {
    let req = gpuctl_core::event::Heartbeat {
        node: "n1".into(),
        metrics: gpus
            .into_iter()
            .enumerate()
            .map(|(i, m)| gpuctl_core::node::GpuMetrics {
                uuid: format!("GPU-n1-{i}"),
                time_ms: now,
                ..m
            })
            .collect(),
        health_error: site.into(),
        ..Default::default()
    };
    c.heartbeat(&req, now);
}

fn drain(c: &Cluster) -> Option<String> {
    c.fleet().nodes()["n1"].drain_reason.clone()
}

fn gpu(temp_c: u32, power_w: f64) -> gpuctl_core::node::GpuMetrics {
    gpuctl_core::node::GpuMetrics {
        temp_c,
        power_w,
        ecc_uncorrected: Some(0),
        ..Default::default()
    }
}

#[test]
fn each_health_condition_drains_with_its_reason_and_lifts_when_clear() {
    let mut c = cluster();
    configure(&mut c, |cfg| cfg.health.max_gpu_power_w = 400);
    attach(&mut c, "n1", T0);
    let ok = || [gpu(50, 200.0), gpu(50, 200.0)];
    beat_with(&mut c, ok(), "", T0);
    assert_eq!(drain(&c), None);

    // Power over the limit; lifted only at or below 95% of it.
    beat_with(&mut c, [gpu(50, 420.0), gpu(50, 200.0)], "", T0 + 1);
    let why = drain(&c).unwrap();
    assert!(
        why.starts_with(
            "health (hardware): GPU GPU-n1-0 drawing 420 W, over health.max_gpu_power_w 400 W"
        ),
        "{why}"
    );
    beat_with(&mut c, [gpu(50, 390.0), gpu(50, 200.0)], "", T0 + 2);
    assert!(drain(&c).is_some(), "390 W is within the hysteresis");
    beat_with(&mut c, ok(), "", T0 + 3);
    assert_eq!(drain(&c), None);

    // Uncorrectable ECC errors; and a second problem adds to the reason.
    let mut ecc = gpu(50, 200.0);
    ecc.ecc_uncorrected = Some(2);
    beat_with(&mut c, [gpu(50, 200.0), ecc.clone()], "", T0 + 4);
    assert_eq!(
        drain(&c).unwrap(),
        "health (hardware): GPU GPU-n1-1 has 2 uncorrectable ECC error(s)"
    );
    beat_with(&mut c, [gpu(50, 200.0), ecc], "ib0 link down", T0 + 5);
    assert_eq!(
        drain(&c).unwrap(),
        "health (hardware): GPU GPU-n1-1 has 2 uncorrectable ECC error(s); health (site check): ib0 link down"
    );
    beat_with(&mut c, ok(), "ib0 link down", T0 + 6);
    assert!(drain(&c).is_some(), "the site check still fails");
    beat_with(&mut c, ok(), "", T0 + 7);
    assert_eq!(drain(&c), None);

    // A failed row remapping.
    let mut remap = gpu(50, 200.0);
    remap.row_remap_failure = true;
    beat_with(&mut c, [remap, gpu(50, 200.0)], "", T0 + 8);
    assert!(drain(&c).unwrap().contains("failed to remap a memory row"));
    beat_with(&mut c, ok(), "", T0 + 9);
    assert_eq!(drain(&c), None);

    // An admin's drain is never lifted nor reworded by the checks.
    c.set_drain("n1", Some("fan swap".into())).unwrap();
    beat_with(&mut c, ok(), "disk full", T0 + 10);
    beat_with(&mut c, ok(), "", T0 + 11);
    assert_eq!(drain(&c).unwrap(), "fan swap");
}

#[test]
fn the_checks_that_are_off_do_not_drain() {
    let mut c = cluster();
    configure(&mut c, |cfg| cfg.health.ecc_drain = false);
    configure(&mut c, |cfg| cfg.health.remap_failure_drain = false);
    configure(&mut c, |cfg| cfg.health.max_gpu_temp_c = 0);
    attach(&mut c, "n1", T0);
    let mut bad = gpu(99, 900.0);
    bad.ecc_uncorrected = Some(5);
    bad.row_remap_failure = true;
    beat_with(&mut c, [bad, gpu(50, 200.0)], "", T0 + 1);
    assert_eq!(drain(&c), None);
}
