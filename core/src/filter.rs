//! Which jobs a listing shows (`gpuctl queue -u/-t/--name/-A/-p`, like squeue's filters).

use crate::record::{Job, JobState};

use crate::error::{Actor, Refusal};
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
    /// Whether it names anything to match (users, states, names, accounts or
    /// partitions).
    pub fn narrows(&self) -> bool {
        !(self.users.is_empty()
            && self.states.is_empty()
            && self.names.is_empty()
            && self.accounts.is_empty()
            && self.partitions.is_empty())
    }

    /// The filter of a cancel by `actor` (`gpuctl cancel --me`, `scancel -u/-t`):
    /// unfinished jobs only (final states named are dropped), at least one criterion
    /// left, and for anyone but an admin their own jobs only (naming another user is
    /// refused).
    pub fn for_cancel(mut self, actor: &Actor) -> Result<JobFilter, Refusal> {
        self.all = false;
        self.states.retain(|s| !s.is_final());
        if !self.narrows() {
            return Err(Refusal::invalid_argument(
                "a cancel by filter needs at least one of users, unfinished states, names, accounts or partitions (gpuctl cancel --me cancels all of yours)",
            ));
        }
        if !actor.admin {
            if self.users.iter().any(|u| *u != actor.user) {
                return Err(actor.deny("only admins cancel other users' jobs by filter"));
            }
            self.users = vec![actor.user.clone()];
        }
        Ok(self)
    }

    pub fn matches(&self, j: &Job) -> bool {
        let spec = &j.spec;
        let any = |list: &[String], v: &str| list.is_empty() || list.iter().any(|x| x == v);
        (self.all || !j.state.is_final())
            && (self.states.is_empty() || self.states.contains(&j.state))
            && any(&self.users, owner(j))
            && any(&self.names, &spec.name)
            && any(&self.accounts, &spec.account)
            && any(&self.partitions, &spec.partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::JobSpec;

    fn job(user: &str, name: &str, state: JobState) -> Job {
        Job {
            spec: JobSpec {
                user: user.into(),
                name: name.into(),
                account: user.into(),
                ..JobSpec::default()
            },
            state,
            ..Job::default()
        }
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

    #[test]
    fn a_cancel_filter_narrows_to_unfinished_jobs_and_to_its_owner() {
        let alice = Actor {
            user: "alice".into(),
            admin: false,
        };
        let root = Actor {
            user: "root".into(),
            admin: true,
        };
        let finished_only = JobFilter {
            states: vec![JobState::Completed],
            ..JobFilter::default()
        };
        let e = finished_only.for_cancel(&root).unwrap_err();
        assert!(e.message.contains("needs at least one"), "{}", e.message);
        let named = JobFilter {
            names: vec!["a".into()],
            all: true,
            ..JobFilter::default()
        };
        let f = named.clone().for_cancel(&alice).unwrap();
        assert_eq!((f.all, f.users.clone()), (false, vec!["alice".to_string()]));
        assert!(f.matches(&job("alice", "a", JobState::Running)));
        assert!(!f.matches(&job("bob", "a", JobState::Running)));
        assert!(!f.matches(&job("alice", "a", JobState::Completed)));
        let f = named.for_cancel(&root).unwrap();
        assert!(
            f.matches(&job("bob", "a", JobState::Pending)),
            "an admin's is everyone's"
        );
        let bobs = JobFilter {
            users: vec!["bob".into()],
            ..JobFilter::default()
        };
        let e = bobs.for_cancel(&alice).unwrap_err();
        assert!(
            e.message.contains("only admins cancel other users"),
            "{}",
            e.message
        );
    }
}
