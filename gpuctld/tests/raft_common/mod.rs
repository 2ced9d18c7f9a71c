//! What the Raft tests share: controllers with their disks, an in-process network that
//! can stop and cut them off, gRPC on loopback, and the leader's side of the daemon
//! (admission on its replica, proposals, passes).
#![allow(dead_code)]

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
pub struct Router {
    pub rafts: Mutex<BTreeMap<u64, Raft<TypeConfig>>>,
    /// Controllers cut off from the others (a partition): nothing reaches them and
    /// nothing from them arrives.
    pub cut: Mutex<BTreeSet<u64>>,
}

impl Router {
    fn get(&self, from: u64, to: u64) -> Result<Raft<TypeConfig>, Unreachable> {
        if self.cut.lock().iter().any(|c| *c == from || *c == to) {
            let cut = std::io::Error::other(format!("{from} and {to} are partitioned"));
            return Err(Unreachable::new(&cut));
        }
        let gone = std::io::Error::other(format!("controller {to} is stopped"));
        self.rafts
            .lock()
            .get(&to)
            .cloned()
            .ok_or_else(|| Unreachable::new(&gone))
    }
}

/// Controller `.1`'s side of the network.
pub struct Net(Arc<Router>, u64);

impl Net {
    /// Controller `id`'s side of `router`.
    pub fn new(router: Arc<Router>, id: u64) -> Net {
        Net(router, id)
    }
}
/// From `.1` to `.2`.
pub struct Conn(Arc<Router>, u64, u64);

impl RaftNetworkFactory<TypeConfig> for Net {
    type Network = Conn;
    async fn new_client(&mut self, target: u64, _: &BasicNode) -> Conn {
        Conn(self.0.clone(), self.1, target)
    }
}

impl RaftNetwork<TypeConfig> for Conn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _: RPCOption,
    ) -> Rpc<AppendEntriesResponse<u64>> {
        let raft = self.0.get(self.1, self.2).map_err(RPCError::Unreachable)?;
        raft.append_entries(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.2, e)))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _: RPCOption,
    ) -> Rpc<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        let raft = self.0.get(self.1, self.2).map_err(RPCError::Unreachable)?;
        raft.install_snapshot(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.2, e)))
    }

    async fn vote(&mut self, rpc: VoteRequest<u64>, _: RPCOption) -> Rpc<VoteResponse<u64>> {
        let raft = self.0.get(self.1, self.2).map_err(RPCError::Unreachable)?;
        raft.vote(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.2, e)))
    }
}

/// One controller: its disk, its Raft and its replica.
pub struct Controller {
    pub id: u64,
    pub dir: std::path::PathBuf,
    pub raft: Raft<TypeConfig>,
    pub replica: Arc<Mutex<Replica>>,
}

pub fn raft_config() -> Arc<openraft::Config> {
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
pub enum Transport {
    Local(Arc<Router>),
    Grpc(Mutex<BTreeMap<u64, (std::net::SocketAddr, tokio::task::JoinHandle<()>)>>),
}

impl Transport {
    /// Where controller `id` is reached (its membership record's address).
    pub fn address(&self, id: u64) -> String {
        match self {
            Transport::Local(_) => format!("c{id}"),
            Transport::Grpc(servers) => servers.lock()[&id].0.to_string(),
        }
    }

    /// Stops what reaches controller `id`.
    pub fn stop(&self, id: u64) {
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

pub async fn start(t: &Transport, id: u64, dir: &std::path::Path) -> Controller {
    // A controller stopped in this process lets go of its database when openraft's
    // tasks have ended (a process that exits, at once).
    let mut tries = 0;
    let db = loop {
        match sled::open(dir) {
            Ok(db) => break db,
            Err(e) if tries < 100 => {
                tries += 1;
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("controller {id}'s database: {e}"),
        }
    };
    let log = LogStore::open(&db).expect("the log's trees");
    let machine = Machine::open(id, &db, Config::default()).expect("the state machine");
    let replica = machine.replica();
    let raft = match t {
        Transport::Local(router) => {
            let net = Net(router.clone(), id);
            let raft = Raft::new(id, raft_config(), net, log, machine).await;
            let raft = raft.expect("a Raft node");
            router.rafts.lock().insert(id, raft.clone());
            raft
        }
        Transport::Grpc(servers) => {
            let raft = Raft::new(id, raft_config(), GrpcNet::new(key(), None), log, machine).await;
            let raft = raft.expect("a Raft node");
            let at = servers.lock().get(&id).map(|s| s.0);
            let listener = tokio::net::TcpListener::bind(at.unwrap_or(([127, 0, 0, 1], 0).into()))
                .await
                .expect("a port for the controller");
            let addr = listener.local_addr().unwrap();
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let service = PeerService::new(
                raft.clone(),
                key(),
                std::time::Duration::from_millis(raft_config().election_timeout_max),
            );
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
pub async fn propose(
    leader: &Controller,
    at: i64,
    change: Change,
) -> (Result<Applied, Refusal>, Effects) {
    let entry = gpuctl_proto::wire::entry_pb(&Entry::new(at, change)).encode_to_vec();
    let proposal = Proposal {
        from: leader.id,
        entry,
    };
    let done = leader.raft.client_write(proposal).await.expect("committed");
    leader
        .replica
        .lock()
        .take_answer(done.log_id.index, 0)
        .expect("the proposer keeps its answer")
}

/// `propose`, when it may not commit (the proposer deposed or cut off): its answer
/// if committed within `within`, else `None` (not acknowledged: it may still commit).
pub async fn try_propose(
    c: &Controller,
    at: i64,
    change: Change,
    within: Duration,
) -> Option<(Result<Applied, Refusal>, Effects)> {
    let entry = gpuctl_proto::wire::entry_pb(&Entry::new(at, change)).encode_to_vec();
    let proposal = Proposal { from: c.id, entry };
    let done = tokio::time::timeout(within, c.raft.client_write(proposal)).await;
    let done = done.ok()?.ok()?;
    c.replica.lock().take_answer(done.log_id.index, 0)
}

/// The leader among `cs`, once one is elected.
pub async fn leader(cs: &[&Controller]) -> u64 {
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

pub fn register(node: &str) -> Register {
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
pub async fn submit(leader: &Controller, at: i64, n: usize) -> Vec<u64> {
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
pub async fn pass(leader: &Controller, at: i64) -> Vec<(u64, u32)> {
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
pub fn difference(a: &str, b: &str) -> String {
    let at = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    let from = at.saturating_sub(60);
    let show = |s: &str| s[from..(at + 100).min(s.len())].to_string();
    format!("\n  one:   {}\n  other: {}", show(a), show(b))
}

/// Every replica's state once all have applied what `leader` has.
pub async fn settled(leader: &Controller, cs: &[&Controller]) -> Vec<String> {
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

/// The cluster key the controllers of a test share.
pub fn key() -> gpuctl_proto::auth::ClusterKey {
    gpuctl_proto::auth::ClusterKey::from_bytes([7; 32])
}
