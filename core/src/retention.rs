//! Finished jobs: compacted when they end (the live state keeps no specs of finished
//! jobs), removed past the configured retention.

use gpuctl_proto::store::StoredJob;

use crate::config::Retention;
use crate::state::Cluster;

/// Drops what a finished job no longer needs and may be large or secret: its env,
/// script, command arguments and the copy kept for re-adoption. Returns whether
/// anything changed.
pub fn compact(stored: &mut StoredJob) -> bool {
    let had_copy = stored.requeued_from.take().is_some();
    let Some(spec) = stored.job.as_mut().and_then(|j| j.spec.as_mut()) else {
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

impl Cluster {
    /// Removes finished jobs past `max_age` (since their end) or beyond `max_jobs`
    /// (oldest first); recorded as deletions.
    pub fn retire(&mut self, r: &Retention, now: i64) {
        let oldest_kept = now.saturating_sub(r.max_age.as_millis().min(i64::MAX as u128) as i64);
        self.jobs.retire(oldest_kept, r.max_jobs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::job_of;
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
                        gpu: Some(pb::resources::Gpu::Gpus(2)),
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
        assert_eq!(
            spec.resources.as_ref().unwrap().gpu,
            Some(pb::resources::Gpu::Gpus(2))
        );
        assert!(s.requeued_from.is_none());
        assert!(!compact(&mut s), "compacting twice changes nothing");
    }
}
