//! A replicated leader's group commit: proposals made while earlier ones are still on
//! their way to a quorum wait in a queue and go to the log together, as one entry whose
//! parts apply in order and answer one by one (`LogBatch`). Openraft's cost is per
//! entry (its core, the log's append and flush, replication): 64 concurrent submits
//! shared about 2,600 entries a second before; now a few entries carry them all.
//!
//! A proposal alone on an idle log goes at once, as an entry of its own: batching costs
//! a lone request nothing, and the queue only fills behind entries already in flight.
//! Heartbeats are the exception: nobody waits on one (an agent sends the next in
//! seconds), and they come one at a time from thousands of agents, so a batch of
//! heartbeats alone lingers `LINGER` for more (or for any other proposal, which sends
//! it at once). Without that, 10,000 agents' 1,000 heartbeats a second were as many
//! entries, each a log flush and a round of wake-ups on every member, and three
//! controllers on two cores fell behind (docs/benchmarks.md).

use std::sync::Arc;

use gpuctl_core::log::{Change, Entry};
use prost::Message as _;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tonic::Status;

use super::Controller;
use super::raft::Answer;
use crate::raft::Proposal;

/// Proposals that may wait for the batcher; a caller beyond that waits to queue.
const QUEUE: usize = 4_096;
/// Entries on their way to a quorum at once: more wait and go together.
const IN_FLIGHT: usize = 4;
/// A batch's bounds: parts, and bytes (well under a peer's message limit, since
/// openraft sends several entries in one message).
const MAX_PARTS: usize = 512;
const MAX_BYTES: usize = 1 << 20;
/// How long a batch of heartbeats alone waits for more.
const LINGER: std::time::Duration = std::time::Duration::from_millis(25);

/// The leader's queue of proposals (`Controller::propose`), drained by `batch_loop`.
pub struct Proposals {
    tx: mpsc::Sender<Queued>,
    rx: parking_lot::Mutex<Option<mpsc::Receiver<Queued>>>,
}

struct Queued {
    /// A heartbeat's: it may wait for company (`LINGER`).
    lazy: bool,
    entry: gpuctl_proto::store::LogEntry,
    done: oneshot::Sender<Result<Answer, Status>>,
}

impl Default for Proposals {
    fn default() -> Proposals {
        let (tx, rx) = mpsc::channel(QUEUE);
        Proposals {
            tx,
            rx: parking_lot::Mutex::new(Some(rx)),
        }
    }
}

impl Controller {
    /// Proposes `change`, decided at `now`, and waits until it applied here: its answer
    /// (kept by the state machine for the entries this controller proposed). Proposals
    /// made together share an entry.
    pub(crate) async fn propose(&self, now: i64, change: Change) -> Result<Answer, Status> {
        let r = self.raft().expect("propose is for replicated controllers");
        let started = std::time::Instant::now();
        let lazy = matches!(change, Change::Heartbeat { .. });
        let entry = gpuctl_proto::wire::entry_pb(&Entry::new(now, change));
        let (done, answer) = oneshot::channel();
        let stopped =
            || Status::unavailable("this controller's Raft stopped; nothing was acknowledged");
        (r.proposals.tx.send(Queued { lazy, entry, done }).await).map_err(|_| stopped())?;
        let answer = answer.await.map_err(|_| stopped())?;
        (self.metrics.raft.commit_seconds).observe(started.elapsed().as_secs_f64());
        answer
    }

    /// Drains the queue of proposals for as long as the controller runs: what queued
    /// while `IN_FLIGHT` entries were on their way goes as one entry.
    pub(crate) async fn batch_loop(self: Arc<Self>) {
        let Some(r) = self.raft() else { return };
        let Some(mut queue) = r.proposals.rx.lock().take() else {
            return;
        };
        let slots = Arc::new(Semaphore::new(IN_FLIGHT));
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let Some(first) = queue.recv().await else {
                return;
            };
            let batch = gather(&mut queue, first).await;
            let (parts, waiters): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|q| (q.entry, q.done)).unzip();
            let entry = match <[_; 1]>::try_from(parts) {
                Ok([one]) => one,
                Err(parts) => gpuctl_proto::wire::batch_pb(parts),
            };
            let proposal = Proposal {
                from: r.me,
                entry: entry.encode_to_vec(),
            };
            let pending = match r.raft.client_write_ff(proposal).await {
                Ok(pending) => pending,
                Err(e) => {
                    let why = format!("this controller's Raft stopped: {e}");
                    for w in waiters {
                        let _ = w.send(Err(Status::unavailable(why.clone())));
                    }
                    continue;
                }
            };
            let ctl = self.clone();
            tokio::spawn(async move {
                match ctl.answers_of(pending, waiters.len()).await {
                    Ok(answers) => {
                        for (w, a) in waiters.into_iter().zip(answers) {
                            let _ = w.send(Ok(a));
                        }
                    }
                    Err(status) => {
                        for w in waiters {
                            let _ = w.send(Err(status.clone()));
                        }
                    }
                }
                drop(slot);
            });
        }
    }
}

/// A batch from `first` and what queued behind it; a batch of heartbeats alone waits up
/// to `LINGER` for more, and goes at once when anything else comes.
async fn gather(queue: &mut mpsc::Receiver<Queued>, first: Queued) -> Vec<Queued> {
    let until = tokio::time::Instant::now() + LINGER;
    let mut lazy = first.lazy;
    let mut bytes = first.entry.encoded_len();
    let mut batch = vec![first];
    while batch.len() < MAX_PARTS && bytes < MAX_BYTES {
        let next = match queue.try_recv() {
            Ok(next) => next,
            Err(_) if lazy => match tokio::time::timeout_at(until, queue.recv()).await {
                Ok(Some(next)) => next,
                Ok(None) | Err(_) => break,
            },
            Err(_) => break,
        };
        lazy &= next.lazy;
        bytes += next.entry.encoded_len();
        batch.push(next);
    }
    batch
}
