//! `gpuctl admin controllers list|add|remove`: the cluster's replicated controllers.

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure};

/// One controller as the one that answered knows it.
#[derive(Serialize)]
pub struct Member {
    id: u64,
    address: String,
    leader: bool,
    term: u64,
    commit_index: u64,
    state: String,
    voter: bool,
}

#[derive(Serialize)]
#[serde(transparent)]
pub struct Members {
    members: Vec<Member>,
    #[serde(skip)]
    replicated: bool,
    #[serde(skip)]
    answered_by: u64,
}

impl View for Members {
    fn text(&self) -> String {
        if !self.replicated {
            return "one controller (no --peers): no Raft, it always leads\n".into();
        }
        let mut out = format!(
            "{:<4} {:<24} {:<12} {:>6} {:>12} VOTER\n",
            "ID", "ADDRESS", "STATE", "TERM", "COMMIT"
        );
        for m in &self.members {
            let me = if m.id == self.answered_by { " *" } else { "" };
            out.push_str(&format!(
                "{:<4} {:<24} {:<12} {:>6} {:>12} {}{me}\n",
                m.id,
                crate::format::printable(&m.address),
                m.state,
                m.term,
                // 0: not known to the controller that answered (a follower's view of
                // another follower).
                if m.commit_index == 0 {
                    "-".to_string()
                } else {
                    m.commit_index.to_string()
                },
                if m.voter { "yes" } else { "no" },
            ));
        }
        out
    }
}

fn members(r: pb::ControllersResponse) -> Members {
    Members {
        replicated: r.replicated,
        answered_by: r.id,
        members: r
            .members
            .into_iter()
            .map(|m| Member {
                id: m.id,
                address: m.address,
                leader: m.leader,
                term: m.term,
                commit_index: m.commit_index,
                state: m.state,
                voter: m.voter,
            })
            .collect(),
    }
}

pub async fn list(client: &mut Client) -> Result<Members, Failure> {
    let r = client.controllers(pb::ControllersRequest {}).await?;
    Ok(members(r.into_inner()))
}

pub async fn add(client: &mut Client, id: u64, address: String) -> Result<Members, Failure> {
    let req = pb::ChangeControllersRequest {
        add_id: id,
        add_address: address,
        remove_id: 0,
    };
    Ok(members(client.change_controllers(req).await?.into_inner()))
}

pub async fn remove(client: &mut Client, id: u64) -> Result<Members, Failure> {
    let req = pb::ChangeControllersRequest {
        add_id: 0,
        add_address: String::new(),
        remove_id: id,
    };
    Ok(members(client.change_controllers(req).await?.into_inner()))
}
