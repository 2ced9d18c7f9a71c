//! `gpuctl cancel JOB...`.

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure, exit};

#[derive(Serialize)]
pub struct Outcome {
    job_id: u64,
    message: String,
    ok: bool,
}

#[derive(Serialize)]
#[serde(transparent)]
pub struct Cancelled {
    results: Vec<Outcome>,
}

impl View for Cancelled {
    /// The jobs cancelled or being killed; refusals go to stderr (`failure`).
    fn text(&self) -> String {
        self.results
            .iter()
            .filter(|r| r.ok)
            .map(|r| format!("Job {}: {}\n", r.job_id, r.message))
            .collect()
    }
}

impl Cancelled {
    /// The jobs that were not cancelled, each on stderr, as a failure of the command.
    pub fn failure(&self) -> Option<Failure> {
        let refused: Vec<&Outcome> = self.results.iter().filter(|r| !r.ok).collect();
        for r in &refused {
            eprintln!("gpuctl: job {}: {}", r.job_id, r.message);
        }
        (!refused.is_empty()).then(|| Failure {
            code: exit::FAILED,
            message: "some jobs were not cancelled".into(),
        })
    }
}

pub async fn run(client: &mut Client, job_ids: Vec<u64>) -> Result<Cancelled, Failure> {
    let results = client
        .cancel(pb::CancelRequest { job_ids })
        .await?
        .into_inner()
        .results
        .into_iter()
        .map(|r| Outcome {
            job_id: r.job_id,
            message: r.message,
            ok: r.ok,
        })
        .collect();
    Ok(Cancelled { results })
}
