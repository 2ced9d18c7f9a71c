//! Job listings: which jobs a filter lets through, and the pages of a listing, encoded
//! from the records without copying them where the caller may see them whole.

use gpuctl_core::filter::JobFilter;
use gpuctl_core::jobs::placement;
use gpuctl_core::record::{Job, JobUsage, Record};
use gpuctl_proto as pb;
use gpuctl_proto::record::{encode_job, encode_usage_field, job_encoded_len, usage_field_len};

use super::{Controller, Shared};
use crate::auth::Caller;
use crate::auth::{redact, sees_whole};

impl Controller {
    pub fn list_jobs(&self, filter: &JobFilter) -> Vec<pb::Job> {
        let c = self.lock();
        let ids = job_ids(&c, filter);
        ids.iter()
            .filter_map(|&id| c.jobs().job(id))
            .map(presented_pb)
            .collect()
    }

    /// Ids of the jobs `list_jobs(filter)` would return, in order.
    pub fn job_ids(&self, filter: &JobFilter) -> Vec<u64> {
        job_ids(&self.lock(), filter)
    }

    /// These jobs (those that still exist), for one page of a listing, as `caller` may
    /// see them (`auth::redact`). Those shown whole are encoded straight from their
    /// records (`push_presented`); only the others are copied first.
    pub fn page_by_id(&self, ids: &[u64], all: bool, caller: &Caller) -> pb::ListJobsResponse {
        let c = self.lock();
        let (lo, hi) = (ids.first().copied(), ids.last().copied());
        // A page of a listing is a run of sorted ids: its jobs are walked in one range
        // of the maps rather than looked up one by one (a page of 250 whole-queue ids
        // spans about 250 ids), unless the ids are sparse in their range.
        let walk = match (lo, hi) {
            (Some(lo), Some(hi)) => {
                ids.is_sorted_by(|a, b| a < b) && (hi - lo) as usize <= 4 * ids.len()
            }
            _ => false,
        };
        let found: Box<dyn Iterator<Item = &Job>> = if walk {
            let mut wanted = ids.iter().copied().peekable();
            Box::new(
                c.jobs()
                    .in_range(lo.unwrap_or(0), hi.unwrap_or(0))
                    .map(|s| &s.job)
                    .filter(move |j| {
                        while wanted.next_if(|&w| w < j.id).is_some() {}
                        wanted.next_if_eq(&j.id).is_some()
                    }),
            )
        } else {
            Box::new(ids.iter().filter_map(|&id| c.jobs().job(id)))
        };
        let mut page = pb::ListJobsResponse::default();
        let mut encoded = Vec::new();
        for j in found.filter(|j| all || !j.state.is_final()) {
            // A running job's usage so far (history, report).
            let usage = c.live_usage().get(&j.id);
            let whole = sees_whole(caller, &j.spec.user);
            // Steps running now are merged into the record's: such a job is copied.
            let steps = c.has_live_steps(j.id);
            if !(whole && !steps && push_presented(&mut encoded, j, usage)) {
                let mut p = presented_pb(j);
                if let Some(u) = usage {
                    p.usage = Some(u.into());
                }
                if steps {
                    p.steps = c.steps_of(j).iter().map(Into::into).collect();
                }
                redact(caller, &mut p);
                page.jobs.push(p);
            }
        }
        page.encoded = encoded.into();
        page
    }
}

/// `presented(j)` as the message users get, copied once (straight into it).
pub(crate) fn presented_pb(j: &Job) -> pb::Job {
    let mut p = pb::Job::from(j);
    let (node, gpus) = placement(j);
    (p.node, p.gpus) = (node, gpus.cloned().collect());
    p
}

/// The ids of the jobs a filter lets through, in id order.
fn job_ids(c: &Shared, filter: &JobFilter) -> Vec<u64> {
    // The records walked in order, not looked up one id at a time.
    let pick = |s: &Record| {
        let j = &s.job;
        filter.matches(j).then_some(j.id)
    };
    // From an index: the listed users' or names' jobs only, not a walk over everyone's.
    let indexed = |jobs: &mut dyn Iterator<Item = &Record>| {
        let mut ids: Vec<u64> = jobs.filter_map(pick).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    if filter.all {
        c.jobs().all().filter_map(pick).collect()
    } else if !filter.users.is_empty() {
        indexed(&mut filter.users.iter().flat_map(|u| c.jobs().active_of(u)))
    } else if !filter.names.is_empty() {
        indexed(&mut filter.names.iter().flat_map(|n| c.jobs().active_named(n)))
    } else {
        c.jobs().active().filter_map(pick).collect()
    }
}

// Field numbers of `Job` (gpuctl.proto) that `presented` sets.
use gpuctl_proto::tags::job::{gpus as JOB_GPUS, node as JOB_NODE, usage as JOB_USAGE};

/// Appends `presented(j)`, with `usage` when given, to a page's encoded jobs, without
/// copying `j`: the record's own encoding, then the fields `presented` derives (its
/// nodes and GPUs) and the usage. A field that comes again on the wire replaces (a
/// string), extends (a repeated field) or merges into (a message) what came before, so
/// this decodes to that job only when the record has none of them itself: then it
/// answers false and appends nothing (the caller copies the job instead).
fn push_presented(out: &mut Vec<u8>, j: &Job, usage: Option<&JobUsage>) -> bool {
    use prost::encoding::string;
    if !j.node.is_empty() || !j.gpus.is_empty() || (usage.is_some() && j.usage.is_some()) {
        return false;
    }
    let (node, gpus) = placement(j);
    let gpus: Vec<&String> = gpus.collect();
    let mut len = job_encoded_len(j);
    if !node.is_empty() {
        len += string::encoded_len(JOB_NODE, &node);
    }
    len += gpus
        .iter()
        .map(|g| string::encoded_len(JOB_GPUS, g))
        .sum::<usize>();
    if let Some(u) = usage {
        len += usage_field_len(JOB_USAGE, u);
    }
    pb::ListJobsResponse::push_encoded(out, len, |out| {
        encode_job(j, out);
        if !node.is_empty() {
            string::encode(JOB_NODE, &node, out);
        }
        for g in gpus {
            string::encode(JOB_GPUS, g, out);
        }
        if let Some(u) = usage {
            encode_usage_field(JOB_USAGE, u, out);
        }
    });
    true
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    use gpuctl_core::jobs::presented;
    use gpuctl_core::record::{Allocation, JobSpec, JobState, SlotUse};

    fn job(id: u64, nodes: &[&str]) -> Job {
        Job {
            id,
            state: JobState::Running,
            spec: JobSpec {
                user: "alice".into(),
                command: vec!["python3".into(), "train.py".into()],
                env: [("K".to_string(), "v".to_string())].into(),
                ..Default::default()
            },
            allocations: nodes
                .iter()
                .enumerate()
                .map(|(rank, n)| Allocation {
                    node: n.to_string(),
                    rank: rank as u32,
                    slots: (0..2)
                        .map(|g| SlotUse {
                            uuid: format!("GPU-{n}-{g}"),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn usage(cpu_time_ms: u64) -> JobUsage {
        JobUsage {
            cpu_time_ms,
            host_reports: 1,
            ..Default::default()
        }
    }

    /// A job pushed from its record decodes to what `presented` (and the usage) give,
    /// pending or on one node or several, with a usage or none; a record that has one
    /// of the derived fields itself is refused (and then copied by the caller).
    #[test]
    fn a_job_encoded_from_its_record_is_the_presented_job() {
        let cases = [
            (job(1, &[]), None),
            (job(2, &["n1"]), None),
            (job(3, &["n1", "n2", "n1"]), Some(usage(7))),
        ];
        let mut encoded = Vec::new();
        let mut want = Vec::new();
        for (j, u) in &cases {
            assert!(push_presented(&mut encoded, j, u.as_ref()));
            assert_eq!(
                presented_pb(j),
                pb::Job::from(&presented(j)),
                "one copy, same job"
            );
            let mut p = presented(j);
            p.usage = u.clone();
            want.push(pb::Job::from(&p));
        }
        let page = pb::ListJobsResponse {
            encoded: encoded.into(),
            ..Default::default()
        };
        let back = pb::ListJobsResponse::decode(&page.encode_to_vec()[..]).unwrap();
        assert_eq!(back.jobs, want);
        assert_eq!(back.jobs[2].node, "n1,n2");
        assert_eq!(back.jobs[2].gpus.len(), 6);

        let mut out = Vec::new();
        let with_node = Job {
            node: "old".into(),
            ..job(4, &["n1"])
        };
        let with_usage = Job {
            usage: Some(usage(1)),
            ..job(5, &["n1"])
        };
        assert!(!push_presented(&mut out, &with_node, None));
        assert!(!push_presented(&mut out, &with_usage, Some(&usage(2))));
        assert!(out.is_empty());
        assert!(push_presented(&mut out, &with_usage, None));
    }
}
