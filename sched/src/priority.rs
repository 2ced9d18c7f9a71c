//! Multifactor priority, as a weighted sum of factors (like Slurm's priority/multifactor).
//!
//! Each factor is a number in a known range times its weight from the config. New
//! factors (fair share, partitions, time of day) are new `Factor` variants and a line in
//! `factors`, not a rewrite.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::model::*;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PriorityWeights {
    /// Points for a job that waited `age_max` or longer (linear before that).
    pub age: i64,
    #[serde(with = "humantime_serde")]
    pub age_max: Duration,
    /// Points for job size (linear in GPU milli, capped at the largest node): with
    /// `favor_small` (the default, like Slurm's PriorityFavorSmall) a job of no GPUs
    /// gets them all and a job as large as the largest node none; without it, the
    /// other way round.
    pub size: i64,
    pub favor_small: bool,
    /// Points per unit of the job file's `priority`.
    pub user: i64,
    /// Multiplier of the QoS level's value.
    pub qos: i64,
    /// Points for an owner who used nothing lately (times the fair-share factor, 0..1;
    /// see `fairshare`).
    pub fair_share: i64,
    /// QoS names and their values; unknown names count 0. Derived from `[qos]` (this
    /// key is the old way to name them), so not printed with the effective config.
    #[serde(skip_serializing)]
    pub qos_levels: BTreeMap<String, i64>,
}

impl Default for PriorityWeights {
    fn default() -> Self {
        PriorityWeights {
            age: 1000,
            age_max: Duration::from_secs(7 * 24 * 3600),
            size: 500,
            favor_small: true,
            user: 1000,
            qos: 1,
            fair_share: 1000,
            qos_levels: [
                ("low".to_string(), 0),
                ("normal".to_string(), 1000),
                ("high".to_string(), 10_000),
            ]
            .into_iter()
            .collect(),
        }
    }
}

impl PriorityWeights {
    /// Weights that rank by submit order only (FIFO).
    pub fn fifo() -> Self {
        PriorityWeights {
            age: 0,
            size: 0,
            user: 0,
            qos: 0,
            fair_share: 0,
            ..PriorityWeights::default()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Factor {
    Age,
    Size,
    User,
    Qos,
    FairShare,
}

impl Factor {
    pub fn name(self) -> &'static str {
        match self {
            Factor::Age => "age",
            Factor::Size => "size",
            Factor::User => "user",
            Factor::Qos => "qos",
            Factor::FairShare => "fairshare",
        }
    }
}

/// A job's priority and the weighted factors it is the sum of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breakdown {
    pub job: JobId,
    pub total: i64,
    pub factors: Vec<(Factor, i64)>,
}

/// `size_norm`: the GPU milli of the largest node (a job that large gets the full size
/// weight).
pub fn breakdown(job: &PendingJob, w: &PriorityWeights, now: Millis, size_norm: u64) -> Breakdown {
    let factors = factors(job, w, now, size_norm);
    Breakdown {
        job: job.id,
        total: total(&factors),
        factors: factors.to_vec(),
    }
}

fn total(factors: &[(Factor, i64)]) -> i64 {
    factors.iter().map(|f| f.1).fold(0i64, i64::saturating_add)
}

fn factors(
    job: &PendingJob,
    w: &PriorityWeights,
    now: Millis,
    size_norm: u64,
) -> [(Factor, i64); 5] {
    let age_max = (w.age_max.as_millis() as i64).max(1);
    let age = (now - job.submit_ms).clamp(0, age_max);
    let size_norm = size_norm.max(1);
    let mut size = job.request.gpu_milli_total().min(size_norm);
    if w.favor_small {
        size = size_norm - size;
    }
    let qos = w.qos_levels.get(&job.qos).copied().unwrap_or(0);
    [
        (Factor::Age, w.age.saturating_mul(age) / age_max),
        (
            Factor::Size,
            (w.size as i128 * size as i128 / size_norm as i128) as i64,
        ),
        (Factor::User, w.user.saturating_mul(i64::from(job.priority))),
        (Factor::Qos, w.qos.saturating_mul(qos)),
        (
            Factor::FairShare,
            w.fair_share
                .saturating_mul(i64::from(job.fair_share_milli.min(1000)))
                / 1000,
        ),
    ]
}

/// Jobs in scheduling order: highest priority first, then earlier submit, then lower id.
pub fn rank<'a>(
    queue: &'a [PendingJob],
    w: &PriorityWeights,
    now: Millis,
    size_norm: u64,
) -> Vec<(&'a PendingJob, i64)> {
    let mut v: Vec<(&PendingJob, i64)> = queue
        .iter()
        .map(|j| (j, total(&factors(j, w, now, size_norm))))
        .collect();
    // The key ends with the (unique) id: a total order, so an unstable sort gives the same.
    v.sort_unstable_by_key(|(j, p)| (std::cmp::Reverse(*p), j.submit_ms, j.id));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: JobId, submit_ms: Millis, gpus: u32, priority: i32, qos: &str) -> PendingJob {
        PendingJob {
            id,
            priority,
            qos: qos.into(),
            submit_ms,
            request: Request::whole(gpus),
            duration_ms: 1000,
            fair_share_milli: 250,
            ..PendingJob::default()
        }
    }

    #[test]
    fn factors_are_weighted_and_capped() {
        let w = PriorityWeights::default();
        let week = 7 * 24 * 3600 * 1000;
        let b = breakdown(&job(1, 0, 4, 2, "high"), &w, 2 * week, 8000);
        assert_eq!(
            b.factors,
            vec![
                (Factor::Age, 1000),
                // Favouring small jobs: half the largest node gets half the points.
                (Factor::Size, 250),
                (Factor::User, 2000),
                (Factor::Qos, 10_000),
                (Factor::FairShare, 250),
            ]
        );
        assert_eq!(b.total, 13_500);
        // No GPUs: all the size points; half the age.
        let half = breakdown(&job(1, week / 2, 0, 0, "nope"), &w, week, 8000);
        assert_eq!(half.total, 500 + 500 + 250);
        let big = PriorityWeights {
            favor_small: false,
            ..w
        };
        let b = breakdown(&job(1, 0, 16, 0, "nope"), &big, 0, 8000);
        assert_eq!(b.factors[1], (Factor::Size, 500));
    }

    #[test]
    fn rank_orders_by_total_then_submit() {
        let w = PriorityWeights::default();
        let q = vec![
            job(1, 0, 1, 0, ""),
            job(2, 0, 1, 1, ""),
            job(3, 0, 1, 0, ""),
        ];
        let ids: Vec<JobId> = rank(&q, &w, 0, 8000).iter().map(|(j, _)| j.id).collect();
        assert_eq!(ids, vec![2, 1, 3]);
        let ids: Vec<JobId> = rank(&q, &PriorityWeights::fifo(), 0, 8000)
            .iter()
            .map(|(j, _)| j.id)
            .collect();
        assert_eq!(ids, vec![1, 2, 3]);
    }
}
