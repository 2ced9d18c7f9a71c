//! `gpuctl hold`, `release` and `requeue` (like scontrol hold/release/requeue).

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure};

#[derive(Debug, Clone, Copy)]
pub enum Action {
    Hold,
    Release,
    Requeue,
}

#[derive(Serialize)]
pub struct Done {
    job_id: u64,
    state: String,
    reason: String,
}

impl Done {
    /// A job as the controller answered it.
    pub fn of(j: &pb::Job) -> Done {
        Done {
            job_id: j.id,
            state: crate::format::state_name(j.state()).to_string(),
            reason: if j.reason.is_empty() {
                "-".into()
            } else {
                crate::format::printable(&j.reason).into_owned()
            },
        }
    }
}

#[derive(Serialize)]
#[serde(transparent)]
pub struct Results(pub Vec<Done>);

impl View for Results {
    fn text(&self) -> String {
        self.0
            .iter()
            .map(|d| format!("job {}: {} ({})\n", d.job_id, d.state, d.reason))
            .collect()
    }
}

pub async fn run(
    client: &mut Client,
    action: Action,
    targets: &[String],
) -> Result<Results, Failure> {
    // The forms cancel takes: ids, array tasks, task lists.
    let (ids, tasks) = super::cancel::parse_targets(targets)?;
    let reqs = ids
        .into_iter()
        .map(|job_id| pb::JobActionRequest {
            job_id,
            ..Default::default()
        })
        .chain(tasks.into_iter().map(|t| pb::JobActionRequest {
            job_id: 0,
            task: Some(t),
            exit_code: None,
        }));
    let mut out = Vec::new();
    for req in reqs {
        let j = match action {
            Action::Hold => client.hold(req).await?,
            Action::Release => client.release(req).await?,
            Action::Requeue => client.requeue(req).await?,
        }
        .into_inner();
        out.push(Done::of(&j));
    }
    Ok(Results(out))
}
