//! Job reports the controller has not acknowledged yet, kept on disk so that a job's end
//! is never lost while the controller is away.

use std::path::PathBuf;
use std::sync::Mutex;

use gpuctl_proto as pb;
use prost::Message;

pub struct ReportQueue {
    path: PathBuf,
    queue: Mutex<Vec<pb::JobReport>>,
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
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<pb::JobReport>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn save(&self, q: &[pb::JobReport]) {
        let mut bytes = Vec::new();
        for r in q {
            r.encode_length_delimited(&mut bytes)
                .expect("Vec grows as needed");
        }
        let tmp = self.path.with_extension("tmp");
        let res = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = res {
            tracing::error!("cannot save job reports to {}: {e}", self.path.display());
        }
    }

    pub fn push(&self, r: pb::JobReport) {
        let mut q = self.lock();
        q.push(r);
        self.save(&q);
    }

    pub fn snapshot(&self) -> Vec<pb::JobReport> {
        self.lock().clone()
    }

    /// Removes reports the controller acknowledged.
    pub fn ack(&self, acked: &[pb::JobReport]) {
        let mut q = self.lock();
        let before = q.len();
        q.retain(|r| !acked.contains(r));
        if q.len() != before {
            self.save(&q);
        }
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
        let q = ReportQueue::open(path.clone()).unwrap();
        assert_eq!(q.snapshot(), vec![r(1), r(2)]);
        q.ack(&[r(1)]);
        let q = ReportQueue::open(path).unwrap();
        assert_eq!(q.snapshot(), vec![r(2)]);
    }
}
