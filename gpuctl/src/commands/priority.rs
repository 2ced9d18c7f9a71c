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
    #[serde(skip)]
    raw: Vec<pb::JobPriority>,
}

impl View for Priorities {
    fn text(&self) -> String {
        format::priority_table(&self.raw)
    }
}

pub async fn run(client: &mut Client) -> Result<Priorities, Failure> {
    let raw = client
        .priorities(pb::PrioritiesRequest {})
        .await?
        .into_inner()
        .jobs;
    let jobs = raw
        .iter()
        .map(|j| JobPriority {
            factors: j.factors.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            job_id: j.job_id,
            priority: j.total,
            user: j.user.clone(),
        })
        .collect();
    Ok(Priorities { jobs, raw })
}
