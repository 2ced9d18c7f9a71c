//! Preemption: which running jobs to stop so that a waiting job of a QoS that preempts
//! theirs can start now.
//!
//! For each waiting job (in rank order) whose QoS preempts others, the candidates are
//! the running jobs of the QoS levels it preempts that have run at least the protected
//! minimum and are not already being stopped. They are taken in the order that loses
//! the least work (GPU-milli times time run, least first) until the job would fit;
//! then every victim not needed is given back. A job that would not fit even with all
//! candidates gone preempts nobody. Jobs already being stopped count as gone, so a
//! preemptor waiting for its victims to end does not take more.

use std::collections::{BTreeMap, BTreeSet};

use super::*;

/// What the preemption planner knows of a running job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningJob {
    pub id: JobId,
    pub qos: String,
    pub start_ms: Millis,
    /// Normalised GPU milli it holds.
    pub gpu_milli: u64,
    /// Already asked to stop (a preemption or requeue in flight).
    pub vacating: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreemptConfig {
    /// QoS -> the QoS levels whose jobs it may preempt.
    pub preempts: BTreeMap<String, Vec<String>>,
    /// A job that has run less than this is not preempted.
    pub min_run_ms: Millis,
    /// At most this many waiting jobs preempt in one pass.
    pub max_preemptors: usize,
    /// Account -> QoS levels whose jobs (of other accounts) its jobs may preempt: an
    /// open window's floor taking its GPUs back.
    pub by_account: BTreeMap<String, Vec<String>>,
    /// The same for the jobs of a partition (a partition's floor).
    pub by_partition: BTreeMap<String, Vec<String>>,
}

/// At most this many waiting jobs are looked at in one pass (each costs a few
/// one-job passes).
const MAX_EXAMINED: usize = 64;

/// A waiting job and the running jobs to stop for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    pub job: JobId,
    pub victims: Vec<JobId>,
}

/// Whether `job` starts now on `cluster` (the scheduler's own feasibility).
fn starts_now(
    cluster: &ClusterView,
    job: &PendingJob,
    config: &SchedConfig,
    now: Millis,
) -> Option<Start> {
    schedule(cluster, std::slice::from_ref(job), config, now)
        .starts
        .into_iter()
        .next()
}

fn without(cluster: &ClusterView, gone: &BTreeSet<JobId>) -> ClusterView {
    ClusterView {
        nodes: cluster.nodes.clone(),
        running: cluster
            .running
            .iter()
            .filter(|r| !gone.contains(&r.job))
            .cloned()
            .collect(),
    }
}

/// The preemptions for `waiting` (pending jobs that did not start this pass, in rank
/// order), given the cluster after this pass's starts and what runs.
pub fn plan_preemptions(
    cluster: &ClusterView,
    running: &[RunningJob],
    waiting: &[PendingJob],
    config: &SchedConfig,
    preempt: &PreemptConfig,
    now: Millis,
) -> Vec<Preemption> {
    let mut out = Vec::new();
    if (preempt.preempts.is_empty()
        && preempt.by_account.is_empty()
        && preempt.by_partition.is_empty())
        || preempt.max_preemptors == 0
    {
        return out;
    }
    let single = SchedConfig {
        backfill: true,
        expected_starts: false,
        caps: limits::Caps::default(),
        ..config.clone()
    };
    // Jobs being stopped count as gone; victims chosen here too.
    let mut gone: BTreeSet<JobId> = running
        .iter()
        .filter(|r| r.vacating)
        .map(|r| r.id)
        .collect();
    let mut base = without(cluster, &gone);
    // Requests (with their targets) that found nothing to preempt this pass: a burst of
    // identical jobs is looked at once.
    let mut hopeless: BTreeSet<(Request, Vec<&String>)> = BTreeSet::new();
    let mut examined = 0usize;
    for job in waiting {
        if out.len() >= preempt.max_preemptors || examined >= MAX_EXAMINED {
            break;
        }
        let mut targets: Vec<&String> = Vec::new();
        targets.extend(preempt.preempts.get(&job.qos).into_iter().flatten());
        targets.extend(preempt.by_account.get(&job.account).into_iter().flatten());
        targets.extend(
            preempt
                .by_partition
                .get(&job.partition)
                .into_iter()
                .flatten(),
        );
        if targets.is_empty() {
            continue;
        }
        let mut candidates: Vec<&RunningJob> = running
            .iter()
            .filter(|r| {
                !gone.contains(&r.id)
                    && targets.contains(&&r.qos)
                    && now.saturating_sub(r.start_ms) >= preempt.min_run_ms
            })
            .collect();
        if candidates.is_empty() && !running.iter().any(|r| r.vacating) {
            continue;
        }
        let shape = (job.request.clone(), targets.clone());
        if hopeless.contains(&shape) {
            continue;
        }
        examined += 1;
        if let Some(start) = starts_now(&base, job, &single, now) {
            // It fits once the jobs being stopped are gone: it waits for them.
            hold_place(&mut base, &start, job, now);
            continue;
        }
        candidates.sort_by_key(|r| {
            let lost =
                u128::from(r.gpu_milli.max(1)) * (now.saturating_sub(r.start_ms).max(0) as u128);
            (lost, std::cmp::Reverse(r.start_ms), r.id)
        });
        // The shortest prefix of the candidates (least lost work first) whose going
        // lets the job start: fitting only gets easier as the prefix grows, so a
        // binary search finds it in a few passes of one job.
        let fits_with = |k: usize| {
            let set: BTreeSet<JobId> = candidates[..k].iter().map(|r| r.id).collect();
            starts_now(&without(&base, &set), job, &single, now)
        };
        let Some(mut start) = fits_with(candidates.len()) else {
            // Could not start anyway: nobody is preempted for it (nor for its twins).
            hopeless.insert(shape);
            continue;
        };
        let (mut lo, mut hi) = (0, candidates.len());
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            match fits_with(mid) {
                Some(s) => {
                    hi = mid;
                    start = s;
                }
                None => lo = mid,
            }
        }
        let mut chosen: Vec<JobId> = candidates[..hi].iter().map(|r| r.id).collect();
        // Give back every victim not needed (the last added is needed).
        let mut i = chosen.len().saturating_sub(1);
        while i > 0 {
            i -= 1;
            let mut trial = chosen.clone();
            trial.remove(i);
            let set: BTreeSet<JobId> = trial.iter().copied().collect();
            if let Some(s) = starts_now(&without(&base, &set), job, &single, now) {
                chosen = trial;
                start = s;
            }
        }
        let set: BTreeSet<JobId> = chosen.iter().copied().collect();
        base = without(&base, &set);
        gone.extend(chosen.iter().copied());
        hold_place(&mut base, &start, job, now);
        out.push(Preemption {
            job: job.id,
            victims: chosen,
        });
    }
    out
}

/// Keeps the place a preemptor will take, so that the next preemptor does not count on it.
fn hold_place(base: &mut ClusterView, start: &Start, job: &PendingJob, now: Millis) {
    for a in &start.allocs {
        base.running.push(Running {
            job: job.id,
            alloc: a.clone(),
            end_ms: now.saturating_add(job.duration_ms.max(1000)),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, gpus: u32) -> NodeView {
        NodeView {
            name: name.into(),
            eligibility: Eligibility::Up,
            slots: (0..gpus)
                .map(|i| SlotView {
                    uuid: format!("{name}-g{i}"),
                    gpu_index: i,
                    model: "A100".into(),
                    memory_mib: 81920,
                    mig_profile: None,
                })
                .collect(),
            cpu_milli: 64_000,
            memory_bytes: 1 << 40,
            partitions: Vec::new(),
        }
    }

    fn run(job: JobId, node: &str, gpus: &[u32]) -> Running {
        Running {
            job,
            alloc: Alloc {
                node: node.into(),
                slots: gpus
                    .iter()
                    .map(|g| SlotUse {
                        uuid: format!("{node}-g{g}"),
                        compute_milli: 1000,
                        memory_mib: 81920,
                    })
                    .collect(),
                cpu_milli: 1000,
                memory_bytes: 0,
            },
            end_ms: 1_000_000_000,
        }
    }

    fn rj(id: JobId, qos: &str, start_ms: Millis, gpus: u64) -> RunningJob {
        RunningJob {
            id,
            qos: qos.into(),
            start_ms,
            gpu_milli: gpus * 1000,
            vacating: false,
        }
    }

    fn high(id: JobId, gpus: u32) -> PendingJob {
        PendingJob {
            id,
            qos: "high".into(),
            request: Request::whole(gpus),
            duration_ms: 3_600_000,
            ..PendingJob::default()
        }
    }

    fn cfg() -> PreemptConfig {
        PreemptConfig {
            preempts: [("high".to_string(), vec!["low".to_string()])].into(),
            min_run_ms: 60_000,
            max_preemptors: 8,
            by_account: BTreeMap::new(),
            by_partition: BTreeMap::new(),
        }
    }

    #[test]
    fn takes_the_victims_that_lose_least_and_only_those_needed() {
        // n1: job 1 (low, 2 GPUs, ran long), job 2 (low, 2 GPUs, ran briefly).
        // n2: job 3 (normal, 4 GPUs): never a victim.
        let cluster = ClusterView {
            nodes: vec![node("n1", 4), node("n2", 4)],
            running: vec![
                run(1, "n1", &[0, 1]),
                run(2, "n1", &[2, 3]),
                run(3, "n2", &[0, 1, 2, 3]),
            ],
        };
        let now = 10_000_000;
        let running = vec![
            rj(1, "low", 0, 2),
            rj(2, "low", now - 120_000, 2),
            rj(3, "normal", 0, 4),
        ];
        let p = plan_preemptions(
            &cluster,
            &running,
            &[high(9, 2)],
            &SchedConfig::default(),
            &cfg(),
            now,
        );
        assert_eq!(
            p,
            vec![Preemption {
                job: 9,
                victims: vec![2]
            }]
        );
        // Four GPUs: both low jobs.
        let p = plan_preemptions(
            &cluster,
            &running,
            &[high(9, 4)],
            &SchedConfig::default(),
            &cfg(),
            now,
        );
        assert_eq!(
            p[0].victims.iter().copied().collect::<BTreeSet<_>>(),
            [1, 2].into()
        );
    }

    #[test]
    fn never_for_a_job_that_could_not_start_and_never_a_protected_one() {
        let cluster = ClusterView {
            nodes: vec![node("n1", 4)],
            running: vec![run(1, "n1", &[0, 1]), run(2, "n1", &[2, 3])],
        };
        let now = 10_000_000;
        // Job 2 is not preemptable; freeing job 1 alone leaves 2 GPUs: a 3-GPU job
        // preempts nobody.
        let running = vec![rj(1, "low", 0, 2), rj(2, "normal", 0, 2)];
        let none = plan_preemptions(
            &cluster,
            &running,
            &[high(9, 3)],
            &SchedConfig::default(),
            &cfg(),
            now,
        );
        assert!(none.is_empty());
        // Job 1 ran 30 s: protected.
        let young = vec![rj(1, "low", now - 30_000, 2), rj(2, "normal", 0, 2)];
        let none = plan_preemptions(
            &cluster,
            &young,
            &[high(9, 2)],
            &SchedConfig::default(),
            &cfg(),
            now,
        );
        assert!(none.is_empty());
    }

    #[test]
    fn a_job_being_stopped_counts_as_gone() {
        let cluster = ClusterView {
            nodes: vec![node("n1", 2)],
            running: vec![run(1, "n1", &[0, 1])],
        };
        let mut r = rj(1, "low", 0, 2);
        r.vacating = true;
        let p = plan_preemptions(
            &cluster,
            &[r],
            &[high(9, 2), high(10, 2)],
            &SchedConfig::default(),
            &cfg(),
            10_000_000,
        );
        // Job 9 waits for job 1 to end; job 10 has nothing left to take.
        assert!(p.is_empty());
    }
}
