//! What replication costs a durable write (issue 40), measured below the daemon: three
//! controllers' Raft (`gpuctld::raft`) over gRPC on loopback, each with its log in
//! sled on disk, committing submit entries, one at a time and from 64 writers at once
//! (openraft batches what arrives together: group commit); against one sled database
//! writing and flushing the same entries, the single controller's durable path; and one
//! controller as a Raft cluster of its own (issue 56: what one journal for every
//! controller would cost the single controller).
//!
//! `cargo bench -p gpuctld --bench raft` (release). Prints a table; docs/benchmarks.md
//! keeps the numbers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuctl_core::log::{Change, Entry};
use gpuctl_core::ops::Admission;
use gpuctl_core::record::{GpuPart, JobSpec, Record, Resources};
use gpuctl_core::{Actor, Config};
use gpuctld::raft::{PeerService, Proposal, TypeConfig};
use openraft::{BasicNode, Raft};
use prost::Message as _;

const T0: i64 = 1_700_000_000_000;
const SEQUENTIAL: usize = 400;
const WRITERS: usize = 64;
const EACH: usize = 150;

fn raft_config() -> Arc<openraft::Config> {
    let c = openraft::Config {
        heartbeat_interval: 100,
        election_timeout_min: 500,
        election_timeout_max: 1000,
        ..Default::default()
    };
    Arc::new(c.validate().expect("a valid Raft config"))
}

/// A submitted job's record as admission builds it (ids set per write).
fn record() -> Record {
    let c = gpuctl_core::Cluster::new(Config::default());
    let ana = Actor {
        user: "ana".into(),
        admin: false,
    };
    let spec = JobSpec {
        user: "ana".into(),
        name: "train".into(),
        command: vec![
            "python".into(),
            "train.py".into(),
            "--epochs".into(),
            "10".into(),
        ],
        workdir: "/home/ana/project".into(),
        env: [("WANDB_PROJECT".to_string(), "bench".to_string())].into(),
        resources: Resources {
            gpu: Some(GpuPart::Gpus(1)),
            cpus: 4,
            memory_bytes: 32 << 30,
            time_limit_secs: 3600,
            ..Resources::default()
        },
        ..JobSpec::default()
    };
    match c.admit(&ana, spec, "", T0) {
        Ok(Admission::New(r)) => *r,
        _ => panic!("admitted"),
    }
}

/// The stored form of the submit of job `id`.
fn entry(template: &Record, id: u64) -> Vec<u8> {
    let mut r = template.clone();
    r.job.id = id;
    gpuctl_proto::wire::entry_pb(&Entry::new(T0, Change::Submit(vec![r]))).encode_to_vec()
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// One controller on loopback for each of `dirs`; their Rafts, the leader first.
async fn members(dirs: &[tempfile::TempDir]) -> Vec<Raft<TypeConfig>> {
    let mut rafts = Vec::new();
    let mut members = BTreeMap::new();
    for (i, dir) in dirs.iter().enumerate() {
        let id = i as u64 + 1;
        let db = sled::open(dir.path()).expect("a sled database");
        let (raft, _) = gpuctld::raft::open(
            id,
            &db,
            Config::default(),
            raft_config(),
            gpuctld::raft::GrpcNet::new(key(), None),
            None,
        )
        .await
        .expect("a Raft node");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        members.insert(
            id,
            BasicNode::new(listener.local_addr().unwrap().to_string()),
        );
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let service = PeerService::new(
            raft.clone(),
            key(),
            std::time::Duration::from_millis(raft_config().election_timeout_max),
        );
        tokio::spawn(async move {
            let serve = tonic::transport::Server::builder().add_service(service);
            let _ = serve.serve_with_incoming(incoming).await;
        });
        rafts.push(raft);
    }
    rafts[0].initialize(members).await.expect("initialized");
    for _ in 0..200 {
        if rafts[0].metrics().borrow().current_leader == Some(1) {
            return rafts;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("controller 1 did not lead");
}

/// Where a durable write goes: committed by a quorum of three controllers, or written
/// and flushed by one controller's store.
#[derive(Clone)]
enum Target {
    Raft(Raft<TypeConfig>),
    Store(gpuctld::store::Store),
}

impl Target {
    async fn write(&self, template: &Record, id: u64) {
        match self {
            Target::Raft(r) => {
                let p = Proposal {
                    from: 1,
                    entry: entry(template, id),
                };
                r.client_write(p).await.expect("committed");
            }
            Target::Store(s) => {
                let mut r = template.clone();
                r.job.id = id;
                s.insert_new_job(&r, id + 1).expect("written");
                s.flush().await.expect("flushed");
            }
        }
    }
}

/// (p50 ms, p99 ms) one write at a time, and writes/s from `WRITERS` at once.
async fn measure(t: &Target, template: &Record, first: u64) -> (f64, f64, f64) {
    let mut lat = Vec::with_capacity(SEQUENTIAL);
    for k in 0..SEQUENTIAL as u64 {
        let s = Instant::now();
        t.write(template, first + k).await;
        lat.push(s.elapsed().as_secs_f64() * 1000.0);
    }
    let base = first + SEQUENTIAL as u64;
    let started = Instant::now();
    let tasks: Vec<_> = (0..WRITERS as u64)
        .map(|w| {
            let (t, template) = (t.clone(), template.clone());
            tokio::spawn(async move {
                for k in 0..EACH as u64 {
                    let id = base + w * EACH as u64 + k;
                    t.write(&template, id).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a writer");
    }
    let rate = (WRITERS * EACH) as f64 / started.elapsed().as_secs_f64();
    (percentile(&mut lat, 0.5), percentile(&mut lat, 0.99), rate)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let template = record();
    let size = entry(&template, 1).len();
    println!("durable writes of a submit entry ({size} bytes), sled on disk:");
    println!("| | one at a time: p50 ms | p99 ms | {WRITERS} writers: writes/s |");
    println!("|---|---|---|---|");
    let dir = tempfile::tempdir().unwrap();
    let one = Target::Store(gpuctld::store::Store::open(dir.path()).unwrap());
    let (p50, p99, rate) = measure(&one, &template, 1).await;
    println!("| one controller (its store) | {p50:.2} | {p99:.2} | {rate:.0} |");
    drop(one);
    // A single controller as a Raft cluster of one (issue 56's first design: one journal
    // for every controller), then three.
    for (n, name) in [
        (1, "one controller on Raft (a cluster of one)"),
        (3, "three controllers on Raft"),
    ] {
        let dirs: Vec<tempfile::TempDir> = (0..n).map(|_| tempfile::tempdir().unwrap()).collect();
        let rafts = members(&dirs).await;
        let (p50, p99, rate) = measure(&Target::Raft(rafts[0].clone()), &template, 1).await;
        println!("| {name} | {p50:.2} | {p99:.2} | {rate:.0} |");
        for r in rafts {
            let _ = r.shutdown().await;
        }
    }
}

fn key() -> gpuctl_proto::auth::ClusterKey {
    gpuctl_proto::auth::ClusterKey::from_bytes([7; 32])
}
