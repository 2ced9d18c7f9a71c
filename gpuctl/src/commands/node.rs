//! `gpuctl node drain|resume NAME`.

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure, NodeAction};
use crate::format;

#[derive(Serialize)]
pub struct NodeChanged {
    name: String,
    state: &'static str,
}

impl View for NodeChanged {
    fn text(&self) -> String {
        format!("Node {} is {}\n", self.name, self.state)
    }
}

pub async fn run(client: &mut Client, action: NodeAction) -> Result<NodeChanged, Failure> {
    let node = match action {
        NodeAction::Drain { name, reason } => {
            client
                .drain_node(pb::DrainNodeRequest { name, reason })
                .await?
        }
        NodeAction::Resume { name } => client.resume_node(pb::ResumeNodeRequest { name }).await?,
    }
    .into_inner();
    Ok(NodeChanged {
        state: format::node_state_name(node.state()),
        name: node.name,
    })
}
