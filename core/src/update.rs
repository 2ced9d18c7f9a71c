//! Changing a job after its submit (Slurm's `scontrol update JobId=N ...`,
//! `gpuctl update`): its time limit, partition, name, comment and nice, by Slurm's
//! rules. Its owner may lower its time limit (an admin may also raise it), move it to
//! another partition while it waits, rename it, comment it and lower its priority; an
//! admin may raise that. A running job's new limit reaches its agents
//! (`Command::Limit`): a limit already passed ends it TIMEOUT at once, as in Slurm.
//! Every change is checked as a submit's would be (text, partition, QoS and cluster
//! limits), and one that fails changes nothing.

use crate::command::{Command, Limit};
use crate::error::{Actor, Refusal};
use crate::record::{JobState, state_name};
use crate::state::{Cluster, Effects, live_allocs};

/// What an update changes (`None`: that field stays).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobUpdate {
    /// The new time limit in seconds (0: none, "UNLIMITED": an admin's).
    pub time_limit_secs: Option<u64>,
    pub partition: Option<String>,
    pub name: Option<String>,
    pub comment: Option<String>,
    /// The new priority adjustment (Slurm's nice is its negative).
    pub priority: Option<i32>,
}

impl JobUpdate {
    pub fn is_empty(&self) -> bool {
        *self == JobUpdate::default()
    }
}

impl Cluster {
    /// Applies `update` to job `id` for `actor` (see the module's doc).
    pub(crate) fn update_job(
        &mut self,
        actor: &Actor,
        id: u64,
        update: &JobUpdate,
    ) -> Result<Effects, Refusal> {
        if update.is_empty() {
            return Err(Refusal::invalid_argument(
                "nothing to update: give a time limit, partition, name, comment or nice",
            ));
        }
        let j = self.own_job(actor, id, "update")?;
        if j.state.is_final() {
            return Err(Refusal::failed_precondition(format!(
                "job {id} is {}: an ended job is not updated",
                state_name(j.state)
            )));
        }
        let running = j.state == JobState::Running;
        let mut spec = j.spec.clone();
        let before = j.time_limit_secs;
        if let Some(p) = &update.partition {
            spec.partition.clone_from(p);
        }
        // UNLIMITED (0) is the most the job's partition and the cluster allow.
        let asked = update.time_limit_secs.map(|t| match t {
            0 => self.longest_limit(&spec.partition),
            t => t,
        });
        let limit = asked.unwrap_or(before);
        if !actor.admin && asked.is_some_and(|new| before != 0 && new > before) {
            return Err(actor.deny(&format!(
                "only an admin raises a job's time limit (job {id} has {}); lower it, or ask an admin",
                shown_limit(before)
            )));
        }
        if let Some(name) = &update.name {
            spec.name.clone_from(name);
        }
        if let Some(comment) = &update.comment {
            spec.comment.clone_from(comment);
        }
        if let Some(p) = update.priority {
            spec.priority = p;
            if p > j.spec.priority && !actor.admin {
                return Err(actor.deny(&format!(
                    "only an admin raises a job's priority (job {id}'s nice is {}); a larger nice lowers it",
                    -j.spec.priority
                )));
            }
        }
        spec.resources.time_limit_secs = limit;
        if update.partition.is_some() {
            if running {
                return Err(Refusal::failed_precondition(format!(
                    "job {id} is RUNNING: only a pending job moves to another partition"
                )));
            }
            // A partition's rules as at submit: it exists, takes jobs, allows the
            // account and this time limit (an unlimited job takes its default).
            self.admit_partition(actor, &mut spec)?;
        }
        if update.partition.is_none()
            && let Some(max) = self.partition_max(&spec.partition)
            && limit > max
        {
            return Err(Refusal::invalid_argument(format!(
                "time limit {} is over partition {:?}'s maximum of {} (partitions.{}.max_time)",
                shown_limit(limit),
                spec.partition,
                shown_limit(max),
                spec.partition
            )));
        }
        crate::validate::check_text(&spec)?;
        // The QoS is unchanged: who may use it is not asked again, its limits are.
        crate::validate::check_policy(&self.config, actor, &spec, true)?;
        let sends: Vec<(String, Command)> = if running && limit != before {
            live_allocs(j)
                .map(|a| {
                    let cmd = Command::Limit(Limit {
                        job_id: id,
                        attempt: j.attempt,
                        time_limit_secs: limit,
                    });
                    (a.node.clone(), cmd)
                })
                .collect()
        } else {
            Vec::new()
        };
        // A new name (or partition) is indexed anew: `replace`, not `edit`.
        let mut stored = self.jobs.get(id).expect("looked up above").clone();
        stored.job.spec = spec;
        stored.job.time_limit_secs = limit;
        self.jobs.replace(stored);
        tracing::info!(job = id, by = %actor.user, ?update, "job updated");
        let mut effects = Effects::wake();
        effects.sends = sends;
        Ok(effects)
    }
}

impl Cluster {
    /// The longest time limit a job of `partition` may have (Slurm's UNLIMITED).
    fn longest_limit(&self, partition: &str) -> u64 {
        let cluster = self.config.limits.max_time_limit.as_secs();
        self.partition_max(partition)
            .map_or(cluster, |m| m.min(cluster))
            .max(1)
    }

    /// `partition`'s `max_time` in seconds, if it sets one.
    fn partition_max(&self, partition: &str) -> Option<u64> {
        let cfg = &self.config;
        let p = cfg.partition(cfg.partition_name(partition))?;
        p.max_time.map(|m| m.as_secs())
    }
}

/// A time limit as `scontrol show job` writes it.
fn shown_limit(secs: u64) -> String {
    if secs == 0 {
        return "no time limit".into();
    }
    humantime::format_duration(std::time::Duration::from_secs(secs.min(1 << 40))).to_string()
}
