//! A large cancel of pending jobs is made durable as one record (`cancel/<seq>`) and its
//! jobs' records follow once it answered: a controller stopped at any point after the
//! answer comes back with every one of those jobs cancelled, and no record left over.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuctl_core::jobs::PendingCancel;
use gpuctl_proto as pb;
use gpuctl_proto::auth::ClusterKey;
use gpuctld::auth::Caller;
use gpuctld::config::Config;
use gpuctld::controller::{Controller, PkiSetup};
use gpuctld::store::Store;

const JOBS: u32 = 600;

fn open(dir: &std::path::Path, key: &ClusterKey) -> Arc<Controller> {
    Controller::open(
        Store::open(dir).unwrap(),
        Config::default(),
        None,
        PkiSetup::shared_key(key.clone(), dir),
    )
    .unwrap()
}

fn root() -> Caller {
    Caller {
        user: "root".into(),
        uid: Some(0),
        gid: Some(0),
        admin: true,
        via: "unix-socket",
    }
}

/// An array of `JOBS` tasks on a cluster with no nodes: all wait.
fn array() -> pb::JobSpec {
    pb::JobSpec {
        script: "true".into(),
        workdir: "/tmp".into(),
        array: format!("0-{}", JOBS - 1),
        resources: Some(pb::Resources {
            gpu: Some(pb::resources::Gpu::Gpus(1)),
            cpus: 1,
            ..pb::Resources::default()
        }),
        ..pb::JobSpec::default()
    }
}

fn states(c: &Controller) -> Vec<(u64, i32, String)> {
    let filter = gpuctl_core::filter::JobFilter {
        all: true,
        ..Default::default()
    };
    (c.list_jobs(&filter).into_iter())
        .map(|j| (j.id, j.state, j.reason))
        .collect()
}

/// Every job of the array is cancelled in what the store holds now: its record says
/// so, or a cancel record names it.
fn on_disk_cancelled(store: &Store, first: u64) {
    use prost::Message as _;
    let mut named = std::collections::HashSet::new();
    for kv in store.db().scan_prefix(b"cancel/") {
        let c = pb::store::StoredCancel::decode(kv.unwrap().1.as_ref()).unwrap();
        named.extend(c.job_ids);
    }
    for id in first..first + u64::from(JOBS) {
        let key = [&b"job/"[..], &id.to_be_bytes()].concat();
        let bytes = store.db().get(key).unwrap().expect("a record");
        let job = pb::store::StoredJob::decode(bytes.as_ref())
            .unwrap()
            .job
            .unwrap();
        assert!(
            job.state == pb::JobState::Cancelled as i32 || named.contains(&id),
            "job {id}: neither its record nor a cancel record says cancelled"
        );
    }
}

fn cancel_records(store: &Store) -> usize {
    store.db().scan_prefix(b"cancel/").count()
}

#[test]
fn a_large_cancel_is_one_record_and_its_jobs_follow() {
    let dir = tempfile::tempdir().unwrap();
    let key = ClusterKey::generate();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (first, ids) = rt.block_on(async {
        let c = open(dir.path(), &key);
        let first = c.submit(&root(), Some(array()), "", false).await.unwrap();
        let results = c.cancel(&root(), &[first], &[], None).await.unwrap();
        assert_eq!(results.len(), JOBS as usize);
        assert!(results.iter().all(|r| r.ok), "{:?}", &results[..3]);
        // On disk as the answer came: every job either in a cancel record or in its own
        // record cancelled (the records follow on a blocking thread meanwhile).
        on_disk_cancelled(c.store(), first);
        let cancelled = states(&c);
        assert!(
            (cancelled.iter()).all(|(_, s, _)| *s == pb::JobState::Cancelled as i32),
            "every task cancelled"
        );
        let t = Instant::now();
        while cancel_records(c.store()) > 0 {
            assert!(t.elapsed() < Duration::from_secs(30), "records not written");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        c.store().flush().await.unwrap();
        (first, cancelled)
    });
    // Another controller on the same state dir (this one's store handle let go).
    let reopened = rt.block_on(async { states(&open(dir.path(), &key)) });
    assert_eq!(reopened, ids, "the same jobs, as the cancel left them");
    assert!(ids[0].0 == first && ids[0].2.contains("cancelled while pending by root"));
}

#[test]
fn a_cancel_record_left_at_a_stop_cancels_its_jobs_at_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let key = ClusterKey::generate();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The state a stop right after the answer leaves: the jobs' records as they were
    // before the cancel (pending), and its one record. Job 3 was written after it.
    let (first, before) = rt.block_on(async {
        let c = open(dir.path(), &key);
        let first = c.submit(&root(), Some(array()), "", false).await.unwrap();
        c.store().flush().await.unwrap();
        (first, states(&c))
    });
    assert!(
        before
            .iter()
            .all(|(_, s, _)| *s == pb::JobState::Pending as i32)
    );
    let last = first + u64::from(JOBS) - 1;
    rt.block_on(async {
        let store = Store::open(dir.path()).unwrap();
        let cancel = PendingCancel {
            at: 1_800_000_000_000,
            reason: "cancelled while pending by root".into(),
            // The first and last three tasks, and a job that was never there.
            ids: vec![first, first + 1, first + 2, last, last + 1],
        };
        store.put_cancel(7, &cancel).unwrap();
        store.flush().await.unwrap();
    });
    let (after, left) = rt.block_on(async {
        let c = open(dir.path(), &key);
        (states(&c), cancel_records(c.store()))
    });
    assert_eq!(left, 0, "the record goes once its jobs are written");
    let cancelled: Vec<u64> = (after.iter())
        .filter(|(_, s, _)| *s == pb::JobState::Cancelled as i32)
        .map(|(id, _, _)| *id)
        .collect();
    assert_eq!(cancelled, [first, first + 1, first + 2, last]);
    assert_eq!(after.len(), before.len(), "no job made up, none lost");
    // Written back: a third start reads them cancelled without any record.
    let again = rt.block_on(async { states(&open(dir.path(), &key)) });
    assert_eq!(again, after);
}
