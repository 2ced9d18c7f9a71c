//! Three controllers' replicas of the cluster kept by openraft (`gpuctld::raft`), over
//! an in-process network and over gRPC on loopback TCP (`RaftPeer`): the leader decides as the daemon does (admission on its own
//! replica, a pass's plan), proposes entries and takes their answers; followers apply.
//! The leader is then stopped: another is elected, nothing acknowledged is lost, no job
//! starts twice; the stopped one restarts from its disk and catches up, and a fourth
//! joins from nothing through a snapshot. Every replica ends alike.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use gpuctl_core::command::Command;
use gpuctl_core::event::{Register, Report, ReportKind};
use gpuctl_core::log::{Applied, Change, Entry, plan_entries};
use gpuctl_core::node::Gpu;
use gpuctl_core::ops::Admission;
use gpuctl_core::record::{GpuPart, JobSpec, Resources};
use gpuctl_core::{Actor, Config, Effects, Refusal};
use gpuctld::raft::{GrpcNet, LogStore, Machine, PeerService, Proposal, Replica, TypeConfig};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft};
use parking_lot::Mutex;
use prost::Message as _;

type Rpc<T, E = openraft::error::Infallible> =
    Result<T, RPCError<u64, BasicNode, RaftError<u64, E>>>;

/// The in-process network: every controller's Raft by id; a controller stopped is gone.
#[derive(Default)]
struct Router {
    rafts: Mutex<BTreeMap<u64, Raft<TypeConfig>>>,
}

impl Router {
    fn get(&self, to: u64) -> Result<Raft<TypeConfig>, Unreachable> {
        let gone = std::io::Error::other(format!("controller {to} is stopped"));
        self.rafts
            .lock()
            .get(&to)
            .cloned()
            .ok_or_else(|| Unreachable::new(&gone))
    }
}

struct Net(Arc<Router>);
struct Conn(Arc<Router>, u64);

impl RaftNetworkFactory<TypeConfig> for Net {
    type Network = Conn;
    async fn new_client(&mut self, target: u64, _: &BasicNode) -> Conn {
        Conn(self.0.clone(), target)
    }
}

impl RaftNetwork<TypeConfig> for Conn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _: RPCOption,
    ) -> Rpc<AppendEntriesResponse<u64>> {
        let raft = self.0.get(self.1).map_err(RPCError::Unreachable)?;
        raft.append_entries(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.1, e)))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _: RPCOption,
    ) -> Rpc<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        let raft = self.0.get(self.1).map_err(RPCError::Unreachable)?;
        raft.install_snapshot(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.1, e)))
    }

    async fn vote(&mut self, rpc: VoteRequest<u64>, _: RPCOption) -> Rpc<VoteResponse<u64>> {
        let raft = self.0.get(self.1).map_err(RPCError::Unreachable)?;
        raft.vote(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.1, e)))
    }
}

/// One controller: its disk, its Raft and its replica.
struct Controller {
    id: u64,
    dir: std::path::PathBuf,
    raft: Raft<TypeConfig>,
    replica: Arc<Mutex<Replica>>,
}

fn raft_config() -> Arc<openraft::Config> {
    let c = openraft::Config {
        heartbeat_interval: 100,
        election_timeout_min: 500,
        election_timeout_max: 1000,
        // Snapshots often, the log purged behind them: a member that joins late
        // must install one.
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(25),
        max_in_snapshot_log_to_keep: 0,
        ..Default::default()
    };
    Arc::new(c.validate().expect("a valid Raft config"))
}

/// How the controllers reach each other: in process, or over gRPC on loopback TCP
/// (each serving `PeerService` on its own port, kept across its restarts).
enum Transport {
    Local(Arc<Router>),
    Grpc(Mutex<BTreeMap<u64, (std::net::SocketAddr, tokio::task::JoinHandle<()>)>>),
}

impl Transport {
    /// Where controller `id` is reached (its membership record's address).
    fn address(&self, id: u64) -> String {
        match self {
            Transport::Local(_) => format!("c{id}"),
            Transport::Grpc(servers) => servers.lock()[&id].0.to_string(),
        }
    }

    /// Stops what reaches controller `id`.
    fn stop(&self, id: u64) {
        match self {
            Transport::Local(router) => {
                router.rafts.lock().remove(&id);
            }
            Transport::Grpc(servers) => {
                if let Some((_, server)) = servers.lock().get(&id) {
                    server.abort();
                }
            }
        }
    }
}

async fn start(t: &Transport, id: u64, dir: &std::path::Path) -> Controller {
    let db = sled::open(dir).expect("a sled database");
    let log = LogStore::open(&db).expect("the log's trees");
    let machine = Machine::open(id, &db, Config::default()).expect("the state machine");
    let replica = machine.replica();
    let raft = match t {
        Transport::Local(router) => {
            let raft = Raft::new(id, raft_config(), Net(router.clone()), log, machine).await;
            let raft = raft.expect("a Raft node");
            router.rafts.lock().insert(id, raft.clone());
            raft
        }
        Transport::Grpc(servers) => {
            let raft = Raft::new(id, raft_config(), GrpcNet, log, machine).await;
            let raft = raft.expect("a Raft node");
            let at = servers.lock().get(&id).map(|s| s.0);
            let listener = tokio::net::TcpListener::bind(at.unwrap_or(([127, 0, 0, 1], 0).into()))
                .await
                .expect("a port for the controller");
            let addr = listener.local_addr().unwrap();
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let service = PeerService::new(raft.clone());
            let server = tokio::spawn(async move {
                let serve = tonic::transport::Server::builder().add_service(service);
                let _ = serve.serve_with_incoming(incoming).await;
            });
            servers.lock().insert(id, (addr, server));
            raft
        }
    };
    Controller {
        id,
        dir: dir.to_path_buf(),
        raft,
        replica,
    }
}

/// Proposes `change` through `leader` as decided at `at`; its answer and effects.
async fn propose(
    leader: &Controller,
    at: i64,
    change: Change,
) -> (Result<Applied, Refusal>, Effects) {
    let entry = gpuctld::wire::entry_pb(&Entry::new(at, change)).encode_to_vec();
    let proposal = Proposal {
        from: leader.id,
        entry,
    };
    let done = leader.raft.client_write(proposal).await.expect("committed");
    leader
        .replica
        .lock()
        .take_answer(done.log_id.index)
        .expect("the proposer keeps its answer")
}

/// The leader among `cs`, once one is elected.
async fn leader(cs: &[&Controller]) -> u64 {
    for _ in 0..200 {
        let leaders: BTreeSet<u64> = (cs.iter())
            .filter_map(|c| c.raft.metrics().borrow().current_leader)
            .collect();
        if let [one] = leaders.iter().copied().collect::<Vec<_>>()[..]
            && cs.iter().any(|c| c.id == one)
        {
            return one;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no leader elected");
}

fn register(node: &str) -> Register {
    Register {
        node: node.into(),
        gpus: (0..2)
            .map(|i| Gpu {
                index: i,
                uuid: format!("GPU-{node}-{i}"),
                model: "A100-80GB".into(),
                memory_mib: 81920,
                ..Gpu::default()
            })
            .collect(),
        cpus: 16,
        memory_bytes: 64 << 30,
        nonce: node.as_bytes().to_vec(),
        agent_id: format!("agent-{node}"),
        ..Register::default()
    }
}

/// Submits `n` one-GPU jobs through the leader (admitted on its replica); their ids.
async fn submit(leader: &Controller, at: i64, n: usize) -> Vec<u64> {
    let ana = Actor {
        user: "ana".into(),
        admin: false,
    };
    let mut ids = Vec::new();
    for _ in 0..n {
        let spec = JobSpec {
            user: "ana".into(),
            name: "train".into(),
            command: vec!["train".into()],
            workdir: "/home/ana".into(),
            resources: Resources {
                gpu: Some(GpuPart::Gpus(1)),
                cpus: 1,
                time_limit_secs: 3600,
                ..Resources::default()
            },
            ..JobSpec::default()
        };
        let admitted = leader.replica.lock().cluster().admit(&ana, spec, "", at);
        let Ok(Admission::New(record)) = admitted else {
            panic!("refused: {:?}", admitted.map(|_| ()));
        };
        ids.push(record.job.id);
        propose(leader, at, Change::Submit(vec![*record]))
            .await
            .0
            .expect("queued");
    }
    ids
}

/// A pass through the leader; its agents report every start ran. The starts' (job,
/// attempt) pairs.
async fn pass(leader: &Controller, at: i64) -> Vec<(u64, u32)> {
    let Ok(Applied::Prepared(waiting)) = propose(leader, at, Change::Prepare).await.0 else {
        panic!("a pass's start answers the jobs it leaves out");
    };
    let plan = {
        let r = leader.replica.lock();
        let c = r.cluster();
        gpuctl_sched::schedule(&c.view(), &c.queue(&waiting), &c.pass_config(at), at)
    };
    let mut starts = Vec::new();
    for e in plan_entries(&plan, 3, at) {
        let (_, effects) = propose(leader, at, e.change).await;
        for (node, cmd) in effects.sends {
            if let Command::Start(s) = cmd {
                starts.push((node, s.job_id, s.attempt));
            }
        }
    }
    let reports = (starts.iter())
        .map(|(n, j, a)| Report::new(n, *j, *a, ReportKind::Started))
        .collect();
    propose(leader, at, Change::Reports(reports))
        .await
        .0
        .expect("reported");
    starts.into_iter().map(|(_, j, a)| (j, a)).collect()
}

/// Where two states first differ, with some context.
fn difference(a: &str, b: &str) -> String {
    let at = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    let from = at.saturating_sub(60);
    let show = |s: &str| s[from..(at + 100).min(s.len())].to_string();
    format!("\n  one:   {}\n  other: {}", show(a), show(b))
}

/// Every replica's state once all have applied what `leader` has.
async fn settled(leader: &Controller, cs: &[&Controller]) -> Vec<String> {
    // The replica, not the metrics: those follow the applies a little later.
    let index = leader.replica.lock().last_applied().map_or(0, |l| l.index);
    let mut out = Vec::new();
    for c in cs {
        c.raft
            .wait(Some(Duration::from_secs(20)))
            .applied_index_at_least(Some(index), "the leader's entries applied")
            .await
            .expect("caught up");
        let r = c.replica.lock();
        out.push(format!("{:?}", r.cluster().records()));
    }
    out
}

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
