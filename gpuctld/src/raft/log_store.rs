//! The Raft log and vote in sled: one tree of entries by index (big-endian, so sled's
//! order is the log's), one of the vote, the committed id and the last purged id. An
//! append is acknowledged to openraft only once sled has flushed it (a vote likewise
//! before it is answered): what a quorum acknowledged survives a crash of any of them.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LogId, LogState, OptionalSend, RaftLogReader,
    StorageError, StorageIOError, Vote,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::TypeConfig;

type Error = StorageError<u64>;

/// The log and vote of one controller (cheap to clone: sled's trees are shared).
#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
}

impl LogStore {
    pub fn open(db: &sled::Db) -> sled::Result<LogStore> {
        Ok(LogStore {
            db: db.clone(),
            log: db.open_tree("raft_log")?,
            meta: db.open_tree("raft_meta")?,
        })
    }

    fn get_meta<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, Error> {
        let Some(v) = self.meta.get(key).map_err(|e| StorageIOError::read(&e))? else {
            return Ok(None);
        };
        let t = serde_json::from_slice(&v).map_err(|e| StorageIOError::read(&e))?;
        Ok(Some(t))
    }

    async fn put_meta<T: Serialize>(&self, key: &str, value: &T) -> Result<(), Error> {
        let v = serde_json::to_vec(value).map_err(|e| StorageIOError::write(&e))?;
        self.meta
            .insert(key, v)
            .map_err(|e| StorageIOError::write(&e))?;
        self.flush().await.map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }

    /// Makes every write so far durable, on a blocking thread: sled's `flush_async`
    /// waits on its own flusher (hundreds of ms a call on the development VM), as the
    /// store found (`Store::flush`).
    async fn flush(&self) -> std::io::Result<()> {
        let db = self.db.clone();
        match tokio::task::spawn_blocking(move || db.flush()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(std::io::Error::other(e)),
            Err(e) => Err(std::io::Error::other(e)),
        }
    }

    /// The index of the last entry kept (at start: what this member had before).
    pub fn last_index(&self) -> Option<u64> {
        self.last_entry_id().ok().flatten().map(|id| id.index)
    }

    fn last_entry_id(&self) -> Result<Option<LogId<u64>>, Error> {
        let Some((_, v)) = self.log.last().map_err(|e| StorageIOError::read_logs(&e))? else {
            return Ok(None);
        };
        Ok(Some(decode(&v)?.log_id))
    }
}

fn key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// An entry as the log keeps it: a kind byte, its log id (term, leader, index, big
/// endian), then for a proposal its proposer and the `LogEntry` bytes as they are, for
/// a membership change its JSON (rare): a third the size of the entry as JSON (whose
/// payload would be base64). Writes per second were the same either way (the bench).
fn encode(e: &Entry<TypeConfig>) -> Result<Vec<u8>, Error> {
    let id = &e.log_id;
    let mut v = Vec::with_capacity(33 + 256);
    let kind = match &e.payload {
        EntryPayload::Blank => 0u8,
        EntryPayload::Normal(_) => 1,
        EntryPayload::Membership(_) => 2,
    };
    v.push(kind);
    v.extend_from_slice(&id.leader_id.term.to_be_bytes());
    v.extend_from_slice(&id.leader_id.node_id.to_be_bytes());
    v.extend_from_slice(&id.index.to_be_bytes());
    match &e.payload {
        EntryPayload::Blank => {}
        EntryPayload::Normal(p) => {
            v.extend_from_slice(&p.from.to_be_bytes());
            v.extend_from_slice(&p.entry);
        }
        EntryPayload::Membership(m) => {
            serde_json::to_writer(&mut v, m).map_err(|x| StorageIOError::write_logs(&x))?;
        }
    }
    Ok(v)
}

fn decode(v: &[u8]) -> Result<Entry<TypeConfig>, Error> {
    let bad = |why: &str| StorageIOError::read_logs(&std::io::Error::other(why.to_string()));
    let word = |at: usize| -> Result<u64, Error> {
        let b = v
            .get(at..at + 8)
            .ok_or_else(|| bad("a log record cut short"))?;
        Ok(u64::from_be_bytes(b.try_into().expect("8 bytes")))
    };
    let (term, node, index) = (word(1)?, word(9)?, word(17)?);
    let log_id = LogId::new(CommittedLeaderId::new(term, node), index);
    let payload = match v.first() {
        Some(0) => EntryPayload::Blank,
        Some(1) => EntryPayload::Normal(super::Proposal {
            from: word(25)?,
            entry: v[33..].to_vec(),
        }),
        Some(2) => EntryPayload::Membership(
            serde_json::from_slice(&v[25..]).map_err(|e| StorageIOError::read_logs(&e))?,
        ),
        _ => return Err(bad("a log record of no known kind").into()),
    };
    Ok(Entry { log_id, payload })
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, Error> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i + 1,
            Bound::Unbounded => 0,
        };
        let iter = match range.end_bound() {
            Bound::Included(&i) => self.log.range(key(start)..=key(i)),
            Bound::Excluded(&i) => self.log.range(key(start)..key(i)),
            Bound::Unbounded => self.log.range(key(start)..),
        };
        iter.map(|kv| decode(&kv.map_err(|e| StorageIOError::read_logs(&e))?.1))
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, Error> {
        let last_purged_log_id: Option<LogId<u64>> = self.get_meta("purged")?;
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), Error> {
        self.put_meta("vote", vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, Error> {
        self.get_meta("vote")
    }

    /// Kept without a flush of its own: it reaches the disk with the next append or
    /// vote, and a committed id lost in a crash only means that a restarted controller
    /// re-applies less of its log before the leader tells it the rest (openraft's
    /// contract: an older committed id is always safe).
    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<(), Error> {
        let v = serde_json::to_vec(&committed).map_err(|e| StorageIOError::write(&e))?;
        self.meta
            .insert("committed", v)
            .map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, Error> {
        Ok(self.get_meta::<Option<LogId<u64>>>("committed")?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), Error>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for e in entries {
            let v = encode(&e)?;
            batch.insert(&key(e.log_id.index), v);
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        callback.log_io_completed(self.flush().await);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), Error> {
        let mut batch = sled::Batch::default();
        for kv in self.log.range(key(log_id.index)..) {
            batch.remove(kv.map_err(|e| StorageIOError::write_logs(&e))?.0);
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), Error> {
        self.put_meta("purged", &log_id).await?;
        let mut batch = sled::Batch::default();
        for kv in self.log.range(..=key(log_id.index)) {
            batch.remove(kv.map_err(|e| StorageIOError::write_logs(&e))?.0);
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}
