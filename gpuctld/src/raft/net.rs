//! Raft between controllers over gRPC (`RaftPeer` in gpuctl.proto): openraft's
//! messages and its answers (a result: what the peer's Raft answered, or why it
//! refused) as JSON. `PeerService` serves a controller's Raft; `GrpcNet` reaches the
//! others. A peer that cannot be reached is `Unreachable` to openraft, which retries.
//! Every message carries an HMAC with the cluster key (`ClusterKey::peer_mac`): a
//! controller answers only holders of the key, the cluster's members. Every request
//! also carries a fresh MAC under that key in its headers (`x-gpuctl-peer`), checked
//! before a byte of its body is read: a message from anyone else, however large it
//! claims to be, costs its headers and no more (it was read whole, up to 256 MiB, and
//! then refused). The service is served on the TCP listener only, never on the users'
//! Unix socket.

use std::collections::HashMap;
use std::time::Duration;

use gpuctl_proto as pb;
use gpuctl_proto::auth::ClusterKey;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use super::TypeConfig;

/// How long a peer has to answer one message (a snapshot's included).
const RPC_TIMEOUT: Duration = Duration::from_secs(10);

fn encode<T: Serialize>(key: &ClusterKey, method: &str, t: &T) -> pb::RaftMessage {
    let json = serde_json::to_vec(t).expect("openraft's messages serialise");
    pb::RaftMessage {
        mac: key.peer_mac(method, &json),
        json,
    }
}

fn decode<T: DeserializeOwned>(
    key: &ClusterKey,
    method: &str,
    m: &pb::RaftMessage,
) -> Result<T, Status> {
    if !key.verify_peer(method, &m.json, &m.mac) {
        return Err(Status::unauthenticated(
            "a Raft message not signed with this cluster's key: only its controllers take part",
        ));
    }
    serde_json::from_slice(&m.json)
        .map_err(|e| Status::invalid_argument(format!("not a Raft message of this kind: {e}")))
}

/// The header that proves a request comes from a member: `MS.HEX`, the sender's clock
/// in Unix ms and the MAC of it under the cluster key.
const PEER_HEADER: &str = "x-gpuctl-peer";

/// How far a member's header time may be from this one's clock.
const PEER_SKEW_MS: i64 = 60_000;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Adds [`PEER_HEADER`] to each request a member sends.
#[derive(Clone)]
pub struct SignPeer(ClusterKey);

impl tonic::service::Interceptor for SignPeer {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let ms = now_ms().to_string();
        let mac = hex::encode(self.0.peer_mac("header", ms.as_bytes()));
        let value = format!("{ms}.{mac}")
            .parse()
            .map_err(|_| Status::internal("an ASCII header is a header"))?;
        req.metadata_mut().insert(PEER_HEADER, value);
        Ok(req)
    }
}

/// Refuses, before its body is read, a request without a member's [`PEER_HEADER`].
#[derive(Clone)]
pub struct CheckPeer(ClusterKey);

impl tonic::service::Interceptor for CheckPeer {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let refused = |why: &str| {
            PEER_REFUSED.note(|n, secs| {
                tracing::warn!(
                    "{n} Raft request(s) refused in the last {secs} s before reading them: {why}"
                );
            });
            Err(Status::unauthenticated(format!(
                "{why}: only this cluster's controllers take part in its Raft"
            )))
        };
        let Some(value) = req
            .metadata()
            .get(PEER_HEADER)
            .and_then(|v| v.to_str().ok())
        else {
            return refused("no member's header");
        };
        let Some((ms, mac)) = value.split_once('.') else {
            return refused("a malformed member's header");
        };
        let (Ok(at), Ok(mac)) = (ms.parse::<i64>(), hex::decode(mac)) else {
            return refused("a malformed member's header");
        };
        if !self.0.verify_peer("header", ms.as_bytes(), &mac) {
            return refused("a member's header not made with this cluster's key");
        }
        if (now_ms() - at).abs() > PEER_SKEW_MS {
            return refused("a member's header too old (or a clock more than 60 s off)");
        }
        if let Some(peer) = req.extensions().get::<gpuctl_proto::guard::TcpPeer>() {
            peer.auth.authenticated();
        }
        Ok(req)
    }
}

/// Messages a member could not deliver (a member down sees hundreds a minute): a line
/// a period.
static UNREACHABLE: gpuctl_proto::ratelog::RateLog =
    gpuctl_proto::ratelog::RateLog::new(Duration::from_secs(30));

/// Refused peer requests: anyone can send them, so a line a period.
static PEER_REFUSED: gpuctl_proto::ratelog::RateLog =
    gpuctl_proto::ratelog::RateLog::new(Duration::from_secs(10));

/// The peer service as served: its requests checked before they are read.
pub type PeerServer = tonic::service::interceptor::InterceptedService<
    pb::raft_peer_server::RaftPeerServer<PeerService>,
    CheckPeer,
>;

/// A member's client of another.
type PeerClient = pb::raft_peer_client::RaftPeerClient<
    tonic::service::interceptor::InterceptedService<Channel, SignPeer>,
>;

/// A controller's Raft, served to its peers.
pub struct PeerService {
    raft: Raft<TypeConfig>,
    key: ClusterKey,
    /// When an append last came (from a leader, or one that thinks it is).
    heard: parking_lot::Mutex<std::time::Instant>,
    /// How long after that a lost leader's lease may still hold (the longest election
    /// timeout): no election is hastened before.
    lease: Duration,
    /// An election this member hastened is under way.
    standing: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl PeerService {
    pub fn new(raft: Raft<TypeConfig>, key: ClusterKey, lease: Duration) -> PeerServer {
        let service = PeerService {
            raft,
            key: key.clone(),
            heard: parking_lot::Mutex::new(std::time::Instant::now()),
            lease,
            standing: Default::default(),
        };
        let server =
            pb::raft_peer_server::RaftPeerServer::new(service).max_decoding_message_size(256 << 20);
        tonic::service::interceptor::InterceptedService::new(server, CheckPeer(key))
    }

    /// After refusing `req` because this member's log is ahead of the candidate's: if
    /// no leader has been heard for longer than a lease, this member stands at once.
    /// Openraft would instead push its own election timer back, and the candidate
    /// (which cannot win) holds its term against the next one: a leader lost while
    /// one follower was an entry behind, and that follower's timer ran out first, cost
    /// two more rounds, over a second (docs/benchmarks.md). Only liveness is at stake:
    /// who may win is Raft's rule, whenever the election starts.
    fn hasten(&self, req: &VoteRequest<u64>, answer: &VoteResponse<u64>) {
        let ahead = !answer.vote_granted && req.last_log_id < answer.last_log_id;
        if !ahead || self.heard.lock().elapsed() < self.lease {
            return;
        }
        if self
            .standing
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let (raft, standing) = (self.raft.clone(), self.standing.clone());
        tokio::spawn(async move {
            // The first round may meet the candidate's vote for itself in its term;
            // the next term is free.
            for _ in 0..2 {
                if raft.trigger().elect().await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                if raft.metrics().borrow().current_leader.is_some() {
                    break;
                }
            }
            standing.store(false, std::sync::atomic::Ordering::SeqCst);
        });
    }
}

#[tonic::async_trait]
impl pb::raft_peer_server::RaftPeer for PeerService {
    async fn append(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = decode(&self.key, "append", req.get_ref())?;
        *self.heard.lock() = std::time::Instant::now();
        let answer = self.raft.append_entries(rpc).await;
        Ok(Response::new(encode(&self.key, "append-answer", &answer)))
    }

    async fn vote(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let rpc: VoteRequest<u64> = decode(&self.key, "vote", req.get_ref())?;
        let answer = self.raft.vote(rpc.clone()).await;
        if let Ok(a) = &answer {
            self.hasten(&rpc, a);
        }
        Ok(Response::new(encode(&self.key, "vote-answer", &answer)))
    }

    async fn snapshot(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(&self.key, "snapshot", req.get_ref())?;
        let answer = self.raft.install_snapshot(rpc).await;
        Ok(Response::new(encode(&self.key, "snapshot-answer", &answer)))
    }

    async fn ping(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let () = decode(&self.key, "ping", req.get_ref())?;
        Ok(Response::new(encode(&self.key, "ping-answer", &())))
    }
}

/// Reaches peers at the addresses their membership records (`BasicNode::addr`, a URL
/// or `host:port`), signing with the cluster key; over TLS under the cluster CA when
/// `tls` is given (the default mode), else plain TCP (`--insecure-shared-key`).
///
/// One channel per peer, kept across openraft's clients (it asks for a new one each
/// election) and kept open by `keep_warm`: followers never speak to each other until
/// their leader is lost, and a first TLS handshake at that moment, on a busy machine,
/// delayed votes by tens of milliseconds, enough for split votes and a second round
/// (docs/benchmarks.md).
#[derive(Clone)]
pub struct GrpcNet {
    key: ClusterKey,
    tls: Option<gpuctl_proto::tls::ClientTls>,
    channels: std::sync::Arc<parking_lot::Mutex<HashMap<u64, (String, Channel)>>>,
}

impl GrpcNet {
    pub fn new(key: ClusterKey, tls: Option<gpuctl_proto::tls::ClientTls>) -> GrpcNet {
        GrpcNet {
            key,
            tls,
            channels: Default::default(),
        }
    }

    /// The channel to `target` at `addr`: the one kept, unless its address changed.
    fn channel(&self, target: u64, addr: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock();
        if let Some((at, ch)) = channels.get(&target)
            && at == addr
        {
            return Ok(ch.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let url = if addr.contains("://") {
            addr.to_string()
        } else {
            format!("{scheme}://{addr}")
        };
        let endpoint = Endpoint::from_shared(url)
            .map_err(|e| format!("controller {target}'s address {addr:?}: {e}"))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(RPC_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(20))
            .keep_alive_while_idle(true);
        let ch = match &self.tls {
            Some(tls) => tls.channel(endpoint),
            None => endpoint.connect_lazy(),
        };
        channels.insert(target, (addr.to_string(), ch.clone()));
        Ok(ch)
    }

    /// Pings every other member of `raft`'s membership every `every`, for as long as it
    /// runs: their connections stay open (and are made again soon after a member
    /// restarts), ready for the next election.
    pub async fn keep_warm(self, me: u64, raft: openraft::Raft<TypeConfig>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let members: Vec<(u64, String)> = {
                let m = raft.metrics();
                let m = m.borrow();
                (m.membership_config.membership().nodes())
                    .filter(|(id, _)| **id != me)
                    .map(|(id, n)| (*id, n.addr.clone()))
                    .collect()
            };
            for (id, addr) in members {
                let Ok(ch) = self.channel(id, &addr) else {
                    continue;
                };
                let key = self.key.clone();
                tokio::spawn(async move {
                    let mut client = pb::raft_peer_client::RaftPeerClient::with_interceptor(
                        ch,
                        SignPeer(key.clone()),
                    );
                    let ping = client.ping(encode(&key, "ping", &()));
                    // A member down is openraft's to notice; this only keeps the way open.
                    let _ = tokio::time::timeout(every, ping).await;
                });
            }
        }
    }
}

/// One peer.
pub struct Peer {
    target: u64,
    key: ClusterKey,
    client: Result<PeerClient, String>,
}

impl RaftNetworkFactory<TypeConfig> for GrpcNet {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Peer {
        let client = self.channel(target, &node.addr).map(|ch| {
            pb::raft_peer_client::RaftPeerClient::with_interceptor(ch, SignPeer(self.key.clone()))
                .max_decoding_message_size(256 << 20)
        });
        Peer {
            target,
            key: self.key.clone(),
            client,
        }
    }
}

type Rpc<T, E = openraft::error::Infallible> =
    Result<T, RPCError<u64, BasicNode, RaftError<u64, E>>>;

impl Peer {
    /// Sends one message; the peer's answer (its Raft's result) read back.
    async fn call<Req, T, E>(&mut self, kind: Kind, req: &Req) -> Rpc<T, E>
    where
        Req: Serialize,
        T: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let client = self.client.as_mut().map_err(|why| {
            RPCError::Unreachable(Unreachable::new(&std::io::Error::other(why.clone())))
        })?;
        let method = match kind {
            Kind::Append => "append",
            Kind::Vote => "vote",
            Kind::Snapshot => "snapshot",
        };
        let msg = encode(&self.key, method, req);
        let answer = match kind {
            Kind::Append => client.append(msg).await,
            Kind::Vote => client.vote(msg).await,
            Kind::Snapshot => client.snapshot(msg).await,
        }
        .map_err(|s| {
            let target = self.target;
            UNREACHABLE.note(|n, secs| {
                tracing::warn!(
                    target_member = target,
                    "controller {target} did not take a Raft message ({}); {n} failed in the last {secs} s (openraft retries)",
                    s.message()
                );
            });
            RPCError::Unreachable(Unreachable::new(&s))
        })?;
        let result: Result<T, RaftError<u64, E>> =
            decode(&self.key, &format!("{method}-answer"), answer.get_ref())
                .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

enum Kind {
    Append,
    Vote,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _: RPCOption,
    ) -> Rpc<AppendEntriesResponse<u64>> {
        self.call(Kind::Append, &rpc).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _: RPCOption,
    ) -> Rpc<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        self.call(Kind::Snapshot, &rpc).await
    }

    async fn vote(&mut self, rpc: VoteRequest<u64>, _: RPCOption) -> Rpc<VoteResponse<u64>> {
        self.call(Kind::Vote, &rpc).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor as _;

    /// A member's header passes; none, one under another key, a malformed one or a
    /// stale one is refused before the body would be read.
    #[test]
    fn peer_requests_are_checked_by_their_headers() {
        let key = ClusterKey::generate();
        let signed = SignPeer(key.clone()).call(Request::new(())).unwrap();
        assert!(CheckPeer(key.clone()).call(signed).is_ok());

        let refused = |req: Request<()>| {
            let e = CheckPeer(key.clone()).call(req).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
            e.message().to_string()
        };
        assert!(refused(Request::new(())).contains("no member's header"));
        let foreign = SignPeer(ClusterKey::generate())
            .call(Request::new(()))
            .unwrap();
        assert!(refused(foreign).contains("not made with this cluster's key"));
        let mut bad = Request::new(());
        bad.metadata_mut()
            .insert(PEER_HEADER, "12.zz".parse().unwrap());
        assert!(refused(bad).contains("malformed"));
        let old = (now_ms() - 2 * PEER_SKEW_MS).to_string();
        let mac = hex::encode(key.peer_mac("header", old.as_bytes()));
        let mut stale = Request::new(());
        stale
            .metadata_mut()
            .insert(PEER_HEADER, format!("{old}.{mac}").parse().unwrap());
        assert!(refused(stale).contains("too old"));
    }
}
