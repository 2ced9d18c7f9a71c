//! `gpuctl priority`: the pending jobs in priority order, with each factor.

use std::collections::BTreeMap;

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure};
use crate::format;

#[derive(Serialize)]
pub struct JobPriority {
    factors: BTreeMap<String, i64>,
    job_id: u64,
    priority: i64,
    user: String,
}

#[derive(Serialize)]
#[serde(transparent)]
pub struct Priorities {
    jobs: Vec<JobPriority>,
}

impl View for Priorities {
    /// A column per factor any job has (absent: 0), after the job, user and total.
    fn text(&self) -> String {
        let mut names: Vec<&String> = self.jobs.iter().flat_map(|j| j.factors.keys()).collect();
        names.sort();
        names.dedup();
        let mut header = vec!["JOBID".to_string(), "USER".into(), "PRIORITY".into()];
        // The factor "user" (the job's own priority, weighted) is not the USER column.
        header.extend(names.iter().map(|n| match n.as_str() {
            "user" => "JOB_PRIO".to_string(),
            n => n.to_uppercase(),
        }));
        let rows = self
            .jobs
            .iter()
            .map(|j| {
                let mut r = vec![j.job_id.to_string(), j.user.clone(), j.priority.to_string()];
                r.extend(
                    names
                        .iter()
                        .map(|n| j.factors.get(*n).copied().unwrap_or(0).to_string()),
                );
                r
            })
            .collect();
        let h: Vec<&str> = header.iter().map(String::as_str).collect();
        format::table(&h, rows)
    }
}

pub async fn run(client: &mut Client) -> Result<Priorities, Failure> {
    let raw = client
        .priorities(pb::PrioritiesRequest {})
        .await?
        .into_inner()
        .jobs;
    let jobs = raw
        .into_iter()
        .map(|j| JobPriority {
            factors: j.factors.into_iter().collect(),
            job_id: j.job_id,
            priority: j.total,
            user: j.user,
        })
        .collect();
    Ok(Priorities { jobs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_user_column_and_the_job_priority_factor_named_apart() {
        let p = Priorities {
            jobs: vec![JobPriority {
                job_id: 5,
                user: "ann".into(),
                priority: 1500,
                factors: [("user".to_string(), 1000), ("age".to_string(), 500)]
                    .into_iter()
                    .collect(),
            }],
        };
        let text = p.text();
        let header = text.lines().next().unwrap();
        assert_eq!(header.matches("USER").count(), 1, "{header}");
        assert!(
            header.contains("JOB_PRIO") && header.contains("AGE"),
            "{header}"
        );
    }
}
