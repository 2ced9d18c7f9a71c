//! `gpuctl nodes [--stats]`: nodes and their GPUs, or the cluster's totals.

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure};
use crate::format;

/// Every node with its GPUs (the JSON is `format::node_json` of each).
pub struct Nodes {
    nodes: Vec<pb::Node>,
}

impl Serialize for Nodes {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq(self.nodes.iter().map(format::node_json))
    }
}

impl View for Nodes {
    fn text(&self) -> String {
        let gpus = format::gpus_table(&self.nodes);
        if gpus.is_empty() {
            format::nodes_table(&self.nodes)
        } else {
            format!("{}\n{gpus}", format::nodes_table(&self.nodes))
        }
    }
}

/// `--stats`: fields in alphabetical order (the documented JSON).
#[derive(Serialize)]
pub struct Stats {
    fragmentation_gpus: f64,
    fragmentation_pct_of_idle: f64,
    gpus_allocated: f64,
    gpus_total: usize,
    nodes: usize,
}

impl View for Stats {
    fn text(&self) -> String {
        format!(
            "nodes: {}\ngpus: {:.2} of {} allocated\nfragmentation: {:.2} GPUs ({:.1}% of idle)\n",
            self.nodes,
            self.gpus_allocated,
            self.gpus_total,
            self.fragmentation_gpus,
            self.fragmentation_pct_of_idle
        )
    }
}

async fn all(client: &mut Client) -> Result<pb::ListNodesResponse, Failure> {
    Ok(client
        .list_nodes(pb::ListNodesRequest::default())
        .await?
        .into_inner())
}

pub async fn run(client: &mut Client) -> Result<Nodes, Failure> {
    Ok(Nodes {
        nodes: all(client).await?.nodes,
    })
}

pub async fn stats(client: &mut Client) -> Result<Stats, Failure> {
    let resp = all(client).await?;
    let gpus = resp.nodes.iter().flat_map(|n| &n.gpus);
    Ok(Stats {
        fragmentation_gpus: resp.fragmentation_gpus,
        fragmentation_pct_of_idle: resp.fragmentation_pct_of_idle,
        gpus_allocated: gpus.clone().map(format::gpu_allocated).sum(),
        gpus_total: gpus.count(),
        nodes: resp.nodes.len(),
    })
}
