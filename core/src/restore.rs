//! A controller's state rebuilt from its records: the one way it is done, by the daemon
//! at start and by the tests that restart a cluster. Pure: the records and the time of
//! the start in, the cluster and the records to write back out.

use crate::record::{JobState, Record, UsageRecord};

use crate::config::Config;
use crate::state::Cluster;

/// What a store holds.
#[derive(Debug, Default, Clone)]
pub struct Records {
    pub jobs: Vec<Record>,
    /// The ids of job records the store read in an older layout and upgraded on the way
    /// in (`gpuctl_proto::record::upgrade_record`): written back in the new one.
    pub upgraded: Vec<u64>,
    pub nodes: Vec<crate::node::Node>,
    /// Fair share's decayed usage, if any was written.
    pub usage: Option<UsageRecord>,
    /// The next job id to hand out, as written (ids start at 1).
    pub next_job_id: u64,
    /// Agents' sessions: none in a store (a restarted controller's agents attach
    /// again); a replica's snapshot holds them (`Cluster::records`), as entries that
    /// follow it act on the nodes attached.
    pub sessions: Vec<Session>,
    /// The last session generation handed out.
    pub generation: u64,
    /// Cancels of pending jobs a store kept as one record each, their jobs' records
    /// perhaps not yet written (`jobs::Changes::cancels`): applied again to those of
    /// their jobs still pending, which are then rewritten.
    pub cancels: Vec<crate::jobs::PendingCancel>,
    /// What running jobs used so far, kept in memory until their runs end: none in a
    /// store (a restart re-learns it from the next samples); a snapshot holds it, as
    /// the entries that follow add to it and write it into records at a run's end.
    pub live: Live,
}

/// Running jobs' figures that live in memory until their runs end, in a fixed order.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Live {
    /// GPU usage so far, by job.
    pub usage: Vec<(u64, crate::record::JobUsage)>,
    /// (job, node, CPU time ms, peak memory bytes) of each running rank.
    pub host: Vec<(u64, String, u64, u64)>,
    /// (job, node, its steps running now).
    pub steps: Vec<(u64, String, Vec<crate::record::Step>)>,
    /// (job, when a sample last showed it busy, whether the idle policy acted since).
    pub idle: Vec<(u64, i64, bool)>,
    /// Each node's last GPU samples.
    pub metrics: Vec<(String, Vec<crate::node::GpuMetrics>)>,
    /// Runs that stopped since fair share's last charge (it charges them next).
    pub ended_runs: Vec<crate::jobs::EndedRun>,
    /// When fair share's usage was last marked for writing.
    pub usage_marked_ms: i64,
}

/// An agent's session as a snapshot holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Session {
    pub node: String,
    pub generation: u64,
    /// The Attach nonce that names the session.
    pub session: Vec<u8>,
    pub agent_id: String,
    pub peer: String,
}

impl Cluster {
    /// What a snapshot of this cluster holds: every job's record, the nodes, fair
    /// share's usage, the next id, and the agents' sessions.
    pub fn records(&self) -> Records {
        let mut sessions: Vec<Session> = (self.fleet.conns.iter())
            .map(|(node, c)| Session {
                node: node.clone(),
                generation: c.generation,
                session: c.session.clone(),
                agent_id: c.agent_id.clone(),
                peer: c.peer.clone(),
            })
            .collect();
        sessions.sort_by(|a, b| a.node.cmp(&b.node));
        let mut live = Live {
            usage: (self.live_usage.iter())
                .map(|(&j, u)| (j, u.clone()))
                .collect(),
            host: (self.live_host.iter())
                .map(|((j, n), &(cpu, mem))| (*j, n.clone(), cpu, mem))
                .collect(),
            steps: (self.live_steps.iter())
                .flat_map(|(&j, by)| by.iter().map(move |(n, s)| (j, n.clone(), s.clone())))
                .collect(),
            idle: (self.idle.iter())
                .map(|(&j, t)| (j, t.busy_ms, t.acted))
                .collect(),
            metrics: (self.fleet.metrics.iter())
                .map(|(n, m)| (n.clone(), m.clone()))
                .collect(),
            ended_runs: self.jobs.ended_runs().to_vec(),
            usage_marked_ms: self.fair.marked_ms,
        };
        live.usage.sort_by_key(|x| x.0);
        live.host.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        live.steps.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        live.idle.sort_by_key(|x| x.0);
        live.metrics.sort_by(|a, b| a.0.cmp(&b.0));
        Records {
            jobs: self.jobs.all().cloned().collect(),
            upgraded: Vec::new(),
            nodes: self.fleet.nodes.values().cloned().collect(),
            usage: Some(self.usage_record()),
            next_job_id: self.next_job_id,
            sessions,
            generation: self.fleet.generation,
            // A snapshot holds every record as it is.
            cancels: Vec::new(),
            live,
        }
    }
}

/// A restored cluster, and the job records it changed in the reading (to write back).
pub struct Restored {
    pub cluster: Cluster,
    pub rewrite: Vec<Record>,
}

/// The cluster `records` describe, started at `now`: every job (finished ones written
/// before compaction existed compacted, upgraded ones written back), ids never handed
/// out twice (the next id is past every stored one, whatever was written), fair share's
/// usage, the begin times to wake for, and every node with a full timeout from `now`
/// for its agent to come back.
pub fn restore(config: Config, records: Records, now: i64) -> Restored {
    let mut cluster = Cluster::new(config);
    cluster.next_job_id = records.next_job_id.max(1);
    let upgraded: std::collections::HashSet<u64> = records.upgraded.into_iter().collect();
    let mut rewrite = Vec::new();
    for mut j in records.jobs {
        let id = j.job.id;
        let compacted = j.job.state.is_final() && crate::jobs::compact(&mut j);
        if upgraded.contains(&id) || compacted {
            rewrite.push(j.clone());
        }
        cluster.next_job_id = cluster.next_job_id.max(id + 1);
        cluster.jobs.insert(j);
    }
    finish_cancels(&mut cluster, &records.cancels, &mut rewrite);
    if let Some(u) = &records.usage {
        cluster.restore_usage(u);
    }
    cluster.recompute_begins();
    for n in records.nodes {
        cluster.fleet.last_heard.insert(n.name.clone(), now);
        cluster.fleet.nodes.insert(n.name.clone(), n);
    }
    cluster.fleet.generation = records.generation;
    for s in records.sessions {
        cluster.fleet.generation = cluster.fleet.generation.max(s.generation);
        let conn = crate::fleet::Conn {
            generation: s.generation,
            session: s.session,
            window: crate::replay::ReplayWindow::default(),
            agent_id: s.agent_id,
            peer: s.peer,
            starts: Vec::new(),
        };
        cluster.fleet.conns.insert(s.node, conn);
    }
    let live = records.live;
    cluster.live_usage = live.usage.into_iter().collect();
    cluster.live_host = (live.host.into_iter())
        .map(|(j, n, cpu, mem)| ((j, n), (cpu, mem)))
        .collect();
    for (j, n, steps) in live.steps {
        cluster.live_steps.entry(j).or_default().insert(n, steps);
    }
    cluster.idle = (live.idle.into_iter())
        .map(|(j, busy_ms, acted)| (j, crate::idle::IdleTrack { busy_ms, acted }))
        .collect();
    cluster.fleet.metrics = live.metrics.into_iter().collect();
    cluster.jobs.set_ended_runs(live.ended_runs);
    cluster.fair.marked_ms = live.usage_marked_ms;
    Restored { cluster, rewrite }
}

/// The cancels a store kept as one record each, applied again: each of their jobs
/// whose record is still pending ends as the cancel ended it (the rest were written
/// after it, or are gone); those are added to `rewrite`. Their mails went out then.
fn finish_cancels(
    cluster: &mut Cluster,
    cancels: &[crate::jobs::PendingCancel],
    rewrite: &mut Vec<Record>,
) {
    for cancel in cancels {
        for &id in &cancel.ids {
            let pending = (cluster.jobs.job(id)).is_some_and(|j| j.state == JobState::Pending);
            if !pending {
                continue;
            }
            cluster
                .jobs
                .transition(id, cancel.transition(), cancel.at)
                .expect("a pending job can be cancelled");
            rewrite.extend(cluster.jobs.get(id).cloned());
        }
    }
    cluster.jobs.take_mails();
    cluster.jobs.take_changes();
}

#[cfg(test)]
mod tests {
    use crate::record::{Job, JobSpec, JobState, Record};

    use super::*;

    fn record(id: u64, state: JobState) -> Record {
        Record {
            job: Job {
                id,
                state,
                spec: JobSpec {
                    user: "ana".into(),
                    name: "train".into(),
                    ..JobSpec::default()
                },
                ..Job::default()
            },
            ..Record::default()
        }
    }

    #[test]
    fn ids_continue_past_every_stored_job_whatever_was_written() {
        let records = Records {
            jobs: vec![record(7, JobState::Pending), record(3, JobState::Completed)],
            next_job_id: 2,
            ..Records::default()
        };
        let r = restore(Config::default(), records, 1_000);
        assert_eq!(r.cluster.next_job_id, 8);
        assert_eq!(r.cluster.jobs.len(), 2);
        let none = restore(Config::default(), Records::default(), 1_000);
        assert_eq!(none.cluster.next_job_id, 1, "ids start at 1");
    }

    #[test]
    fn a_cancel_kept_as_one_record_ends_the_jobs_still_pending_alone() {
        let cancel = crate::jobs::PendingCancel {
            at: 5_000,
            reason: "cancelled while pending by ana".into(),
            ids: vec![1, 2, 3, 9],
        };
        let records = Records {
            // 1 pending (its record not written after the cancel), 2 written after it
            // (cancelled), 3 requeued and running since, 9 gone (retention).
            jobs: vec![
                record(1, JobState::Pending),
                record(2, JobState::Cancelled),
                record(3, JobState::Running),
            ],
            cancels: vec![cancel],
            ..Records::default()
        };
        let r = restore(Config::default(), records, 9_000);
        let j = |id| r.cluster.jobs.job(id).unwrap();
        assert_eq!(j(1).state, JobState::Cancelled);
        assert_eq!(j(1).end_time_ms, 5_000, "ended when the cancel was applied");
        assert_eq!(j(1).reason, "cancelled while pending by ana");
        assert_eq!(j(2).state, JobState::Cancelled);
        assert_eq!(
            j(3).state,
            JobState::Running,
            "changed after the cancel: kept"
        );
        let rewritten: Vec<u64> = r.rewrite.iter().map(|s| s.job.id).collect();
        assert_eq!(rewritten, [1]);
        r.cluster.check().unwrap();
    }

    #[test]
    fn nodes_are_heard_from_at_the_start() {
        let records = Records {
            nodes: vec![crate::node::Node {
                name: "n1".into(),
                ..crate::node::Node::default()
            }],
            ..Records::default()
        };
        let r = restore(Config::default(), records, 42);
        assert_eq!(r.cluster.fleet.last_heard.get("n1"), Some(&42));
        assert!(r.cluster.fleet.nodes.contains_key("n1"));
    }
}
