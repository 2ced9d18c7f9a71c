//! The log's entries in their stored form (`LogEntry` of store.proto): what a
//! replicated controller appends and sends its followers. Protobuf, so that a newer
//! controller reads what an older one wrote (a rolling upgrade).

use crate::store::{self as st, log_entry::Change as Pb, log_job_action::Action};
use crate::{self as pb, job_report};
use gpuctl_core::event::{Heartbeat, Register, Report, ReportKind};
use gpuctl_core::log::{Change, Entry, JobAction, Wait};
use gpuctl_core::update::JobUpdate;
use gpuctl_core::{Actor, Config};
use gpuctl_sched as sched;

use super::{gpu_metrics_pb, gpu_pb, running_pb};

/// An entry that cannot be read: written by a newer version, or damaged.
#[derive(Debug, thiserror::Error)]
#[error("log entry at {at}: {why}")]
pub struct BadEntry {
    pub at: i64,
    pub why: String,
}

/// The entries a stored entry holds, in order: a batch's parts (`batch`), else itself.
/// A batch inside a batch is refused.
pub fn entry_parts(e: st::LogEntry) -> Result<Vec<st::LogEntry>, BadEntry> {
    match e.change {
        Some(Pb::Batch(b)) => {
            let whole = |p: &&st::LogEntry| {
                matches!(
                    p.change,
                    Some(Pb::Batch(_) | Pb::Import(_) | Pb::Credential(_))
                )
            };
            if let Some(p) = b.parts.iter().find(whole) {
                return Err(BadEntry {
                    at: p.at,
                    why: "a batch inside a batch, an import or a credential".into(),
                });
            }
            Ok(b.parts)
        }
        _ => Ok(vec![e]),
    }
}

/// Entries proposed together, stored as one (`entry_parts` splits them again).
pub fn batch_pb(parts: Vec<st::LogEntry>) -> st::LogEntry {
    st::LogEntry {
        at: parts.first().map_or(0, |p| p.at),
        change: Some(Pb::Batch(st::LogBatch { parts })),
    }
}

/// An entry in its stored form.
pub fn entry_pb(e: &Entry) -> st::LogEntry {
    let change = match &e.change {
        Change::Submit(records) => Pb::Submit(st::LogSubmit {
            jobs: records.iter().map(Into::into).collect(),
        }),
        Change::Cancel { actor, ids, tasks } => Pb::Cancel(st::LogCancel {
            actor: Some(actor_pb(actor)),
            ids: ids.clone(),
            tasks: (tasks.iter())
                .map(|t| pb::ArrayTask {
                    array_job_id: t.array_job_id,
                    task_id: t.task_id,
                })
                .collect(),
        }),
        Change::Job { actor, id, action } => {
            let (kind, shell_exit) = match action {
                JobAction::Hold => (Action::Hold, None),
                JobAction::Release => (Action::Release, None),
                JobAction::Requeue => (Action::Requeue, None),
                JobAction::ReleaseAllocation(code) => (Action::ReleaseAllocation, *code),
            };
            Pb::Job(st::LogJobAction {
                actor: Some(actor_pb(actor)),
                id: *id,
                action: kind.into(),
                shell_exit,
            })
        }
        Change::Update { actor, id, update } => Pb::Update(st::LogUpdate {
            actor: Some(actor_pb(actor)),
            id: *id,
            time_limit_secs: update.time_limit_secs,
            partition: update.partition.clone(),
            name: update.name.clone(),
            comment: update.comment.clone(),
            priority: update.priority,
        }),
        Change::Drain { node, reason } => Pb::Drain(st::LogDrain {
            node: node.clone(),
            reason: reason.clone(),
        }),
        Change::Attach { register, peer } => Pb::Attach(st::LogAttach {
            register: Some(register_pb(register.clone())),
            peer: peer.map(|p| p.to_string()).unwrap_or_default(),
        }),
        Change::Disconnected { node, generation } => Pb::Disconnected(st::LogDisconnected {
            node: node.clone(),
            generation: *generation,
        }),
        Change::Heartbeat { heartbeat, not_run } => Pb::Heartbeat(st::LogHeartbeat {
            heartbeat: Some(heartbeat_pb(heartbeat.clone())),
            not_run: (not_run.iter())
                .map(|&(job, attempt)| st::LogInstance { job, attempt })
                .collect(),
        }),
        Change::Reports(reports) => Pb::Reports(st::LogReports {
            reports: reports.iter().cloned().map(report_pb).collect(),
        }),
        Change::CheckNodes { silent } => Pb::CheckNodes(st::LogCheckNodes {
            silent: silent.clone(),
        }),
        Change::FailNode { node, why } => Pb::FailNode(st::LogFailNode {
            node: node.clone(),
            why: why.clone(),
        }),
        Change::Prepare => Pb::Prepare(st::LogNothing {}),
        Change::Pass => Pb::Pass(st::LogNothing {}),
        Change::Starts(starts) => Pb::Starts(st::LogStarts {
            starts: starts.iter().map(start_pb).collect(),
        }),
        Change::Waiting(waits) => Pb::Waiting(st::LogWaiting {
            waits: (waits.iter())
                .map(|w| st::LogWait {
                    job: w.job,
                    reason: w.reason.to_string(),
                    expected_start_ms: w.expected_start_ms,
                })
                .collect(),
        }),
        Change::Preempt(candidates) => Pb::Preempt(st::LogPreempt {
            candidates: candidates.clone(),
        }),
        Change::Reconfigure(config) => Pb::Reconfigure(config.to_toml()),
    };
    st::LogEntry {
        at: e.at,
        change: Some(change),
    }
}

/// An entry read back from its stored form.
pub fn entry(e: st::LogEntry) -> Result<Entry, BadEntry> {
    let at = e.at;
    let bad = |why: String| BadEntry { at, why };
    let change = match e
        .change
        .ok_or_else(|| bad("no change (a newer kind?)".into()))?
    {
        Pb::Submit(s) => Change::Submit(
            (s.jobs.into_iter())
                .map(|j| {
                    j.try_into()
                        .map_err(|e| bad(format!("a submitted job: {e}")))
                })
                .collect::<Result<_, _>>()?,
        ),
        Pb::Cancel(c) => Change::Cancel {
            actor: actor(c.actor),
            ids: c.ids,
            tasks: c.tasks.iter().map(super::task_ref).collect(),
        },
        Pb::Job(j) => {
            let action = match j.action() {
                Action::Hold => JobAction::Hold,
                Action::Release => JobAction::Release,
                Action::Requeue => JobAction::Requeue,
                Action::ReleaseAllocation => JobAction::ReleaseAllocation(j.shell_exit),
                Action::Unspecified => return Err(bad("a job action of no known kind".into())),
            };
            Change::Job {
                actor: actor(j.actor),
                id: j.id,
                action,
            }
        }
        Pb::Update(u) => Change::Update {
            actor: actor(u.actor),
            id: u.id,
            update: JobUpdate {
                time_limit_secs: u.time_limit_secs,
                partition: u.partition,
                name: u.name,
                comment: u.comment,
                priority: u.priority,
            },
        },
        Pb::Drain(d) => Change::Drain {
            node: d.node,
            reason: d.reason,
        },
        Pb::Attach(a) => Change::Attach {
            register: super::register(a.register.unwrap_or_default()),
            peer: (!a.peer.is_empty())
                .then(|| a.peer.parse())
                .transpose()
                .map_err(|e| bad(format!("an attach's peer {:?}: {e}", a.peer)))?,
        },
        Pb::Disconnected(d) => Change::Disconnected {
            node: d.node,
            generation: d.generation,
        },
        Pb::Heartbeat(h) => Change::Heartbeat {
            heartbeat: super::heartbeat(h.heartbeat.unwrap_or_default()),
            not_run: h.not_run.iter().map(|i| (i.job, i.attempt)).collect(),
        },
        Pb::Reports(r) => Change::Reports(
            (r.reports.into_iter())
                .map(|r| super::report(r).map_err(|s| bad(s.message().to_string())))
                .collect::<Result<_, _>>()?,
        ),
        Pb::CheckNodes(c) => Change::CheckNodes { silent: c.silent },
        Pb::FailNode(f) => Change::FailNode {
            node: f.node,
            why: f.why,
        },
        Pb::Prepare(_) => Change::Prepare,
        Pb::Pass(_) => Change::Pass,
        Pb::Batch(_) => {
            return Err(bad(
                "a batch where one entry belongs (batches are split before)".into(),
            ));
        }
        Pb::Import(_) | Pb::Credential(_) => {
            return Err(bad(
                "an import or a credential where a change of the cluster belongs (the state machine applies them itself)".into(),
            ));
        }
        Pb::Starts(s) => Change::Starts(s.starts.into_iter().map(start).collect()),
        Pb::Waiting(w) => Change::Waiting(
            (w.waits.into_iter())
                .map(|w| Wait {
                    job: w.job,
                    reason: w.reason.into(),
                    expected_start_ms: w.expected_start_ms,
                })
                .collect(),
        ),
        Pb::Preempt(p) => Change::Preempt(p.candidates),
        Pb::Reconfigure(text) => {
            let config =
                Config::from_toml(&text).map_err(|e| bad(format!("a configuration: {e}")))?;
            Change::Reconfigure(Box::new(config))
        }
    };
    Ok(Entry { at, change })
}

fn actor_pb(a: &Actor) -> st::LogActor {
    st::LogActor {
        user: a.user.clone(),
        admin: a.admin,
    }
}

fn actor(a: Option<st::LogActor>) -> Actor {
    let a = a.unwrap_or_default();
    Actor {
        user: a.user,
        admin: a.admin,
    }
}

fn start_pb(s: &sched::Start) -> st::LogStart {
    st::LogStart {
        job: s.job,
        allocs: (s.allocs.iter())
            .map(|a| st::LogAlloc {
                node: a.node.clone(),
                slots: (a.slots.iter())
                    .map(|s| pb::SlotUse::from(&gpuctl_core::record::SlotUse::from(s)))
                    .collect(),
                cpu_milli: a.cpu_milli,
                memory_bytes: a.memory_bytes,
            })
            .collect(),
    }
}

fn start(s: st::LogStart) -> sched::Start {
    sched::Start {
        job: s.job,
        allocs: (s.allocs.into_iter())
            .map(|a| sched::Alloc {
                node: a.node,
                slots: (a.slots.into_iter())
                    .map(|s| sched::SlotUse::from(&gpuctl_core::record::SlotUse::from(s)))
                    .collect(),
                cpu_milli: a.cpu_milli,
                memory_bytes: a.memory_bytes,
            })
            .collect(),
    }
}

/// An attach as its agent sent it.
fn register_pb(r: Register) -> pb::RegisterRequest {
    pb::RegisterRequest {
        node: r.node,
        gpus: r.gpus.into_iter().map(gpu_pb).collect(),
        cpus: r.cpus,
        memory_bytes: r.memory_bytes,
        gpu_backend: r.gpu_backend,
        running: r.running.into_iter().map(running_pb).collect(),
        unacked_reports: r.unacked_reports.into_iter().map(report_pb).collect(),
        nonce: r.nonce,
        agent_id: r.agent_id,
        address: r.address,
        allow_root_jobs: r.allow_root_jobs,
        features: r.features,
        previous_session: r.previous_session,
        mig_dynamic: r.mig_dynamic,
        // Its stream's, not the state's: the link to the agent keeps it.
        takes_kill_batches: false,
    }
}

/// A heartbeat as its agent sent it.
fn heartbeat_pb(h: Heartbeat) -> pb::HeartbeatRequest {
    pb::HeartbeatRequest {
        node: h.node,
        running: h.running.into_iter().map(running_pb).collect(),
        metrics: h.metrics.into_iter().map(gpu_metrics_pb).collect(),
        commands_handled: h.commands_handled,
        reporting: h.reporting.into_iter().map(running_pb).collect(),
        health_error: h.health_error,
    }
}

/// A report as its agent sent it.
fn report_pb(r: Report) -> pb::JobReport {
    let kind = match r.kind {
        ReportKind::Started => job_report::Kind::Started,
        ReportKind::Ended => job_report::Kind::Ended,
        ReportKind::Warning => job_report::Kind::Warning,
    };
    pb::JobReport {
        node: r.node,
        job_id: r.job_id,
        attempt: r.attempt,
        kind: kind.into(),
        state: crate::record::state_number(r.state),
        exit_code: r.exit_code,
        reason: r.reason,
        time_ms: r.time_ms,
        cpu_time_ms: r.cpu_time_ms,
        mem_peak_bytes: r.mem_peak_bytes,
        steps: r.steps.iter().map(Into::into).collect(),
        node_fault: r.node_fault,
    }
}

#[cfg(test)]
mod tests;
