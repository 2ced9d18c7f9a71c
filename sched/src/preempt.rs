//! Preemption: which running jobs to stop so that a waiting job of a QoS that preempts
//! theirs can start now, or so that a window's floor takes back what it lent.
//!
//! A floor that lends (`Lender`) takes back reclaimable jobs of others (they
//! checkpoint and are requeued) for a waiting job of its owner, as long as the owner
//! holds less than its floor with that job. A borrower inside its minimum run is taken
//! only when the owner's job would otherwise miss the reclaim bound: its wait so far,
//! the borrower's signal lead and a pass's slack reach `reclaim_within_ms`.
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
    /// Whose it is (a floor takes back only others' jobs).
    pub account: String,
    pub partition: String,
    /// It checkpoints and is requeued when stopped (`PendingJob::reclaimable`).
    pub reclaimable: bool,
    /// How long it takes to give its GPUs back once asked (its signal's lead).
    pub lead_ms: Millis,
}

/// A floor that lends, open now: its owner and how much it may still take back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lender {
    pub owner: floors::FloorOwner,
    /// The floor less what the owner's running jobs hold (normalised GPU milli).
    pub room_milli: u64,
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
    /// Open floors that lend to reclaimable jobs.
    pub lenders: Vec<Lender>,
    /// A floor's owner starts within this of its submit while borrowers hold its GPUs.
    pub reclaim_within_ms: Millis,
    /// What the bound keeps besides a borrower's lead: how late a pass may come (the
    /// controller's periodic pass), the requeue's report, the owner's start.
    pub reclaim_slack_ms: Millis,
}

impl PreemptConfig {
    /// Whether any waiting job may preempt at all.
    pub fn is_empty(&self) -> bool {
        self.preempts.is_empty()
            && self.by_account.is_empty()
            && self.by_partition.is_empty()
            && self.lenders.is_empty()
    }
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
    if preempt.is_empty() || preempt.max_preemptors == 0 {
        return out;
    }
    let mut lenders = preempt.lenders.clone();
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
    // The cluster without the jobs being stopped: built when a waiting job first has
    // someone to preempt (most passes find nobody, and a copy of a big view is dear).
    let mut base_cell: Option<ClusterView> = None;
    // Requests (with their targets) that found nothing to preempt this pass: a burst of
    // identical jobs is looked at once.
    let mut hopeless: BTreeSet<(Request, Vec<&String>, bool)> = BTreeSet::new();
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
        let need = limits::norm_milli(&job.request);
        let lender = lenders
            .iter()
            .position(|l| l.owner.owns(&job.account, &job.partition) && need <= l.room_milli);
        if targets.is_empty() && lender.is_none() {
            continue;
        }
        let waited = now.saturating_sub(job.submit_ms);
        let protected = |r: &RunningJob| now.saturating_sub(r.start_ms) < preempt.min_run_ms;
        let mut candidates: Vec<&RunningJob> = running
            .iter()
            .filter(|r| !gone.contains(&r.id))
            .filter(|r| {
                let by_qos = targets.contains(&&r.qos) && !protected(r);
                let reclaim = lender.is_some_and(|l| {
                    r.reclaimable
                        && !lenders[l].owner.owns(&r.account, &r.partition)
                        && (!protected(r)
                            || waited + r.lead_ms + preempt.reclaim_slack_ms
                                >= preempt.reclaim_within_ms)
                });
                by_qos || reclaim
            })
            .collect();
        if candidates.is_empty() && !running.iter().any(|r| r.vacating) {
            continue;
        }
        let shape = (job.request.clone(), targets.clone(), lender.is_some());
        if hopeless.contains(&shape) {
            continue;
        }
        examined += 1;
        let base = base_cell.get_or_insert_with(|| without(cluster, &gone));
        if let Some(start) = starts_now(base, job, &single, now) {
            // It fits once the jobs being stopped are gone: it waits for them.
            hold_place(base, &start, job, now);
            continue;
        }
        // Least lost work first, jobs inside their minimum run last; a reclaimable
        // job loses only its signal's lead (it checkpoints).
        candidates.sort_by_key(|r| {
            let ran = if r.reclaimable {
                r.lead_ms.min(now.saturating_sub(r.start_ms))
            } else {
                now.saturating_sub(r.start_ms)
            };
            let lost = u128::from(r.gpu_milli.max(1)) * (ran.max(0) as u128);
            (protected(r), lost, std::cmp::Reverse(r.start_ms), r.id)
        });
        // The shortest prefix of the candidates (least lost work first) whose going
        // lets the job start: fitting only gets easier as the prefix grows, so a
        // binary search finds it in a few passes of one job.
        let fits_with = |k: usize| {
            let set: BTreeSet<JobId> = candidates[..k].iter().map(|r| r.id).collect();
            starts_now(&without(base, &set), job, &single, now)
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
            if let Some(s) = starts_now(&without(base, &set), job, &single, now) {
                chosen = trial;
                start = s;
            }
        }
        let set: BTreeSet<JobId> = chosen.iter().copied().collect();
        *base = without(base, &set);
        gone.extend(chosen.iter().copied());
        if let Some(l) = lender {
            lenders[l].room_milli -= need;
        }
        hold_place(base, &start, job, now);
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
            features: Vec::new(),
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
            account: "training".into(),
            partition: String::new(),
            reclaimable: false,
            lead_ms: 10_000,
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
            lenders: Vec::new(),
            reclaim_within_ms: 120_000,
            reclaim_slack_ms: 15_000,
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

    fn lending() -> PreemptConfig {
        PreemptConfig {
            lenders: vec![Lender {
                owner: floors::FloorOwner::Account("inference".into()),
                room_milli: 3000,
            }],
            ..cfg()
        }
    }

    fn owner_job(id: JobId, gpus: u32, submit_ms: Millis) -> PendingJob {
        PendingJob {
            id,
            qos: "normal".into(),
            account: "inference".into(),
            submit_ms,
            request: Request::whole(gpus),
            duration_ms: 600_000,
            ..PendingJob::default()
        }
    }

    #[test]
    fn a_floor_takes_back_borrowers_within_its_room_and_not_its_own_jobs() {
        let cluster = ClusterView {
            nodes: vec![node("n1", 4)],
            running: vec![run(1, "n1", &[0, 1]), run(2, "n1", &[2, 3])],
        };
        let now = 10_000_000;
        let mut borrower = rj(1, "normal", 0, 2);
        borrower.reclaimable = true;
        let mut own = rj(2, "normal", 0, 2);
        own.reclaimable = true;
        own.account = "inference".into();
        let running = vec![borrower.clone(), own];
        let p = plan_preemptions(
            &cluster,
            &running,
            &[owner_job(9, 2, now)],
            &SchedConfig::default(),
            &lending(),
            now,
        );
        assert_eq!(
            p,
            vec![Preemption {
                job: 9,
                victims: vec![1]
            }]
        );
        // Beyond the floor's room (3 GPUs) the owner takes nothing back.
        let p = plan_preemptions(
            &cluster,
            &running,
            &[owner_job(9, 4, now)],
            &SchedConfig::default(),
            &lending(),
            now,
        );
        assert!(p.is_empty());
        // A job that cannot give back is never a borrower to reclaim.
        let fixed = vec![rj(1, "normal", 0, 2), rj(3, "normal", 0, 2)];
        let p = plan_preemptions(
            &cluster,
            &fixed,
            &[owner_job(9, 2, now)],
            &SchedConfig::default(),
            &lending(),
            now,
        );
        assert!(p.is_empty());
        // Room is used up by a first owner's job: a second one takes nothing more.
        let two = vec![borrower, {
            let mut b = rj(2, "normal", 0, 2);
            b.reclaimable = true;
            b
        }];
        let p = plan_preemptions(
            &cluster,
            &two,
            &[owner_job(9, 2, now), owner_job(10, 2, now)],
            &SchedConfig::default(),
            &lending(),
            now,
        );
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn a_young_borrower_is_reclaimed_only_when_the_bound_is_at_risk() {
        let cluster = ClusterView {
            nodes: vec![node("n1", 2)],
            running: vec![run(1, "n1", &[0, 1])],
        };
        let now = 10_000_000;
        let mut young = rj(1, "normal", now - 30_000, 2);
        young.reclaimable = true;
        young.lead_ms = 60_000;
        let running = vec![young];
        let plan = |submit| {
            plan_preemptions(
                &cluster,
                &running,
                &[owner_job(9, 2, submit)],
                &SchedConfig::default(),
                &lending(),
                now,
            )
        };
        // Just submitted: 0 + 60 + 15 s < 120 s, the borrower keeps its minimum run.
        assert!(plan(now).is_empty());
        // Waited 45 s: 45 + 60 + 15 >= 120, it is taken back now.
        assert_eq!(plan(now - 45_000).len(), 1);
    }
}
