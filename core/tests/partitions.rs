//! Partitions and the singleton dependency in the state machine: where a job may run,
//! the limits its partition sets at submit and in passes, and one-at-a-time jobs.

mod common;

use common::*;
use gpuctl_core::record::{Dependency, DependencyKind, GpuPart, JobSpec, JobState};
use gpuctl_core::{Actor, Cluster, Config, Kind};

fn config(text: &str) -> Config {
    let mut c: Config = toml::from_str(text).expect("config");
    c.resolve_qos();
    c.check_partitions().expect("partitions");
    c
}

const TWO: &str = r#"
[accounts.risk]
users = ["alice"]
[accounts.research]
users = ["bob"]
[partitions.inference]
nodes = ["inf[1-2]"]
max_time = "2h"
default_time = "30m"
allowed_accounts = ["risk"]
default_qos = "high"
[partitions.batch]
default = true
"#;

fn in_partition(p: &str) -> JobSpec {
    let mut s = spec(2, false);
    s.partition = p.into();
    s
}

fn admit_err(c: &Cluster, who: &Actor, spec: JobSpec) -> gpuctl_core::Refusal {
    c.admit(who, spec, "", T0).expect_err("refused")
}

#[test]
fn a_partition_keeps_its_jobs_on_its_nodes_and_others_anywhere() {
    let mut c = Cluster::new(config(TWO));
    attach(&mut c, "inf1", T0);
    attach(&mut c, "train1", T0);
    let admin = Actor {
        user: "alice".into(),
        admin: true,
    };
    // Two inference jobs: one fits inf1, the other must wait (train1 is not theirs).
    let mut s = in_partition("inference");
    s.resources.time_limit_secs = 0;
    let a = submit_spec_as(&mut c, &admin, s.clone(), T0);
    let b = submit_spec_as(&mut c, &admin, s, T0);
    let e = pass(&mut c, T0);
    assert_eq!(commands(&e), vec![to("inf1", &format!("start {a}"))]);
    let jb = c.jobs().job(b).unwrap();
    assert_eq!(jb.state, JobState::Pending);
    assert_eq!(jb.reason, "Resources");
    // The partition's default time and QoS were given to it.
    assert_eq!(jb.time_limit_secs, 1800);
    assert_eq!(jb.spec.qos, "high");
    // A job naming no partition goes to the default one (every node): train1.
    let d = submit(&mut c, 2, false, T0);
    let e = pass(&mut c, T0);
    assert_eq!(commands(&e), vec![to("train1", &format!("start {d}"))]);
    assert_eq!(c.jobs().job(d).unwrap().spec.partition, "batch");
}

#[test]
fn submits_are_checked_against_their_partition() {
    let mut c = Cluster::new(config(TWO));
    attach(&mut c, "inf1", T0);
    attach(&mut c, "train1", T0);
    let bob = Actor {
        user: "bob".into(),
        admin: false,
    };
    let mut s = in_partition("inference");
    s.user = "bob".into();
    let e = admit_err(&c, &bob, s);
    assert_eq!(e.kind, Kind::PermissionDenied);
    assert!(
        e.message.contains("partitions.inference.allowed_accounts"),
        "{}",
        e.message
    );
    let mut s = in_partition("inference");
    s.resources.time_limit_secs = 3 * 3600;
    let e = admit_err(&c, &alice(), s);
    assert!(
        e.message
            .contains("over partition \"inference\"'s maximum of 2h"),
        "{}",
        e.message
    );
    let e = admit_err(&c, &alice(), in_partition("gpu"));
    assert!(
        e.message.contains("unknown partition \"gpu\"") && e.message.contains("batch, inference"),
        "{}",
        e.message
    );
    // Three GPUs fit no node of the partition (each has 2).
    let mut s = in_partition("inference");
    s.resources.gpu = Some(GpuPart::Gpus(3));
    s.resources.time_limit_secs = 60;
    let e = admit_err(&c, &alice(), s);
    assert!(
        e.message.contains("no node of partition inference"),
        "{}",
        e.message
    );
}

#[test]
fn a_down_partition_holds_its_jobs_with_a_reason_and_a_draining_one_takes_none() {
    let mut cfg = config(TWO);
    cfg.partitions.get_mut("batch").unwrap().state = gpuctl_core::partitions::PartitionState::Down;
    let mut c = Cluster::new(cfg);
    attach(&mut c, "train1", T0);
    let id = submit(&mut c, 1, false, T0);
    let e = pass(&mut c, T0);
    assert!(commands(&e).is_empty());
    assert_eq!(c.jobs().job(id).unwrap().reason, "PartitionDown");
    let Ok(gpuctl_core::explain::Explain::Done(why)) = c.explain(id, T0) else {
        panic!("a job of a down partition is not in the pass")
    };
    assert_eq!(why.reason, "PartitionDown");
    assert_eq!(
        why.summary,
        "partition batch is down: its jobs wait until it is up (partitions.batch.state)"
    );
    // Up again (a restart with the new config): it runs.
    configure(&mut c, |cfg| {
        cfg.partitions.get_mut("batch").unwrap().state = gpuctl_core::partitions::PartitionState::Up
    });
    let e = pass(&mut c, T0 + 1000);
    assert_eq!(commands(&e), vec![to("train1", &format!("start {id}"))]);
    configure(&mut c, |cfg| {
        cfg.partitions.get_mut("batch").unwrap().state =
            gpuctl_core::partitions::PartitionState::Drain
    });
    let e = admit_err(&c, &alice(), spec(1, false));
    assert!(e.message.contains("draining"), "{}", e.message);
    // A lower max_time after submit keeps a longer job out, by name.
    configure(&mut c, |cfg| {
        cfg.partitions.get_mut("batch").unwrap().state = gpuctl_core::partitions::PartitionState::Up
    });
    let long = submit(&mut c, 2, false, T0);
    configure(&mut c, |cfg| {
        cfg.partitions.get_mut("batch").unwrap().max_time = Some(std::time::Duration::from_secs(60))
    });
    pass(&mut c, T0 + 2000);
    assert_eq!(c.jobs().job(long).unwrap().reason, "PartitionTimeLimit");
    let Ok(gpuctl_core::explain::Explain::Done(why)) = c.explain(long, T0 + 2000) else {
        panic!("a job over its partition's max_time is not in the pass")
    };
    assert!(
        why.summary.contains("over partition batch's max_time"),
        "{}",
        why.summary
    );
}

fn named(name: &str, deps: &str) -> JobSpec {
    let mut s = spec(1, false);
    s.name = name.into();
    if deps == "singleton" {
        s.dependencies = vec![Dependency {
            kind: DependencyKind::Singleton,
            job_id: 0,
        }];
    }
    s
}

#[test]
fn singletons_of_one_user_and_name_run_one_at_a_time_in_order() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let a = submit_spec(&mut c, named("etl", "singleton"), T0);
    let b = submit_spec(&mut c, named("etl", "singleton"), T0);
    let other = submit_spec(&mut c, named("train", "singleton"), T0);
    let e = pass(&mut c, T0);
    let mut started = commands(&e);
    started.sort();
    assert_eq!(
        started,
        vec![
            to("n1", &format!("start {a}")),
            to("n1", &format!("start {other}"))
        ]
    );
    assert_eq!(c.jobs().job(b).unwrap().reason, "Dependency");
    report(&mut c, "n1", a, None, T0);
    report(&mut c, "n1", a, Some((JobState::Failed, 1)), T0 + 1000);
    // Any end lets the next one go.
    let e = pass(&mut c, T0 + 1000);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {b}"))]);
    // A singleton waits for a running namesake, singleton or not.
    report(&mut c, "n1", b, None, T0 + 1000);
    report(&mut c, "n1", other, None, T0);
    report(
        &mut c,
        "n1",
        other,
        Some((JobState::Completed, 0)),
        T0 + 1500,
    );
    let plain = submit_spec(&mut c, named("train", ""), T0 + 2000);
    let e = pass(&mut c, T0 + 2000);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {plain}"))]);
    let c2 = submit_spec(&mut c, named("train", "singleton"), T0 + 3000);
    let e = pass(&mut c, T0 + 3000);
    assert!(commands(&e).is_empty(), "{:?}", commands(&e));
    assert_eq!(c.jobs().job(c2).unwrap().state, JobState::Pending);
    // A singleton names no job.
    let mut bad = named("x", "singleton");
    bad.dependencies[0].job_id = 7;
    let e = c.admit(&alice(), bad, "", T0).unwrap_err();
    assert!(e.message.contains("singleton"), "{}", e.message);
}

#[test]
fn a_partition_floor_keeps_gpus_for_its_jobs_while_its_window_is_open() {
    // Both partitions hold every node: they differ in what their jobs may ask.
    let cfg = config(
        r#"
[partitions.inference]
max_time = "1h"
[partitions.batch]
default = true
[windows.always]
days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
start = "00:00"
end = "23:59"
partition_floor = { inference = 0.5 }
"#,
    );
    let mut c = Cluster::new(cfg);
    attach(&mut c, "n1", T0);
    attach(&mut c, "n2", T0);
    // 4 GPUs, half kept for inference: batch jobs may hold 2.
    let batch: Vec<u64> = (0..3).map(|_| submit(&mut c, 1, false, T0)).collect();
    let e = pass(&mut c, T0);
    assert_eq!(commands(&e).len(), 2, "{:?}", commands(&e));
    assert_eq!(c.jobs().job(batch[2]).unwrap().reason, "WindowFloor");
    // An inference job takes what was kept; the third batch job still waits.
    let mut s = spec(2, false);
    s.partition = "inference".into();
    let inf = submit_spec(&mut c, s, T0);
    let e = pass(&mut c, T0);
    let started = commands(&e);
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0].1, format!("start {inf}"));
    assert_eq!(c.jobs().job(batch[2]).unwrap().reason, "WindowFloor");
    // A floor must name a partition, and one of every node.
    for (text, want) in [
        (
            "[windows.w]\ndays = [\"mon\"]\nstart = \"08:00\"\nend = \"09:00\"\npartition_floor = { nowhere = 0.5 }\n",
            "not a partition",
        ),
        (
            "[partitions.p]\nnodes = [\"gpu[1-2]\"]\n[windows.w]\ndays = [\"mon\"]\nstart = \"08:00\"\nend = \"09:00\"\npartition_floor = { p = 0.5 }\n",
            "holds only some nodes",
        ),
    ] {
        let mut bad: Config = toml::from_str(text).unwrap();
        bad.resolve_qos();
        let e = bad.check_partitions().unwrap_err();
        assert!(e.contains(want), "{e}");
    }
}
