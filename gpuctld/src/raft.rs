//! Replicated controllers (issue 40): the cluster's log (`gpuctl_core::log`) kept by
//! openraft. `TypeConfig` names the types; `log_store.rs` keeps the log and the vote in
//! sled; `machine.rs` applies committed entries to a `Cluster` and builds and installs
//! snapshots (`gpuctl_proto::wire::snapshot`); `net.rs` carries Raft between controllers over gRPC.
//! The daemon starts it with `--id N --peers ...` (`daemon.rs`) and saves through it in
//! the journal's Raft half (`controller/journal/raft.rs`); docs/replication.md.

// openraft's storage traits return its `StorageError` (224 bytes); the helpers here
// return what the traits do.
#![allow(clippy::result_large_err)]

use std::io::Cursor;

use serde::{Deserialize, Serialize};

mod log_store;
mod machine;
mod net;

pub use log_store::LogStore;
pub use machine::{Machine, Replica, Target};
pub use net::{GrpcNet, PeerServer, PeerService};

openraft::declare_raft_types!(
    /// gpuctl's Raft: nodes are controllers numbered by `--id`, entries carry log
    /// entries in their stored form.
    pub TypeConfig:
        D = Proposal,
        R = Reply,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// An entry proposed to the log: its stored form (`LogEntry`, protobuf), and the
/// controller that proposed it (which alone keeps what applying it answered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub from: u64,
    #[serde(with = "bytes_b64")]
    pub entry: Vec<u8>,
}

/// What applying an entry answers through Raft: nothing but that it applied. The
/// answer itself (`Applied`, the commands to send) stays on the controller that
/// proposed the entry (`Replica::take_answer`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {}

/// Opens controller `id`'s Raft on its sled database: the log, the state machine (from
/// its last snapshot, else an empty cluster on `config`; in `target` when given), and
/// its peers over gRPC, signed with `key`. Serve its peers with `PeerService::new`.
pub async fn open(
    id: u64,
    db: &sled::Db,
    config: gpuctl_core::Config,
    raft: std::sync::Arc<openraft::Config>,
    net: GrpcNet,
    target: Option<std::sync::Arc<dyn Target>>,
) -> anyhow::Result<(openraft::Raft<TypeConfig>, Machine)> {
    let log = LogStore::open(db)?;
    let mut machine = Machine::open_on(id, db, config, target).map_err(anyhow::Error::msg)?;
    machine.replays_to(log.last_index());
    let node = openraft::Raft::new(id, raft, net, log, machine.clone()).await?;
    Ok((node, machine))
}

/// Bytes as base64 text in serde's formats (the log's JSON records).
mod bytes_b64 {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(b))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}
