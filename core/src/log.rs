//! The cluster's log: every change to the state that must outlive the process, as an
//! entry, and `Cluster::apply`, the one way an entry changes the state.
//!
//! An entry says what happened and when (`Entry::at`, the time the controller that
//! decided it read from its clock): applying it reads no clock, does no I/O and draws
//! no random number, so the same entries applied in the same order to two clusters
//! that started alike leave them alike (`core/tests/log.rs`). That is what replicated
//! controllers rely on (issue 40): the leader decides, the log carries its decisions,
//! every replica applies them.
//!
//! What the leader decides before an entry exists, and keeps to itself:
//! - admission: a submit is checked (`Cluster::admit`, which only reads the state) and
//!   the entry carries the records it built, ids included;
//! - an agent's proof of identity: the challenge nonce it answers and whether another
//!   agent holds its name (`Cluster::check_attach`); the entry is the attach itself;
//! - a session's replay window, when the agent was last heard from and the numbers of
//!   the commands sent on it (`check_session`, `command_sent`): sessions live on the
//!   controller an agent is connected to, and an agent attaches again to a new one.
//!   What depends on them is decided first and carried by the entry: the nodes silent
//!   too long (`silent_nodes`), the starts an agent handled without running them
//!   (`starts_not_run`);
//! - a scheduling pass's plan: the entries are its starts, its waiting jobs' reasons
//!   and the jobs that may preempt, checked again against the state as they apply.
//!
//! A refusal an entry meets as it applies (a cancel of someone else's job) is the same
//! on every replica: it changes nothing anywhere.

use crate::config::Config;
use crate::error::{Actor, Refusal};
use crate::event::{Heartbeat, HeartbeatAnswer, Register, Report};
use crate::node::NodeRow;
use crate::reconfig::Reconfigured;
use crate::record::Record;
use crate::state::{Cluster, Effects};
use crate::view::{CancelResult, TaskRef};
use gpuctl_sched as sched;
use std::borrow::Cow;
use std::collections::BTreeSet;

/// One change to the cluster, and when it was decided (ms since the epoch).
#[derive(Debug, Clone)]
pub struct Entry {
    pub at: i64,
    pub change: Change,
}

impl Entry {
    pub fn new(at: i64, change: Change) -> Entry {
        Entry { at, change }
    }
}

/// What changes. Each variant is one operation of the state machine.
#[derive(Debug, Clone)]
pub enum Change {
    /// Jobs admitted (`Cluster::admit`): one, or the tasks of an array, with their ids.
    Submit(Vec<Record>),
    /// A cancel of jobs by id and of arrays' tasks by index (a filter's jobs are
    /// resolved to ids before).
    Cancel {
        actor: Actor,
        ids: Vec<u64>,
        tasks: Vec<TaskRef>,
    },
    /// A hold, release, requeue or the end of an allocation, of one job.
    Job {
        actor: Actor,
        id: u64,
        action: JobAction,
    },
    /// A job's time limit, partition, name, comment or nice changed.
    Update {
        actor: Actor,
        id: u64,
        update: crate::update::JobUpdate,
    },
    /// A node drained (with why) or resumed (`None`).
    Drain {
        node: String,
        reason: Option<String>,
    },
    /// An agent attached (its identity checked by `Cluster::check_attach`).
    Attach {
        register: Register,
        peer: Option<std::net::SocketAddr>,
    },
    /// An agent's command stream closed.
    Disconnected { node: String, generation: u64 },
    /// A heartbeat, with the starts its agent handled without running them
    /// (`Cluster::starts_not_run`: the session's commands are the leader's).
    Heartbeat {
        heartbeat: Heartbeat,
        not_run: Vec<(u64, u32)>,
    },
    /// One node's reports, in order.
    Reports(Vec<Report>),
    /// The watchdog's round: the nodes silent past the node timeout (by when the
    /// leader last heard from them: `Cluster::silent_nodes`) fail.
    CheckNodes { silent: Vec<String> },
    /// A node failed for a reason of the controller's (its identity revoked).
    FailNode { node: String, why: String },
    /// The changing start of a scheduling pass (`Cluster::pass_prepare`).
    Prepare,
    /// A whole scheduling pass that every replica runs alike (`Cluster::whole_pass`:
    /// its start, the plan of the pure scheduler from the state it left, and the plan
    /// applied): one entry instead of a start, a plan's parts and their round trips,
    /// for passes small enough to run under the lock.
    Pass,
    /// Starts of a pass's plan.
    Starts(Vec<sched::Start>),
    /// Why jobs of a pass's plan wait.
    Waiting(Vec<Wait>),
    /// After a pass: the waiting jobs that may take running jobs' places.
    Preempt(Vec<u64>),
    /// A new configuration (`gpuctl admin reconfigure`).
    Reconfigure(Box<Config>),
}

/// Why a job of a pass's plan waits (the queue's REASON), and when it is expected to
/// start (Unix ms; 0: not known; `KEEP_START`: as the last pass that planned it said).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    pub job: u64,
    pub reason: Cow<'static, str>,
    pub expected_start_ms: i64,
}

impl Wait {
    pub fn of(w: &sched::Waiting) -> Wait {
        Wait {
            job: w.job,
            reason: Cow::Borrowed(w.reason.name()),
            expected_start_ms: w.reservation.as_ref().map_or(0, |r| r.start),
        }
    }

    /// Every waiting job of `plan`: those it did not plan (it stopped once nothing
    /// else could start, `sched::Plan::unplanned`) wait for resources and keep the
    /// expected start a pass that planned them gave.
    pub fn all_of(plan: &sched::Plan) -> Vec<Wait> {
        let (planned, unplanned) = plan.planned_and_not();
        let kept = unplanned.iter().map(|w| Wait {
            expected_start_ms: KEEP_START,
            ..Wait::of(w)
        });
        planned.iter().map(Wait::of).chain(kept).collect()
    }

    /// `all_of` in parts of at most `part` (each a `Change::Waiting`).
    pub fn parts_of(plan: &sched::Plan, part: usize) -> impl Iterator<Item = Vec<Wait>> {
        let mut all = Wait::all_of(plan).into_iter();
        let part = part.max(1);
        std::iter::from_fn(move || {
            let next: Vec<Wait> = all.by_ref().take(part).collect();
            (!next.is_empty()).then_some(next)
        })
    }
}

/// A `Wait`'s expected start that leaves the job's as it is.
pub const KEEP_START: i64 = -1;

/// What a hold, release or requeue does to its job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobAction {
    Hold,
    Release,
    Requeue,
    /// The end of an interactive allocation, with how its shell ended.
    ReleaseAllocation(Option<i32>),
}

/// What a whole pass (`Cluster::whole_pass`) answers the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Passed {
    /// Whether jobs still wait after it.
    pub waiting: bool,
    /// The room its plan left for a job that needs a GPU (`policy::gpu_room`).
    pub room: crate::policy::GpuRoom,
}

/// The pending jobs a pass leaves out, as `pass_prepare` settled them: those waiting
/// for other jobs or for their partition, and every job submitted after it (ids from
/// `first_new` on). The daemon takes the queue in later holds of its lock: a job
/// submitted between them has not had its dependencies looked at, so it waits for the
/// next pass (its submit asks for one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Waiting {
    pub ids: BTreeSet<u64>,
    pub first_new: u64,
}

impl Waiting {
    pub fn contains(&self, id: u64) -> bool {
        id >= self.first_new || self.ids.contains(&id)
    }
}

/// What an entry answers the one who asked for it.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// Nothing to answer.
    Done,
    Cancelled(Vec<CancelResult>),
    Node(Box<NodeRow>),
    /// An attach's session generation.
    Attached(u64),
    Heartbeat(HeartbeatAnswer),
    /// For each report, whether the instance it names is stale.
    Reports(Vec<bool>),
    /// The pending jobs a pass leaves out (they wait for others, or a partition).
    Prepared(Waiting),
    Passed(Passed),
    Reconfigured(Reconfigured),
}

impl Cluster {
    /// Applies one entry: its answer (or the refusal it met, which changed nothing)
    /// and its effects. What changed is taken with `take_changes` as after any
    /// operation.
    pub fn apply(&mut self, entry: Entry) -> (Result<Applied, Refusal>, Effects) {
        let now = entry.at;
        let mut effects = Effects::default();
        let answer = match entry.change {
            Change::Submit(records) => self.check_submit(&records).map(|()| {
                for r in records {
                    effects.merge(self.commit_submit(r));
                }
                Applied::Done
            }),
            Change::Cancel { actor, ids, tasks } => self
                .cancel_tasks(&actor, &ids, &tasks, now)
                .map(|(results, e)| {
                    effects = e;
                    Applied::Cancelled(results)
                }),
            Change::Job { actor, id, action } => {
                let done = match action {
                    JobAction::Hold => self.hold(&actor, id),
                    JobAction::Release => self.release(&actor, id),
                    JobAction::Requeue => {
                        self.requeue(&actor, id, &format!("requeued by {}", actor.user), now)
                    }
                    JobAction::ReleaseAllocation(code) => self.release_allocation(&actor, id, code),
                };
                done.map(|e| {
                    effects = e;
                    Applied::Done
                })
            }
            Change::Update { actor, id, update } => self.update_job(&actor, id, &update).map(|e| {
                effects = e;
                Applied::Done
            }),
            Change::Drain { node, reason } => self.set_drain(&node, reason).map(|(row, e)| {
                effects = e;
                Applied::Node(Box::new(row))
            }),
            Change::Attach { register, peer } => {
                self.attach_checked(&register, peer, now)
                    .map(|(generation, e)| {
                        effects = e;
                        Applied::Attached(generation)
                    })
            }
            Change::Disconnected { node, generation } => {
                self.disconnected(&node, generation);
                Ok(Applied::Done)
            }
            Change::Heartbeat { heartbeat, not_run } => {
                let (answer, e) = self.heartbeat_checked(&heartbeat, &not_run, now);
                effects = e;
                Ok(Applied::Heartbeat(answer))
            }
            Change::Reports(reports) => {
                let mut stale = Vec::with_capacity(reports.len());
                for r in &reports {
                    let (s, e) = self.report(r, now);
                    stale.push(s);
                    effects.merge(e);
                }
                Ok(Applied::Reports(stale))
            }
            Change::CheckNodes { silent } => {
                effects = self.fail_silent(&silent, now);
                Ok(Applied::Done)
            }
            Change::FailNode { node, why } => {
                self.fail_node(&node, &why, now, &mut effects);
                Ok(Applied::Done)
            }
            Change::Prepare => {
                let waiting = self.pass_prepare(now);
                effects = self.lend_pass(now);
                Ok(Applied::Prepared(waiting))
            }
            Change::Pass => {
                let (passed, e) = self.whole_pass(now);
                effects = e;
                Ok(Applied::Passed(passed))
            }
            Change::Starts(starts) => {
                effects = self.apply_starts(&starts, now);
                Ok(Applied::Done)
            }
            Change::Waiting(waiting) => {
                self.annotate_waiting(&waiting);
                Ok(Applied::Done)
            }
            Change::Preempt(candidates) => {
                self.preempt_for(&candidates, now, &mut effects);
                self.plan_mig(now, &mut effects);
                Ok(Applied::Done)
            }
            Change::Reconfigure(config) => Ok(Applied::Reconfigured(self.reconfigure(*config))),
        };
        effects.mails.extend(self.jobs.take_mails());
        (answer, effects)
    }
}

impl Cluster {
    /// Whether admitted `records` may be queued as they are: their ids are free and
    /// their request id names no queued job. Admissions decided on a state that had
    /// not applied everything before them (a new leader's, or a leader's with earlier
    /// submits still in the log) can collide; the later one is refused, alike on every
    /// replica, and its submit admitted again.
    fn check_submit(&self, records: &[Record]) -> Result<(), Refusal> {
        for r in records {
            if self.jobs.get(r.job.id).is_some() {
                return Err(Refusal::already_exists(format!(
                    "job id {} was taken meanwhile; admit the submit again",
                    r.job.id
                )));
            }
            let (user, request) = (&r.job.spec.user, &r.request_id);
            if let Some(id) = (!request.is_empty())
                .then(|| self.jobs.by_request(user, request))
                .flatten()
            {
                return Err(Refusal::already_exists(format!(
                    "request {request:?} of {user} was queued meanwhile as job {id}"
                )));
            }
        }
        Ok(())
    }
}

/// The entries that apply a pass's plan as `Cluster::apply_plan` does: its starts in
/// parts of `part`, its waiting jobs' reasons likewise, then preemption.
pub fn plan_entries(plan: &sched::Plan, part: usize, at: i64) -> Vec<Entry> {
    let part = part.max(1);
    let starts = (plan.starts.chunks(part)).map(|p| Entry::new(at, Change::Starts(p.to_vec())));
    let waiting = Wait::parts_of(plan, part).map(|p| Entry::new(at, Change::Waiting(p)));
    starts
        .chain(waiting)
        .chain(std::iter::once(Entry::new(
            at,
            Change::Preempt(crate::policy::preempt_candidates(plan)),
        )))
        .collect()
}
