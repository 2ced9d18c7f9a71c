//! The replicated state machine: committed entries applied to a `Cluster`
//! (`Cluster::apply`, alike on every controller) and to the controller's `Credentials`
//! (API tokens, join tokens, node identities), snapshots built from both and installed
//! into both (`gpuctl_proto::wire::snapshot`), the last snapshot kept in sled so that a controller
//! that restarts starts from it and re-applies only the log after it.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::sync::Arc;

use gpuctl_core::log::Applied;
use gpuctl_core::{Cluster, Config, Effects, Refusal};
use gpuctl_proto::store as st;
use openraft::storage::RaftStateMachine;
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership,
};
use parking_lot::Mutex;
use prost::Message as _;

use super::{Reply, TypeConfig};
use crate::credentials::Credentials;

type Error = StorageError<u64>;
type Answer = (Result<Applied, Refusal>, Effects);
type Meta = SnapshotMeta<u64, openraft::BasicNode>;

/// The answers a controller keeps for the entries it proposed, at most: a proposer
/// takes its answer as soon as the entry applies, so only answers nobody waits for
/// (the proposer's request gone) are ever dropped.
const MAX_ANSWERS: usize = 10_000;

/// Where a replica's cluster lives when it is not in the `Replica` itself: in the
/// controller's shell, under its one lock (the daemon: requests read the cluster the
/// log applies to).
pub trait Target: Send + Sync + 'static {
    /// Runs `f` on the cluster under its lock.
    fn with_cluster(&self, f: &mut dyn FnMut(&mut Cluster));
    /// Runs `f` on the credentials under their lock.
    fn with_credentials(&self, f: &mut dyn FnMut(&mut Credentials));
}

/// One controller's replica of the cluster, shared by the state machine openraft drives
/// and the controller that reads it.
pub struct Replica {
    /// The cluster, unless a `Target` holds it (then this one stays empty).
    cluster: Cluster,
    /// The credentials, likewise.
    credentials: Credentials,
    last_applied: Option<LogId<u64>>,
    /// The time of the last entry applied (a snapshot's restore time).
    last_at: i64,
    membership: StoredMembership<u64, openraft::BasicNode>,
    /// What the entries this controller proposed answered, by log index and part (a
    /// batch's parts answer one by one; an entry alone is part 0).
    answers: BTreeMap<(u64, usize), Answer>,
}

impl Replica {
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn last_applied(&self) -> Option<LogId<u64>> {
        self.last_applied
    }

    /// The answer of part `part` of the entry at `index`, which this controller
    /// proposed (part 0: an entry alone, or a batch's first).
    pub fn take_answer(&mut self, index: u64, part: usize) -> Option<Answer> {
        self.answers.remove(&(index, part))
    }
}

/// The state machine openraft drives (cheap to clone).
#[derive(Clone)]
pub struct Machine {
    me: u64,
    replica: Arc<Mutex<Replica>>,
    target: Option<Arc<dyn Target>>,
    /// The last snapshot: "meta" (JSON) and "data" (a `Snapshot`, protobuf).
    snapshots: sled::Tree,
    /// Entries up to this index were in the log at start: applying them again after a
    /// restart replays events that were logged when first applied, so their lines are
    /// not logged again (one summary line instead).
    replay_until: Option<u64>,
}

/// Runs `f` with nothing logged when `quiet` (a replayed entry).
fn quietly<R>(quiet: bool, f: impl FnOnce() -> R) -> R {
    if quiet {
        tracing::dispatcher::with_default(&tracing::Dispatch::none(), f)
    } else {
        f()
    }
}

impl Machine {
    /// The state machine of controller `me`: its last snapshot's cluster, or an empty
    /// one on `config`.
    pub fn open(me: u64, db: &sled::Db, config: Config) -> Result<Machine, String> {
        Machine::open_on(me, db, config, None)
    }

    /// `open`, with the cluster in `target` (the controller's shell) when given.
    pub fn open_on(
        me: u64,
        db: &sled::Db,
        config: Config,
        target: Option<Arc<dyn Target>>,
    ) -> Result<Machine, String> {
        let snapshots = db.open_tree("raft_snapshot").map_err(|e| e.to_string())?;
        let replica = Replica {
            cluster: Cluster::new(config),
            credentials: Credentials::default(),
            last_applied: None,
            last_at: 0,
            membership: StoredMembership::default(),
            answers: BTreeMap::new(),
        };
        let m = Machine {
            me,
            replica: Arc::new(Mutex::new(replica)),
            target,
            snapshots,
            replay_until: None,
        };
        if let Some((meta, data)) = m.stored().map_err(|e| e.to_string())? {
            m.install(&meta, data).map_err(|e| e.to_string())?;
        }
        Ok(m)
    }

    /// Entries up to `last` (the log's last index at start) are a replay.
    pub fn replays_to(&mut self, last: Option<u64>) {
        self.replay_until = last;
    }

    /// The replica, for the controller to read (and to take its answers from).
    pub fn replica(&self) -> Arc<Mutex<Replica>> {
        self.replica.clone()
    }

    /// Runs `f` on the replicated cluster: the replica's, or the target's.
    fn on_cluster<R>(&self, r: &mut Replica, f: impl FnOnce(&mut Cluster) -> R) -> R {
        match &self.target {
            Some(t) => through(|g| t.with_cluster(g), f),
            None => f(&mut r.cluster),
        }
    }

    /// Runs `f` on the replicated credentials: the replica's, or the target's.
    fn on_credentials<R>(&self, r: &mut Replica, f: impl FnOnce(&mut Credentials) -> R) -> R {
        match &self.target {
            Some(t) => through(|g| t.with_credentials(g), f),
            None => f(&mut r.credentials),
        }
    }

    /// Replaces the cluster and the credentials with a snapshot's (or an import's).
    fn replace(&self, r: &mut Replica, mut pb: st::Snapshot) -> Result<(), String> {
        let credentials = Credentials::from_records(pb.credentials.take().unwrap_or_default());
        let cluster = gpuctl_proto::wire::cluster(pb).map_err(|e| e.to_string())?;
        self.on_cluster(r, |c| *c = cluster);
        self.on_credentials(r, |c| *c = credentials);
        Ok(())
    }

    fn stored(&self) -> Result<Option<(Meta, Vec<u8>)>, Error> {
        let read = |k: &str| {
            self.snapshots
                .get(k)
                .map_err(|e| StorageIOError::read_snapshot(None, &e))
        };
        let (Some(meta), Some(data)) = (read("meta")?, read("data")?) else {
            return Ok(None);
        };
        let meta =
            serde_json::from_slice(&meta).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(Some((meta, data.to_vec())))
    }

    fn store(&self, meta: &Meta, data: &[u8]) -> Result<(), Error> {
        let fail = |e: &dyn std::error::Error| {
            StorageIOError::write_snapshot(Some(meta.signature()), openraft::AnyError::error(e))
        };
        let meta_json = serde_json::to_vec(meta).map_err(|e| fail(&e))?;
        let mut batch = sled::Batch::default();
        batch.insert("meta", meta_json);
        batch.insert("data", data);
        self.snapshots.apply_batch(batch).map_err(|e| fail(&e))?;
        self.snapshots.flush().map_err(|e| fail(&e))?;
        Ok(())
    }

    /// Replaces the replica's state with a snapshot's.
    fn install(&self, meta: &Meta, data: Vec<u8>) -> Result<(), Error> {
        let bad = |why: String| {
            StorageIOError::read_snapshot(Some(meta.signature()), openraft::AnyError::error(why))
        };
        let pb = st::Snapshot::decode(data.as_slice()).map_err(|e| bad(e.to_string()))?;
        let at = pb.at;
        let mut r = self.replica.lock();
        self.replace(&mut r, pb).map_err(bad)?;
        r.last_applied = meta.last_log_id;
        r.last_at = at;
        r.membership = meta.last_membership.clone();
        r.answers.clear();
        Ok(())
    }
}

/// Runs `f` through `with`, a target's `with_*` (which takes a `dyn FnMut`), and
/// returns what it returned.
fn through<T, R>(with: impl FnOnce(&mut dyn FnMut(&mut T)), f: impl FnOnce(&mut T) -> R) -> R {
    let (mut f, mut out) = (Some(f), None);
    with(&mut |t| out = f.take().map(|f| f(t)));
    out.expect("the target ran the closure")
}

impl RaftSnapshotBuilder<TypeConfig> for Machine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, Error> {
        let (data, meta) = {
            let mut r = self.replica.lock();
            let at = r.last_at;
            let mut pb = self.on_cluster(&mut r, |c| gpuctl_proto::wire::snapshot_pb(c, at));
            pb.credentials = Some(self.on_credentials(&mut r, |c| c.records()));
            let data = pb.encode_to_vec();
            let id = match r.last_applied {
                Some(l) => format!("{}-{}-{}", l.leader_id.term, l.leader_id.node_id, l.index),
                None => "empty".to_string(),
            };
            let meta = SnapshotMeta {
                last_log_id: r.last_applied,
                last_membership: r.membership.clone(),
                snapshot_id: id,
            };
            (data, meta)
        };
        self.store(&meta, &data)?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for Machine {
    type SnapshotBuilder = Machine;

    async fn applied_state(
        &mut self,
    ) -> Result<
        (
            Option<LogId<u64>>,
            StoredMembership<u64, openraft::BasicNode>,
        ),
        Error,
    > {
        let r = self.replica.lock();
        Ok((r.last_applied, r.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Reply>, Error>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        let mut r = self.replica.lock();
        for e in entries {
            r.last_applied = Some(e.log_id);
            match e.payload {
                EntryPayload::Blank => {}
                EntryPayload::Membership(m) => {
                    r.membership = StoredMembership::new(Some(e.log_id), m);
                }
                EntryPayload::Normal(p) => {
                    let bad = |why: String| {
                        StorageIOError::apply(e.log_id, openraft::AnyError::error(why))
                    };
                    let pb =
                        st::LogEntry::decode(p.entry.as_slice()).map_err(|x| bad(x.to_string()))?;
                    match pb.change {
                        Some(st::log_entry::Change::Import(snapshot)) => {
                            // A single controller's state adopted: it replaces this
                            // replica's.
                            let at = snapshot.at;
                            self.replace(&mut r, snapshot).map_err(bad)?;
                            r.last_at = at;
                            if p.from == self.me {
                                let done = (Ok(Applied::Done), Effects::default());
                                r.answers.insert((e.log_id.index, 0), done);
                            }
                            replies.push(Reply {});
                            continue;
                        }
                        Some(st::log_entry::Change::Credential(change)) => {
                            let at = pb.at;
                            let answer = self.on_credentials(&mut r, |c| c.apply(at, &change));
                            r.last_at = at;
                            if p.from == self.me {
                                let answer = (answer.map(|()| Applied::Done), Effects::default());
                                r.answers.insert((e.log_id.index, 0), answer);
                            }
                            replies.push(Reply {});
                            continue;
                        }
                        _ => {}
                    }
                    // Every part read before any applies: an entry applies whole or not.
                    let parts = (gpuctl_proto::wire::entry_parts(pb)
                        .map_err(|x| bad(x.to_string()))?)
                    .into_iter()
                    .map(|part| gpuctl_proto::wire::entry(part).map_err(|x| bad(x.to_string())))
                    .collect::<Result<Vec<_>, _>>()?;
                    for (i, entry) in parts.into_iter().enumerate() {
                        r.last_at = entry.at;
                        // What a store would write is dropped: a replica's durable
                        // state is its log and its snapshots.
                        let replay = self.replay_until.is_some_and(|u| e.log_id.index <= u);
                        let answer = quietly(replay, || {
                            self.on_cluster(&mut r, |c| {
                                let answer = c.apply(entry);
                                c.take_changes();
                                answer
                            })
                        });
                        if p.from == self.me {
                            r.answers.insert((e.log_id.index, i), answer);
                        }
                    }
                    while r.answers.len() > MAX_ANSWERS {
                        r.answers.pop_first();
                    }
                }
            }
            replies.push(Reply {});
            if self.replay_until == Some(e.log_id.index) {
                tracing::info!(
                    index = e.log_id.index,
                    "replayed this member's log after its last snapshot (its events were logged when first applied)"
                );
            }
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, Error> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), Error> {
        let data = snapshot.into_inner();
        self.install(meta, data.clone())?;
        self.store(meta, &data)?;
        tracing::info!(
            up_to = ?meta.last_log_id,
            bytes = data.len(),
            "installed the leader's snapshot"
        );
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, Error> {
        Ok(self.stored()?.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}
