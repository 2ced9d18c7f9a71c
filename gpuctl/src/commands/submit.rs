//! `gpuctl submit`: sends the job (read and checked by `crate::submit` before anything
//! is contacted), retrying with the same request id while the outcome is unknown.

use gpuctl_proto as pb;
use serde::Serialize;

use super::{View, emit};
use crate::cli::{Cli, Client, Failure, connect, exit, print, print_json_streamed};

#[derive(Serialize)]
pub struct Submitted {
    /// The job file, when one call submitted several.
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    pub(crate) job_id: u64,
    /// What the controller changed in the request (right-sizing).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
}

impl Submitted {
    /// `--parsable`: the id alone.
    fn parsable(&self) -> String {
        format!("{}\n", self.job_id)
    }
}

impl View for Submitted {
    fn text(&self) -> String {
        let mut text = format!("Submitted job {}\n", self.job_id);
        for n in &self.notes {
            text.push_str(&format!("{n}\n"));
        }
        text
    }
}

/// Several jobs, in order, one request each on one connection (each durable, each with
/// its own request id), printed as they are queued (`--json`: an array of
/// `{file, job_id}` at the end). The first refusal stops the rest: the error says
/// which files were not submitted, and what was queued before it has been printed.
pub async fn run_all(
    cli: &Cli,
    client: &mut Client,
    specs: Vec<crate::submit::Submission>,
    json: bool,
    parsable: bool,
) -> Result<(), Failure> {
    if specs.len() == 1 {
        let sub = specs.into_iter().next().expect("one");
        let s = run(cli, client, &sub.file, sub.spec, sub.hold).await?;
        if parsable {
            print(&s.parsable());
        } else {
            emit(&s, json);
        }
        return Ok(());
    }
    let total = specs.len();
    let mut done = Vec::with_capacity(total);
    for sub in specs {
        let file = sub.file;
        match run(cli, client, &file, sub.spec, sub.hold).await {
            Ok(mut s) => {
                s.file = Some(file.clone());
                if parsable {
                    print(&s.parsable());
                } else if !json {
                    print(&s.text());
                }
                done.push(s);
            }
            Err(mut f) => {
                if json {
                    print_json_streamed(&done);
                }
                let after = match total - done.len() - 1 {
                    0 => String::new(),
                    1 => " and the file after it".to_string(),
                    n => format!(" and the {n} files after it"),
                };
                f.message = format!(
                    "{}\n{} of {total} jobs submitted; not submitted: {file}{after}",
                    f.message,
                    done.len()
                );
                return Err(f);
            }
        }
    }
    if json {
        print_json_streamed(&done);
    }
    Ok(())
}

/// Whether a failed request may or may not have reached the controller (the
/// connection broke, or no answer came): only then is a retry needed to know.
fn outcome_unknown(s: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        s.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    ) || crate::cli::connection_broke(s)
}

/// A random id for a submit, so that a retry is recognised (16 bytes of the kernel's
/// randomness, as hex).
fn request_id() -> String {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read as _;
        let _ = f.read_exact(&mut b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut out: String = b.iter().map(|x| format!("{x:02x}")).collect();
    out.push_str(&format!("-{:x}-{}", t, std::process::id()));
    out.truncate(64);
    out
}

/// Submits `spec` (from `file`). When the outcome is unknown (the connection broke, the
/// controller restarted), asks again with the same request id for up to `--timeout`:
/// the controller answers a repeat with the job it already queued, so the job is queued
/// once. Only if the controller stays silent is the outcome reported as unknown.
pub async fn run(
    cli: &Cli,
    client: &mut Client,
    file: &str,
    spec: pb::JobSpec,
    hold: bool,
) -> Result<Submitted, Failure> {
    let req = pb::SubmitRequest {
        spec: Some(spec),
        request_id: request_id(),
        hold,
    };
    let started = std::time::Instant::now();
    loop {
        let s = match client.submit(req.clone()).await {
            Ok(r) => {
                let r = r.into_inner();
                return Ok(Submitted {
                    file: None,
                    job_id: r.job_id,
                    notes: r.notes,
                });
            }
            Err(s) if outcome_unknown(&s) => s,
            Err(s) => {
                let mut f = Failure::from(s);
                f.message = format!("{file}: rejected: {}", f.message);
                return Err(f);
            }
        };
        if started.elapsed() >= cli.timeout {
            return Err(Failure {
                code: exit::UNREACHABLE,
                message: format!(
                    "{}: the controller did not confirm the submit ({}); the job may or may not have been queued: `gpuctl queue` shows it if it was (request id {})",
                    file,
                    s.message(),
                    req.request_id
                ),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        if let Ok(c) = connect(cli).await {
            *client = c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection that broke mid-request (a controller killed under it) leaves the
    /// submit's outcome unknown, whatever code the transport gave it: the submit is
    /// asked again with the same request id, and if it never is confirmed the exit is
    /// 3 (unreachable), never 1 (refused).
    #[test]
    fn a_broken_connection_is_an_unknown_outcome_and_unreachable() {
        for s in [
            tonic::Status::internal("h2 protocol error: error reading a body from connection"),
            tonic::Status::unknown("transport error"),
            tonic::Status::cancelled("operation was canceled: connection closed"),
            tonic::Status::internal("connection reset by peer"),
        ] {
            assert!(outcome_unknown(&s), "{s:?}");
            let f = Failure::from(s.clone());
            assert_eq!(f.code, exit::UNREACHABLE, "{s:?}");
            assert!(f.message.contains("went away"), "{}", f.message);
        }
        let refused = tonic::Status::invalid_argument("time limit over the maximum");
        assert!(!outcome_unknown(&refused));
        assert_eq!(Failure::from(refused).code, exit::FAILED);
    }
}
