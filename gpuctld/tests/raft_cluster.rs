//! Three controllers' replicas of the cluster kept by openraft (`gpuctld::raft`), over
//! an in-process network and over gRPC on loopback TCP (`RaftPeer`): the leader decides as the daemon does (admission on its own
//! replica, a pass's plan), proposes entries and takes their answers; followers apply.
//! The leader is then stopped: another is elected, nothing acknowledged is lost, no job
//! starts twice; the stopped one restarts from its disk and catches up, and a fourth
//! joins from nothing through a snapshot. Every replica ends alike.

mod raft_common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gpuctl_core::event::{Report, ReportKind};
use gpuctl_core::log::{Applied, Change};
use openraft::BasicNode;
use parking_lot::Mutex;
use raft_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_controllers_in_one_process_survive_the_loss_of_their_leader() {
    the_loss_of_a_leader(Transport::Local(Arc::default())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_controllers_over_grpc_survive_the_loss_of_their_leader() {
    the_loss_of_a_leader(Transport::Grpc(Mutex::default())).await;
}

async fn the_loss_of_a_leader(t: Transport) {
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut cs = Vec::new();
    for id in 1..=3 {
        cs.push(start(&t, id, dirs[id as usize - 1].path()).await);
    }
    let members: BTreeMap<u64, BasicNode> =
        (1..=3).map(|i| (i, BasicNode::new(t.address(i)))).collect();
    cs[0].raft.initialize(members).await.expect("initialized");
    let t0 = 1_700_000_000_000;

    let first = leader(&cs.iter().collect::<Vec<_>>()).await;
    let l = cs.iter().find(|c| c.id == first).unwrap();
    for n in ["n1", "n2", "n3", "n4"] {
        let attached = propose(
            l,
            t0,
            Change::Attach {
                register: register(n),
                peer: None,
            },
        )
        .await;
        assert!(
            matches!(attached.0, Ok(Applied::Attached(_))),
            "{attached:?}"
        );
    }
    let mut acked = submit(l, t0 + 1, 12).await;
    let mut started = pass(l, t0 + 2).await;
    assert_eq!(started.len(), 8, "8 GPUs, 12 one-GPU jobs");
    let all: Vec<&Controller> = cs.iter().collect();
    let states = settled(l, &all).await;
    for s in &states[1..] {
        assert!(
            s == &states[0],
            "replicas differ before the loss:{}",
            difference(s, &states[0])
        );
    }

    // The leader stops (its process gone: the network no longer reaches it).
    t.stop(first);
    l.raft.shutdown().await.expect("stopped");
    let rest: Vec<&Controller> = cs.iter().filter(|c| c.id != first).collect();
    let lost_at = std::time::Instant::now();
    let second = leader(&rest).await;
    let elected_in = lost_at.elapsed();
    assert_ne!(second, first);
    let l2 = cs.iter().find(|c| c.id == second).unwrap();
    // Everything acknowledged is there; more comes, and the jobs that ended free GPUs.
    {
        let r = l2.replica.lock();
        for id in &acked {
            assert!(
                r.cluster().jobs().job(*id).is_some(),
                "acknowledged job {id} lost"
            );
        }
    }
    acked.extend(submit(l2, t0 + 3, 6).await);
    let ends: Vec<Report> = started[..4]
        .iter()
        .map(|&(j, a)| {
            let node = l2
                .replica
                .lock()
                .cluster()
                .jobs()
                .job(j)
                .unwrap()
                .allocations[0]
                .node
                .clone();
            let mut r = Report::new(&node, j, a, ReportKind::Ended);
            r.state = gpuctl_sched::job::JobState::Completed;
            r.exit_code = Some(0);
            r
        })
        .collect();
    propose(l2, t0 + 4, Change::Reports(ends))
        .await
        .0
        .expect("ended");
    started.extend(pass(l2, t0 + 5).await);
    let ids: BTreeSet<u64> = started.iter().map(|s| s.0).collect();
    assert_eq!(ids.len(), started.len(), "a job started twice: {started:?}");
    assert_eq!(started.len(), 12);

    // The old leader restarts from its disk and catches up; a fourth controller joins
    // with an empty disk, after snapshots purged the log's start.
    let old = cs.iter().position(|c| c.id == first).unwrap();
    let dir = cs[old].dir.clone();
    cs[old] = start(&t, first, &dir).await;
    let fourth = start(&t, 4, dirs[3].path()).await;
    let l2 = cs.iter().find(|c| c.id == second).unwrap();
    l2.raft.trigger().snapshot().await.expect("a snapshot");
    l2.raft
        .add_learner(4, BasicNode::new(t.address(4)), true)
        .await
        .expect("learner added");
    let mut all: Vec<&Controller> = cs.iter().collect();
    all.push(&fourth);
    let states = settled(l2, &all).await;
    for (c, s) in all.iter().zip(&states) {
        assert!(
            *s == states[0],
            "controller {} differs from the leader:{}",
            c.id,
            difference(s, &states[0])
        );
    }
    let purged = l2.raft.metrics().borrow().purged;
    let got = fourth.raft.metrics().borrow().snapshot;
    assert!(
        purged.is_some(),
        "the leader's log was not purged behind a snapshot"
    );
    assert!(got.is_some(), "the newcomer installed no snapshot");
    let missing: Vec<u64> = {
        let r = fourth.replica.lock();
        (acked.iter().copied())
            .filter(|id| r.cluster().jobs().job(*id).is_none())
            .collect()
    };
    assert!(
        missing.is_empty(),
        "jobs missing on the newcomer: {missing:?}"
    );
    eprintln!("a new leader in {elected_in:?}");
    for c in cs.iter().chain([&fourth]) {
        let _ = c.raft.shutdown().await;
        t.stop(c.id);
    }
}
