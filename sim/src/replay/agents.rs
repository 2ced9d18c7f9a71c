//! The replay's simulated agents: they run what the controller sends. A start reports
//! STARTED at once and is due to end COMPLETED after the job's duration; a kill (a
//! cancel, a requeue, a preemption) ends the instance after its grace (the checkpoint
//! signal's lead), in the state the kill names. Every instance that stops is recorded
//! as a run, with the GPU slots it held. A job that checkpoints (its trace row has a
//! signal and `requeue`) saves its work when signalled: requeued, it runs only what was
//! left (the signal's lead is what it loses); any other job starts over.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use super::logged::Logged;
use gpuctl_core::command::Command;
use gpuctl_core::event::{Report, ReportKind};
use gpuctl_core::log::Change;
use gpuctl_core::record::JobState;
use gpuctl_sched::Millis;
use gpuctl_sched::job::JobState as State;

use super::TraceJob;

/// One instance that ran: whose, when, how much, and whether it finished its work.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// The controller's job id, and the trace's.
    pub job: u64,
    pub trace_id: u64,
    pub account: String,
    pub start: Millis,
    pub end: Millis,
    pub gpu_milli: u64,
    pub completed: bool,
    /// Work it saved before it stopped (a checkpoint at its signal), ms.
    pub saved_ms: Millis,
    /// The GPU slots it held (every rank): (slot uuid, compute milli).
    pub slots: Vec<(String, u32)>,
}

/// A due end: (time, job, attempt, node, state).
type Due = Reverse<(Millis, u64, u32, String, State)>;

#[derive(Default)]
pub struct SimAgents {
    ends: BinaryHeap<Due>,
    /// Instances running: (job, attempt) -> (start, GPU milli).
    running: HashMap<(u64, u32), (Millis, u64)>,
    /// GPU milli held by running instances.
    pub allocated_milli: u64,
    pub runs: Vec<RunRecord>,
    /// Jobs that went back to the queue (requeued, preempted) since the last call.
    pub requeued: usize,
    /// Work each checkpointing job has saved, ms.
    saved: HashMap<u64, Millis>,
    /// Instances signalled to stop: (job, attempt) -> when (their checkpoint).
    signalled: HashMap<(u64, u32), Millis>,
    /// Slots of running instances, every rank: (job, attempt) -> (uuid, compute milli).
    slots: HashMap<(u64, u32), Vec<(String, u32)>>,
}

impl SimAgents {
    /// When the next end is due.
    pub fn next_end(&self) -> Option<Millis> {
        self.ends.peek().map(|Reverse((t, ..))| *t)
    }

    /// Reports every end due by `now`. Returns the last end time.
    pub fn report_due(
        &mut self,
        c: &mut Logged,
        by_id: &BTreeMap<u64, &TraceJob>,
        now: Millis,
    ) -> Option<Millis> {
        let mut last = None;
        while let Some(Reverse((t, id, attempt, node, state))) = self.ends.peek().cloned() {
            if t > now {
                break;
            }
            self.ends.pop();
            if !self.running.contains_key(&(id, attempt)) {
                continue; // that instance is already gone
            }
            let completed = state == State::Completed;
            let end = Report {
                state,
                exit_code: Some(if completed { 0 } else { -15 }),
                time_ms: t,
                ..Report::new(&node, id, attempt, ReportKind::Ended)
            };
            c.apply_sure(t, Change::Reports(vec![end]));
            let Some(j) = c.jobs().job(id) else { continue };
            let gone = j.state != JobState::Running || j.attempt != attempt;
            if gone && let Some((start, milli)) = self.running.remove(&(id, attempt)) {
                self.allocated_milli -= milli;
                if j.state == JobState::Pending {
                    self.requeued += 1;
                }
                let completed = j.state == JobState::Completed;
                let trace = by_id[&id];
                let mut saved_ms = 0;
                if let Some(at) = self.signalled.remove(&(id, attempt))
                    && !completed
                    && checkpoints(trace)
                {
                    saved_ms = (at - start).max(0);
                    *self.saved.entry(id).or_default() += saved_ms;
                }
                self.runs.push(RunRecord {
                    job: id,
                    trace_id: trace.id,
                    account: trace.account.clone(),
                    start,
                    end: t,
                    gpu_milli: milli,
                    completed,
                    saved_ms,
                    slots: self.slots.remove(&(id, attempt)).unwrap_or_default(),
                });
            }
            last = Some(t);
        }
        last
    }

    /// Runs the commands a pass sent. Returns the jobs started (rank 0 of each).
    pub fn deliver<'a>(
        &mut self,
        c: &mut Logged,
        sends: Vec<(String, Command)>,
        by_id: &BTreeMap<u64, &'a TraceJob>,
        now: Millis,
    ) -> Vec<&'a TraceJob> {
        let mut started = Vec::new();
        for (node, cmd) in sends {
            match cmd {
                Command::Start(s) => {
                    let j = by_id[&s.job_id];
                    let report = Report {
                        time_ms: now,
                        ..Report::new(&node, s.job_id, s.attempt, ReportKind::Started)
                    };
                    c.apply_sure(now, Change::Reports(vec![report]));
                    let done = State::Completed;
                    let saved = self.saved.get(&s.job_id).copied().unwrap_or(0);
                    let left = (j.duration - saved).max(1000);
                    self.ends
                        .push(Reverse((now + left, s.job_id, s.attempt, node, done)));
                    self.slots
                        .entry((s.job_id, s.attempt))
                        .or_default()
                        .extend(s.slots.iter().map(|x| (x.uuid.clone(), x.compute_milli)));
                    if s.rank == 0 {
                        self.running
                            .insert((s.job_id, s.attempt), (now, j.gpu_milli));
                        self.allocated_milli += j.gpu_milli;
                        started.push(j);
                    }
                }
                Command::Kill(k) => {
                    let attempt = if k.attempt > 0 {
                        k.attempt
                    } else {
                        c.jobs().job(k.job_id).map_or(0, |j| j.attempt)
                    };
                    let grace = i64::try_from(k.kill_grace_secs).unwrap_or(0) * 1000;
                    self.signalled.entry((k.job_id, attempt)).or_insert(now);
                    self.ends
                        .push(Reverse((now + grace, k.job_id, attempt, node, k.as_state)));
                }
            }
        }
        started
    }
}

/// Whether a trace job saves its work when signalled (a checkpoint signal and requeue).
fn checkpoints(j: &TraceJob) -> bool {
    j.requeue && !j.signal.is_empty()
}
