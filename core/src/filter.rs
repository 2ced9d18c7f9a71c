//! Which jobs a listing shows (`gpuctl queue -u/-t/--name/-A/-p`, like squeue's filters).

use gpuctl_proto::{self as pb, JobState};

use crate::jobs::owner;

/// A listing's filter, from a `ListJobsRequest`: each list empty = any.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub all: bool,
    pub users: Vec<String>,
    pub states: Vec<JobState>,
    pub names: Vec<String>,
    pub accounts: Vec<String>,
    pub partitions: Vec<String>,
}

impl From<&pb::ListJobsRequest> for JobFilter {
    fn from(r: &pb::ListJobsRequest) -> JobFilter {
        JobFilter {
            // Asking for a final state asks for finished jobs.
            all: r.all || r.states().any(|s| s.is_final()),
            users: r.users.clone(),
            states: r.states().collect(),
            names: r.names.clone(),
            accounts: r.accounts.clone(),
            partitions: r.partitions.clone(),
        }
    }
}

impl JobFilter {
    pub fn matches(&self, j: &pb::Job) -> bool {
        let spec = j.spec.as_ref();
        let any = |list: &[String], v: &str| list.is_empty() || list.iter().any(|x| x == v);
        (self.all || !j.state().is_final())
            && (self.states.is_empty() || self.states.contains(&j.state()))
            && any(&self.users, owner(j))
            && any(&self.names, spec.map_or("", |s| s.name.as_str()))
            && any(&self.accounts, spec.map_or("", |s| s.account.as_str()))
            && any(&self.partitions, spec.map_or("", |s| s.partition.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(user: &str, name: &str, state: JobState) -> pb::Job {
        let mut j = pb::Job {
            spec: Some(pb::JobSpec {
                user: user.into(),
                name: name.into(),
                account: user.into(),
                ..pb::JobSpec::default()
            }),
            ..pb::Job::default()
        };
        j.set_state(state);
        j
    }

    #[test]
    fn filters_combine() {
        let r = pb::ListJobsRequest {
            users: vec!["alice".into()],
            states: vec![JobState::Pending as i32],
            ..pb::ListJobsRequest::default()
        };
        let f = JobFilter::from(&r);
        assert!(f.matches(&job("alice", "a", JobState::Pending)));
        assert!(!f.matches(&job("bob", "a", JobState::Pending)));
        assert!(!f.matches(&job("alice", "a", JobState::Running)));
        let done = JobFilter::from(&pb::ListJobsRequest {
            states: vec![JobState::Completed as i32],
            names: vec!["b".into()],
            ..pb::ListJobsRequest::default()
        });
        assert!(done.matches(&job("x", "b", JobState::Completed)));
        assert!(!done.matches(&job("x", "a", JobState::Completed)));
        assert!(!JobFilter::default().matches(&job("x", "b", JobState::Completed)));
    }
}
