//! A leader's group commit (`LogBatch`): entries proposed together and stored as one
//! apply exactly as the same entries one by one: the same state and, part by part, the
//! same answers and effects, a refused part included. A damaged batch applies nothing.

mod raft_common;

use gpuctl_core::log::{Change, Entry};
use gpuctl_core::ops::Admission;
use gpuctl_core::record::{GpuPart, JobSpec, Resources};
use gpuctl_core::{Actor, Cluster, Config};
use gpuctld::raft::{Machine, Proposal, TypeConfig};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, EntryPayload, LogId};
use prost::Message as _;

fn ana() -> Actor {
    Actor {
        user: "ana".into(),
        admin: false,
    }
}

fn spec(gpus: u32) -> JobSpec {
    JobSpec {
        user: "ana".into(),
        name: "train".into(),
        command: vec!["train".into()],
        workdir: "/home/ana".into(),
        resources: Resources {
            gpu: Some(GpuPart::Gpus(gpus)),
            cpus: 1,
            time_limit_secs: 3600,
            ..Resources::default()
        },
        ..JobSpec::default()
    }
}

/// A history as a leader decides it: agents attach, jobs are submitted (one of them
/// twice, as two leaders' admissions of one request would be), passes start them,
/// a cancel; each entry decided on the state the ones before it left.
fn history() -> Vec<Entry> {
    let mut leader = Cluster::new(Config::default());
    let mut log = Vec::new();
    let mut push = |c: &mut Cluster, at: i64, change: Change| {
        let e = Entry::new(at, change);
        let _ = c.apply(e.clone());
        c.take_changes();
        log.push(e);
    };
    let mut at = 1_000;
    for node in ["n1", "n2"] {
        let change = Change::Attach {
            register: raft_common::register(node),
            peer: None,
        };
        push(&mut leader, at, change);
    }
    for i in 0..7u32 {
        at += 10;
        let request = format!("req-{i}");
        let Ok(Admission::New(record)) = leader.admit(&ana(), spec(1 + i % 2), &request, at) else {
            panic!("admitted");
        };
        if i == 3 {
            // The same request admitted again before the first applied: refused.
            push(&mut leader, at, Change::Submit(vec![(*record).clone()]));
        }
        push(&mut leader, at, Change::Submit(vec![*record]));
        if i % 3 == 2 {
            push(&mut leader, at, Change::Pass);
        }
    }
    let cancel = Change::Cancel {
        actor: ana(),
        ids: vec![2],
        tasks: vec![],
    };
    push(&mut leader, at + 5, cancel);
    push(&mut leader, at + 10, Change::Pass);
    log
}

fn raft_entry(
    index: u64,
    parts: Vec<gpuctl_proto::store::LogEntry>,
) -> openraft::Entry<TypeConfig> {
    let entry = match <[_; 1]>::try_from(parts) {
        Ok([one]) => one,
        Err(parts) => gpuctl_proto::wire::batch_pb(parts),
    };
    openraft::Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Proposal {
            from: 1,
            entry: entry.encode_to_vec(),
        }),
    }
}

/// Applies `log` grouped as `sizes` says (cycled): the cluster's records, and every
/// part's answer in order.
async fn applied(log: &[Entry], sizes: &[usize]) -> (String, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let mut m = Machine::open(1, &db, Config::default()).unwrap();
    let mut answers = Vec::new();
    let (mut rest, mut index) = (log, 1);
    for size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (batch, after) = rest.split_at((*size).min(rest.len()));
        let parts: Vec<_> = batch.iter().map(gpuctl_proto::wire::entry_pb).collect();
        m.apply([raft_entry(index, parts)]).await.expect("applied");
        let replica = m.replica();
        let mut r = replica.lock();
        for part in 0..batch.len() {
            let answer = r.take_answer(index, part).expect("an answer for each part");
            answers.push(format!("{answer:?}"));
        }
        assert!(
            r.take_answer(index, batch.len()).is_none(),
            "no answer past the parts"
        );
        (rest, index) = (after, index + 1);
    }
    let state = format!("{:?}", m.replica().lock().cluster().records());
    (state, answers)
}

#[tokio::test]
async fn entries_proposed_together_apply_as_the_same_entries_one_by_one() {
    let log = history();
    let (state, answers) = applied(&log, &[1]).await;
    assert!(
        answers.iter().any(|a| a.contains("AlreadyExists")),
        "the history holds a refused submit: {answers:?}"
    );
    assert!(
        answers.iter().any(|a| a.contains("Start")),
        "the passes start jobs"
    );
    for sizes in [&[2][..], &[3, 1, 5], &[64], &[4, 7, 2]] {
        let (s, a) = applied(&log, sizes).await;
        assert!(
            s == state,
            "batches of {sizes:?}: {}",
            raft_common::difference(&state, &s)
        );
        assert_eq!(
            a, answers,
            "batches of {sizes:?} answer part by part as one by one"
        );
    }
}

#[tokio::test]
async fn a_batch_inside_a_batch_applies_nothing() {
    let log = history();
    let dir = tempfile::tempdir().unwrap();
    let db = sled::open(dir.path()).unwrap();
    let mut m = Machine::open(1, &db, Config::default()).unwrap();
    let before = format!("{:?}", m.replica().lock().cluster().records());
    let inner =
        gpuctl_proto::wire::batch_pb(log[2..4].iter().map(gpuctl_proto::wire::entry_pb).collect());
    let parts = vec![gpuctl_proto::wire::entry_pb(&log[0]), inner];
    let err = m.apply([raft_entry(1, parts)]).await.expect_err("refused");
    assert!(err.to_string().contains("a batch inside a batch"), "{err}");
    let after = format!("{:?}", m.replica().lock().cluster().records());
    assert_eq!(before, after, "no part of a damaged batch applied");
}
