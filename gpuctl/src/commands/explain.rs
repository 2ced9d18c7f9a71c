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
    /// For the text: the expected start as the controller gave it (0: unknown), and
    /// whether the job waits.
    #[serde(skip)]
    expected_start_ms: i64,
    #[serde(skip)]
    pending: bool,
}

impl View for Explain {
    fn text(&self) -> String {
        let shown = |s: &str| format::printable(s).into_owned();
        let reason = shown(&self.reason);
        let mut out = format!(
            "Job {}: {}\n  reason: {}\n",
            self.job_id,
            self.state,
            if reason.is_empty() { "-" } else { &reason }
        );
        if !self.summary.is_empty() {
            out.push_str(&format!("  why: {}\n", shown(&self.summary)));
        }
        if !self.pending {
            return out;
        }
        out.push_str(&format!(
            "  queue position: {} (priority {})\n  expected start: {}\n",
            self.rank + 1,
            self.priority,
            if self.expected_start_ms > 0 {
                format::short_time(self.expected_start_ms)
            } else {
                "unknown".into()
            }
        ));
        // Nodes with the same reason go on one line.
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for n in &self.nodes {
            let r = n.reason.as_deref().map_or("fits now".into(), shown);
            match groups.iter_mut().find(|g| g.0 == r) {
                Some(g) => g.1.push(shown(&n.node)),
                None => groups.push((r, vec![shown(&n.node)])),
            }
        }
        if !groups.is_empty() {
            out.push_str("  nodes:\n");
        }
        for (r, nodes) in groups {
            let listed = if nodes.len() > 8 {
                format!("{} and {} more", nodes[..8].join(","), nodes.len() - 8)
            } else {
                nodes.join(",")
            };
            out.push_str(&format!("    {listed}: {r}\n"));
        }
        out
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
        expected_start_ms: e.expected_start_ms,
        pending: e.state() == pb::JobState::Pending,
    })
}
