//! `gpuctl partitions`: the partitions, their nodes, limits and jobs (like `sinfo -s`
//! and `scontrol show partition`).

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure};
use crate::format;

#[derive(Serialize)]
pub struct PartitionRow {
    name: String,
    default: bool,
    state: String,
    nodes: Vec<String>,
    node_patterns: Vec<String>,
    gpus: u32,
    default_time_secs: Option<u64>,
    max_time_secs: Option<u64>,
    allowed_accounts: Vec<String>,
    default_qos: Option<String>,
    pending_jobs: u32,
    running_jobs: u32,
}

#[derive(Serialize)]
#[serde(transparent)]
pub struct Partitions {
    partitions: Vec<PartitionRow>,
}

fn limit(secs: Option<u64>) -> String {
    secs.map_or_else(
        || "-".into(),
        |s| format::slurm_duration(i64::try_from(s).unwrap_or(i64::MAX / 1000) * 1000),
    )
}

impl View for Partitions {
    fn text(&self) -> String {
        let rows = self
            .partitions
            .iter()
            .map(|p| {
                vec![
                    if p.default {
                        format!("{}*", p.name)
                    } else {
                        p.name.clone()
                    },
                    p.state.clone(),
                    p.nodes.len().to_string(),
                    p.gpus.to_string(),
                    limit(p.default_time_secs),
                    limit(p.max_time_secs),
                    if p.allowed_accounts.is_empty() {
                        "ALL".into()
                    } else {
                        p.allowed_accounts.join(",")
                    },
                    p.default_qos.clone().unwrap_or_else(|| "-".into()),
                    format!("{}/{}", p.running_jobs, p.pending_jobs),
                    if p.node_patterns.is_empty() {
                        "ALL".into()
                    } else {
                        p.node_patterns.join(",")
                    },
                ]
            })
            .collect();
        format::table(
            &[
                "PARTITION",
                "STATE",
                "NODES",
                "GPUS",
                "DEFAULT_TIME",
                "MAX_TIME",
                "ACCOUNTS",
                "DEFAULT_QOS",
                "JOBS(R/PD)",
                "NODELIST",
            ],
            rows,
        )
    }
}

pub async fn run(client: &mut Client) -> Result<Partitions, Failure> {
    let rows = client
        .partitions(pb::PartitionsRequest {})
        .await?
        .into_inner()
        .partitions;
    let nonzero = |s: u64| (s > 0).then_some(s);
    let partitions = rows
        .into_iter()
        .map(|p| PartitionRow {
            default: p.is_default,
            state: p.state,
            nodes: p.nodes,
            node_patterns: p.node_patterns,
            gpus: p.gpus,
            default_time_secs: nonzero(p.default_time_secs),
            max_time_secs: nonzero(p.max_time_secs),
            allowed_accounts: p.allowed_accounts,
            default_qos: (!p.default_qos.is_empty()).then_some(p.default_qos),
            pending_jobs: p.pending_jobs,
            running_jobs: p.running_jobs,
            name: p.name,
        })
        .collect();
    Ok(Partitions { partitions })
}
