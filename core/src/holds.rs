//! Holding, releasing and requeueing jobs (Slurm's `scontrol hold/release/requeue`).
//!
//! A held job stays pending and out of every pass (reason `JobHeldUser`, or
//! `JobHeldAdmin` when an admin held it: then only an admin releases it). A requeue
//! of a running job kills its instances; when they have ended it is pending again
//! with the same id, submit time and an attempt that grows at its next start (the
//! GPUs are free only once the instances are gone).

use crate::record::{Job, JobState, Record, state_name};

use crate::error::{Actor, Refusal};
use crate::jobs::{Transition, owner};
use crate::state::{Cluster, Effects, live_allocs};

pub const HELD_USER: &str = "JobHeldUser";
pub const HELD_ADMIN: &str = "JobHeldAdmin";

/// A job submitted held (`sbatch -H`): held by its owner from the start, so that
/// nothing can start it before `release`.
pub fn held_at_submit(s: &mut Record) {
    let j = &mut s.job;
    j.hold = "user".into();
    j.reason = HELD_USER.into();
}

impl Cluster {
    /// The job `id` if `actor` may act on it.
    pub(crate) fn own_job(&self, actor: &Actor, id: u64, what: &str) -> Result<&Job, Refusal> {
        let j = self
            .jobs
            .job(id)
            .ok_or_else(|| Refusal::not_found(format!("no job {id}")))?;
        if !actor.admin && owner(j) != actor.user {
            return Err(actor.deny(&format!(
                "only a job's owner or an admin may {what} it (job {id} belongs to {})",
                owner(j)
            )));
        }
        Ok(j)
    }

    /// Holds a pending job.
    pub(crate) fn hold(&mut self, actor: &Actor, id: u64) -> Result<Effects, Refusal> {
        let j = self.own_job(actor, id, "hold")?;
        if j.state != JobState::Pending {
            return Err(Refusal::failed_precondition(format!(
                "job {id} is {}; only pending jobs are held",
                state_name(j.state)
            )));
        }
        if j.hold == crate::begin::BEGIN_HOLD {
            return Err(Refusal::failed_precondition(format!(
                "job {id} waits for its begin time already"
            )));
        }
        let (hold, reason) = if actor.admin && owner(j) != actor.user {
            ("admin", HELD_ADMIN)
        } else {
            ("user", HELD_USER)
        };
        // Written (`edit`), not only shown: a hold outlives a restart.
        self.jobs.edit(id, |s| {
            let j = &mut s.job;
            j.hold = hold.into();
            j.reason = reason.into();
            j.expected_start_ms = 0;
        });
        tracing::info!(job = id, by = %actor.user, "job held");
        Ok(Effects::wake())
    }

    /// Releases a held job.
    pub(crate) fn release(&mut self, actor: &Actor, id: u64) -> Result<Effects, Refusal> {
        let j = self.own_job(actor, id, "release")?;
        if j.hold.is_empty() {
            return Err(Refusal::failed_precondition(format!(
                "job {id} is not held"
            )));
        }
        if j.hold == "admin" && !actor.admin {
            return Err(actor.deny(&format!(
                "job {id} was held by an admin; only an admin releases it"
            )));
        }
        if j.hold == crate::begin::BEGIN_HOLD {
            return Err(Refusal::failed_precondition(format!(
                "job {id} waits for its begin time, not a hold; cancel and resubmit to change it"
            )));
        }
        self.jobs.edit(id, |s| {
            s.job.hold.clear();
            s.job.reason = "None".into();
        });
        tracing::info!(job = id, by = %actor.user, "job released");
        Ok(Effects::wake())
    }

    /// Sends a running job back to the queue (`reason` says why): its instances are
    /// killed, and it is pending again once they have ended.
    pub(crate) fn requeue(
        &mut self,
        actor: &Actor,
        id: u64,
        reason: &str,
        now: i64,
    ) -> Result<Effects, Refusal> {
        let j = self.own_job(actor, id, "requeue")?;
        if j.state != JobState::Running {
            return Err(Refusal::failed_precondition(format!(
                "job {id} is {}; only running jobs are requeued",
                state_name(j.state)
            )));
        }
        Ok(self.request_requeue(id, reason, None, now))
    }

    /// Asks a running job's instances to stop so that it requeues: `signal` is the
    /// checkpoint signal and how long before the kill (`None`: SIGTERM, then the kill
    /// grace). A job whose nodes are all gone is requeued at once.
    pub(crate) fn request_requeue(
        &mut self,
        id: u64,
        reason: &str,
        signal: Option<(String, u64)>,
        now: i64,
    ) -> Effects {
        let mut effects = Effects::wake();
        let Some(j) = self.jobs.job(id) else {
            return effects;
        };
        let attempt = j.attempt;
        let nodes: Vec<String> = live_allocs(j).map(|a| a.node.clone()).collect();
        let lead = signal
            .as_ref()
            .map_or(self.config.kill_grace.as_secs(), |(_, t)| *t);
        let vacate_by =
            now.saturating_add(i64::try_from(lead).unwrap_or(0).saturating_mul(1000) + 5_000);
        self.jobs.edit(id, |s| {
            s.requeue_requested = reason.to_string();
            s.vacate_by_ms = vacate_by;
        });
        let mut sent = false;
        for node in nodes {
            if self.fleet.conns.contains_key(&node) {
                let mut k = self.kill(id, attempt, reason);
                if let Some((sig, lead)) = &signal {
                    k.signal = sig.clone();
                    k.kill_grace_secs = k.kill_grace_secs.max(*lead);
                }
                let kill = crate::command::Command::Kill(k);
                effects.sends.push((node, kill));
                sent = true;
            }
        }
        if !sent {
            let back = Transition::Requeue {
                reason: reason.to_string(),
                keep_for_readopt: false,
            };
            let _ = self.jobs.transition(id, back, now);
            self.jobs.edit(id, |s| s.requeue_requested.clear());
        }
        tracing::info!(job = id, reason, "requeue asked");
        effects
    }
}
