//! Submitting a job, and the scheduling pass's two halves: the input of a pass and the
//! application of its plan.

use crate::log::{Wait, plan_entries};

use crate::record::{Job, JobSpec, JobState, Record};
use crate::request;
use gpuctl_sched::{self as sched, ClusterView, PendingJob};

use crate::command::{Command, Start};
use crate::error::{Actor, Refusal};
use crate::jobs::{Transition, owner};
use crate::state::{Cluster, Effects, settle_dependencies};
use crate::validate::{
    check_dependencies, check_feasible, check_policy, check_text, validate_spec,
};

/// What a submit comes to.
#[derive(Debug)]
pub enum Admission {
    /// The same (user, request id) was submitted before: this is its job.
    Repeat(u64),
    /// A new job, checked; the shell writes it, then `Cluster::commit_submit`s it.
    New(Box<Record>),
    /// A job array: one job per task, ids in a row from the array's id (its first);
    /// the shell writes them all at once, then commits each.
    Array(Vec<Record>),
}

pub use crate::log::{Passed, Waiting};

impl Cluster {
    /// Checks a job for the queue (its spec's user already set by the shell from the
    /// caller) and builds its record with the next id. Changes nothing.
    pub fn admit(
        &self,
        actor: &Actor,
        spec: JobSpec,
        request_id: &str,
        now: i64,
    ) -> Result<Admission, Refusal> {
        self.admit_from(actor, spec, request_id, now, self.next_job_id)
    }

    /// `admit`, the job's id (an array's first task's) `first_id` or later: a leader
    /// whose earlier admissions are still on their way through the log hands out ids
    /// past them (`Cluster::next_job_id` counts only those applied).
    pub fn admit_from(
        &self,
        actor: &Actor,
        mut spec: JobSpec,
        request_id: &str,
        now: i64,
        first_id: u64,
    ) -> Result<Admission, Refusal> {
        let first_id = first_id.max(self.next_job_id);
        let limits = &self.config.limits;
        if spec.account.is_empty() {
            spec.account = self.config.default_account(&spec.user);
        }
        check_text(&spec)?;
        let asked_qos = !spec.qos.is_empty();
        let partition_time = self.admit_partition(actor, &mut spec)?;
        // A QoS the partition gives is the admin's choice for it: open to whoever may
        // use the partition.
        let qos_given = !asked_qos && !spec.qos.is_empty();
        if spec.qos.is_empty() && self.config.qos.contains_key(crate::config::DEFAULT_QOS) {
            spec.qos = crate::config::DEFAULT_QOS.to_string();
        }
        validate_spec(&spec, limits.max_list_len)?;
        check_policy(&self.config, actor, &spec, qos_given)?;
        crate::begin::check(&spec, now)?;
        if !request_id.is_empty()
            && let Some(id) = self.jobs.by_request(&spec.user, request_id)
        {
            return Ok(Admission::Repeat(id));
        }
        if spec.array_job_id != 0 || spec.array_task_id.is_some() {
            return Err(Refusal::invalid_argument(
                "array_job_id and array_task_id are set by the controller; submit an array with `array`",
            ));
        }
        let array = if spec.array.is_empty() {
            None
        } else {
            let a = gpuctl_sched::array::parse(&spec.array, limits.max_array_tasks)
                .map_err(Refusal::invalid_argument)?;
            Some(a)
        };
        let count = array.as_ref().map_or(1, |a| a.tasks.len());
        let pending = self.jobs.pending_of(&spec.user);
        if count == 1 && pending >= limits.max_pending_per_user {
            return Err(Refusal::resource_exhausted(format!(
                "user {} already has {pending} pending jobs, the most allowed (limits.max_pending_per_user)",
                spec.user
            )));
        }
        if pending + count > limits.max_pending_per_user {
            return Err(Refusal::resource_exhausted(format!(
                "user {} has {pending} pending jobs; {count} more would pass the most allowed, {} (limits.max_pending_per_user)",
                spec.user, limits.max_pending_per_user
            )));
        }
        if (self.config.qos.get(&spec.qos)).is_some_and(|q| q.opportunistic) {
            spec.opportunistic = true;
        }
        if spec.opportunistic {
            check_opportunistic(&spec)?;
        }
        let mut notes = if spec.right_size {
            self.right_size(&mut spec, partition_time, now)
        } else {
            Vec::new()
        };
        if spec.colocate {
            let runs = self.last_runs(&spec, now, true);
            let mut res = spec.resources.clone();
            notes.extend(crate::colocate::colocate(
                &mut res,
                &runs,
                &self.config.colocation,
            ));
            spec.resources = res;
        }
        let mut res = spec.resources.clone();
        let partition = self.config.partition_filter(&spec.partition);
        if res.exclusive {
            crate::exclusive::resolve(self, &mut res, partition.clone())?;
            spec.resources = res.clone();
        }
        check_feasible(self, &res, partition)?;
        check_dependencies(self, &spec)?;
        // Like the agents would: a job of root runs only where an agent allows it.
        if spec.user == "root"
            && !self.fleet.nodes.is_empty()
            && !self.fleet.nodes.values().any(|n| n.allow_root_jobs)
        {
            return Err(Refusal::failed_precondition(
                "jobs of root are refused: no agent of this cluster runs them (start gpud with --allow-root-jobs, or submit as an ordinary user)",
            ));
        }
        // Like the pass would say: it waits while a job it depends on has not ended
        // (those that can never be met were refused above).
        let waits = spec
            .dependencies
            .iter()
            .any(|d| self.jobs.job(d.job_id).is_some_and(|j| !j.state.is_final()));
        let time_limit_secs = if res.time_limit_secs > 0 {
            res.time_limit_secs
        } else {
            partition_time.unwrap_or(self.config.default_time_limit.as_secs())
        }
        .min(self.config.limits.max_time_limit.as_secs())
        .min(
            self.config
                .qos
                .get(&spec.qos)
                .and_then(|q| q.max_time)
                .map_or(u64::MAX, |m| m.as_secs().max(1)),
        );
        let record = |id: u64, spec: JobSpec, request_id: &str| {
            let mut job = Job {
                id,
                spec,
                state: JobState::Pending,
                reason: if waits { "Dependency" } else { "None" }.into(),
                submit_time_ms: now,
                time_limit_secs,
                warnings: notes.clone(),
                ..Job::default()
            };
            crate::begin::hold_new(&mut job, now);
            Record {
                job,
                request_id: request_id.to_string(),
                ..Record::default()
            }
        };
        let Some(array) = array else {
            return Ok(Admission::New(Box::new(record(first_id, spec, request_id))));
        };
        let first = first_id;
        let tasks = array
            .tasks
            .iter()
            .enumerate()
            .map(|(i, &task)| {
                let mut s = spec.clone();
                s.array_job_id = first;
                s.array_task_id = Some(task);
                // The request id names the array: a repeated submit finds its first task.
                record(first + i as u64, s, if i == 0 { request_id } else { "" })
            })
            .collect();
        Ok(Admission::Array(tasks))
    }

    /// Right-sizing (`efficiency::right_size`) from the user's last completed runs of
    /// the same name; the lines say what changed.
    fn right_size(&self, spec: &mut JobSpec, partition_time: Option<u64>, now: i64) -> Vec<String> {
        let reports = self.last_runs(spec, now, false);
        let mut res = spec.resources.clone();
        let limit = if res.time_limit_secs > 0 {
            res.time_limit_secs
        } else {
            partition_time.unwrap_or(self.config.default_time_limit.as_secs())
        };
        let notes = crate::efficiency::right_size(&mut res, limit, &reports);
        spec.resources = res;
        notes
    }

    /// Reports of the user's last runs of `spec`'s name that have usage figures, latest
    /// first (at most `efficiency::RIGHT_SIZE_RUNS`): completed ones, or (`any_end`)
    /// ended however (a co-located run ended over its memory measured its peak too).
    fn last_runs(
        &self,
        spec: &JobSpec,
        now: i64,
        any_end: bool,
    ) -> Vec<crate::efficiency::Efficiency> {
        let mut runs: Vec<&Job> = self
            .jobs
            .all()
            .map(|s| &s.job)
            .filter(|j| {
                (j.state == JobState::Completed || (any_end && j.state.is_final()))
                    && j.usage.is_some()
                    && j.spec.user == spec.user
                    && j.spec.name == spec.name
            })
            .collect();
        runs.sort_by_key(|j| std::cmp::Reverse(j.end_time_ms));
        runs.truncate(crate::efficiency::RIGHT_SIZE_RUNS);
        runs.iter()
            .map(|j| crate::efficiency::report(j, now))
            .collect()
    }

    /// Queues a job `admit` built, once the shell has written it (with the next id).
    pub(crate) fn commit_submit(&mut self, stored: Record) -> Effects {
        let id = stored.job.id;
        self.next_job_id = self.next_job_id.max(id + 1);
        self.note_begin(&stored.job);
        tracing::info!(job = id, user = owner(&stored.job), "job submitted");
        self.jobs.insert(stored);
        Effects::wake()
    }

    /// The first, changing part of `pass_input`: retention, fair-share charges,
    /// dependencies and partitions settled. Answers the pending jobs left out of the
    /// pass (they wait for other jobs, or their partition). The daemon takes the rest
    /// (`view`, `queue`, `pass_config`) in separate holds of its lock, so that no
    /// request waits for a whole pass input at 100,000 jobs; the plan's starts are
    /// checked again against the cluster as it is when applied.
    pub(crate) fn pass_prepare(&mut self, now: i64) -> Waiting {
        self.release_begun(now);
        let retention = self.config.retention.clone();
        self.retire(&retention, now);
        self.charge_usage(now);
        let mut waiting = Waiting {
            ids: settle_dependencies(self, now),
            first_new: self.next_job_id,
        };
        for (id, why) in self.partition_blocked() {
            waiting.ids.insert(id);
            let why = why.reason();
            self.jobs.annotate_pending(id, |j| {
                if j.reason != why {
                    j.reason = why.into();
                }
                j.expected_start_ms = 0;
            });
        }
        waiting
    }

    /// A whole pass: its start, the plan of the pure scheduler from the state that left
    /// (outside no lock: the caller holds the state), the plan applied. What a pass
    /// entry (`Change::Pass`) does on every replica alike.
    pub(crate) fn whole_pass(&mut self, now: i64) -> (Passed, Effects) {
        use crate::policy::room_after;
        let waiting = self.pass_prepare(now);
        let mut effects = self.lend_pass(now);
        let view = self.view();
        let queue = self.queue(&waiting);
        if queue.is_empty() {
            let left_out = !waiting.ids.is_empty();
            let passed = Passed {
                waiting: left_out,
                room: room_after(&view, None, left_out),
            };
            return (passed, effects);
        }
        let plan = sched::schedule(&view, &queue, &self.pass_config(now), now);
        let room = room_after(&view, Some(&plan), !plan.waiting.is_empty());
        effects.merge(self.apply_plan(&plan, now));
        let passed = Passed {
            waiting: !plan.waiting.is_empty(),
            room,
        };
        (passed, effects)
    }

    /// The same input without changing anything (for `explain` and `priorities`): jobs
    /// whose dependencies are not met are left out.
    pub fn pass_input_readonly(
        &self,
        now: i64,
    ) -> (ClusterView, Vec<PendingJob>, sched::SchedConfig) {
        let mut ids = crate::state::dependency_blocked(self);
        ids.extend(self.partition_blocked().into_iter().map(|(id, _)| id));
        let waiting = Waiting {
            ids,
            first_new: u64::MAX,
        };
        (self.view(), self.queue(&waiting), self.pass_config(now))
    }

    /// The pending jobs of a pass, less `waiting`.
    pub fn queue(&self, waiting: &Waiting) -> Vec<PendingJob> {
        let shares = self.fair_share_table();
        self.queue_part(waiting, &shares, 0, usize::MAX).0
    }

    /// Part of `queue`: up to `max` jobs with ids above `after` (see `pending_part`).
    pub fn queue_part(
        &self,
        waiting: &Waiting,
        shares: &sched::fairshare::FairShareTable,
        after: u64,
        max: usize,
    ) -> (Vec<PendingJob>, Option<u64>) {
        let (mut part, next) = self.pending_part(shares, after, max);
        part.retain(|p| !waiting.contains(p.id));
        (part, next)
    }

    /// Whether a pending job is held (it stays out of every pass).
    pub fn held(&self, id: u64) -> bool {
        self.jobs.job(id).is_some_and(|j| !j.hold.is_empty())
    }

    /// The pass's config at `now`: the workload mix, caps, windows.
    pub fn pass_config(&self, now: i64) -> sched::SchedConfig {
        let mut cfg = self.sched_config.clone();
        if cfg.policy == sched::packing::Policy::Fgd {
            cfg.workload = self.workload();
        }
        cfg.caps = self.caps();
        self.apply_windows(&mut cfg, now);
        cfg
    }

    /// Applies a plan made at `now` from an earlier `pass_input`, as its log entries
    /// (`log::plan_entries`, in one part): each start is checked again against the
    /// cluster as it is now (things may have moved while planning), its job starts,
    /// and its `StartJob`s go to its nodes; waiting jobs show their reason and expected
    /// start; then preemption.
    pub(crate) fn apply_plan(&mut self, plan: &sched::Plan, now: i64) -> Effects {
        let mut effects = Effects::default();
        for entry in plan_entries(plan, usize::MAX, now) {
            effects.merge(self.apply(entry).1);
        }
        effects
    }

    /// The starts of a plan: each checked again against the cluster as it is now
    /// (things may have moved while planning), its job started, its `StartJob`s sent.
    /// A part of a plan's starts at a time is fine: each part is checked against the
    /// cluster as the parts before it left it.
    pub(crate) fn apply_starts(&mut self, starts: &[sched::Start], now: i64) -> Effects {
        // Starts are checked against what holds now on their nodes (things changed
        // while the pass ran outside the lock).
        let touched: std::collections::BTreeSet<&str> = starts
            .iter()
            .flat_map(|s| s.allocs.iter().map(|a| a.node.as_str()))
            .collect();
        let mut ledger = sched::Ledger::new(&self.view_of(&touched));
        let mut effects = Effects::default();
        let mut started = Vec::new();
        for start in starts {
            let pending = self
                .jobs
                .job(start.job)
                .is_some_and(|j| j.state == JobState::Pending);
            let connected = start
                .allocs
                .iter()
                .all(|a| self.fleet.conns.contains_key(&a.node));
            if !pending || !connected {
                continue;
            }
            if let Err(why) = ledger.take(start) {
                tracing::debug!(
                    job = start.job,
                    "placement no longer valid ({why}); next pass retries"
                );
                continue;
            }
            let guaranteed = self
                .jobs
                .job(start.job)
                .is_some_and(|j| !crate::opportunistic::is_borrower(j));
            if guaranteed && self.borrowers_in_the_way(start, now, &mut effects) {
                continue;
            }
            self.start(start, now, &mut effects);
            self.cache_held(start.job);
            started.push(start.job);
        }
        // Jobs that borrow a window's floor say so while they run.
        for (id, why) in self.borrowing(&started, now) {
            self.jobs.edit(id, |s| {
                s.job.reason = why;
            });
        }
        effects
    }

    /// Waiting jobs show their reason and expected start (in memory only); a part of a
    /// plan's `waiting` at a time is fine.
    pub(crate) fn annotate_waiting(&mut self, waiting: &[Wait]) {
        for w in waiting {
            let preempted = self.jobs.get(w.job).is_some_and(|s| s.preempted_by != 0);
            self.jobs.annotate_pending(w.job, |j| {
                // A preempted job says so until it runs again.
                if j.reason != w.reason && !preempted {
                    j.reason = w.reason.to_string();
                }
                if w.expected_start_ms != crate::log::KEEP_START {
                    j.expected_start_ms = w.expected_start_ms;
                }
            });
        }
    }

    pub(crate) fn start(&mut self, start: &sched::Start, now: i64, effects: &mut Effects) {
        let nodelist: Vec<String> = start.allocs.iter().map(|a| a.node.clone()).collect();
        let allocations = start
            .allocs
            .iter()
            .enumerate()
            .map(|(r, a)| request::allocation(a, r as u32))
            .collect();
        self.jobs
            .transition(start.job, Transition::Start { allocations }, now)
            .expect("checked pending above");
        let j = self.jobs.job(start.job).expect("just started");
        if !crate::opportunistic::is_borrower(j) {
            // A guaranteed job takes its GPUs back from the borrowers there.
            let taken: Vec<(String, Vec<crate::record::SlotUse>)> = (j.allocations.iter())
                .map(|a| (a.node.clone(), a.slots.clone()))
                .collect();
            for (node, slots) in taken {
                self.evict_borrowers(&node, &slots, start.job, now, effects);
            }
        }
        let j = self.jobs.job(start.job).expect("just started");
        let addresses: Vec<String> = nodelist
            .iter()
            .map(|n| {
                self.fleet
                    .nodes
                    .get(n)
                    .map(|x| x.address.clone())
                    .unwrap_or_default()
            })
            .collect();
        tracing::info!(job = j.id, attempt = j.attempt, nodes = ?nodelist, "starting job");
        for a in &j.allocations {
            let cmd = Start {
                job_id: j.id,
                spec: j.spec.clone(),
                time_limit_secs: j.time_limit_secs,
                kill_grace_secs: self.config.kill_grace.as_secs(),
                slots: a.slots.clone(),
                rank: a.rank,
                nodelist: nodelist.clone(),
                attempt: j.attempt,
                addresses: addresses.clone(),
                session_generation: (self.fleet.conns.get(&a.node)).map_or(0, |c| c.generation),
            };
            effects
                .sends
                .push((a.node.clone(), Command::Start(Box::new(cmd))));
        }
    }
}

/// What the opportunistic class can run: GPUs (whole or a share) lent on one kind of
/// GPU, no MIG instance (a lent GPU is a whole one), nor a whole node.
fn check_opportunistic(spec: &JobSpec) -> Result<(), Refusal> {
    use crate::record::GpuPart;
    let bad = |why: &str| {
        Err(Refusal::invalid_argument(format!(
            "an opportunistic job {why}"
        )))
    };
    match &spec.resources.gpu {
        None | Some(GpuPart::Gpus(0)) => {
            bad("runs in the idle of GPUs others hold: it must ask for GPUs (gpus = N, or a share)")
        }
        Some(GpuPart::Mig(_)) => bad("borrows whole GPUs or shares of one, not MIG instances"),
        Some(_) if spec.resources.exclusive => bad("cannot hold whole nodes (exclusive)"),
        Some(_) => Ok(()),
    }
}
