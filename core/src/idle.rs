//! Idle allocations: the `[idle]` policy. A running job whose every GPU (or slice) stayed
//! under `util_below` percent of its share for `after` is warned, requeued or
//! cancelled, from the agents' samples, with the reason on the job (and so in history).
//! A job that gets busy again starts a new idle stretch.

use crate::record::JobState;
use crate::state::{Cluster, Effects, live_allocs};
use serde::Deserialize;
use std::collections::HashMap;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum IdleAction {
    /// A warning on the job (its reason and warnings); it keeps running.
    #[default]
    Warn,
    /// Stopped and put back in the queue (like `gpuctl requeue`).
    Requeue,
    /// Cancelled.
    Cancel,
}

/// The `[idle]` table. Off unless `after` is given.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdlePolicy {
    #[serde(with = "humantime_serde")]
    pub after: Option<Duration>,
    /// Utilisation (percent of the job's share) under which a GPU counts as idle.
    pub util_below: f64,
    pub action: IdleAction,
    /// Jobs of these QoS levels or partitions are left alone.
    pub exempt_qos: Vec<String>,
    pub exempt_partitions: Vec<String>,
    /// A job whose GPUs stay idle this long has them lent to opportunistic jobs until
    /// its use resumes (`crate::opportunistic`), whatever `after` does; "off": never.
    #[serde(with = "lend_after")]
    pub lend_after: Option<Duration>,
}

impl Default for IdlePolicy {
    fn default() -> Self {
        IdlePolicy {
            after: None,
            util_below: 5.0,
            action: IdleAction::Warn,
            exempt_qos: Vec::new(),
            exempt_partitions: Vec::new(),
            lend_after: Some(Duration::from_secs(600)),
        }
    }
}

/// `lend_after`: a duration ("10m"), or "off".
mod lend_after {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
            None => s.serialize_str("off"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        if text.trim() == "off" {
            return Ok(None);
        }
        humantime::parse_duration(&text).map(Some).map_err(|e| {
            serde::de::Error::custom(format!(
                "{text:?}: {e} (a duration such as \"10m\", or \"off\")"
            ))
        })
    }
}

impl IdlePolicy {
    pub fn check(&self) -> Result<(), String> {
        if !(0.0..=100.0).contains(&self.util_below) {
            return Err(format!(
                "idle.util_below = {} is not a percentage (0 to 100)",
                self.util_below
            ));
        }
        if self.lend_after.is_some_and(|d| d < Duration::from_secs(1)) {
            return Err("idle.lend_after is under a second: give it as \"10m\", or \"off\"".into());
        }
        if self.after.is_some_and(|d| d < Duration::from_secs(1)) {
            return Err("idle.after is under a second: give it as \"30m\", \"1h\"".into());
        }
        Ok(())
    }
}

/// Per running job: when a sample last showed it busy, and whether the policy acted on
/// the idle stretch since.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdleTrack {
    pub busy_ms: i64,
    pub acted: bool,
}

pub type IdleTracks = HashMap<u64, IdleTrack>;

impl Cluster {
    /// A sample of `job` at `t` with this utilisation (percent of its share).
    pub(crate) fn note_busy(&mut self, job: u64, t: i64, util: f64) {
        let below = self.config.idle.util_below;
        let track = self.idle.entry(job).or_default();
        if util >= below && t > track.busy_ms {
            track.busy_ms = t;
            track.acted = false;
        }
    }

    /// Applies the policy to the running jobs in `ids` (those of a heartbeat).
    pub(crate) fn check_idle(&mut self, ids: impl IntoIterator<Item = u64>, now: i64) -> Effects {
        let mut effects = Effects::default();
        let policy = self.config.idle.clone();
        let Some(after) = policy.after else {
            return effects;
        };
        let after_ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
        for id in ids {
            let Some(j) = self.jobs.job(id).filter(|j| j.state == JobState::Running) else {
                continue;
            };
            let spec = j.spec.clone();
            if policy.exempt_qos.contains(&spec.qos)
                || policy.exempt_partitions.contains(&spec.partition)
            {
                continue;
            }
            // Only jobs with GPUs idle them; a job with none has nothing to give back.
            if !live_allocs(j).any(|a| !a.slots.is_empty()) {
                continue;
            }
            let track = self.idle.get(&id).copied().unwrap_or_default();
            let since = track.busy_ms.max(j.start_time_ms);
            if track.acted || now - since < after_ms {
                continue;
            }
            self.idle.entry(id).or_default().acted = true;
            let why = format!(
                "idle: its GPUs were under {}% for {}",
                policy.util_below,
                humantime::format_duration(Duration::from_millis(
                    (now - since) as u64 / 1000 * 1000
                ))
            );
            tracing::warn!(job = id, action = ?policy.action, "{why}");
            match policy.action {
                IdleAction::Warn => {
                    self.jobs.edit(id, |s| {
                        let j = &mut s.job;
                        j.reason = why.clone();
                        if j.warnings.len() < 20 {
                            j.warnings.push(why.clone());
                        }
                    });
                }
                IdleAction::Requeue => {
                    let e = self.request_requeue(id, &format!("requeued: {why}"), None, now);
                    effects.merge(e);
                }
                IdleAction::Cancel => {
                    let why = format!("cancelled: {why}");
                    let (sends, _) =
                        self.kill_running(id, &why, gpuctl_sched::job::JobState::Cancelled);
                    effects.sends.extend(sends);
                    effects.wake = true;
                }
            }
        }
        effects
    }

    /// Forgets the tracks of jobs no longer running.
    pub(crate) fn sweep_idle(&mut self) {
        let jobs = &self.jobs;
        self.idle.retain(|&id, _| {
            jobs.get(id)
                .is_some_and(|s| s.job.state == JobState::Running)
        });
    }
}

/// The running job ids of a heartbeat.
pub fn running_ids(running: &[crate::event::Running]) -> Vec<u64> {
    running.iter().map(|r| r.job_id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_parses_and_is_checked() {
        let p: IdlePolicy = toml::from_str(
            "after = \"30m\"\nutil_below = 5\naction = \"requeue\"\nexempt_qos = [\"high\"]\n",
        )
        .unwrap();
        assert_eq!(p.after, Some(Duration::from_secs(1800)));
        assert_eq!(p.action, IdleAction::Requeue);
        assert!(p.check().is_ok());
        let bad = IdlePolicy {
            util_below: 150.0,
            ..p.clone()
        };
        assert!(bad.check().unwrap_err().contains("percentage"));
        let short = IdlePolicy {
            after: Some(Duration::from_millis(10)),
            ..p
        };
        assert!(short.check().is_err());
        assert!(toml::from_str::<IdlePolicy>("action = \"nap\"").is_err());
    }
}
