//! The daemon's leader path on Raft, below the daemon: three `Controller`s (the shell
//! the daemon runs, with their stores on disk) over the in-process network, so that
//! what the binaries' tests reach only end to end is exercised here: the journal's
//! `propose` and its group commit (`batch_loop`), `commit` and the answers read back
//! from the proposer's replica, admission past submits still in the log, a follower's
//! refusal, and a repeated request.

mod raft_common;

use std::sync::Arc;
use std::time::Duration;

use gpuctl_proto as pb;
use gpuctld::auth::Caller;
use gpuctld::controller::{Controller, PkiSetup, Repl, Shell};
use gpuctld::raft::{LogStore, Machine};
use gpuctld::store::Store;
use openraft::{BasicNode, Raft};
use raft_common::{Net, Router, key, raft_config};

struct Member {
    ctl: Arc<Controller>,
    raft: Raft<gpuctld::raft::TypeConfig>,
    _dir: tempfile::TempDir,
}

async fn member(router: &Arc<Router>, id: u64) -> Member {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).expect("a store");
    let db = store.db().clone();
    let config = gpuctl_core::Config::default();
    let pki = PkiSetup::shared_key(key(), dir.path());
    let ctl = Controller::open(store, config.clone(), None, pki).expect("a controller");
    let target: Arc<dyn gpuctld::raft::Target> = Arc::new(Shell(Arc::downgrade(&ctl)));
    let log = LogStore::open(&db).expect("the log");
    let mut machine = Machine::open_on(id, &db, config, Some(target)).expect("a machine");
    machine.replays_to(None);
    let net = Net::new(router.clone(), id);
    let raft = Raft::new(id, raft_config(), net, log, machine.clone())
        .await
        .expect("a Raft node");
    router.rafts.lock().insert(id, raft.clone());
    ctl.set_replicated(Repl {
        me: id,
        raft: raft.clone(),
        machine,
        confirmed_ms: std::sync::atomic::AtomicI64::new(0),
        lease_ms: 900,
        proposals: Default::default(),
        importing: std::sync::atomic::AtomicBool::new(false),
    });
    tokio::spawn(ctl.clone().follow_leadership());
    Member {
        ctl,
        raft,
        _dir: dir,
    }
}

fn ana() -> Caller {
    Caller {
        user: "ana".into(),
        uid: Some(1000),
        gid: Some(1000),
        admin: false,
        via: "unix-socket",
    }
}

fn spec(name: &str) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        command: vec!["train".into()],
        workdir: "/home/ana".into(),
        resources: Some(pb::Resources {
            gpu: Some(pb::resources::Gpu::Gpus(1)),
            cpus: 1,
            time_limit_secs: 3600,
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_path_batches_commits_and_answers_every_submit() {
    let router = Arc::new(Router::default());
    let mut members = Vec::new();
    for id in 1..=3 {
        members.push(member(&router, id).await);
    }
    let nodes = (1..=3u64).map(|id| (id, BasicNode::new(format!("c{id}"))));
    members[0]
        .raft
        .initialize(nodes.collect::<std::collections::BTreeMap<_, _>>())
        .await
        .expect("membership");
    let mut leader = None;
    for _ in 0..200 {
        leader = members.iter().position(|m| m.ctl.is_leader());
        if leader.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let leader = &members[leader.expect("a leader within 5 s")];
    let follower = members.iter().find(|m| !m.ctl.is_leader()).unwrap();

    // A follower refuses, naming where the leader is.
    let refused = follower.ctl.require_leader().unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(
        refused.message().contains("is not the leader"),
        "{}",
        refused.message()
    );

    // 64 submits at once: ids handed out past those still in the log, every one
    // acknowledged once it applied, in fewer entries than submits (group commit).
    let before = leader.raft.metrics().borrow().last_log_index.unwrap_or(0);
    let submits = (0..64).map(|k| {
        let ctl = leader.ctl.clone();
        tokio::spawn(async move {
            let request = format!("req-{k}");
            ctl.submit(&ana(), Some(spec(&format!("j{k}"))), &request, false)
                .await
        })
    });
    let mut ids = Vec::new();
    for s in submits.collect::<Vec<_>>() {
        ids.push(s.await.unwrap().expect("acknowledged"));
    }
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), 64, "{ids:?}");
    let after = leader.raft.metrics().borrow().last_log_index.unwrap_or(0);
    let entries = after - before;
    assert!(
        entries < 64,
        "64 submits took {entries} entries: no batching"
    );

    // A repeated request answers its job, and adds none.
    let again = leader
        .ctl
        .submit(&ana(), Some(spec("j5")), "req-5", false)
        .await
        .unwrap();
    assert_eq!(again, ids[5]);

    // Every member holds every acknowledged job, as the leader answered it.
    for m in &members {
        for _ in 0..200 {
            if ids.iter().all(|&id| m.ctl.get_job(id).is_ok()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        for (k, &id) in ids.iter().enumerate() {
            let job = m.ctl.get_job(id).expect("replicated");
            assert_eq!(job.spec.unwrap().name, format!("j{k}"));
        }
    }
    assert_eq!(
        leader
            .ctl
            .get_job(*unique.last().unwrap() + 1)
            .unwrap_err()
            .code(),
        tonic::Code::NotFound
    );
}
