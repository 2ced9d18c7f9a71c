//! Finished jobs: compacted when they end (the live state keeps no specs of finished
//! jobs), removed past the configured retention.

use gpuctl_proto::store::StoredJob;

use super::{Cluster, Controller, job_mut, job_of};
use crate::store::StoreError;

/// Drops what a finished job no longer needs and may be large or secret: its env,
/// script, command arguments and the copy kept for re-adoption. Returns whether
/// anything changed.
pub(super) fn compact(stored: &mut StoredJob) -> bool {
    let had_copy = stored.requeued_from.take().is_some();
    let j = job_mut(stored);
    let Some(spec) = j.spec.as_mut() else {
        return had_copy;
    };
    let big = !spec.env.is_empty() || !spec.script.is_empty() || spec.command.len() > 1;
    // New values, not `clear()`: a cleared String keeps its allocation.
    spec.env = Default::default();
    spec.script = String::new();
    spec.command.truncate(1);
    spec.command.shrink_to_fit();
    big || had_copy
}

impl Controller {
    /// Compacts the jobs that just ended, and removes finished jobs past
    /// `retention.max_age` (since their end) or beyond `retention.max_jobs` (oldest
    /// first). Returns whether the store was written.
    pub(super) fn retire(
        &self,
        c: &mut Cluster,
        ended: &[u64],
        now: i64,
    ) -> Result<bool, StoreError> {
        let mut wrote = false;
        for id in ended {
            let Some(stored) = c.jobs.get_mut(id) else {
                continue;
            };
            let end = job_of(stored).end_time_ms;
            if compact(stored) {
                self.store.put_job(stored)?;
                wrote = true;
            }
            c.finished.insert((end, *id));
        }
        let r = &self.config.retention;
        let oldest_kept = now.saturating_sub(r.max_age.as_millis().min(i64::MAX as u128) as i64);
        while let Some(&(end, id)) = c.finished.first() {
            if end >= oldest_kept && c.finished.len() <= r.max_jobs {
                break;
            }
            c.finished.pop_first();
            if c.jobs
                .get(&id)
                .is_some_and(|s| job_of(s).state().is_final())
            {
                if let Some(s) = c.jobs.remove(&id)
                    && !s.request_id.is_empty()
                {
                    let key = (super::owner(job_of(&s)).to_string(), s.request_id.clone());
                    c.requests.remove(&key);
                }
                self.store.delete_job(id)?;
                wrote = true;
            }
        }
        Ok(wrote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto as pb;

    #[test]
    fn compact_keeps_metadata_only() {
        let mut s = StoredJob {
            job: Some(pb::Job {
                id: 3,
                spec: Some(pb::JobSpec {
                    name: "train".into(),
                    user: "alice".into(),
                    script: "a\nb\n".into(),
                    command: vec![],
                    env: [("K".to_string(), "secret".to_string())]
                        .into_iter()
                        .collect(),
                    resources: Some(pb::Resources {
                        gpus: 2,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            requeued_from: Some(pb::Job::default()),
            ..Default::default()
        };
        assert!(compact(&mut s));
        let spec = job_of(&s).spec.as_ref().unwrap();
        assert!(spec.env.is_empty());
        assert!(spec.script.is_empty());
        assert_eq!(spec.name, "train");
        assert_eq!(spec.resources.as_ref().unwrap().gpus, 2);
        assert!(s.requeued_from.is_none());
        assert!(!compact(&mut s), "compacting twice changes nothing");
    }
}
