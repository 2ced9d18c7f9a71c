//! Mail about jobs (`sbatch --mail-type`, `--mail-user`): when a job whose mail types
//! ask for it begins, ends, fails or is requeued, a mail is due to its `mail_user` (its
//! user when none), with Slurm's subject lines ("Slurm Job_id=12 Name=train Began,
//! Queued time 00:00:03"). `Jobs::transition` notes them; `Cluster::apply` hands them
//! out as effects; the controller that leads sends them through `[mail] program`
//! (none: not sent). Pure.

use crate::record::{Job, JobState};
use crate::text::hms;

/// One mail due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mail {
    pub to: String,
    pub subject: String,
}

/// Whether `job`'s mail types ask for `kind` (ALL asks for all but the limit ones).
fn wants(job: &Job, kind: &str) -> bool {
    job.spec
        .mail_type
        .split(',')
        .any(|t| t == kind || (t == "ALL" && !kind.starts_with("TIME_LIMIT")))
}

/// The mail due after `job` went from `from` to its state at `now`, if its mail
/// types ask for one.
pub fn after_transition(job: &Job, from: JobState, now: i64) -> Option<Mail> {
    if job.spec.mail_type.is_empty() || job.spec.mail_type == "NONE" {
        return None;
    }
    let head = format!("Slurm Job_id={} Name={}", job.id, job.spec.name);
    let run = hms(now - job.start_time_ms);
    let code = job.exit_code.unwrap_or(0);
    let subject = match (from, job.state) {
        (JobState::Pending, JobState::Running) if wants(job, "BEGIN") => {
            format!(
                "{head} Began, Queued time {}",
                hms(now - job.submit_time_ms)
            )
        }
        (JobState::Running, JobState::Pending) if wants(job, "REQUEUE") => {
            format!("{head} Requeued, Run time {run}")
        }
        (_, JobState::Timeout)
            if wants(job, "TIME_LIMIT") || wants(job, "FAIL") || wants(job, "END") =>
        {
            format!("{head} Reached time limit, Run time {run}, TIMEOUT, ExitCode {code}")
        }
        (_, s @ (JobState::Failed | JobState::NodeFail))
            if wants(job, "FAIL") || wants(job, "END") =>
        {
            format!(
                "{head} Failed, Run time {run}, {}, ExitCode {code}",
                state_word(s)
            )
        }
        (_, s @ (JobState::Completed | JobState::Cancelled | JobState::Preempted))
            if wants(job, "END") =>
        {
            format!(
                "{head} Ended, Run time {run}, {}, ExitCode {code}",
                state_word(s)
            )
        }
        _ => return None,
    };
    let to = if job.spec.mail_user.is_empty() {
        job.spec.user.clone()
    } else {
        job.spec.mail_user.clone()
    };
    Some(Mail { to, subject })
}

fn state_word(s: JobState) -> &'static str {
    match s {
        JobState::Completed => "COMPLETED",
        JobState::Cancelled => "CANCELLED",
        JobState::Preempted => "PREEMPTED",
        JobState::NodeFail => "NODE_FAIL",
        _ => "FAILED",
    }
}

/// Whether `to` may be handed to a mail program as its recipient argument: a user
/// name or an address, never something it could read as an option.
pub fn valid_recipient(to: &str) -> bool {
    !to.is_empty()
        && !to.starts_with('-')
        && to.len() <= 254
        && to
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._%+-@".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(types: &str, state: JobState) -> Job {
        let mut j = Job {
            id: 12,
            state,
            submit_time_ms: 1_000,
            start_time_ms: 4_000,
            exit_code: Some(0),
            ..Job::default()
        };
        j.spec.name = "train".into();
        j.spec.user = "alice".into();
        j.spec.mail_type = types.into();
        j
    }

    #[test]
    fn subjects_as_slurm_writes_them_for_the_types_asked() {
        let began = after_transition(
            &job("BEGIN,END", JobState::Running),
            JobState::Pending,
            4_000,
        );
        assert_eq!(
            began,
            Some(Mail {
                to: "alice".into(),
                subject: "Slurm Job_id=12 Name=train Began, Queued time 00:00:03".into()
            })
        );
        let ended = after_transition(&job("END", JobState::Completed), JobState::Running, 64_000);
        assert_eq!(
            ended.unwrap().subject,
            "Slurm Job_id=12 Name=train Ended, Run time 00:01:00, COMPLETED, ExitCode 0"
        );
        let mut failed = job("FAIL", JobState::Failed);
        failed.exit_code = Some(3);
        failed.spec.mail_user = "team@example.com".into();
        let m = after_transition(&failed, JobState::Running, 5_000).unwrap();
        assert_eq!(m.to, "team@example.com");
        assert!(m.subject.contains("Failed") && m.subject.ends_with("ExitCode 3"));
        // Not asked: nothing.
        assert!(
            after_transition(&job("FAIL", JobState::Completed), JobState::Running, 9_000).is_none()
        );
        assert!(after_transition(&job("", JobState::Running), JobState::Pending, 9_000).is_none());
        assert!(
            after_transition(&job("ALL", JobState::Pending), JobState::Running, 9_000).is_some()
        );
    }

    #[test]
    fn recipients_are_names_or_addresses_never_options() {
        assert!(valid_recipient("alice"));
        assert!(valid_recipient("team+gpu@example.com"));
        for bad in ["", "-oQ/tmp/x", "a b", "a;rm", "a\nb", "$(id)"] {
            assert!(!valid_recipient(bad), "{bad:?}");
        }
    }
}
