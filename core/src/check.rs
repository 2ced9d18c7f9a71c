//! The cluster's invariants across its owners, checked from scratch: what the tests
//! call after every step. Each owner's own (`Jobs::check`: its indexes; `Fleet::check`:
//! its sessions and records; `FairShare::check`: usage and charges) and what holds
//! between them: job ids below the next one, a running job's allocations on known
//! nodes, and no GPU given more than all of its compute or memory.

use crate::state::{Cluster, live_allocs};
use std::collections::HashMap;

impl Cluster {
    /// The first invariant that does not hold, if any.
    pub fn check(&self) -> Result<(), String> {
        self.jobs.check()?;
        self.fleet.check()?;
        self.fair.check()?;
        if let Some(s) = self.jobs.all().find(|s| s.job.id >= self.next_job_id) {
            return Err(format!(
                "job {} is not below the next id {}",
                s.job.id, self.next_job_id
            ));
        }
        let memory: HashMap<&str, u64> = self
            .fleet
            .nodes
            .values()
            .flat_map(|n| n.gpus.iter())
            .map(|g| (g.uuid.as_str(), g.memory_mib))
            .collect();
        for s in self.jobs.active() {
            let j = &s.job;
            if let Some(a) = live_allocs(j).find(|a| !self.fleet.nodes.contains_key(&a.node)) {
                return Err(format!("job {} runs on unknown node {}", j.id, a.node));
            }
        }
        // Borrowers' GPU memory limits fit their GPUs (`opportunistic.rs`).
        let mut lent: HashMap<&str, (u64, Vec<u64>)> = HashMap::new();
        for s in self.jobs.active().filter(|s| s.job.spec.opportunistic) {
            for sl in live_allocs(&s.job).flat_map(|a| a.slots.iter()) {
                let e = lent.entry(sl.uuid.as_str()).or_default();
                e.0 += sl.memory_mib;
                e.1.push(s.job.id);
            }
        }
        for (uuid, (mib, jobs)) in lent {
            if let Some(&have) = memory.get(uuid)
                && mib > have
            {
                return Err(format!(
                    "GPU {uuid}: borrowers {jobs:?} given {mib} MiB of {have}"
                ));
            }
        }
        for (node, u) in self.usage() {
            for (uuid, (compute, mib, jobs)) in &u.slots {
                if *compute > 1000 {
                    return Err(format!(
                        "{node} GPU {uuid}: compute {compute} of 1000 given to jobs {jobs:?}"
                    ));
                }
                if let Some(&have) = memory.get(uuid.as_str())
                    && have > 0
                    && *mib > have
                {
                    return Err(format!(
                        "{node} GPU {uuid}: {mib} MiB of {have} given to jobs {jobs:?}"
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::record::{Allocation, Job, JobSpec, JobState, Record, SlotUse};

    use crate::{Cluster, Config};

    fn running(id: u64, node: &str, compute: u32, mib: u64) -> Record {
        Record {
            job: Job {
                id,
                state: JobState::Running,
                spec: JobSpec {
                    user: "ana".into(),
                    ..JobSpec::default()
                },
                allocations: vec![Allocation {
                    node: node.into(),
                    slots: vec![SlotUse {
                        uuid: "GPU-0".into(),
                        compute_milli: compute,
                        memory_mib: mib,
                    }],
                    ..Allocation::default()
                }],
                ..Job::default()
            },
            ..Record::default()
        }
    }

    fn cluster() -> Cluster {
        let mut c = Cluster::new(Config::default());
        c.fleet.nodes.insert(
            "n1".into(),
            crate::node::Node {
                name: "n1".into(),
                gpus: vec![crate::node::Gpu {
                    uuid: "GPU-0".into(),
                    memory_mib: 1000,
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        c.next_job_id = 10;
        c
    }

    #[test]
    fn each_broken_invariant_is_named() {
        let mut c = cluster();
        c.jobs.insert(running(1, "n1", 600, 500));
        c.jobs.insert(running(2, "n1", 400, 500));
        assert_eq!(c.check(), Ok(()), "a GPU given all of itself, no more");

        let mut over = c.clone_for_test();
        over.jobs.insert(running(3, "n1", 100, 0));
        assert!(over.check().unwrap_err().contains("compute 1100 of 1000"));

        let mut memory = c.clone_for_test();
        memory.jobs.insert(running(3, "n1", 0, 1));
        assert!(memory.check().unwrap_err().contains("1001 MiB of 1000"));

        let mut lost = c.clone_for_test();
        lost.jobs.insert(running(3, "n9", 0, 0));
        assert!(lost.check().unwrap_err().contains("unknown node n9"));

        let mut ahead = c.clone_for_test();
        ahead.jobs.insert(running(10, "n1", 0, 0));
        assert!(
            ahead
                .check()
                .unwrap_err()
                .contains("not below the next id 10")
        );
    }

    impl Cluster {
        /// The jobs and nodes again, in a new cluster (a `Cluster` is not `Clone`).
        fn clone_for_test(&self) -> Cluster {
            let mut c = Cluster::new(Config::default());
            c.next_job_id = self.next_job_id;
            c.fleet.nodes = self.fleet.nodes.clone();
            for s in self.jobs.all() {
                c.jobs.insert(s.clone());
            }
            c
        }
    }
}
