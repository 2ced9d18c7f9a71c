//! A controller's state rebuilt from its records: the one way it is done, by the daemon
//! at start and by the tests that restart a cluster. Pure: the records and the time of
//! the start in, the cluster and the records to write back out.

use crate::record::{Record, UsageRecord};

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
    if let Some(u) = &records.usage {
        cluster.restore_usage(u);
    }
    cluster.recompute_begins();
    for n in records.nodes {
        cluster.fleet.last_heard.insert(n.name.clone(), now);
        cluster.fleet.nodes.insert(n.name.clone(), n);
    }
    Restored { cluster, rewrite }
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
