//! The replay's simulated agents: they run what the controller sends. A start reports
//! STARTED at once and is due to end COMPLETED after the job's duration; a kill (a
//! cancel, a requeue, a preemption) ends the instance after its grace (the checkpoint
//! signal's lead), in the state the kill names. Every instance that stops is recorded
//! as a run.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use gpuctl_core::Cluster;
use gpuctl_proto::{self as pb, JobState};
use gpuctl_sched::Millis;

use super::TraceJob;

/// One instance that ran: whose, when, how much, and whether it finished its work.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub job: u64,
    pub account: String,
    pub start: Millis,
    pub end: Millis,
    pub gpu_milli: u64,
    pub completed: bool,
}

/// A due end: (time, job, attempt, node, state).
type Due = Reverse<(Millis, u64, u32, String, i32)>;

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
}

impl SimAgents {
    /// When the next end is due.
    pub fn next_end(&self) -> Option<Millis> {
        self.ends.peek().map(|Reverse((t, ..))| *t)
    }

    /// Reports every end due by `now`. Returns the last end time.
    pub fn report_due(
        &mut self,
        c: &mut Cluster,
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
            let completed = state == JobState::Completed as i32;
            let end = pb::JobReport {
                node,
                job_id: id,
                kind: pb::job_report::Kind::Ended as i32,
                state,
                exit_code: Some(if completed { 0 } else { -15 }),
                time_ms: t,
                attempt,
                ..pb::JobReport::default()
            };
            c.report(&end, t);
            let Some(j) = c.jobs.job(id) else { continue };
            let gone = j.state() != JobState::Running || j.attempt != attempt;
            if gone && let Some((start, milli)) = self.running.remove(&(id, attempt)) {
                self.allocated_milli -= milli;
                if j.state() == JobState::Pending {
                    self.requeued += 1;
                }
                self.runs.push(RunRecord {
                    job: id,
                    account: by_id[&id].account.clone(),
                    start,
                    end: t,
                    gpu_milli: milli,
                    completed: j.state() == JobState::Completed,
                });
            }
            last = Some(t);
        }
        last
    }

    /// Runs the commands a pass sent. Returns the jobs started (rank 0 of each).
    pub fn deliver<'a>(
        &mut self,
        c: &mut Cluster,
        sends: Vec<(String, pb::AgentCommand)>,
        by_id: &BTreeMap<u64, &'a TraceJob>,
        now: Millis,
    ) -> Vec<&'a TraceJob> {
        let mut started = Vec::new();
        for (node, cmd) in sends {
            match cmd.command {
                Some(pb::agent_command::Command::Start(s)) => {
                    let j = by_id[&s.job_id];
                    let report = pb::JobReport {
                        node: node.clone(),
                        job_id: s.job_id,
                        kind: pb::job_report::Kind::Started as i32,
                        time_ms: now,
                        attempt: s.attempt,
                        ..pb::JobReport::default()
                    };
                    c.report(&report, now);
                    let done = JobState::Completed as i32;
                    self.ends
                        .push(Reverse((now + j.duration, s.job_id, s.attempt, node, done)));
                    if s.rank == 0 {
                        self.running
                            .insert((s.job_id, s.attempt), (now, j.gpu_milli));
                        self.allocated_milli += j.gpu_milli;
                        started.push(j);
                    }
                }
                Some(pb::agent_command::Command::Kill(k)) => {
                    let attempt = if k.attempt > 0 {
                        k.attempt
                    } else {
                        c.jobs.job(k.job_id).map_or(0, |j| j.attempt)
                    };
                    let grace = i64::try_from(k.kill_grace_secs).unwrap_or(0) * 1000;
                    self.ends
                        .push(Reverse((now + grace, k.job_id, attempt, node, k.as_state)));
                }
                None => {}
            }
        }
        started
    }
}
