//! A replica's snapshot in its stored form (`Snapshot` of store.proto): the store's
//! own records (jobs, nodes, fair share's usage), the configuration, and what the log's
//! later entries act on (sessions, running jobs' figures). Protobuf, like the log.

use crate::store as st;
use gpuctl_core::jobs::EndedRun;
use gpuctl_core::restore::{Live, Records, Session};
use gpuctl_core::{Cluster, Config};

use super::{gpu_metrics, gpu_metrics_pb, node, stored_node};

/// A snapshot that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("snapshot: {0}")]
pub struct BadSnapshot(pub String);

/// `c`'s snapshot, its last entry applied at `at`.
pub fn snapshot_pb(c: &Cluster, at: i64) -> st::Snapshot {
    let r = c.records();
    let live = r.live;
    st::Snapshot {
        at,
        config: c.config().to_toml(),
        next_job_id: r.next_job_id,
        jobs: r.jobs.iter().map(Into::into).collect(),
        nodes: r.nodes.iter().map(stored_node).collect(),
        usage: r.usage.as_ref().map(Into::into),
        sessions: (r.sessions.into_iter())
            .map(|s| st::SnapshotSession {
                node: s.node,
                generation: s.generation,
                session: s.session,
                agent_id: s.agent_id,
                peer: s.peer,
            })
            .collect(),
        generation: r.generation,
        live_usage: (live.usage.iter())
            .map(|(job, u)| st::SnapshotUsage {
                job: *job,
                usage: Some(u.into()),
            })
            .collect(),
        live_host: (live.host.into_iter())
            .map(
                |(job, node, cpu_time_ms, mem_peak_bytes)| st::SnapshotHost {
                    job,
                    node,
                    cpu_time_ms,
                    mem_peak_bytes,
                },
            )
            .collect(),
        live_steps: (live.steps.into_iter())
            .map(|(job, node, steps)| st::SnapshotSteps {
                job,
                node,
                steps: steps.iter().map(Into::into).collect(),
            })
            .collect(),
        idle: (live.idle.into_iter())
            .map(|(job, busy_ms, acted)| st::SnapshotIdle {
                job,
                busy_ms,
                acted,
            })
            .collect(),
        metrics: (live.metrics.into_iter())
            .map(|(node, m)| st::SnapshotMetrics {
                node,
                metrics: m.into_iter().map(gpu_metrics_pb).collect(),
            })
            .collect(),
        ended_runs: (live.ended_runs.into_iter())
            .map(|r| st::SnapshotRun {
                job: r.job,
                account: r.account,
                user: r.user,
                start_ms: r.start_ms,
                end_ms: r.end_ms,
                allocations: r.allocations.iter().map(Into::into).collect(),
            })
            .collect(),
        usage_marked_ms: live.usage_marked_ms,
        // The shell's, added by who needs them (`raft::Machine`).
        credentials: None,
    }
}

/// The cluster a snapshot holds (`gpuctl_core::restore`, as of its last entry).
pub fn cluster(s: st::Snapshot) -> Result<Cluster, BadSnapshot> {
    let config =
        Config::from_toml(&s.config).map_err(|e| BadSnapshot(format!("its configuration: {e}")))?;
    let jobs = (s.jobs.into_iter())
        .map(|j| j.try_into().map_err(|e| BadSnapshot(format!("a job: {e}"))))
        .collect::<Result<_, _>>()?;
    let live = Live {
        usage: (s.live_usage.into_iter())
            .map(|u| (u.job, u.usage.unwrap_or_default().into()))
            .collect(),
        host: (s.live_host.into_iter())
            .map(|h| (h.job, h.node, h.cpu_time_ms, h.mem_peak_bytes))
            .collect(),
        steps: (s.live_steps.into_iter())
            .map(|x| (x.job, x.node, x.steps.into_iter().map(Into::into).collect()))
            .collect(),
        idle: (s.idle.into_iter())
            .map(|i| (i.job, i.busy_ms, i.acted))
            .collect(),
        metrics: (s.metrics.into_iter())
            .map(|m| (m.node, m.metrics.into_iter().map(gpu_metrics).collect()))
            .collect(),
        ended_runs: (s.ended_runs.into_iter())
            .map(|r| EndedRun {
                job: r.job,
                account: r.account,
                user: r.user,
                start_ms: r.start_ms,
                end_ms: r.end_ms,
                allocations: r.allocations.into_iter().map(Into::into).collect(),
            })
            .collect(),
        usage_marked_ms: s.usage_marked_ms,
    };
    let records = Records {
        jobs,
        upgraded: Vec::new(),
        nodes: s.nodes.into_iter().map(node).collect(),
        usage: s.usage.map(Into::into),
        next_job_id: s.next_job_id,
        sessions: (s.sessions.into_iter())
            .map(|x| Session {
                node: x.node,
                generation: x.generation,
                session: x.session,
                agent_id: x.agent_id,
                peer: x.peer,
            })
            .collect(),
        generation: s.generation,
        // A snapshot holds every record as it is.
        cancels: Vec::new(),
        live,
    };
    Ok(gpuctl_core::restore::restore(config, records, s.at).cluster)
}

#[cfg(test)]
mod tests;
