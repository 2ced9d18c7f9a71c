//! `gpuctl explain JOB`: why a job waits, node by node.

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure};
use crate::format;

#[derive(Serialize)]
pub struct NodeReason {
    node: String,
    /// `None`: the job fits there now.
    reason: Option<String>,
}

/// Fields in alphabetical order (the documented JSON).
#[derive(Serialize)]
pub struct Explain {
    expected_start: Option<String>,
    job_id: u64,
    nodes: Vec<NodeReason>,
    priority: i64,
    rank: u32,
    reason: String,
    state: &'static str,
    summary: String,
    #[serde(skip)]
    raw: pb::Explanation,
}

impl View for Explain {
    fn text(&self) -> String {
        format::explain_text(&self.raw)
    }
}

pub async fn run(client: &mut Client, job_id: u64) -> Result<Explain, Failure> {
    let e = client
        .explain(pb::GetJobRequest { job_id })
        .await?
        .into_inner();
    Ok(Explain {
        expected_start: format::time_string(e.expected_start_ms),
        job_id: e.job_id,
        nodes: e
            .nodes
            .iter()
            .map(|n| NodeReason {
                node: n.node.clone(),
                reason: (!n.reason.is_empty()).then(|| n.reason.clone()),
            })
            .collect(),
        priority: e.priority,
        rank: e.rank,
        reason: e.reason.clone(),
        state: format::state_name(e.state()),
        summary: e.summary.clone(),
        raw: e,
    })
}
