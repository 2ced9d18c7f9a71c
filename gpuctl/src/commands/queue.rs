//! `gpuctl queue`: pending and running jobs (`--all`: finished ones too). The listing
//! comes in pages; `--json` writes each page as it arrives, so that 100,000 jobs stream.

use gpuctl_proto as pb;

use super::View;
use crate::cli::{Client, Failure, fail, print_json_streamed};
use crate::format;

/// The text form: every page collected into one table.
pub struct Queue {
    jobs: Vec<pb::Job>,
    with_start: bool,
}

impl serde::Serialize for Queue {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq(self.jobs.iter().map(format::JobJson::new))
    }
}

impl View for Queue {
    fn text(&self) -> String {
        format::queue_table(&self.jobs, self.with_start)
    }
}

pub async fn run(client: &mut Client, all: bool, with_start: bool) -> Result<Queue, Failure> {
    let mut pages = client
        .list_jobs_paged(pb::ListJobsRequest { all })
        .await?
        .into_inner();
    let mut jobs = Vec::new();
    while let Some(page) = pages.message().await? {
        jobs.extend(page.jobs);
    }
    Ok(Queue { jobs, with_start })
}

/// `--json`: pages are printed as they arrive (receiving, decoding and writing JSON
/// overlap). The first page decides a failure before any output.
pub async fn stream_json(client: &mut Client, all: bool) -> Result<(), Failure> {
    let mut pages = client
        .list_jobs_paged(pb::ListJobsRequest { all })
        .await?
        .into_inner();
    let first = pages.message().await?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<pb::Job>>(4);
    let writer = tokio::task::spawn_blocking(move || {
        print_json_streamed(&format::StreamedJobs::new(rx));
    });
    if let Some(p) = first {
        let _ = tx.send(p.jobs);
    }
    let mut failed = None;
    loop {
        match pages.message().await {
            Ok(Some(p)) => {
                if tx.send(p.jobs).is_err() {
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    drop(tx);
    if writer.await.is_err() {
        return Err(fail(
            "writing the JSON failed; the output above is incomplete",
        ));
    }
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
