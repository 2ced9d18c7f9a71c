//! The controller's durable state in sled: jobs, nodes and the job id counter.
//!
//! Records are protobuf (`gpuctl_proto::store`). Keys: `meta/schema`, `meta/next_job_id`,
//! `job/<id as 8 big-endian bytes>`, `node/<name>`, `token/<id>`, `cancel/<seq as 8
//! big-endian bytes>` (a large cancel of pending jobs until its jobs' records are
//! written: `put_cancel`). A state dir written by an incompatible version is refused at
//! open.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use gpuctl_core::jobs::PendingCancel;
use gpuctl_core::record::{Record, UsageRecord};
use gpuctl_proto::record::{BadRecord, encode_record, upgrade_record};
use gpuctl_proto::store::{
    StoredCancel, StoredJob, StoredJoinToken, StoredNode, StoredNodeIdentity, StoredToken,
    StoredUsage,
};
use prost::Message;

const SCHEMA_KEY: &[u8] = b"meta/schema";
/// sled's log segment size for new state dirs.
const SEGMENT_BYTES: usize = 8 << 20;

/// The segment size of an existing sled dir (its `conf` file), or `SEGMENT_BYTES`.
fn segment_size(db: &Path) -> usize {
    std::fs::read_to_string(db.join("conf"))
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("segment_size: "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(SEGMENT_BYTES)
}

/// sled's page cache.
const CACHE_BYTES: u64 = 64 << 20;
/// Bump when a change makes old state unreadable.
pub const SCHEMA: &str = "gpuctld-store-v1";
const NEXT_ID_KEY: &[u8] = b"meta/next_job_id";
const JOB_PREFIX: &[u8] = b"job/";
const NODE_PREFIX: &[u8] = b"node/";
const TOKEN_PREFIX: &[u8] = b"token/";
const USAGE_KEY: &[u8] = b"meta/usage";
const JOIN_TOKEN_PREFIX: &[u8] = b"jointoken/";
const IDENTITY_PREFIX: &[u8] = b"identity/";
const CANCEL_PREFIX: &[u8] = b"cancel/";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Not retryable: the directory is locked by another gpuctld, unreadable, or not sled.
    #[error("cannot open state dir {dir}: {source} (is another gpuctld using it?)")]
    Open {
        dir: String,
        #[source]
        source: sled::Error,
    },
    /// Not retryable: written by another version of gpuctld.
    #[error(
        "state dir {dir} was written by an incompatible version ({found}); this gpuctld reads {SCHEMA}. Use a matching gpuctld or a new --state-dir"
    )]
    Incompatible { dir: String, found: String },
    /// Not retryable: a record does not decode.
    #[error("corrupt record {key} in state dir: {source}")]
    Corrupt {
        key: String,
        #[source]
        source: prost::DecodeError,
    },
    /// Not retryable: a job record decodes but is not a job this version knows.
    #[error("bad job record {key} in state dir: {source}")]
    BadJob {
        key: String,
        #[source]
        source: BadRecord,
    },
    /// Not retryable: a record's key is not one this version writes.
    #[error("bad key {key} in state dir")]
    BadKey { key: String },
    /// Not retryable: the job id counter is not 8 bytes.
    #[error("corrupt job id counter in state dir")]
    CorruptCounter,
    /// Retryable: an I/O error from sled.
    #[error("state store I/O error: {0}")]
    Io(#[from] sled::Error),
    /// Retryable: a flush did not finish in time (a full or failing disk); nothing
    /// waiting on it is acknowledged.
    #[error("the state store did not reach the disk within {0:?} (is the disk full or failing?)")]
    Stalled(std::time::Duration),
    /// Retryable: an earlier write or flush failed, and the store takes no more until
    /// the controller restarts from its durable state (it does so by itself once the
    /// disk has room).
    #[error(
        "the state store failed earlier (is the disk full or failing?) and writes nothing until it restarts"
    )]
    Failed,
}

impl StoreError {
    /// Whether a retry may succeed once the disk has space or recovers.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Io(_) | StoreError::Stalled(_) | StoreError::Failed
        )
    }
}

/// How long one flush may take before callers get `Stalled` instead of waiting.
pub const FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Everything read back at start.
#[derive(Debug, Default)]
pub struct Loaded {
    pub jobs: Vec<Record>,
    /// The ids of job records read in an older layout (upgraded in the reading).
    pub upgraded: Vec<u64>,
    pub nodes: Vec<StoredNode>,
    pub tokens: Vec<StoredToken>,
    pub join_tokens: Vec<StoredJoinToken>,
    /// Nodes' certificates and key epochs.
    pub identities: Vec<StoredNodeIdentity>,
    /// Fair share's decayed usage, if any was written.
    pub usage: Option<UsageRecord>,
    /// The next job id to hand out (ids start at 1).
    pub next_job_id: u64,
    /// Cancels kept as one record each (`put_cancel`), by their number, in order.
    pub cancels: Vec<(u64, PendingCancel)>,
}

#[derive(Clone)]
pub struct Store {
    db: sled::Db,
    commit: Arc<GroupCommit>,
    dir: std::path::PathBuf,
    /// How long each durable commit took (a metric).
    commit_seconds: prometheus_client::metrics::histogram::Histogram,
}

/// Group commit: one flush at a time, and each covers every write made before it
/// started, so callers that arrive during a flush share the next one. (sled's own
/// `flush_async` deadlocks when called concurrently, sled issue #1308; this uses the
/// blocking `flush` on the blocking pool instead.)
#[derive(Default)]
struct GroupCommit {
    /// Writes completed so far.
    written: AtomicU64,
    /// Writes known durable.
    flushed: AtomicU64,
    lock: tokio::sync::Mutex<()>,
    /// Flushes actually done (for tests and stats).
    flushes: AtomicU64,
    /// A write or flush failed with the disk full or stalled: sled does not recover
    /// from that in place (its flushes hang), so the daemon restarts itself from the
    /// durable state once space is back (`daemon::restart_when_disk_recovers`).
    failed: std::sync::atomic::AtomicBool,
}

/// A key as errors show it: a job's as `job/ID` (its id is 8 binary bytes), others as
/// text.
fn key_text(k: &[u8]) -> String {
    match k.strip_prefix(JOB_PREFIX).map(<[u8; 8]>::try_from) {
        Some(Ok(id)) => format!("job/{}", u64::from_be_bytes(id)),
        _ => String::from_utf8_lossy(k).into_owned(),
    }
}

fn job_key(id: u64) -> Vec<u8> {
    [JOB_PREFIX, &id.to_be_bytes()].concat()
}

fn cancel_key(seq: u64) -> Vec<u8> {
    [CANCEL_PREFIX, &seq.to_be_bytes()].concat()
}

fn stored_cancel(c: &PendingCancel) -> Vec<u8> {
    let stored = StoredCancel {
        at_ms: c.at,
        reason: c.reason.clone(),
        job_ids: c.ids.clone(),
    };
    stored.encode_to_vec()
}

fn node_key(name: &str) -> Vec<u8> {
    [NODE_PREFIX, name.as_bytes()].concat()
}

/// Opens sled in `dir/db`. sled's file lock outlives a dropped handle for a moment (its
/// flusher thread lets go of the database last), so a lock held elsewhere is retried for
/// up to `LOCK_WAIT` before it is reported: a store reopened in the same process (tests,
/// a controller restarting its state) does not fail on its own shadow, and a second
/// gpuctld on the same directory is still refused.
fn open_db(dir: &Path) -> sled::Result<sled::Db> {
    const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
    let start = std::time::Instant::now();
    loop {
        let opened = sled::Config::new()
            .path(dir.join("db"))
            // Jobs of up to `limits.max_job_bytes` stay inline in sled's log (values over
            // a quarter segment become blob files that sled 0.34 does not remove when they
            // are overwritten or deleted: 2,000 large jobs left 630 MB of them). A state
            // dir created with another segment size keeps its own (sled refuses a change).
            .segment_size(segment_size(&dir.join("db")))
            // sled's default page cache is 1 GiB: the controller's memory would grow to
            // it with old versions of large (since compacted) jobs.
            .cache_capacity(CACHE_BYTES)
            .open();
        match opened {
            Err(sled::Error::Io(e))
                if e.kind() == std::io::ErrorKind::WouldBlock && start.elapsed() < LOCK_WAIT =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

impl Store {
    /// The sled database (replicated controllers keep their Raft log in it too).
    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let shown = dir.display().to_string();
        let db = open_db(dir).map_err(|source| StoreError::Open {
            dir: shown.clone(),
            source,
        })?;
        match db.get(SCHEMA_KEY)? {
            Some(v) if v.as_ref() == SCHEMA.as_bytes() => {}
            Some(v) => {
                return Err(StoreError::Incompatible {
                    dir: shown,
                    found: String::from_utf8_lossy(&v).into_owned(),
                });
            }
            None if db.is_empty() => {
                db.insert(SCHEMA_KEY, SCHEMA.as_bytes())?;
                db.flush()?;
            }
            None => {
                return Err(StoreError::Incompatible {
                    dir: shown,
                    found: "no schema record".into(),
                });
            }
        }
        Ok(Store {
            db,
            commit: Arc::default(),
            dir: dir.to_path_buf(),
            commit_seconds: prometheus_client::metrics::histogram::Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 16),
            ),
        })
    }

    /// The histogram of durable commit times.
    pub fn commit_seconds(&self) -> prometheus_client::metrics::histogram::Histogram {
        self.commit_seconds.clone()
    }

    /// Bytes free to unprivileged writers on the state dir's filesystem (`None` when
    /// it cannot be read).
    pub fn free_bytes(&self) -> Option<u64> {
        let st = nix::sys::statvfs::statvfs(&self.dir).ok()?;
        Some((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
    }

    pub fn load(&self) -> Result<Loaded, StoreError> {
        let mut loaded = Loaded {
            next_job_id: 1,
            ..Loaded::default()
        };
        if let Some(v) = self.db.get(NEXT_ID_KEY)? {
            let bytes: [u8; 8] = v
                .as_ref()
                .try_into()
                .map_err(|_| StoreError::CorruptCounter)?;
            loaded.next_job_id = u64::from_be_bytes(bytes);
        }
        for (key, mut stored) in self.scan_keyed::<StoredJob>(JOB_PREFIX)? {
            let upgraded = upgrade_record(&mut stored);
            let record =
                Record::try_from(stored).map_err(|source| StoreError::BadJob { key, source })?;
            if upgraded {
                loaded.upgraded.push(record.job.id);
            }
            loaded.jobs.push(record);
        }
        for kv in self.db.scan_prefix(CANCEL_PREFIX) {
            let (k, v) = kv?;
            let key = key_text(&k);
            let seq = (k.strip_prefix(CANCEL_PREFIX))
                .and_then(|n| <[u8; 8]>::try_from(n).ok())
                .map(u64::from_be_bytes);
            let Some(seq) = seq else {
                return Err(StoreError::BadKey { key });
            };
            let c = StoredCancel::decode(v.as_ref())
                .map_err(|source| StoreError::Corrupt { key, source })?;
            let cancel = PendingCancel {
                at: c.at_ms,
                reason: c.reason,
                ids: c.job_ids,
            };
            loaded.cancels.push((seq, cancel));
        }
        loaded.nodes = self.scan(NODE_PREFIX)?;
        loaded.tokens = self.scan(TOKEN_PREFIX)?;
        loaded.join_tokens = self.scan(JOIN_TOKEN_PREFIX)?;
        loaded.identities = self.scan(IDENTITY_PREFIX)?;
        if let Some(v) = self.db.get(USAGE_KEY)? {
            let u = StoredUsage::decode(v.as_ref()).map_err(|source| StoreError::Corrupt {
                key: String::from_utf8_lossy(USAGE_KEY).into_owned(),
                source,
            })?;
            loaded.usage = Some(u.into());
        }
        Ok(loaded)
    }

    /// Writes a new job and the advanced id counter atomically. Durable after `flush`.
    pub fn insert_new_job(&self, job: &Record, next_job_id: u64) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        batch.insert(job_key(job.job.id), encode_record(job));
        batch.insert(NEXT_ID_KEY, &next_job_id.to_be_bytes());
        self.check(self.db.apply_batch(batch).map_err(StoreError::from))?;
        self.wrote();
        Ok(())
    }

    /// Writes the tasks of a job array and the advanced id counter atomically.
    pub fn insert_new_jobs(&self, jobs: &[Record], next_job_id: u64) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for job in jobs {
            batch.insert(job_key(job.job.id), encode_record(job));
        }
        batch.insert(NEXT_ID_KEY, &next_job_id.to_be_bytes());
        self.check(self.db.apply_batch(batch).map_err(StoreError::from))?;
        self.wrote();
        Ok(())
    }

    /// Writes a cancel of pending jobs as one record numbered `seq`, in place of its
    /// jobs' (the cancel's answer waits for this one write, not thousands): their records
    /// follow in `settle_cancel`. Durable after `flush`.
    pub fn put_cancel(&self, seq: u64, cancel: &PendingCancel) -> Result<(), StoreError> {
        let written = self.db.insert(cancel_key(seq), stored_cancel(cancel));
        self.check(written.map(|_| ()).map_err(StoreError::from))?;
        self.wrote();
        Ok(())
    }

    /// Writes some jobs of cancel `seq` (`jobs`: their records as they are now) and, in
    /// the same atomic batch, the cancel record with the jobs left (`left`; none: the
    /// record goes). Durable after `flush`.
    pub fn settle_cancel(
        &self,
        seq: u64,
        jobs: &[&Record],
        left: Option<&PendingCancel>,
    ) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for job in jobs {
            batch.insert(job_key(job.job.id), encode_record(job));
        }
        match left {
            Some(c) => batch.insert(cancel_key(seq), stored_cancel(c)),
            None => batch.remove(cancel_key(seq)),
        }
        self.check(self.db.apply_batch(batch).map_err(StoreError::from))?;
        self.wrote();
        Ok(())
    }

    /// Removes cancel records once their jobs are written (at start). Durable after
    /// `flush`.
    pub fn delete_cancels(&self, seqs: impl IntoIterator<Item = u64>) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for seq in seqs {
            batch.remove(cancel_key(seq));
        }
        self.check(self.db.apply_batch(batch).map_err(StoreError::from))?;
        self.wrote();
        Ok(())
    }

    pub fn put_job(&self, job: &Record) -> Result<(), StoreError> {
        self.put_job_bytes(job.job.id, &encode_record(job))
    }

    /// Writes a job record's bytes as they are: for tests that write what an older
    /// version wrote (the controller writes `Record`s with `put_job`).
    pub fn put_job_bytes(&self, id: u64, bytes: &[u8]) -> Result<(), StoreError> {
        self.check(
            self.db
                .insert(job_key(id), bytes)
                .map(|_| ())
                .map_err(StoreError::from),
        )?;
        self.wrote();
        Ok(())
    }

    /// Removes a job's record (retention). Durable after `flush`.
    pub fn delete_job(&self, id: u64) -> Result<(), StoreError> {
        self.check(
            self.db
                .remove(job_key(id))
                .map(|_| ())
                .map_err(StoreError::from),
        )?;
        self.wrote();
        Ok(())
    }

    /// Writes fair share's usage. Durable after `flush`.
    pub fn put_usage(&self, usage: &UsageRecord) -> Result<(), StoreError> {
        self.check(
            self.db
                .insert(USAGE_KEY, StoredUsage::from(usage).encode_to_vec())
                .map(|_| ())
                .map_err(StoreError::from),
        )?;
        self.wrote();
        Ok(())
    }

    pub fn put_node(&self, node: &StoredNode) -> Result<(), StoreError> {
        self.check(
            self.db
                .insert(node_key(&node.name), node.encode_to_vec())
                .map_err(StoreError::from),
        )?;
        self.wrote();
        Ok(())
    }

    /// Every record under `prefix`; one that does not decode is `Corrupt`, named.
    fn scan<T: Message + Default>(&self, prefix: &[u8]) -> Result<Vec<T>, StoreError> {
        Ok(self
            .scan_keyed(prefix)?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }

    /// The records under `prefix`, each with its key as shown in errors.
    fn scan_keyed<T: Message + Default>(
        &self,
        prefix: &[u8],
    ) -> Result<Vec<(String, T)>, StoreError> {
        let mut out = Vec::new();
        for kv in self.db.scan_prefix(prefix) {
            let (k, v) = kv?;
            let key = key_text(&k);
            match T::decode(v.as_ref()) {
                Ok(t) => out.push((key, t)),
                Err(source) => return Err(StoreError::Corrupt { key, source }),
            }
        }
        Ok(out)
    }

    pub fn put_join_token(&self, t: &StoredJoinToken) -> Result<(), StoreError> {
        let key = [JOIN_TOKEN_PREFIX, t.hash.as_bytes()].concat();
        self.check(
            self.db
                .insert(key, t.encode_to_vec())
                .map(|_| ())
                .map_err(StoreError::from),
        )?;
        self.wrote();
        Ok(())
    }

    /// A used join token out, and the node's identity in, atomically.
    pub fn joined(&self, used: Option<&str>, id: &StoredNodeIdentity) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        if let Some(hash) = used {
            batch.remove([JOIN_TOKEN_PREFIX, hash.as_bytes()].concat());
        }
        batch.insert(
            [IDENTITY_PREFIX, id.node.as_bytes()].concat(),
            id.encode_to_vec(),
        );
        self.check(self.db.apply_batch(batch).map_err(StoreError::from))?;
        self.wrote();
        Ok(())
    }

    pub fn put_token(&self, t: &StoredToken) -> Result<(), StoreError> {
        self.db
            .insert([TOKEN_PREFIX, t.id.as_bytes()].concat(), t.encode_to_vec())?;
        self.wrote();
        Ok(())
    }

    pub fn delete_token(&self, id: &str) -> Result<(), StoreError> {
        self.db.remove([TOKEN_PREFIX, id.as_bytes()].concat())?;
        self.wrote();
        Ok(())
    }

    /// Whether the store has failed (see `GroupCommit::failed`).
    pub fn failed(&self) -> bool {
        self.commit.failed.load(Ordering::Acquire)
    }

    fn check<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &r
            && e.retryable()
        {
            if !self.failed() {
                tracing::error!("state store failed: {e}; submits are refused until it recovers");
            }
            self.commit.failed.store(true, Ordering::Release);
        }
        r
    }

    fn wrote(&self) {
        self.commit.written.fetch_add(1, Ordering::AcqRel);
    }

    /// Makes every write made before the call durable (group commit: concurrent
    /// callers share flushes).
    pub async fn flush(&self) -> Result<(), StoreError> {
        let c = &self.commit;
        let target = c.written.load(Ordering::Acquire);
        if c.flushed.load(Ordering::Acquire) >= target {
            return Ok(());
        }
        let _one_at_a_time = c.lock.lock().await;
        if c.flushed.load(Ordering::Acquire) >= target {
            return Ok(());
        }
        let upto = c.written.load(Ordering::Acquire);
        let db = self.db.clone();
        let started = std::time::Instant::now();
        // A flush stuck on a full disk must not hold every later caller (and shutdown)
        // forever: they get `Stalled` and may retry.
        if self.failed() {
            return Err(StoreError::Failed);
        }
        let flushed = tokio::time::timeout(
            FLUSH_TIMEOUT,
            tokio::task::spawn_blocking(move || db.flush()),
        )
        .await;
        match flushed {
            Ok(r) => {
                self.check(r.expect("sled flush panicked").map_err(StoreError::from))?;
            }
            Err(_) => return self.check(Err(StoreError::Stalled(FLUSH_TIMEOUT))),
        }
        c.flushed.fetch_max(upto, Ordering::AcqRel);
        c.flushes.fetch_add(1, Ordering::Relaxed);
        self.commit_seconds.observe(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// How many flushes reached the disk (group commit makes this far fewer than the
    /// acknowledged writes).
    pub fn flushes(&self) -> u64 {
        self.commit.flushes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_core::record::Job;

    fn job(id: u64) -> Record {
        Record {
            job: Job {
                id,
                ..Job::default()
            },
            ..Record::default()
        }
    }

    #[test]
    fn roundtrip_and_counter() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            assert_eq!(s.load().unwrap().next_job_id, 1);
            s.insert_new_job(&job(1), 2).unwrap();
            s.insert_new_job(&job(2), 3).unwrap();
            s.put_node(&StoredNode {
                name: "n1".into(),
                ..StoredNode::default()
            })
            .unwrap();
            s.db.flush().unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        let l = s.load().unwrap();
        assert_eq!(l.next_job_id, 3);
        let ids: Vec<u64> = l.jobs.iter().map(|j| j.job.id).collect();
        assert_eq!(ids, vec![1, 2]);
        assert_eq!(l.nodes[0].name, "n1");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_flushes_share_and_complete() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let tasks: Vec<_> = (1..=200u64)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move {
                    s.insert_new_job(&job(i), i + 1).unwrap();
                    s.flush().await.unwrap();
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert!(s.flushes() >= 1);
        assert!(
            s.flushes() < 200,
            "group commit shared no flush: {}",
            s.flushes()
        );
        assert_eq!(s.load().unwrap().jobs.len(), 200);
        // Nothing written since: no flush needed.
        let before = s.flushes();
        s.flush().await.unwrap();
        assert_eq!(s.flushes(), before);
    }

    #[test]
    fn incompatible_schema_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            s.db.insert(SCHEMA_KEY, b"gpuctld-store-v999".as_slice())
                .unwrap();
            s.db.flush().unwrap();
        }
        let err = Store::open(dir.path()).err().unwrap().to_string();
        assert!(
            err.contains("incompatible version (gpuctld-store-v999)"),
            "{err}"
        );
    }

    /// A job record in a state this version does not know (a newer controller's, or
    /// none) stops the load with its key: it is not read as some other state.
    #[test]
    fn a_job_record_in_an_unknown_state_is_refused_with_its_key() {
        use gpuctl_proto::Job as PbJob;
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        s.insert_new_job(&job(1), 2).unwrap();
        let newer = StoredJob {
            job: Some(PbJob {
                id: 2,
                state: 99,
                ..PbJob::default()
            }),
            ..StoredJob::default()
        };
        s.put_job_bytes(2, &newer.encode_to_vec()).unwrap();
        let err = s.load().err().unwrap();
        assert!(matches!(err, StoreError::BadJob { .. }), "{err}");
        let text = err.to_string();
        assert_eq!(
            text,
            "bad job record job/2 in state dir: unknown job state 99"
        );
        s.delete_job(2).unwrap();
        assert_eq!(s.load().unwrap().jobs.len(), 1, "the others read as ever");
    }
}
