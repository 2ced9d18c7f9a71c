//! Raft between controllers over gRPC (`RaftPeer` in gpuctl.proto): openraft's
//! messages and its answers (a result: what the peer's Raft answered, or why it
//! refused) as JSON. `PeerService` serves a controller's Raft; `GrpcNet` reaches the
//! others. A peer that cannot be reached is `Unreachable` to openraft, which retries.
//! Every message carries an HMAC with the cluster key (`ClusterKey::peer_mac`): a
//! controller answers only holders of the key, the cluster's members.

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

/// A controller's Raft, served to its peers.
pub struct PeerService {
    raft: Raft<TypeConfig>,
    key: ClusterKey,
}

impl PeerService {
    pub fn new(
        raft: Raft<TypeConfig>,
        key: ClusterKey,
    ) -> pb::raft_peer_server::RaftPeerServer<PeerService> {
        pb::raft_peer_server::RaftPeerServer::new(PeerService { raft, key })
            .max_decoding_message_size(256 << 20)
    }
}

#[tonic::async_trait]
impl pb::raft_peer_server::RaftPeer for PeerService {
    async fn append(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = decode(&self.key, "append", req.get_ref())?;
        let answer = self.raft.append_entries(rpc).await;
        Ok(Response::new(encode(&self.key, "append-answer", &answer)))
    }

    async fn vote(
        &self,
        req: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let rpc: VoteRequest<u64> = decode(&self.key, "vote", req.get_ref())?;
        let answer = self.raft.vote(rpc).await;
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
}

/// Reaches peers at the addresses their membership records (`BasicNode::addr`, a URL
/// or `host:port`), signing with the cluster key; over TLS under the cluster CA when
/// `tls` is given (the default mode), else plain TCP (`--insecure-shared-key`).
pub struct GrpcNet {
    pub key: ClusterKey,
    pub tls: Option<gpuctl_proto::tls::ClientTls>,
}

/// One peer.
pub struct Peer {
    target: u64,
    key: ClusterKey,
    client: Result<pb::raft_peer_client::RaftPeerClient<Channel>, String>,
}

impl RaftNetworkFactory<TypeConfig> for GrpcNet {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Peer {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let url = if node.addr.contains("://") {
            node.addr.clone()
        } else {
            format!("{scheme}://{}", node.addr)
        };
        let tls = self.tls.clone();
        let client = Endpoint::from_shared(url)
            .map(|e| {
                e.connect_timeout(Duration::from_secs(2))
                    .timeout(RPC_TIMEOUT)
            })
            .map(|e| {
                let channel = match &tls {
                    Some(tls) => tls.channel(e),
                    None => e.connect_lazy(),
                };
                pb::raft_peer_client::RaftPeerClient::new(channel)
                    .max_decoding_message_size(256 << 20)
            })
            .map_err(|e| format!("controller {target}'s address {:?}: {e}", node.addr));
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
        .map_err(|s| RPCError::Unreachable(Unreachable::new(&s)))?;
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
