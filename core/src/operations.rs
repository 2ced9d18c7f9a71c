//! Each operation of the state machine as one entry (`Operations`): a `Change` made
//! into an `Entry`, given to `Cluster::apply`, and its answer unpacked. For the
//! simulator, the tests and the examples, which drive a cluster one operation at a
//! time; the daemon builds its entries itself (its journal decides where they go). Only
//! `apply` changes the cluster's state from outside this crate (and `Cluster::leader`,
//! the session bookkeeping), so none of these can do what an entry cannot.
//!
//! A hold, release or the end of an allocation reads no time: its entry is stamped 0.

use crate::error::Refusal;
use crate::event::{Heartbeat, HeartbeatAnswer, Register, Report};
use crate::log::{Applied, Change, Entry, JobAction, Wait};
use crate::node::NodeRow;
use crate::ops::Waiting;
use crate::reconfig::Reconfigured;
use crate::record::Record;
use crate::state::{Cluster, Effects};
use crate::view::CancelResult;
use crate::{Actor, Config};
use gpuctl_sched as sched;

/// A cluster driven one entry at a time (see the module's doc).
pub trait Operations {
    /// An admitted job queued (`Change::Submit` of one record).
    fn commit_submit(&mut self, stored: Record) -> Effects;
    /// Jobs cancelled by `actor`.
    fn cancel(
        &mut self,
        actor: &Actor,
        ids: &[u64],
        now: i64,
    ) -> Result<(Vec<CancelResult>, Effects), Refusal>;
    fn hold(&mut self, actor: &Actor, id: u64) -> Result<Effects, Refusal>;
    fn release(&mut self, actor: &Actor, id: u64) -> Result<Effects, Refusal>;
    /// A job's time limit, partition, name, comment or nice changed by `actor`.
    fn update_job(
        &mut self,
        actor: &Actor,
        id: u64,
        update: &crate::update::JobUpdate,
    ) -> Result<Effects, Refusal>;
    /// A requeue by `actor` (its reason is the entry's: "requeued by USER").
    fn requeue(&mut self, actor: &Actor, id: u64, now: i64) -> Result<Effects, Refusal>;
    fn release_allocation(
        &mut self,
        actor: &Actor,
        id: u64,
        code: Option<i32>,
    ) -> Result<Effects, Refusal>;
    /// A node drained (`Some(reason)`) or resumed.
    fn set_drain(
        &mut self,
        node: &str,
        reason: Option<String>,
    ) -> Result<(NodeRow, Effects), Refusal>;
    /// An agent attaching: checked by the leader's desk, then its `Attach` entry.
    fn attach(
        &mut self,
        req: &Register,
        peer: Option<std::net::SocketAddr>,
        now: i64,
    ) -> Result<(u64, Effects), Refusal>;
    fn disconnected(&mut self, node: &str, generation: u64);
    /// A heartbeat, with the starts its agent handled without running them.
    fn heartbeat(&mut self, req: &Heartbeat, now: i64) -> (HeartbeatAnswer, Effects);
    /// A report: whether its instance is stale, and the effects.
    fn report(&mut self, r: &Report, now: i64) -> (bool, Effects);
    /// The watchdog's round: the nodes silent past the node timeout fail.
    fn check_nodes(&mut self, now: i64) -> Effects;
    /// A pass's changing start (`Change::Prepare`): the jobs left out of it.
    fn pass_prepare(&mut self, now: i64) -> Waiting;
    /// A pass's start and what it plans from: the view, the queue and the config.
    fn pass_input(
        &mut self,
        now: i64,
    ) -> (
        sched::ClusterView,
        Vec<sched::PendingJob>,
        sched::SchedConfig,
    );
    /// A plan applied as its entries (`log::plan_entries`).
    fn apply_plan(&mut self, plan: &sched::Plan, now: i64) -> Effects;
    fn apply_starts(&mut self, starts: &[sched::Start], now: i64) -> Effects;
    fn annotate_waiting(&mut self, waiting: &[Wait]);
    /// After a plan: the running jobs its waiting jobs of preempting QoS levels take.
    fn preempt(&mut self, plan: &sched::Plan, now: i64, effects: &mut Effects);
    fn reconfigure(&mut self, config: Config) -> Reconfigured;
}

/// Applies `change` at `at`: its answer and effects.
fn run(c: &mut Cluster, at: i64, change: Change) -> (Result<Applied, Refusal>, Effects) {
    c.apply(Entry::new(at, change))
}

/// A change answered `Done`: its effects.
fn done(c: &mut Cluster, at: i64, change: Change) -> Result<Effects, Refusal> {
    let (answer, effects) = run(c, at, change);
    answer.map(|_| effects)
}

fn job(
    c: &mut Cluster,
    actor: &Actor,
    id: u64,
    at: i64,
    action: JobAction,
) -> Result<Effects, Refusal> {
    let actor = actor.clone();
    done(c, at, Change::Job { actor, id, action })
}

impl Operations for Cluster {
    fn commit_submit(&mut self, stored: Record) -> Effects {
        let (answer, effects) = run(self, 0, Change::Submit(vec![stored]));
        answer.expect("an admitted record is queued");
        effects
    }

    fn cancel(
        &mut self,
        actor: &Actor,
        ids: &[u64],
        now: i64,
    ) -> Result<(Vec<CancelResult>, Effects), Refusal> {
        let change = Change::Cancel {
            actor: actor.clone(),
            ids: ids.to_vec(),
            tasks: Vec::new(),
        };
        let (answer, effects) = run(self, now, change);
        match answer? {
            Applied::Cancelled(results) => Ok((results, effects)),
            other => unreachable!("a cancel answers its results, not {other:?}"),
        }
    }

    fn hold(&mut self, actor: &Actor, id: u64) -> Result<Effects, Refusal> {
        job(self, actor, id, 0, JobAction::Hold)
    }

    fn release(&mut self, actor: &Actor, id: u64) -> Result<Effects, Refusal> {
        job(self, actor, id, 0, JobAction::Release)
    }

    fn update_job(
        &mut self,
        actor: &Actor,
        id: u64,
        update: &crate::update::JobUpdate,
    ) -> Result<Effects, Refusal> {
        let change = Change::Update {
            actor: actor.clone(),
            id,
            update: update.clone(),
        };
        done(self, 0, change)
    }

    fn requeue(&mut self, actor: &Actor, id: u64, now: i64) -> Result<Effects, Refusal> {
        job(self, actor, id, now, JobAction::Requeue)
    }

    fn release_allocation(
        &mut self,
        actor: &Actor,
        id: u64,
        code: Option<i32>,
    ) -> Result<Effects, Refusal> {
        job(self, actor, id, 0, JobAction::ReleaseAllocation(code))
    }

    fn set_drain(
        &mut self,
        node: &str,
        reason: Option<String>,
    ) -> Result<(NodeRow, Effects), Refusal> {
        let node = node.to_string();
        let (answer, effects) = run(self, 0, Change::Drain { node, reason });
        match answer? {
            Applied::Node(row) => Ok((*row, effects)),
            other => unreachable!("a drain answers its node, not {other:?}"),
        }
    }

    fn attach(
        &mut self,
        req: &Register,
        peer: Option<std::net::SocketAddr>,
        now: i64,
    ) -> Result<(u64, Effects), Refusal> {
        self.leader().check_attach(req, now)?;
        let register = req.clone();
        let (answer, effects) = run(self, now, Change::Attach { register, peer });
        match answer? {
            Applied::Attached(generation) => Ok((generation, effects)),
            other => unreachable!("an attach answers its generation, not {other:?}"),
        }
    }

    fn disconnected(&mut self, node: &str, generation: u64) {
        let node = node.to_string();
        let (answer, _) = run(self, 0, Change::Disconnected { node, generation });
        answer.expect("a closed stream is never refused");
    }

    fn heartbeat(&mut self, req: &Heartbeat, now: i64) -> (HeartbeatAnswer, Effects) {
        let not_run = self.leader().starts_not_run(req);
        let heartbeat = req.clone();
        match run(self, now, Change::Heartbeat { heartbeat, not_run }) {
            (Ok(Applied::Heartbeat(answer)), effects) => (answer, effects),
            (other, _) => unreachable!("a heartbeat answers, not {other:?}"),
        }
    }

    fn report(&mut self, r: &Report, now: i64) -> (bool, Effects) {
        match run(self, now, Change::Reports(vec![r.clone()])) {
            (Ok(Applied::Reports(stale)), effects) => (stale.first() == Some(&true), effects),
            (other, _) => unreachable!("reports answer their acks, not {other:?}"),
        }
    }

    fn check_nodes(&mut self, now: i64) -> Effects {
        let silent = self.silent_nodes(now);
        run(self, now, Change::CheckNodes { silent }).1
    }

    fn pass_prepare(&mut self, now: i64) -> Waiting {
        match run(self, now, Change::Prepare) {
            (Ok(Applied::Prepared(waiting)), _) => waiting,
            (other, _) => unreachable!("a pass's start answers its waiting jobs, not {other:?}"),
        }
    }

    fn pass_input(
        &mut self,
        now: i64,
    ) -> (
        sched::ClusterView,
        Vec<sched::PendingJob>,
        sched::SchedConfig,
    ) {
        let waiting = Operations::pass_prepare(self, now);
        (self.view(), self.queue(&waiting), self.pass_config(now))
    }

    fn apply_plan(&mut self, plan: &sched::Plan, now: i64) -> Effects {
        let mut effects = Effects::default();
        for entry in crate::log::plan_entries(plan, usize::MAX, now) {
            effects.merge(self.apply(entry).1);
        }
        effects
    }

    fn apply_starts(&mut self, starts: &[sched::Start], now: i64) -> Effects {
        run(self, now, Change::Starts(starts.to_vec())).1
    }

    fn annotate_waiting(&mut self, waiting: &[Wait]) {
        let (answer, _) = run(self, 0, Change::Waiting(waiting.to_vec()));
        answer.expect("waiting jobs' notes are never refused");
    }

    fn preempt(&mut self, plan: &sched::Plan, now: i64, effects: &mut Effects) {
        let candidates = crate::policy::preempt_candidates(plan);
        effects.merge(run(self, now, Change::Preempt(candidates)).1);
    }

    fn reconfigure(&mut self, config: Config) -> Reconfigured {
        match run(self, 0, Change::Reconfigure(Box::new(config))) {
            (Ok(Applied::Reconfigured(done)), _) => done,
            (other, _) => unreachable!("a reconfigure answers what it did, not {other:?}"),
        }
    }
}
