//! The journal: the one seam between a change decided under the lock and the change
//! made durable (issue 56). Every operation of the controller goes through it and none
//! asks whether the controller is replicated; that question is asked here, and only
//! here (`Controller::raft` is private to this module and its two halves).
//!
//! - **Alone** (`alone.rs`; no `--peers`): a change applies at once under the lock, the
//!   records it changed go to sled (`Controller::persist`), and one flush makes them
//!   durable before any answer that lets a caller forget something (group commit: every
//!   write before the flush rides on it).
//! - **Raft** (`raft.rs`, `batching.rs`; `--id N --peers ...`): a change is decided under
//!   the lock, proposed to the log (batched with the others in flight), and applied on
//!   every member once a quorum holds it; what it wrote is durable in the log before it
//!   applied, so there is nothing to flush.
//!
//! Both apply the same `gpuctl_core::log::Entry` to the same `Cluster::apply`: the
//! answers and effects are the same, only where the change is kept differs. A single
//! controller is not a Raft cluster of one: measured, openraft's per-entry round trip
//! (a task hop, a log append, a state machine apply) cost a sequential submit more
//! than the bound the issue set (docs/benchmarks.md, "One journal").

use std::sync::Arc;

use gpuctl_core::Refusal;
use gpuctl_core::log::{Applied, Change};
use gpuctl_proto::store::log_credential::Change as Credential;
use parking_lot::MutexGuard;
use tonic::Status;

use super::{Controller, Out, Shared, now_ms, store_status};

mod alone;
mod batching;
mod cancels;
mod raft;

pub(crate) use cancels::OpenCancels;

pub use raft::{Repl, Shell};

/// An admitted submit: its first job's id and the notes admission made, or `Err(id)`
/// for a repeated request (its job's id).
pub(super) type Admitted = Result<(u64, Vec<String>), u64>;

impl Controller {
    /// This controller's part in a replicated cluster (`None`: it runs alone). Private to
    /// the journal: the rest of the controller never branches on it.
    fn raft(&self) -> Option<&Repl> {
        self.repl.get()
    }

    /// Starts this controller's part in a replicated cluster (once, at start).
    pub fn set_replicated(&self, repl: Repl) {
        if self.repl.set(repl).is_err() {
            panic!("the controller's Raft is set once");
        }
    }

    /// While a single controller's state is being adopted into a new replicated cluster
    /// (`adopt`), this member does not serve as leader.
    pub fn set_importing(&self) {
        if let Some(r) = self.raft() {
            (r.importing).store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Applies what `decide` decided under the lock: alone, at once (the decision and
    /// its apply under one hold of the lock, the records written, not yet flushed: the
    /// caller's `deliver` does); on Raft, through the log (the decision under the lock,
    /// the apply once a quorum holds the entry). `then` reads the answer under the lock;
    /// what is left to do is returned.
    pub(super) async fn commit<T, R>(
        &self,
        decide: impl FnOnce(&mut Shared, i64) -> Result<(Change, T), Status>,
        then: impl FnOnce(&mut Shared, T, Result<Applied, Refusal>) -> Result<R, Status>,
    ) -> Result<(R, Out), Status> {
        if self.raft().is_none() {
            let mut c = self.lock();
            let now = now_ms();
            let (change, t) = decide(&mut c, now)?;
            let (answer, effects) = c.apply(now, change);
            let r = then(&mut c, t, answer);
            let out = self.settle(c, effects).map_err(store_status)?;
            return Ok((r?, out));
        }
        let (now, change, t) = {
            let mut c = self.lock();
            let now = now_ms();
            let (change, t) = decide(&mut c, now)?;
            (now, change, t)
        };
        let (answer, effects) = self.propose(now, change).await?;
        let mut c = self.lock();
        let r = then(&mut c, t, answer);
        let (sends, wake) = c.route(effects);
        let out = Out {
            sends,
            wake,
            wrote: false,
        };
        Ok((r?, out))
    }

    /// Admits a submit's records (`hold`: held at submit) and makes them part of the
    /// state; `defer` is set when its pass may wait (`Shared::defers`). Alone the records
    /// are written (not yet flushed: `durable`); on Raft they are in the log.
    pub(super) async fn admit(
        &self,
        actor: &gpuctl_core::Actor,
        spec: gpuctl_core::record::JobSpec,
        request_id: &str,
        hold: bool,
        defer: &mut bool,
    ) -> Result<Admitted, Status> {
        match self.raft() {
            None => self.admit_alone(actor, spec, request_id, hold, defer),
            Some(_) => {
                self.admit_replicated(actor, spec, request_id, hold, defer)
                    .await
            }
        }
    }

    /// Makes everything written so far durable before an answer that lets its caller
    /// forget something (alone: a flush of sled; on Raft what applied is in the log).
    pub(super) async fn durable(&self) -> Result<(), Status> {
        if self.raft().is_some() {
            return Ok(());
        }
        self.store.flush().await.map_err(store_status)
    }

    /// Whether an operation's delivery flushes before it sends (`wrote`: it wrote
    /// records; `always`: its answer must find everything durable).
    pub(super) fn flush_due(&self, wrote: bool, always: bool) -> bool {
        (wrote || always) && self.raft().is_none()
    }

    /// One scheduling pass: alone, under the lock in parts (`pass_alone`); on Raft, the
    /// leader's, its parts through the log (`replicated_pass`).
    pub async fn schedule_pass(self: &Arc<Self>) -> Result<(), crate::store::StoreError> {
        if self.raft().is_none() {
            return self.pass_alone().await;
        }
        if let Err(e) = self.replicated_pass().await {
            tracing::warn!("scheduling pass not applied: {}", e.message());
        }
        Ok(())
    }

    /// Applies a credential change decided at `now` (`Pki`): alone it applies and is
    /// durable before the answer; on Raft it is proposed and answered once it applied (a
    /// follower refuses, naming the leader).
    pub(super) async fn record(&self, now: i64, change: Credential) -> Result<(), Status> {
        match self.raft() {
            None => self.record_alone(now, change).await,
            Some(_) => self.record_replicated(now, change).await,
        }
    }

    /// How often the node watchdog sweeps for silent agents, in rounds of a second: every
    /// round alone; on Raft a sweep is an entry, so every 30th.
    pub(super) fn sweep_due(&self, round: u64) -> bool {
        self.raft().is_none() || round.is_multiple_of(30)
    }

    /// An agent's stream closed (`c`: the lock, its link already dropped): alone its
    /// session ends at once; on Raft the leader proposes the end without waiting for it
    /// (a deposed leader's is refused: the new one hands out new sessions anyway).
    pub(super) fn end_session(self: &Arc<Self>, mut c: MutexGuard<'_, Shared>, change: Change) {
        if self.raft().is_none() {
            c.apply_sure(now_ms(), change);
            return;
        }
        drop(c);
        if self.is_leader() {
            let ctl = self.clone();
            tokio::spawn(async move {
                let _ = ctl.propose(now_ms(), change).await;
            });
        }
    }

    /// At shutdown, with every agent's stream dropped: alone the sessions end with them;
    /// on Raft they are replicated state and the agents attach to the next leader, which
    /// hands out new ones.
    pub(super) fn streams_closed(&self, c: &mut Shared) {
        if self.raft().is_none() {
            c.core.leader().end_sessions();
        }
    }
}
