//! Where the daemon's protobuf meets the state machine's own types (`gpuctl_core::node`
//! and `gpuctl_core::event`): what agents send, converted on the way in; the state's
//! answers, its commands, node listings and answers to users (`gpuctl_core::view`),
//! converted on the way out; a node's record, converted
//! to and from its stored form (`StoredNode`, whose format on disk is unchanged).

use crate::store::StoredNode;
use crate::{self as pb, job_report};
use gpuctl_core::command::Command;
use gpuctl_core::event::{Heartbeat, HeartbeatAnswer, Register, Report, ReportKind, Running};
use gpuctl_core::filter::JobFilter;
use gpuctl_core::node::{
    Gpu, GpuMetrics, GpuRow, JobGpuUse, MigInstance, Node, NodeListing, NodeRow, NodeState,
};
use gpuctl_core::record::JobSpec;
use gpuctl_core::view::{
    CancelResult, Explanation, JobPriority, PartitionRow, Share, TaskRef, Windows,
};
use gpuctl_sched::job::JobState as State;
use tonic::Status;

mod log;
mod snapshot;
pub use log::{BadEntry, batch_pb, entry, entry_parts, entry_pb};
pub use snapshot::{BadSnapshot, cluster, snapshot_pb};

/// An agent's attach. Unacknowledged reports of no known kind (none a released agent
/// sends) are left out, with a line in the log.
pub fn register(r: pb::RegisterRequest) -> Register {
    let node = r.node;
    let unacked_reports = r
        .unacked_reports
        .into_iter()
        .filter_map(|x| {
            report(x)
                .inspect_err(
                    |e| tracing::warn!(%node, "unacknowledged report left out: {}", e.message()),
                )
                .ok()
        })
        .collect();
    Register {
        gpus: r.gpus.into_iter().map(gpu).collect(),
        cpus: r.cpus,
        memory_bytes: r.memory_bytes,
        gpu_backend: r.gpu_backend,
        running: r.running.into_iter().map(running).collect(),
        unacked_reports,
        nonce: r.nonce,
        agent_id: r.agent_id,
        address: r.address,
        allow_root_jobs: r.allow_root_jobs,
        features: r.features,
        previous_session: r.previous_session,
        mig_dynamic: r.mig_dynamic,
        node,
    }
}

fn running(r: pb::RunningJob) -> Running {
    Running {
        job_id: r.job_id,
        attempt: r.attempt,
        cpu_time_ms: r.cpu_time_ms,
        mem_peak_bytes: r.mem_peak_bytes,
        steps: r.steps.into_iter().map(Into::into).collect(),
    }
}

fn running_pb(r: Running) -> pb::RunningJob {
    pb::RunningJob {
        job_id: r.job_id,
        attempt: r.attempt,
        cpu_time_ms: r.cpu_time_ms,
        mem_peak_bytes: r.mem_peak_bytes,
        steps: r.steps.iter().map(Into::into).collect(),
    }
}

/// A GPU as its agent discovered it (what a listing adds is not taken from an agent).
fn gpu(g: pb::Gpu) -> Gpu {
    Gpu {
        uuid: g.uuid,
        model: g.model,
        memory_mib: g.memory_mib,
        index: g.index,
        pci_bus_id: g.pci_bus_id,
        mig: g
            .mig
            .into_iter()
            .map(|m| MigInstance {
                uuid: m.uuid,
                profile: m.profile,
                memory_mib: m.memory_mib,
            })
            .collect(),
    }
}

fn gpu_metrics(m: pb::GpuMetrics) -> GpuMetrics {
    GpuMetrics {
        uuid: m.uuid,
        util_pct: m.util_pct,
        mem_util_pct: m.mem_util_pct,
        mem_used_mib: m.mem_used_mib,
        temp_c: m.temp_c,
        fan_pct: m.fan_pct,
        power_w: m.power_w,
        power_limit_w: m.power_limit_w,
        ecc_uncorrected: m.ecc_uncorrected,
        jobs: m
            .jobs
            .into_iter()
            .map(|j| JobGpuUse {
                job_id: j.job_id,
                mem_used_mib: j.mem_used_mib,
                processes: j.processes,
                util_pct: j.util_pct,
            })
            .collect(),
        time_ms: m.time_ms,
        last_xid: m.last_xid,
        last_xid_ms: m.last_xid_ms,
        row_remap_failure: m.row_remap_failure,
    }
}

fn gpu_metrics_pb(m: GpuMetrics) -> pb::GpuMetrics {
    pb::GpuMetrics {
        uuid: m.uuid,
        util_pct: m.util_pct,
        mem_util_pct: m.mem_util_pct,
        mem_used_mib: m.mem_used_mib,
        temp_c: m.temp_c,
        fan_pct: m.fan_pct,
        power_w: m.power_w,
        power_limit_w: m.power_limit_w,
        ecc_uncorrected: m.ecc_uncorrected,
        jobs: m
            .jobs
            .into_iter()
            .map(|j| pb::JobGpuUse {
                job_id: j.job_id,
                mem_used_mib: j.mem_used_mib,
                processes: j.processes,
                util_pct: j.util_pct,
            })
            .collect(),
        time_ms: m.time_ms,
        last_xid: m.last_xid,
        last_xid_ms: m.last_xid_ms,
        row_remap_failure: m.row_remap_failure,
    }
}

/// A heartbeat (its signature and session checked by the caller).
pub fn heartbeat(h: pb::HeartbeatRequest) -> Heartbeat {
    Heartbeat {
        node: h.node,
        running: h.running.into_iter().map(running).collect(),
        metrics: h.metrics.into_iter().map(gpu_metrics).collect(),
        commands_handled: h.commands_handled,
        reporting: h.reporting.into_iter().map(running).collect(),
        health_error: h.health_error,
    }
}

pub fn heartbeat_answer(a: HeartbeatAnswer) -> pb::HeartbeatResponse {
    pb::HeartbeatResponse {
        known: a.known,
        stale: a.stale.into_iter().map(running_pb).collect(),
        power_caps: (a.power_caps.into_iter())
            .map(|c| pb::PowerCap {
                cap: Some(match c {
                    gpuctl_core::power::PowerCap::Watts(w) => pb::power_cap::Cap::Watts(w),
                    gpuctl_core::power::PowerCap::ShareMilli(m) => {
                        pb::power_cap::Cap::ShareMilli(m)
                    }
                }),
            })
            .collect(),
    }
}

/// An agent's report; one of no known kind is refused (a released agent sends none).
/// An end's state that the state machine does not know reads as FAILED there.
pub fn report(r: pb::JobReport) -> Result<Report, Status> {
    let kind = match r.kind() {
        job_report::Kind::Started => ReportKind::Started,
        job_report::Kind::Ended => ReportKind::Ended,
        job_report::Kind::Warning => ReportKind::Warning,
        job_report::Kind::Unspecified => {
            return Err(Status::invalid_argument(format!(
                "report of job {} names no kind (STARTED, ENDED or WARNING)",
                r.job_id
            )));
        }
    };
    Ok(Report {
        state: State::try_from(r.state()).unwrap_or(State::Failed),
        node: r.node,
        job_id: r.job_id,
        attempt: r.attempt,
        kind,
        exit_code: r.exit_code,
        reason: r.reason,
        time_ms: r.time_ms,
        cpu_time_ms: r.cpu_time_ms,
        mem_peak_bytes: r.mem_peak_bytes,
        steps: r.steps.into_iter().map(Into::into).collect(),
        node_fault: r.node_fault,
    })
}

/// A submitted job's spec in core's words; the flat GPU fields of before the `gpu`
/// oneof are refused (a record's are upgraded instead, by the store).
pub fn job_spec(s: pb::JobSpec) -> Result<JobSpec, Status> {
    if s.resources
        .as_ref()
        .is_some_and(crate::record::legacy_fields)
    {
        return Err(Status::invalid_argument(
            "the flat GPU share/MIG fields are gone: set the `gpu` oneof",
        ));
    }
    Ok(s.into())
}

/// A node's record from its stored form.
pub fn node(n: StoredNode) -> Node {
    Node {
        name: n.name,
        gpus: n.gpus.into_iter().map(gpu).collect(),
        cpus: n.cpus,
        memory_bytes: n.memory_bytes,
        drain_reason: n.drain_reason,
        gpu_backend: n.gpu_backend,
        last_seen_ms: n.last_seen_ms,
        agent_id: n.agent_id,
        address: n.address,
        allow_root_jobs: n.allow_root_jobs,
        drain_automatic: n.drain_automatic,
        xid_handled_ms: n.xid_handled_ms,
        features: n.features,
        mig_dynamic: n.mig_dynamic,
    }
}

/// A GPU as stored and listed (what a listing adds left at zero).
fn gpu_pb(g: Gpu) -> pb::Gpu {
    pb::Gpu {
        uuid: g.uuid,
        model: g.model,
        memory_mib: g.memory_mib,
        index: g.index,
        pci_bus_id: g.pci_bus_id,
        mig: g
            .mig
            .into_iter()
            .map(|m| pb::MigInstance {
                uuid: m.uuid,
                profile: m.profile,
                memory_mib: m.memory_mib,
                allocated_to: 0,
            })
            .collect(),
        ..pb::Gpu::default()
    }
}

/// A node's record in its stored form.
pub fn stored_node(n: &Node) -> StoredNode {
    let n = n.clone();
    StoredNode {
        name: n.name,
        gpus: n.gpus.into_iter().map(gpu_pb).collect(),
        cpus: n.cpus,
        memory_bytes: n.memory_bytes,
        drain_reason: n.drain_reason,
        gpu_backend: n.gpu_backend,
        last_seen_ms: n.last_seen_ms,
        agent_id: n.agent_id,
        address: n.address,
        allow_root_jobs: n.allow_root_jobs,
        drain_automatic: n.drain_automatic,
        xid_handled_ms: n.xid_handled_ms,
        features: n.features,
        mig_dynamic: n.mig_dynamic,
    }
}

fn gpu_row_pb(r: GpuRow) -> pb::Gpu {
    let mut g = gpu_pb(r.gpu);
    for (m, to) in g.mig.iter_mut().zip(r.mig_allocated_to) {
        m.allocated_to = to;
    }
    g.allocated_to = r.allocated_to;
    g.compute_allocated_milli = r.compute_allocated_milli;
    g.memory_allocated_mib = r.memory_allocated_mib;
    g.jobs = r.jobs;
    g.metrics = r.metrics.map(gpu_metrics_pb);
    g.mig_changing = r.mig_changing_to.is_some();
    g.mig_changing_to = r.mig_changing_to.unwrap_or_default();
    g
}

/// A node as the listings show it.
pub fn node_pb(r: NodeRow) -> pb::Node {
    let state = match r.state {
        NodeState::Idle => pb::NodeState::Idle,
        NodeState::Mixed => pb::NodeState::Mixed,
        NodeState::Allocated => pb::NodeState::Allocated,
        NodeState::Draining => pb::NodeState::Draining,
        NodeState::Drained => pb::NodeState::Drained,
        NodeState::Down => pb::NodeState::Down,
    };
    let n = r.node;
    pb::Node {
        name: n.name,
        state: state as i32,
        gpus: r.gpus.into_iter().map(gpu_row_pb).collect(),
        reason: r.reason,
        cpus: n.cpus,
        cpus_allocated: r.cpus_allocated,
        memory_bytes: n.memory_bytes,
        memory_allocated: r.memory_allocated,
        last_seen_ms: n.last_seen_ms,
        gpu_backend: n.gpu_backend,
        partitions: r.partitions,
        features: n.features,
    }
}

pub fn listing_pb(l: NodeListing) -> pb::ListNodesResponse {
    pb::ListNodesResponse {
        nodes: l.nodes.into_iter().map(node_pb).collect(),
        fragmentation_gpus: l.fragmentation_gpus,
        fragmentation_pct_of_idle: l.fragmentation_pct_of_idle,
    }
}

/// A command for an agent, unsigned (the stream signs it with its session and number).
pub fn command_pb(c: Command) -> pb::AgentCommand {
    let command = match c {
        Command::Start(s) => {
            let s = *s;
            pb::agent_command::Command::Start(pb::StartJob {
                job_id: s.job_id,
                spec: Some(s.spec.into()),
                time_limit_secs: s.time_limit_secs,
                kill_grace_secs: s.kill_grace_secs,
                slots: s.slots.iter().map(Into::into).collect(),
                rank: s.rank,
                nodelist: s.nodelist,
                attempt: s.attempt,
                addresses: s.addresses,
            })
        }
        Command::Kill(k) => pb::agent_command::Command::Kill(pb::KillJob {
            job_id: k.job_id,
            as_state: pb::JobState::from(k.as_state) as i32,
            kill_grace_secs: k.kill_grace_secs,
            reason: k.reason,
            attempt: k.attempt,
            signal: k.signal,
            signal_only: k.signal_only,
        }),
        Command::Mig(m) => pb::agent_command::Command::Mig(pb::SetMigLayout {
            gpu: m.gpu,
            profiles: m.layout,
        }),
        Command::Limit(l) => pb::agent_command::Command::Limit(pb::SetTimeLimit {
            job_id: l.job_id,
            attempt: l.attempt,
            time_limit_secs: l.time_limit_secs,
        }),
    };
    pb::AgentCommand {
        command: Some(command),
        ..pb::AgentCommand::default()
    }
}

/// Why a job waits, as `gpuctl explain` shows it.
pub fn explanation_pb(e: Explanation) -> pb::Explanation {
    pb::Explanation {
        job_id: e.job_id,
        state: pb::JobState::from(e.state) as i32,
        reason: e.reason,
        summary: e.summary,
        expected_start_ms: e.expected_start_ms,
        rank: e.rank,
        priority: e.priority,
        nodes: e
            .nodes
            .into_iter()
            .map(|n| pb::NodeExplain {
                node: n.node,
                reason: n.reason,
            })
            .collect(),
    }
}

pub fn task_ref(t: &pb::ArrayTask) -> TaskRef {
    TaskRef {
        array_job_id: t.array_job_id,
        task_id: t.task_id,
    }
}

pub fn cancel_result_pb(r: CancelResult) -> pb::CancelResult {
    pb::CancelResult {
        job_id: r.job_id,
        ok: r.ok,
        message: r.message,
    }
}

pub fn partition_row_pb(r: PartitionRow) -> pb::PartitionRow {
    pb::PartitionRow {
        name: r.name,
        is_default: r.is_default,
        state: r.state,
        nodes: r.nodes,
        node_patterns: r.node_patterns,
        default_time_secs: r.default_time_secs,
        max_time_secs: r.max_time_secs,
        allowed_accounts: r.allowed_accounts,
        default_qos: r.default_qos,
        gpus: r.gpus,
        pending_jobs: r.pending_jobs,
        running_jobs: r.running_jobs,
    }
}

pub fn windows_pb(w: Windows) -> pb::WindowsResponse {
    pb::WindowsResponse {
        timezone: w.timezone,
        windows: w
            .windows
            .into_iter()
            .map(|r| pb::WindowRow {
                name: r.name,
                open: r.open,
                next_change_ms: r.next_change_ms,
                days: r.days,
                start: r.start,
                end: r.end,
                floor: r.floor.into_iter().collect(),
                qos_priority: r.qos_priority.into_iter().collect(),
                preemption: r.preemption,
            })
            .collect(),
        preemption_allowed: w.preemption_allowed,
        now_ms: w.now_ms,
    }
}

pub fn share_pb(s: Share) -> pb::ShareResponse {
    pb::ShareResponse {
        rows: s.rows.into_iter().map(pb::ShareRow::from).collect(),
        half_life: s.half_life,
    }
}

/// A listing's (or a cancel's) filter (`crate::convert`); a state the domain
/// does not know is refused.
pub fn job_filter(r: &pb::ListJobsRequest) -> Result<JobFilter, Status> {
    JobFilter::try_from(r).map_err(|e| Status::invalid_argument(format!("{e} in the filter")))
}

pub fn job_priority_pb(p: JobPriority) -> pb::JobPriority {
    pb::JobPriority {
        job_id: p.job_id,
        user: p.user,
        total: p.total,
        factors: p.factors.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_record_is_the_same_after_a_round_trip_through_its_stored_form() {
        let stored = StoredNode {
            name: "n1".into(),
            gpus: vec![pb::Gpu {
                uuid: "GPU-1".into(),
                model: "A100-80GB".into(),
                memory_mib: 81920,
                index: 3,
                pci_bus_id: "0000:17:00.0".into(),
                mig: vec![pb::MigInstance {
                    uuid: "MIG-1".into(),
                    profile: "1g.10gb".into(),
                    memory_mib: 9728,
                    allocated_to: 0,
                }],
                ..pb::Gpu::default()
            }],
            cpus: 64,
            memory_bytes: 1 << 40,
            drain_reason: Some("fan".into()),
            gpu_backend: "nvml".into(),
            last_seen_ms: 7,
            agent_id: "a".into(),
            address: "10.0.0.1".into(),
            allow_root_jobs: true,
            drain_automatic: true,
            xid_handled_ms: 9,
            features: vec!["ib".into()],
            mig_dynamic: true,
        };
        assert_eq!(stored_node(&node(stored.clone())), stored);
    }

    #[test]
    fn a_report_without_a_kind_is_refused_and_an_unknown_end_reads_failed() {
        let r = pb::JobReport {
            node: "n1".into(),
            job_id: 4,
            ..pb::JobReport::default()
        };
        assert!(report(r.clone()).is_err());
        let ended = report(pb::JobReport {
            kind: job_report::Kind::Ended as i32,
            ..r
        })
        .unwrap();
        assert_eq!(
            (ended.kind, ended.state),
            (ReportKind::Ended, State::Failed)
        );
    }

    #[test]
    fn a_filter_with_an_unknown_state_is_refused_not_widened() {
        let r = pb::ListJobsRequest {
            states: vec![0],
            ..pb::ListJobsRequest::default()
        };
        assert!(job_filter(&r).is_err());
        let r = pb::ListJobsRequest {
            states: vec![pb::JobState::Completed as i32],
            ..pb::ListJobsRequest::default()
        };
        let f = job_filter(&r).unwrap();
        assert!(f.all, "a final state asks for finished jobs");
        assert_eq!(f.states, vec![State::Completed]);
    }

    #[test]
    fn commands_keep_every_field_and_a_kills_end_state() {
        use gpuctl_core::command::{Kill, Start};
        let start = Start {
            job_id: 9,
            attempt: 2,
            spec: JobSpec {
                user: "ana".into(),
                ..JobSpec::default()
            },
            time_limit_secs: 60,
            kill_grace_secs: 10,
            slots: vec![gpuctl_core::record::SlotUse {
                uuid: "GPU-1".into(),
                compute_milli: 500,
                memory_mib: 0,
            }],
            rank: 1,
            nodelist: vec!["a".into(), "b".into()],
            addresses: vec!["10.0.0.1".into(), "10.0.0.2".into()],
            session_generation: 3,
        };
        let Some(pb::agent_command::Command::Start(s)) =
            command_pb(Command::Start(Box::new(start.clone()))).command
        else {
            panic!("a start")
        };
        assert_eq!(
            (
                s.job_id,
                s.attempt,
                s.spec.unwrap().user,
                s.time_limit_secs,
                s.kill_grace_secs
            ),
            (9, 2, "ana".to_string(), 60, 10)
        );
        let slots: Vec<gpuctl_core::record::SlotUse> =
            s.slots.into_iter().map(Into::into).collect();
        assert_eq!((slots, s.rank), (start.slots, 1));
        assert_eq!((s.nodelist, s.addresses), (start.nodelist, start.addresses));
        let kill = Kill {
            job_id: 9,
            attempt: 2,
            as_state: State::Preempted,
            kill_grace_secs: 30,
            reason: "preempted".into(),
            signal: "USR1".into(),
            signal_only: false,
        };
        let Some(pb::agent_command::Command::Kill(k)) = command_pb(Command::Kill(kill)).command
        else {
            panic!("a kill")
        };
        assert_eq!(k.as_state(), pb::JobState::Preempted);
        assert_eq!((k.job_id, k.attempt, k.kill_grace_secs), (9, 2, 30));
        assert_eq!(
            (k.reason.as_str(), k.signal.as_str()),
            ("preempted", "USR1")
        );
    }

    #[test]
    fn a_heartbeat_keeps_its_samples_and_instances() {
        let hb = pb::HeartbeatRequest {
            node: "n1".into(),
            running: vec![pb::RunningJob {
                job_id: 3,
                attempt: 1,
                cpu_time_ms: Some(5),
                mem_peak_bytes: None,
                steps: Vec::new(),
            }],
            metrics: vec![pb::GpuMetrics {
                uuid: "GPU-1".into(),
                util_pct: 40,
                temp_c: 70,
                fan_pct: Some(30),
                ecc_uncorrected: Some(1),
                last_xid: Some(79),
                last_xid_ms: 12,
                row_remap_failure: true,
                jobs: vec![pb::JobGpuUse {
                    job_id: 3,
                    mem_used_mib: 100,
                    processes: 2,
                    util_pct: Some(35),
                }],
                ..pb::GpuMetrics::default()
            }],
            commands_handled: 4,
            reporting: vec![pb::RunningJob {
                job_id: 2,
                attempt: 1,
                ..pb::RunningJob::default()
            }],
            health_error: "disk".into(),
        };
        let h = heartbeat(hb.clone());
        assert_eq!((h.node.as_str(), h.commands_handled), ("n1", 4));
        assert_eq!(
            h.running,
            vec![Running {
                cpu_time_ms: Some(5),
                ..Running::new(3, 1)
            }]
        );
        assert_eq!(h.reporting, vec![Running::new(2, 1)]);
        assert_eq!(h.health_error, "disk");
        // Back to the wire (a listing shows the latest sample): the same message.
        assert_eq!(
            h.metrics
                .into_iter()
                .map(gpu_metrics_pb)
                .collect::<Vec<_>>(),
            hb.metrics
        );
    }
}
