//! Which jobs a listing shows (`gpuctl queue -u/-t/--name/-A/-p`, like squeue's filters).

use gpuctl_proto as pb;
use gpuctl_sched::job::JobState;

use crate::jobs::owner;

/// A listing's filter (the daemon makes it from a `ListJobsRequest`): each list empty =
/// any; `all` lists finished jobs too.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub all: bool,
    pub users: Vec<String>,
    pub states: Vec<JobState>,
    pub names: Vec<String>,
    pub accounts: Vec<String>,
    pub partitions: Vec<String>,
}

impl JobFilter {
    pub fn matches(&self, j: &pb::Job) -> bool {
        let spec = j.spec.as_ref();
        let any = |list: &[String], v: &str| list.is_empty() || list.iter().any(|x| x == v);
        let state = JobState::try_from(j.state()).ok();
        (self.all || !j.state().is_final())
            && (self.states.is_empty() || state.is_some_and(|s| self.states.contains(&s)))
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
        let state = pb::JobState::from(state);
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
        let f = JobFilter {
            users: vec!["alice".into()],
            states: vec![JobState::Pending],
            ..JobFilter::default()
        };
        assert!(f.matches(&job("alice", "a", JobState::Pending)));
        assert!(!f.matches(&job("bob", "a", JobState::Pending)));
        assert!(!f.matches(&job("alice", "a", JobState::Running)));
        let done = JobFilter {
            all: true,
            states: vec![JobState::Completed],
            names: vec!["b".into()],
            ..JobFilter::default()
        };
        assert!(done.matches(&job("x", "b", JobState::Completed)));
        assert!(!done.matches(&job("x", "a", JobState::Completed)));
        assert!(!JobFilter::default().matches(&job("x", "b", JobState::Completed)));
    }
}
