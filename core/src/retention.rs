//! Finished jobs removed past the configured retention (they are compacted when they
//! end: `jobs::compact`).

use crate::config::Retention;
use crate::state::Cluster;

impl Cluster {
    /// Removes finished jobs past `max_age` (since their end) or beyond `max_jobs`
    /// (oldest first); recorded as deletions.
    pub(crate) fn retire(&mut self, r: &Retention, now: i64) {
        let oldest_kept = now.saturating_sub(r.max_age.as_millis().min(i64::MAX as u128) as i64);
        self.jobs.retire(oldest_kept, r.max_jobs);
    }
}

#[cfg(test)]
mod tests {
    use crate::jobs::compact;
    use crate::record::{GpuPart, Job, JobSpec, Record, Resources};

    #[test]
    fn compact_keeps_metadata_only() {
        let mut s = Record {
            job: Job {
                id: 3,
                spec: JobSpec {
                    name: "train".into(),
                    user: "alice".into(),
                    script: "a\nb\n".into(),
                    command: vec![],
                    env: [("K".to_string(), "secret".to_string())]
                        .into_iter()
                        .collect(),
                    resources: Resources {
                        gpu: Some(GpuPart::Gpus(2)),
                        ..Default::default()
                    },
                    ..Default::default()
                },
                ..Default::default()
            },
            requeued_from: Some(Job::default()),
            ..Default::default()
        };
        assert!(compact(&mut s));
        let spec = &s.job.spec;
        assert!(spec.env.is_empty());
        assert!(spec.script.is_empty());
        assert_eq!(spec.name, "train");
        assert_eq!(spec.resources.gpu, Some(GpuPart::Gpus(2)));
        assert!(s.requeued_from.is_none());
        assert!(!compact(&mut s), "compacting twice changes nothing");
    }
}
