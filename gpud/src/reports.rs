//! Job reports the controller has not acknowledged yet, kept on disk so that a job's end
//! is never lost while the controller is away.

use std::path::PathBuf;
use std::sync::Mutex;

use gpuctl_proto as pb;
use prost::Message;

/// The queue in memory, and its copy on disk. `push` and `ack` change the memory only
/// (they run on the agent's async worker, in the path from a job's end to the
/// controller); `persist` writes the copy, on a blocking thread, after the report is on
/// its way (see `Agent::report`).
pub struct ReportQueue {
    path: PathBuf,
    queue: Mutex<Vec<pb::JobReport>>,
    /// One write of the file at a time; each writes the queue as it is when it starts,
    /// so the last to finish holds the newest state.
    file: Mutex<()>,
}

impl ReportQueue {
    pub fn open(path: PathBuf) -> std::io::Result<ReportQueue> {
        let mut queue = Vec::new();
        match std::fs::read(&path) {
            Ok(bytes) => {
                let mut buf = bytes.as_slice();
                while !buf.is_empty() {
                    match pb::JobReport::decode_length_delimited(&mut buf) {
                        Ok(r) => queue.push(r),
                        Err(e) => {
                            tracing::warn!("{}: dropping an unreadable tail: {e}", path.display());
                            break;
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(ReportQueue {
            path,
            queue: Mutex::new(queue),
            file: Mutex::new(()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<pb::JobReport>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the queue as it is now to disk (blocking: call it off the async workers).
    pub fn persist(&self) {
        let _one_at_a_time = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let mut bytes = Vec::new();
        for r in self.lock().iter() {
            r.encode_length_delimited(&mut bytes)
                .expect("Vec grows as needed");
        }
        let tmp = self.path.with_extension("tmp");
        // Root's alone, whatever the umask: reports name jobs and their ends.
        let res = {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .and_then(|mut f| f.write_all(&bytes))
                .and_then(|()| std::fs::rename(&tmp, &self.path))
        };
        if let Err(e) = res {
            tracing::error!("cannot save job reports to {}: {e}", self.path.display());
        }
    }

    /// Queues a report (in memory: `persist` writes it).
    pub fn push(&self, r: pb::JobReport) {
        self.lock().push(r);
    }

    pub fn snapshot(&self) -> Vec<pb::JobReport> {
        self.lock().clone()
    }

    /// Removes reports the controller acknowledged (in memory); returns whether any was
    /// queued, i.e. whether the copy on disk is now out of date.
    pub fn ack(&self, acked: &[pb::JobReport]) -> bool {
        let mut q = self.lock();
        let before = q.len();
        q.retain(|r| !acked.contains(r));
        q.len() != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survives_reopen_and_acks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reports.pb");
        let r = |id| pb::JobReport {
            job_id: id,
            node: "n".into(),
            ..pb::JobReport::default()
        };
        let q = ReportQueue::open(path.clone()).unwrap();
        q.push(r(1));
        q.push(r(2));
        // In memory until persisted.
        assert!(
            ReportQueue::open(path.clone())
                .unwrap()
                .snapshot()
                .is_empty()
        );
        q.persist();
        let q = ReportQueue::open(path.clone()).unwrap();
        assert_eq!(q.snapshot(), vec![r(1), r(2)]);
        assert!(q.ack(&[r(1)]));
        assert!(!q.ack(&[r(1)]), "acking twice changes nothing");
        q.persist();
        let q = ReportQueue::open(path).unwrap();
        assert_eq!(q.snapshot(), vec![r(2)]);
    }
}
