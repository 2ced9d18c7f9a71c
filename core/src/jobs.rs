//! The job table: every job the controller keeps, the indexes over them, and the one
//! place where a job's state changes (`Jobs::transition`).
//!
//! Pure: no store, no clock, no locks. Callers pass `now`; what changed is recorded
//! (`take_changes`) and the controller's shell persists it before it answers anyone or
//! tells an agent. Every index is kept exact by `transition`, `insert` and `remove`:
//! `check` recomputes them from the jobs, and the tests run it after every step.

use crate::record::{Allocation, Job, JobState, Record, Resources};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A job's owner, as its spec names it.
pub fn owner(j: &Job) -> &str {
    &j.spec.user
}

/// A job's (account, user), as fair share knows its owner.
fn owner_key(j: &Job) -> (String, String) {
    (j.spec.account.clone(), owner(j).to_string())
}

/// A job's name (its spec's).
fn name(j: &Job) -> &str {
    &j.spec.name
}

/// A change of a job's state.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// PENDING -> RUNNING: a new attempt on these allocations (rank order).
    Start { allocations: Vec<Allocation> },
    /// RUNNING -> PENDING: back to the queue. With `keep_for_readopt`, the running record
    /// is kept so that a returning node still running this very start can take it back
    /// (`Readopt`).
    Requeue {
        reason: String,
        keep_for_readopt: bool,
    },
    /// PENDING -> RUNNING as it was before its requeue, when `node` reports the same
    /// `attempt` still running there.
    Readopt { node: String, attempt: u32 },
    /// A running job's allocations on `node` end (a rank's end, a start lost or refused
    /// there). When that was its last live allocation, the job ends: RUNNING -> the
    /// final state of its ranks (`final_state`).
    EndOn {
        node: String,
        state: JobState,
        exit_code: Option<i32>,
        reason: String,
    },
    /// PENDING or RUNNING -> a final state. A running job's live allocations end with it.
    Finish {
        state: JobState,
        exit_code: Option<i32>,
        reason: String,
    },
}

/// A job as users see it: its node list and GPUs derived from its allocations (the
/// records keep the placement once, as allocations).
pub fn presented(j: &Job) -> Job {
    let (node, gpus) = placement(j);
    let gpus = gpus.cloned().collect();
    Job {
        node,
        gpus,
        ..j.clone()
    }
}

/// Where a job is placed, as users see it: its nodes (each once, in rank order, joined
/// with commas) and its slots' UUIDs.
pub fn placement(j: &Job) -> (String, impl Iterator<Item = &String>) {
    let mut nodes: Vec<&str> = Vec::new();
    for a in &j.allocations {
        if !nodes.contains(&a.node.as_str()) {
            nodes.push(&a.node);
        }
    }
    let gpus = j
        .allocations
        .iter()
        .flat_map(|a| a.slots.iter().map(|x| &x.uuid));
    (nodes.join(","), gpus)
}

/// Drops what a finished job no longer needs and may be large or secret: its env,
/// script, command arguments and the copy kept for re-adoption. Returns whether
/// anything changed.
pub fn compact(stored: &mut Record) -> bool {
    let had_copy = stored.requeued_from.take().is_some();
    let spec = &mut stored.job.spec;
    let big = !spec.env.is_empty() || !spec.script.is_empty() || spec.command.len() > 1;
    // New values, not `clear()`: a cleared String keeps its allocation.
    spec.env = Default::default();
    spec.script = String::new();
    spec.command.truncate(1);
    spec.command.shrink_to_fit();
    big || had_copy
}

/// A transition that does not apply to the job as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no job {0}")]
    Unknown(u64),
    #[error("job {id} is {from:?}; {what} does not apply")]
    Illegal {
        id: u64,
        from: JobState,
        what: &'static str,
    },
}

/// What changed since the last `take_changes`: jobs to write, jobs to delete.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub put: BTreeSet<u64>,
    pub delete: BTreeSet<u64>,
    /// Cancels of pending jobs, each with the jobs it ended (all in `put`): a store may
    /// keep one record for such a cancel in place of its jobs' (`deferrable`), which
    /// `restore::Records::cancels` applies again to the pending records it finds.
    pub cancels: Vec<PendingCancel>,
    /// Jobs of `cancels` changed again after their cancel in the same window: their
    /// records say more than the cancel, so they are written as they are.
    pub changed_after: BTreeSet<u64>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.put.is_empty() && self.delete.is_empty()
    }

    /// The jobs of `cancel` whose records only that cancel changed since the store
    /// last wrote them: what one record of the cancel stands for.
    pub fn deferrable(&self, cancel: &PendingCancel) -> Vec<u64> {
        (cancel.ids.iter().copied())
            .filter(|id| self.put.contains(id) && !self.changed_after.contains(id))
            .collect()
    }
}

/// Pending jobs one cancel ended, at `at` with `reason` (`Transition::Finish` to
/// CANCELLED): applied again to their pending records, it gives the records the cancel
/// left (`restore`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingCancel {
    pub at: i64,
    pub reason: String,
    pub ids: Vec<u64>,
}

impl PendingCancel {
    /// The cancel's transition of one pending job.
    pub fn transition(&self) -> Transition {
        Transition::Finish {
            state: JobState::Cancelled,
            exit_code: None,
            reason: self.reason.clone(),
        }
    }
}

#[derive(Default)]
pub struct Jobs {
    /// PENDING and RUNNING jobs, by id: passes walk these several times each, so they
    /// are a map of their own (walked in order, not looked up one by one).
    live: BTreeMap<u64, Record>,
    /// Finished jobs (as retained), by id.
    done: BTreeMap<u64, Record>,
    /// PENDING jobs with dependencies.
    with_deps: BTreeSet<u64>,
    /// RUNNING jobs by the nodes of their live allocations (an attaching or failed
    /// node's jobs without a walk over every job: at 10,000 nodes reattaching after a
    /// restart, that walk was the controller's whole CPU).
    by_node: HashMap<String, BTreeSet<u64>>,
    /// PENDING jobs per user (for `max_pending_per_user`).
    pending_by_user: HashMap<String, usize>,
    /// PENDING jobs per QoS level (the few that may preempt, found without a look at
    /// every waiting job: `Cluster::preempt_for`).
    pending_by_qos: HashMap<String, BTreeSet<u64>>,
    /// PENDING and RUNNING jobs per user (a user's queue, `gpuctl queue -u`/`--me`,
    /// without a walk over every job).
    active_by_user: HashMap<String, BTreeSet<u64>>,
    /// PENDING and RUNNING jobs per job name (`gpuctl queue --name`: at 25,000 nodes a
    /// walk over 155,000 active jobs held the lock 20-25 ms per listing).
    active_by_name: HashMap<String, BTreeSet<u64>>,
    /// PENDING and RUNNING jobs per (account, user): who the fair-share table ranks
    /// (a walk over every active job for them was 15 ms of each pass at 120,000 jobs).
    active_owners: HashMap<(String, String), usize>,
    /// RUNNING jobs with a live allocation (fair share charges these at every pass:
    /// a walk over every active job to find them was 50 ms of each pass at 120,000
    /// jobs, most of it cache misses on the pending ones), with each run's start and
    /// number of live allocations (what fair share's per-run cache is checked against,
    /// without touching the job).
    running: BTreeMap<u64, (i64, usize)>,
    /// Finished jobs by (end time, id), for retention.
    finished: BTreeSet<(i64, u64)>,
    /// Mails due since the last `take_mails` (`crate::mail`).
    mails: Vec<crate::mail::Mail>,
    /// Grows whenever a job comes or goes, or what it asks for is edited: what is
    /// computed from the jobs' requests is cached against it.
    revision: u64,
    /// Submits by (user, client request id): a repeated submit gets the same job.
    requests: HashMap<(String, String), u64>,
    changes: Changes,
    /// Every job changed, in order, for passes that carry what they read from one to
    /// the next (`touched_since`).
    touched: TouchLog,
    /// Runs that stopped (ended, requeued) since the last `take_ended_runs`: fair share
    /// charges their last stretch.
    ended_runs: Vec<EndedRun>,
}

/// How far a reader of the jobs got (`Jobs::cursor`): what changed after it is
/// `Jobs::touched_since` it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobsCursor {
    /// Which `Jobs` (another, a restored state's, starts its own log).
    log: u64,
    seq: u64,
}

/// The ids of the jobs changed (came, went, or any part of their record changed), in
/// the order they changed, the oldest dropped past `TOUCH_LOG_MAX` (a controller that
/// runs no passes, a Raft follower, keeps no more).
#[derive(Debug)]
struct TouchLog {
    /// This log among every `Jobs` of the process.
    log: u64,
    /// The sequence number of `ids[0]`.
    first: u64,
    ids: std::collections::VecDeque<u64>,
}

const TOUCH_LOG_MAX: usize = 1 << 20;

impl Default for TouchLog {
    fn default() -> TouchLog {
        // Bookkeeping of this process's, not state: no two `Jobs` share a log number.
        static LOGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        TouchLog {
            log: LOGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            first: 0,
            ids: std::collections::VecDeque::new(),
        }
    }
}

/// A run that stopped: what it held, from when to when.
#[derive(Debug, Clone, PartialEq)]
pub struct EndedRun {
    pub job: u64,
    pub account: String,
    pub user: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub allocations: Vec<Allocation>,
}

/// Two walks of disjoint id-ordered maps as one, in the order `first` says.
fn merge_by_id<'a>(
    a: impl Iterator<Item = (&'a u64, &'a Record)>,
    b: impl Iterator<Item = (&'a u64, &'a Record)>,
    first: impl Fn(u64, u64) -> bool,
) -> impl Iterator<Item = &'a Record> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || {
        let from_a = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => first(*x.0, *y.0),
            (Some(_), None) => true,
            (None, _) => false,
        };
        let next = if from_a { a.next() } else { b.next() };
        next.map(|x| x.1)
    })
}

/// What a job asks for, as submitted (or edited since).
fn requested(s: &Record) -> &Resources {
    &s.job.spec.resources
}

fn has_deps(j: &Job) -> bool {
    !j.spec.dependencies.is_empty()
}

impl Jobs {
    pub fn get(&self, id: u64) -> Option<&Record> {
        self.live.get(&id).or_else(|| self.done.get(&id))
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Record> {
        match self.live.get_mut(&id) {
            Some(s) => Some(s),
            None => self.done.get_mut(&id),
        }
    }

    fn take(&mut self, id: u64) -> Option<Record> {
        self.live.remove(&id).or_else(|| self.done.remove(&id))
    }

    fn put(&mut self, id: u64, s: Record) {
        if s.job.state.is_final() {
            self.done.insert(id, s);
        } else {
            self.live.insert(id, s);
        }
    }

    pub fn job(&self, id: u64) -> Option<&Job> {
        self.get(id).map(|s| &s.job)
    }

    pub fn len(&self) -> usize {
        self.live.len() + self.done.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty() && self.done.is_empty()
    }

    /// Every job, by id (the live and the finished merged as walked, nothing copied).
    pub fn all(&self) -> impl Iterator<Item = &Record> {
        merge_by_id(self.live.iter(), self.done.iter(), |x, y| x < y)
    }

    /// Every job with an id in `lo..=hi`, by id.
    pub fn in_range(&self, lo: u64, hi: u64) -> impl Iterator<Item = &Record> {
        merge_by_id(
            self.live.range(lo..=hi),
            self.done.range(lo..=hi),
            |x, y| x < y,
        )
    }

    /// Every job, newest (highest id) first.
    pub fn newest(&self) -> impl Iterator<Item = &Record> {
        merge_by_id(self.live.iter().rev(), self.done.iter().rev(), |x, y| x > y)
    }

    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.all().map(|s| s.job.id)
    }

    /// Changes whenever a job was added or removed, or what it asks for was edited
    /// (not on state changes).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// PENDING and RUNNING jobs, by id.
    pub fn active(&self) -> impl Iterator<Item = &Record> {
        self.live.values()
    }

    /// PENDING and RUNNING jobs with ids above `after`, by id.
    pub fn active_after(&self, after: u64) -> impl Iterator<Item = &Record> {
        self.live
            .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            .map(|(_, s)| s)
    }

    pub fn active_ids(&self) -> Vec<u64> {
        self.live.keys().copied().collect()
    }

    /// How many jobs are PENDING or RUNNING.
    pub fn active_len(&self) -> usize {
        self.live.len()
    }

    /// RUNNING jobs with a live allocation, by id: (id, start time, live allocations).
    pub fn running(&self) -> impl Iterator<Item = (u64, i64, usize)> {
        self.running
            .iter()
            .map(|(&id, &(start, live))| (id, start, live))
    }

    /// A RUNNING job's start time and live allocations, as `running` has them.
    pub fn running_of(&self, id: u64) -> Option<(i64, usize)> {
        self.running.get(&id).copied()
    }

    /// Every (account, user) with a PENDING or RUNNING job.
    pub fn active_owners(&self) -> impl Iterator<Item = (&str, &str)> {
        self.active_owners
            .keys()
            .map(|(a, u)| (a.as_str(), u.as_str()))
    }

    /// `user`'s PENDING and RUNNING jobs, by id.
    pub fn active_of(&self, user: &str) -> impl Iterator<Item = &Record> {
        self.live_in(self.active_by_user.get(user))
    }

    /// The PENDING jobs of a QoS level, by id.
    pub fn pending_of_qos(&self, qos: &str) -> impl Iterator<Item = u64> + '_ {
        self.pending_by_qos.get(qos).into_iter().flatten().copied()
    }

    /// PENDING and RUNNING jobs named `name`, by id.
    pub fn active_named(&self, name: &str) -> impl Iterator<Item = &Record> {
        self.live_in(self.active_by_name.get(name))
    }

    /// The live records of an index entry's ids.
    fn live_in<'a>(&'a self, ids: Option<&'a BTreeSet<u64>>) -> impl Iterator<Item = &'a Record> {
        ids.into_iter().flatten().filter_map(|id| self.live.get(id))
    }

    /// RUNNING jobs with a live allocation on `node`, by id.
    pub fn on_node(&self, node: &str) -> Vec<u64> {
        self.by_node
            .get(node)
            .map(|ids| ids.iter().copied().collect())
            .unwrap_or_default()
    }

    /// PENDING jobs with dependencies.
    pub fn with_deps(&self) -> impl Iterator<Item = &Job> {
        self.with_deps.iter().map(|id| &self.live[id].job)
    }

    pub fn pending_of(&self, user: &str) -> usize {
        self.pending_by_user.get(user).copied().unwrap_or(0)
    }

    pub fn by_request(&self, user: &str, request_id: &str) -> Option<u64> {
        self.requests
            .get(&(user.to_string(), request_id.to_string()))
            .copied()
    }

    /// Adds a job in whatever state it is (a new submit, or one loaded from the store).
    /// Not recorded as a change: a new job is written with the next id, a loaded one is
    /// already on disk.
    pub(crate) fn insert(&mut self, stored: Record) {
        self.revision += 1;
        let j = &stored.job;
        let id = j.id;
        self.touch(id);
        if let Some(old) = self.take(id) {
            self.unindex(&old);
        }
        self.index(&stored);
        self.put(id, stored);
    }

    fn index(&mut self, s: &Record) {
        let j = &s.job;
        if !j.state.is_final() {
            self.active_by_user
                .entry(owner(j).to_string())
                .or_default()
                .insert(j.id);
            self.active_by_name
                .entry(name(j).to_string())
                .or_default()
                .insert(j.id);
            *self.active_owners.entry(owner_key(j)).or_default() += 1;
        }
        match j.state {
            JobState::Pending => {
                *self
                    .pending_by_user
                    .entry(owner(j).to_string())
                    .or_default() += 1;
                self.pending_by_qos
                    .entry(j.spec.qos.clone())
                    .or_default()
                    .insert(j.id);
                if has_deps(j) {
                    self.with_deps.insert(j.id);
                }
            }
            JobState::Running => {
                let mut live = 0;
                for a in j.allocations.iter().filter(|a| !a.ended) {
                    self.by_node.entry(a.node.clone()).or_default().insert(j.id);
                    live += 1;
                }
                if live > 0 {
                    self.running.insert(j.id, (j.start_time_ms, live));
                }
            }
            _ => {
                self.finished.insert((j.end_time_ms, j.id));
            }
        }
        if !s.request_id.is_empty() {
            self.requests
                .insert((owner(j).to_string(), s.request_id.clone()), j.id);
        }
    }

    fn unindex(&mut self, s: &Record) {
        let j = &s.job;
        self.with_deps.remove(&j.id);
        self.running.remove(&j.id);
        if let Some(ids) = self.active_by_name.get_mut(name(j))
            && ids.remove(&j.id)
            && ids.is_empty()
        {
            self.active_by_name.remove(name(j));
        }
        if let Some(ids) = self.active_by_user.get_mut(owner(j))
            && ids.remove(&j.id)
        {
            if ids.is_empty() {
                self.active_by_user.remove(owner(j));
            }
            let key = owner_key(j);
            if let Some(n) = self.active_owners.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.active_owners.remove(&key);
                }
            }
        }
        for a in &j.allocations {
            if let Some(ids) = self.by_node.get_mut(&a.node) {
                ids.remove(&j.id);
                if ids.is_empty() {
                    self.by_node.remove(&a.node);
                }
            }
        }
        self.finished.remove(&(j.end_time_ms, j.id));
        if j.state == JobState::Pending
            && let Some(n) = self.pending_by_user.get_mut(owner(j))
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.pending_by_user.remove(owner(j));
            }
        }
        if j.state == JobState::Pending
            && let Some(ids) = self.pending_by_qos.get_mut(&j.spec.qos)
            && ids.remove(&j.id)
            && ids.is_empty()
        {
            self.pending_by_qos.remove(&j.spec.qos);
        }
        if !s.request_id.is_empty() {
            self.requests
                .remove(&(owner(j).to_string(), s.request_id.clone()));
        }
    }

    /// Removes a finished job (retention). Returns whether it was there.
    pub(crate) fn remove(&mut self, id: u64) -> bool {
        let Some(old) = self.take(id) else {
            return false;
        };
        self.revision += 1;
        self.unindex(&old);
        self.changes.put.remove(&id);
        self.changes.delete.insert(id);
        self.changed_again(id);
        self.touch(id);
        true
    }

    /// Changes what is not the job's state (flags, warnings, the reason a running job
    /// shows) and records the job as changed. The state must stay as it is: that is
    /// `transition`'s alone.
    pub(crate) fn edit<R>(&mut self, id: u64, f: impl FnOnce(&mut Record) -> R) -> Option<R> {
        let s = self.get_mut(id)?;
        let before = s.job.state;
        let asked = requested(s).clone();
        // What it is indexed by, checked in debug builds only (edits are on hot paths).
        #[cfg(debug_assertions)]
        let keys = (owner(&s.job).to_string(), name(&s.job).to_string());
        let r = f(s);
        assert_eq!(s.job.state, before, "job {id}: edit changed its state");
        #[cfg(debug_assertions)]
        assert!(
            keys.0 == owner(&s.job) && keys.1 == name(&s.job),
            "job {id}: edit changed what it is indexed by (use `replace`)"
        );
        if *requested(s) != asked {
            self.revision += 1;
        }
        self.written(id);
        Some(r)
    }

    /// Puts `stored` in place of the job of its id, every index following (a changed
    /// name, owner, partition or limit: `gpuctl update`), and records it as changed.
    /// The state must stay as it is: that is `transition`'s alone.
    pub(crate) fn replace(&mut self, stored: Record) {
        let id = stored.job.id;
        debug_assert_eq!(
            self.get(id).map(|s| s.job.state),
            Some(stored.job.state),
            "job {id}: replace changed its state"
        );
        self.insert(stored);
        self.written(id);
    }

    /// Sets what a pending job shows while it waits (its reason and expected start):
    /// kept in memory only, recomputed by every pass. Only for PENDING jobs.
    /// A hold it lifts (a begin time come, `begin.rs`) puts the job back in a pass's
    /// queue: the job is noted as changed (`touched_since`).
    pub(crate) fn annotate_pending(&mut self, id: u64, f: impl FnOnce(&mut Job)) {
        let mut lifted = false;
        if let Some(s) = self.live.get_mut(&id) {
            let j = &mut s.job;
            if j.state == JobState::Pending {
                let held = !j.hold.is_empty();
                f(j);
                debug_assert_eq!(j.state, JobState::Pending);
                // Held before, or held now, not both.
                lifted = held == j.hold.is_empty();
            }
        }
        if lifted {
            self.touch(id);
        }
    }

    /// The one place where a job's state changes. Keeps every index true and records
    /// the job as changed.
    pub(crate) fn transition(&mut self, id: u64, t: Transition, now: i64) -> Result<(), Refused> {
        let s = self.get(id).ok_or(Refused::Unknown(id))?;
        let from = s.job.state;
        let what = match &t {
            Transition::Start { .. } => "start",
            Transition::Requeue { .. } => "requeue",
            Transition::Readopt { .. } => "readopt",
            Transition::EndOn { .. } => "a rank's end",
            Transition::Finish { .. } => "finish",
        };
        let legal = match &t {
            Transition::Start { .. } => from == JobState::Pending,
            Transition::Requeue { .. } => from == JobState::Running,
            Transition::Readopt { node, attempt } => readoptable(s, node, *attempt),
            Transition::EndOn { node, state, .. } => {
                from == JobState::Running
                    && state.is_final()
                    && s.job
                        .allocations
                        .iter()
                        .any(|a| !a.ended && a.node == *node)
            }
            Transition::Finish { state, .. } => !from.is_final() && state.is_final(),
        };
        if !legal {
            return Err(Refused::Illegal { id, from, what });
        }
        let mut s = self.take(id).expect("looked up above");
        self.unindex(&s);
        let before = (from == JobState::Running).then(|| {
            let j = &s.job;
            EndedRun {
                job: id,
                account: j.spec.account.clone(),
                user: owner(j).to_string(),
                start_ms: j.start_time_ms,
                end_ms: now,
                allocations: j.allocations.clone(),
            }
        });
        apply(&mut s, t, now);
        if let Some(run) = before.filter(|_| s.job.state != JobState::Running) {
            self.ended_runs.push(run);
        }
        if !s.job.spec.mail_type.is_empty() {
            self.mails
                .extend(crate::mail::after_transition(&s.job, from, now));
        }
        self.index(&s);
        self.put(id, s);
        self.written(id);
        Ok(())
    }

    /// Records that pending jobs just ended by one cancel (each through `transition`)
    /// were ended so and by nothing else (`Changes::cancels`).
    pub(crate) fn cancelled_pending(&mut self, cancel: PendingCancel) {
        if cancel.ids.is_empty() {
            return;
        }
        for id in &cancel.ids {
            self.changes.changed_after.remove(id);
        }
        self.changes.cancels.push(cancel);
    }

    /// Notes that job `id` changed (`touched_since`).
    fn touch(&mut self, id: u64) {
        let log = &mut self.touched;
        if log.ids.len() == TOUCH_LOG_MAX {
            log.ids.pop_front();
            log.first += 1;
        }
        log.ids.push_back(id);
    }

    /// Forgets what changed so far: every cursor taken before reads everything again
    /// (a new configuration changes what readers computed from every job).
    pub(crate) fn forget_touched(&mut self) {
        let log = &mut self.touched;
        log.first += log.ids.len() as u64 + 1;
        log.ids.clear();
    }

    /// Where the jobs stand now, for `touched_since`.
    pub fn cursor(&self) -> JobsCursor {
        let log = &self.touched;
        JobsCursor {
            log: log.log,
            seq: log.first + log.ids.len() as u64,
        }
    }

    /// The jobs changed since `at` (each once, in id order), or `None` when that is no
    /// longer known (another `Jobs`'s cursor, or one older than the log keeps): then
    /// the reader reads everything again.
    pub fn touched_since(&self, at: JobsCursor) -> Option<Vec<u64>> {
        let log = &self.touched;
        if at.log != log.log || at.seq < log.first {
            return None;
        }
        let from = usize::try_from(at.seq - log.first).ok()?;
        let mut ids: Vec<u64> = log.ids.range(from.min(log.ids.len())..).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        Some(ids)
    }

    /// Whether `id` changed since the last `take_changes`.
    pub(crate) fn changed(&self, id: u64) -> bool {
        self.changes.put.contains(&id) || self.changes.delete.contains(&id)
    }

    /// Job `id` changed and its record is to be written: for the store (`changes`),
    /// and for readers of the touch log.
    fn written(&mut self, id: u64) {
        self.changes.put.insert(id);
        self.changed_again(id);
        self.touch(id);
    }

    /// A job changed: if a cancel of this window ended it, its record now says more.
    fn changed_again(&mut self, id: u64) {
        if !self.changes.cancels.is_empty() {
            self.changes.changed_after.insert(id);
        }
    }

    /// Finished jobs that ended before `oldest_end`, and beyond the newest `max_jobs`,
    /// are removed (recorded as deletions).
    pub(crate) fn retire(&mut self, oldest_end: i64, max_jobs: usize) -> usize {
        let mut removed = 0;
        while let Some(&(end, id)) = self.finished.first() {
            if end >= oldest_end && self.finished.len() <= max_jobs {
                break;
            }
            self.remove(id);
            removed += 1;
        }
        removed
    }

    /// Runs that stopped since the last call.
    /// The runs stopped since the last charge, not yet charged.
    pub fn ended_runs(&self) -> &[EndedRun] {
        &self.ended_runs
    }

    /// Sets the runs stopped and not yet charged (a snapshot's).
    pub(crate) fn set_ended_runs(&mut self, runs: Vec<EndedRun>) {
        self.ended_runs = runs;
    }

    /// The mails due since the last call.
    pub(crate) fn take_mails(&mut self) -> Vec<crate::mail::Mail> {
        std::mem::take(&mut self.mails)
    }

    pub(crate) fn take_ended_runs(&mut self) -> Vec<EndedRun> {
        std::mem::take(&mut self.ended_runs)
    }

    /// What changed since the last call, for the shell to persist.
    pub(crate) fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// Recomputes every index from the jobs and compares them: the first that differs,
    /// or a job filed as live or done in the wrong state. Tests call it after every
    /// step (through `Cluster::check`).
    pub fn check(&self) -> Result<(), String> {
        let mut fresh = Jobs::default();
        for s in self.live.values().chain(self.done.values()) {
            fresh.index(s);
        }
        if let Some(s) = self.live.values().find(|s| s.job.state.is_final()) {
            return Err(format!("job {} is live but {:?}", s.job.id, s.job.state));
        }
        if let Some(s) = self.done.values().find(|s| !s.job.state.is_final()) {
            return Err(format!("job {} is done but {:?}", s.job.id, s.job.state));
        }
        fn same<T: PartialEq + std::fmt::Debug>(what: &str, a: &T, b: &T) -> Result<(), String> {
            if a == b {
                Ok(())
            } else {
                Err(format!("index {what}: kept {b:?}, recomputed {a:?}"))
            }
        }
        same("with_deps", &fresh.with_deps, &self.with_deps)?;
        same("by_node", &fresh.by_node, &self.by_node)?;
        same(
            "pending_by_user",
            &fresh.pending_by_user,
            &self.pending_by_user,
        )?;
        same(
            "pending_by_qos",
            &fresh.pending_by_qos,
            &self.pending_by_qos,
        )?;
        same("finished", &fresh.finished, &self.finished)?;
        same("running", &fresh.running, &self.running)?;
        same(
            "active_by_user",
            &fresh.active_by_user,
            &self.active_by_user,
        )?;
        same(
            "active_by_name",
            &fresh.active_by_name,
            &self.active_by_name,
        )?;
        same("active_owners", &fresh.active_owners, &self.active_owners)?;
        same("requests", &fresh.requests, &self.requests)
    }
}

/// Whether a requeued job can be taken back by `node`, which still runs (or has just
/// ended) the very start it was requeued from. Only single-node jobs: a gang job's
/// other ranks were killed at requeue.
fn readoptable(s: &Record, node: &str, attempt: u32) -> bool {
    let Some(before) = &s.requeued_from else {
        return false;
    };
    let j = &s.job;
    j.state == JobState::Pending
        && j.attempt == attempt
        && before.attempt == attempt
        && !before.allocations.is_empty()
        && before.allocations.iter().all(|a| a.node == node)
}

/// The final state of a job from the ends of its allocations: a rank's own failure
/// (FAILED, TIMEOUT) wins over the ranks killed because of it, which win over success.
fn final_state(allocs: &[Allocation]) -> (JobState, Option<i32>, String) {
    let bad = allocs
        .iter()
        .find(|a| matches!(a.state, Some(JobState::Failed | JobState::Timeout)))
        .or_else(|| allocs.iter().find(|a| a.state != Some(JobState::Completed)));
    match bad {
        Some(a) => (
            a.state.unwrap_or(JobState::Failed),
            a.exit_code,
            a.reason.clone(),
        ),
        None => (
            JobState::Completed,
            allocs.first().and_then(|a| a.exit_code),
            String::new(),
        ),
    }
}

fn apply(s: &mut Record, t: Transition, now: i64) {
    match t {
        Transition::Start { allocations } => {
            let j = &mut s.job;
            j.state = JobState::Running;
            j.attempt += 1;
            // The record keeps the last run's steps.
            j.steps.clear();
            // The placement is the allocations alone (`presented` derives the rest).
            j.node.clear();
            j.gpus.clear();
            j.allocations = allocations;
            j.start_time_ms = now;
            j.launch_time_ms = 0;
            j.expected_start_ms = 0;
            j.reason = String::new();
            s.start_confirmed = false;
            s.requeued_from = None;
            s.requeue_requested.clear();
            s.preempted_by = 0;
            s.vacate_by_ms = 0;
        }
        Transition::Requeue {
            reason,
            keep_for_readopt,
        } => {
            let before = s.job.clone();
            let j = &mut s.job;
            j.state = JobState::Pending;
            j.allocations.clear();
            j.node.clear();
            j.gpus.clear();
            j.start_time_ms = 0;
            j.launch_time_ms = 0;
            j.reason = reason;
            s.start_confirmed = false;
            s.requeue_requested.clear();
            // `preempted_by` stays until it starts again: its reason says so meanwhile.
            s.vacate_by_ms = 0;
            s.requeued_from = keep_for_readopt.then_some(before);
        }
        Transition::Readopt { .. } => {
            let mut before = s.requeued_from.take().expect("checked readoptable");
            before.reason = String::new();
            before.expected_start_ms = 0;
            s.job = before;
            s.start_confirmed = true;
        }
        Transition::EndOn {
            node,
            state,
            exit_code,
            reason,
        } => {
            let j = &mut s.job;
            for a in j
                .allocations
                .iter_mut()
                .filter(|a| a.node == node && !a.ended)
            {
                a.ended = true;
                a.state = Some(state);
                a.exit_code = exit_code;
                a.reason.clone_from(&reason);
            }
            if j.allocations.iter().all(|a| a.ended) {
                let (state, exit_code, reason) = final_state(&j.allocations);
                end(s, state, exit_code, reason, now);
            }
        }
        Transition::Finish {
            state,
            exit_code,
            reason,
        } => {
            for a in s.job.allocations.iter_mut().filter(|a| !a.ended) {
                a.ended = true;
                a.state = Some(state);
            }
            end(s, state, exit_code, reason, now);
        }
    }
}

/// A job's end: its final state, exit code and reason at `now`, then compacted.
fn end(s: &mut Record, state: JobState, exit_code: Option<i32>, reason: String, now: i64) {
    let j = &mut s.job;
    j.state = state;
    j.exit_code = exit_code;
    j.reason = reason;
    j.end_time_ms = now;
    j.expected_start_ms = 0;
    compact(s);
}

#[cfg(test)]
#[path = "jobs/tests.rs"]
mod tests;
