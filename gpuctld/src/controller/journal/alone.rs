//! The journal alone (one controller, no `--peers`): a change applies at once under the
//! lock and the records it changed are written to sled (`persist`); one flush makes
//! everything written so far durable (`Store::flush`, whose concurrent callers share
//! one). A scheduling pass runs here in parts under short holds of the lock.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use gpuctl_core::Effects;
use gpuctl_core::log::{Applied, Change, Wait};
use gpuctl_core::ops::Admission;
use gpuctl_core::policy::GpuRoom;
use gpuctl_proto::store::log_credential::Change as Credential;
use gpuctl_sched as sched;
use parking_lot::MutexGuard;
use tonic::Status;

use super::Admitted;
use crate::controller::{
    Controller, INLINE_JOBS, INLINE_PASS, Out, PART, PassInput, START_PART, Shared, now_ms, status,
    store_status,
};
use crate::store::StoreError;

impl Controller {
    /// Writes what changed since the last call (not yet flushed). Returns whether
    /// anything was written.
    fn persist(&self, c: &mut Shared) -> Result<bool, StoreError> {
        let mut changes = c.core.take_changes();
        let any = !changes.is_empty();
        // A large cancel of pending jobs: one record (`cancels.rs`).
        self.before_writing(c, &mut changes.jobs)?;
        for &id in &changes.jobs.put {
            if let Some(s) = c.jobs().get(id) {
                self.store.put_job(s)?;
            }
        }
        for &id in &changes.jobs.delete {
            self.store.delete_job(id)?;
        }
        for name in &changes.nodes {
            if let Some(n) = c.fleet().node(name) {
                self.store.put_node(&gpuctl_proto::wire::stored_node(n))?;
            }
        }
        if changes.usage {
            self.store.put_usage(&c.usage_record())?;
        }
        Ok(any)
    }

    /// Persists, routes the effects, and releases the lock.
    pub(super) fn settle(
        &self,
        mut c: MutexGuard<'_, Shared>,
        effects: Effects,
    ) -> Result<Out, StoreError> {
        let wrote = self.persist(&mut c)?;
        let (sends, wake) = c.route(effects);
        Ok(Out { sends, wake, wrote })
    }

    /// A submit's admission alone: the records and the next id written in one batch
    /// (ids are never reused), then applied; flushed by the caller (`durable`).
    pub(super) fn admit_alone(
        &self,
        actor: &gpuctl_core::Actor,
        spec: gpuctl_core::record::JobSpec,
        request_id: &str,
        hold: bool,
        defer: &mut bool,
    ) -> Result<Admitted, Status> {
        let mut c = self.lock();
        let now = now_ms();
        match c.admit(actor, spec, request_id, now).map_err(status)? {
            Admission::Repeat(id) => Ok(Err(id)),
            Admission::New(mut stored) => {
                if hold {
                    gpuctl_core::holds::held_at_submit(&mut stored);
                }
                let id = stored.job.id;
                // The job and the next id in one batch: ids are never reused.
                self.store
                    .insert_new_job(&stored, id + 1)
                    .map_err(store_status)?;
                *defer = c.defers(&stored.job);
                let notes = stored.job.warnings.clone();
                c.apply_sure(now, Change::Submit(vec![*stored]));
                Ok(Ok((id, notes)))
            }
            Admission::Array(mut tasks) => {
                if hold {
                    tasks
                        .iter_mut()
                        .for_each(gpuctl_core::holds::held_at_submit);
                }
                let first = tasks.first().map_or(0, |s| s.job.id);
                let next = tasks.last().map_or(first, |s| s.job.id) + 1;
                self.store
                    .insert_new_jobs(&tasks, next)
                    .map_err(store_status)?;
                *defer = tasks.first().is_some_and(|t| c.defers(&t.job));
                let notes = tasks
                    .first()
                    .map(|t| t.job.warnings.clone())
                    .unwrap_or_default();
                c.apply_sure(now, Change::Submit(tasks));
                Ok(Ok((first, notes)))
            }
        }
    }

    /// A credential change alone: applied, written, and flushed before the answer.
    pub(super) async fn record_alone(&self, now: i64, change: Credential) -> Result<(), Status> {
        let change = gpuctl_proto::store::LogCredential {
            change: Some(change),
        };
        self.pki.with(|c| c.apply(now, &change)).map_err(status)?;
        let written = match change.change.expect("set above") {
            Credential::ApiToken(t) => self.store.put_token(&t),
            Credential::ApiTokenRevoked(id) => self.store.delete_token(&id),
            Credential::JoinToken(t) => self.store.put_join_token(&t),
            Credential::Joined(j) => match &j.identity {
                Some(id) => self.store.joined(Some(&j.token_hash), id),
                None => Ok(()),
            },
            Credential::Renewed(id) | Credential::Revoked(id) => self.store.joined(None, &id),
        };
        written.map_err(store_status)?;
        self.store.flush().await.map_err(store_status)
    }

    /// One pass: the state's input, a plan (pure, outside the lock and off the async
    /// threads), the plan applied to the state as it is then, persisted, then sent.
    /// (`Cluster::pass_input` and `apply_plan`, as the simulator runs them, taken in
    /// parts of `PART` jobs.) The steps under the lock run on a blocking thread, never
    /// on the async workers, with a gap after each (see `step`).
    pub(super) async fn pass_alone(self: &Arc<Self>) -> Result<(), StoreError> {
        // A small pass (the last took under `INLINE_PASS`, and few jobs are active now:
        // a burst of submits makes the next pass large) runs on this async worker: a
        // hop to the blocking pool and back costs a thread wake-up each, about 1 ms of
        // a small cluster's submit-to-launch time on the development VM.
        let inline = self.last_pass_us.load(Ordering::Relaxed) < INLINE_PASS.as_micros() as u64
            && self.lock().jobs().active_len() < INLINE_JOBS;
        let now = now_ms();
        let started = std::time::Instant::now();
        let (read, cfg, changed, lent) = if inline {
            self.pass_input(now, true)?
        } else {
            let ctl = self.clone();
            tokio::task::spawn_blocking(move || ctl.pass_input(now, false))
                .await
                .expect("pass input panicked")?
        };
        let mut took = started.elapsed();
        if changed {
            self.store.flush().await?;
        }
        if !lent.sends.is_empty() || lent.wake {
            self.deliver(lent, false).await?;
        }
        let now = now_ms();
        let started = std::time::Instant::now();
        let plan_apply = move |ctl: &Controller| -> Result<Option<Out>, StoreError> {
            let (plan, room) = match ctl.plan_carried(read, &cfg, now) {
                Ok(planned) => planned,
                Err(unplanned) => {
                    ctl.settle_unplanned(unplanned, now, inline);
                    return Ok(None);
                }
            };
            ctl.metrics
                .pass_seconds
                .observe(started.elapsed().as_secs_f64());
            ctl.apply_plan(&plan, room, now, inline).map(Some)
        };
        let out = if inline {
            plan_apply(self)?
        } else {
            let ctl = self.clone();
            tokio::task::spawn_blocking(move || plan_apply(&ctl))
                .await
                .expect("scheduler pass panicked")?
        };
        took += started.elapsed();
        self.last_pass_us
            .store(took.as_micros() as u64, Ordering::Relaxed);
        match out {
            Some(out) if !out.sends.is_empty() => self.deliver(out, true).await,
            _ => Ok(()),
        }
    }

    /// A pass's input in short holds of the lock, not one: requests (queue, heartbeats)
    /// get in between (at 100,000 jobs one hold was 250 ms). Starts are checked again
    /// when the plan is applied. Answers whether anything was written, and whether
    /// pending jobs were left out of the queue (they wait for others or a partition).
    fn pass_input(&self, now: i64, inline: bool) -> Result<PassInput, StoreError> {
        let (waiting, cursor, changed, lent) = self.step(inline, |c| {
            c.room.pass_started();
            // Before the start: the next pass reads again what changes from here on.
            let cursor = c.jobs().cursor();
            let (answer, effects) = c.apply(now, Change::Prepare);
            let waiting = match answer {
                Ok(Applied::Prepared(waiting)) => waiting,
                other => unreachable!("a pass's start answers its waiting jobs, not {other:?}"),
            };
            // The lend pass's starts and yields (`gpuctl_core::opportunistic`), sent
            // after the flush below.
            let (sends, wake) = c.route(effects);
            let lent = Out {
                sends,
                wake,
                wrote: false,
            };
            self.persist(c)
                .map(|changed| (waiting, cursor, changed, lent))
        })?;
        let (read, cfg) = self.pass_read(&waiting, cursor, now, inline);
        Ok((read, cfg, changed, lent))
    }

    /// A plan applied as `Cluster::apply_plan` does, in parts: the starts, the waiting
    /// jobs' reasons a part at a time, then preemption; persisted (not yet flushed).
    fn apply_plan(
        &self,
        plan: &sched::Plan,
        room: GpuRoom,
        now: i64,
        inline: bool,
    ) -> Result<Out, StoreError> {
        let mut effects = Effects::default();
        for part in plan.starts.chunks(START_PART) {
            let starts = Change::Starts(part.to_vec());
            effects.merge(self.step(inline, |c| c.apply_sure(now, starts)));
        }
        for part in Wait::parts_of(plan, PART) {
            let waiting = Change::Waiting(part);
            self.step(inline, |c| c.apply_sure(now, waiting));
        }
        let candidates = gpuctl_core::policy::preempt_candidates(plan);
        let mut c = self.lock();
        effects.merge(c.apply_sure(now, Change::Preempt(candidates)));
        // Before `settle`: effects that wake the scheduler leave the room at `Any`.
        let wake = self.settle_room(&mut c, !plan.waiting.is_empty(), room, now);
        let mut out = self.settle(c, effects)?;
        out.wake |= wake;
        Ok(out)
    }
}
