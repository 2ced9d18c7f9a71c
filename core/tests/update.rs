//! `scontrol update JobId=N ...`: what a job's owner and an admin may change after its
//! submit, what reaches a running job's agent, and that a refused update changes
//! nothing.

mod common;

use common::*;
use gpuctl_core::operations::Operations as _;
use gpuctl_core::record::{JobSpec, JobState};
use gpuctl_core::update::JobUpdate;
use gpuctl_core::{Actor, Cluster, Config, Kind};

const PARTS: &str = r#"
[partitions.short]
max_time = "2h"
[partitions.batch]
default = true
[partitions.closed]
state = "drain"
"#;

fn cluster_with_parts() -> Cluster {
    let mut cfg: Config = toml::from_str(PARTS).expect("config");
    cfg.resolve_qos();
    cfg.check_partitions().expect("partitions");
    Cluster::new(cfg)
}

fn root() -> Actor {
    Actor {
        user: "root".into(),
        admin: true,
    }
}

fn limit(secs: u64) -> JobUpdate {
    JobUpdate {
        time_limit_secs: Some(secs),
        ..JobUpdate::default()
    }
}

fn job_spec(c: &Cluster, id: u64) -> JobSpec {
    c.jobs().job(id).unwrap().spec.clone()
}

#[test]
fn an_owner_lowers_a_pending_limit_and_only_an_admin_raises_it() {
    let mut c = cluster_with_parts();
    let id = submit(&mut c, 1, false, T0);
    c.take_changes();
    c.update_job(&alice(), id, &limit(600)).unwrap();
    assert_eq!(c.jobs().job(id).unwrap().time_limit_secs, 600);
    assert!(
        c.take_changes().jobs.put.contains(&id),
        "an update is written"
    );
    let e = c.update_job(&alice(), id, &limit(7200)).unwrap_err();
    assert_eq!(e.kind, Kind::PermissionDenied, "{e:?}");
    assert!(e.message.contains("only an admin raises"), "{}", e.message);
    assert_eq!(c.jobs().job(id).unwrap().time_limit_secs, 600);
    // UNLIMITED is a raise too; an admin's goes to the cluster's longest.
    assert!(c.update_job(&alice(), id, &limit(0)).is_err());
    c.update_job(&root(), id, &limit(0)).unwrap();
    let longest = c.config().limits.max_time_limit.as_secs();
    assert_eq!(c.jobs().job(id).unwrap().time_limit_secs, longest);
    // Someone else's job is not theirs to change.
    let bob = Actor {
        user: "bob".into(),
        admin: false,
    };
    let e = c.update_job(&bob, id, &limit(60)).unwrap_err();
    assert_eq!(e.kind, Kind::PermissionDenied);
}

#[test]
fn a_pending_job_moves_partition_under_that_partitions_rules() {
    let mut c = cluster_with_parts();
    let id = submit(&mut c, 1, false, T0);
    // Its hour fits short's two.
    let to = |p: &str| JobUpdate {
        partition: Some(p.into()),
        ..JobUpdate::default()
    };
    c.update_job(&alice(), id, &to("short")).unwrap();
    assert_eq!(job_spec(&c, id).partition, "short");
    let e = c.update_job(&alice(), id, &to("nowhere")).unwrap_err();
    assert!(e.message.contains("unknown partition"), "{}", e.message);
    let e = c.update_job(&alice(), id, &to("closed")).unwrap_err();
    assert!(e.message.contains("draining"), "{}", e.message);
    assert_eq!(
        job_spec(&c, id).partition,
        "short",
        "a refusal changes nothing"
    );
    // An admin may raise it to three hours only where the partition allows three.
    let both = JobUpdate {
        time_limit_secs: Some(3 * 3600),
        partition: Some("batch".into()),
        ..JobUpdate::default()
    };
    let e = c.update_job(&root(), id, &limit(3 * 3600)).unwrap_err();
    assert!(e.message.contains("max_time"), "{}", e.message);
    c.update_job(&root(), id, &both).unwrap();
    let j = c.jobs().job(id).unwrap();
    assert_eq!(
        (j.spec.partition.as_str(), j.time_limit_secs),
        ("batch", 3 * 3600)
    );
}

#[test]
fn a_running_jobs_new_limit_reaches_its_agent_and_its_partition_stays() {
    let mut c = cluster_with_parts();
    attach(&mut c, "n1", T0);
    let id = submit(&mut c, 1, false, T0);
    let e = pass(&mut c, T0);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {id}"))]);
    assert_eq!(state(&c, id), JobState::Running);
    let e = c.update_job(&alice(), id, &limit(120)).unwrap();
    assert_eq!(commands(&e), vec![to("n1", &format!("limit {id} 120"))]);
    assert!(e.wake, "a shorter job changes the plan's reservations");
    // The same limit again sends nothing.
    let e = c.update_job(&alice(), id, &limit(120)).unwrap();
    assert!(commands(&e).is_empty());
    let e = c
        .update_job(
            &alice(),
            id,
            &JobUpdate {
                partition: Some("short".into()),
                ..JobUpdate::default()
            },
        )
        .unwrap_err();
    assert!(e.message.contains("only a pending job"), "{}", e.message);
    // Ended: nothing changes any more.
    report(&mut c, "n1", id, Some((JobState::Completed, 0)), T0 + 5);
    let e = c.update_job(&alice(), id, &limit(60)).unwrap_err();
    assert!(e.message.contains("an ended job"), "{}", e.message);
}

#[test]
fn names_comments_and_nice_are_checked_as_at_submit() {
    let mut c = cluster_with_parts();
    let id = submit(&mut c, 1, false, T0);
    let named = |n: &str| JobUpdate {
        name: Some(n.into()),
        ..JobUpdate::default()
    };
    c.update_job(&alice(), id, &named("eval")).unwrap();
    assert_eq!(job_spec(&c, id).name, "eval");
    // Found by its new name (`queue --name`), no more by its old one.
    let named_ids =
        |c: &Cluster, n: &str| -> Vec<u64> { c.jobs().active_named(n).map(|s| s.job.id).collect() };
    assert_eq!(named_ids(&c, "eval"), [id]);
    assert!(named_ids(&c, "train").is_empty());
    checked(&c);
    let e = c
        .update_job(&alice(), id, &named("a\u{1b}[2Jb"))
        .unwrap_err();
    assert_eq!(e.kind, Kind::InvalidArgument);
    let long = JobUpdate {
        comment: Some("x".repeat(5000)),
        ..JobUpdate::default()
    };
    assert!(c.update_job(&alice(), id, &long).is_err());
    assert_eq!(job_spec(&c, id).name, "eval");
    assert_eq!(job_spec(&c, id).comment, "");
    // Nice: the owner lowers the priority, only an admin raises it back.
    let nice = |p: i32| JobUpdate {
        priority: Some(p),
        ..JobUpdate::default()
    };
    c.update_job(&alice(), id, &nice(-100)).unwrap();
    assert_eq!(job_spec(&c, id).priority, -100);
    assert!(c.update_job(&alice(), id, &nice(0)).is_err());
    c.update_job(&root(), id, &nice(0)).unwrap();
    assert!(c.update_job(&alice(), id, &nice(-1_000_000_000)).is_err());
    // Nothing asked: refused, not a silent no-op.
    assert!(c.update_job(&alice(), id, &JobUpdate::default()).is_err());
}
