//! `gpuctl queue`: pending and running jobs (`--all`: finished ones too), filtered like
//! squeue (`-u`, `--me`, `-t`, `--name`, `-A`, `-p`), with chosen columns (`-o`) and without
//! the header (`-h`). The listing comes in pages; `--json` writes each page as it
//! arrives, so that 100,000 jobs stream.

use gpuctl_proto::{self as pb, JobState};

use super::View;
use crate::cli::{Client, Failure, fail};
use crate::{format, json_pages};

#[derive(clap::Args, Clone, Debug)]
#[command(disable_help_flag = true)]
pub struct QueueArgs {
    /// Include finished jobs.
    #[arg(long)]
    pub all: bool,
    /// Show expected start times of pending jobs (like squeue --start).
    #[arg(long)]
    pub start: bool,
    /// A JSON array of jobs (the filters apply; the columns do not).
    #[arg(long)]
    pub json: bool,
    /// Only jobs of these users (comma-separated).
    #[arg(short = 'u', long = "user", value_delimiter = ',')]
    pub users: Vec<String>,
    /// Only your own jobs.
    #[arg(long)]
    pub me: bool,
    /// Only jobs in these states (comma-separated): PENDING, RUNNING, COMPLETED,
    /// FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED, or squeue's PD, R, CD, F, CA,
    /// TO, NF, PR.
    /// A finished state lists finished jobs too.
    #[arg(short = 't', long = "state", value_delimiter = ',')]
    pub states: Vec<String>,
    /// Only jobs with these names.
    #[arg(long = "name", value_delimiter = ',')]
    pub names: Vec<String>,
    /// Only jobs charged to these accounts.
    #[arg(short = 'A', long = "account", value_delimiter = ',')]
    pub accounts: Vec<String>,
    /// Only jobs of these partitions.
    #[arg(short = 'p', long = "partition", value_delimiter = ',')]
    pub partitions: Vec<String>,
    /// The columns, comma-separated, from: jobid, name, user, account, partition, qos, state,
    /// time, start_time, submit_time, gpus, node, reason, attempt, time_limit.
    #[arg(short = 'o', long = "format", value_delimiter = ',')]
    pub format: Vec<String>,
    /// No header line.
    #[arg(short = 'h', long = "noheader")]
    pub noheader: bool,
    /// The steps running now (each `srun` of a job's script), one row each, as
    /// squeue --steps: STEPID, NAME, USER, TASKS, NODES, TIME.
    #[arg(short = 's', long)]
    pub steps: bool,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
}

/// A state as `-t` takes it.
pub fn parse_state(s: &str) -> Result<JobState, Failure> {
    let up = s.trim().to_ascii_uppercase();
    let st = match up.as_str() {
        "PD" | "PENDING" => JobState::Pending,
        "R" | "RUNNING" => JobState::Running,
        "CD" | "COMPLETED" => JobState::Completed,
        "F" | "FAILED" => JobState::Failed,
        "CA" | "CANCELLED" => JobState::Cancelled,
        "TO" | "TIMEOUT" => JobState::Timeout,
        "NF" | "NODE_FAIL" => JobState::NodeFail,
        "PR" | "PREEMPTED" => JobState::Preempted,
        _ => {
            return Err(fail(format!(
                "unknown state {s:?} (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED, or PD, R, CD, F, CA, TO, NF, PR)"
            )));
        }
    };
    Ok(st)
}

impl QueueArgs {
    /// The columns asked for, checked.
    pub fn columns(&self) -> Result<Vec<String>, Failure> {
        if self.format.is_empty() {
            return Ok(format::default_queue_columns(self.start));
        }
        let cols: Vec<String> = self
            .format
            .iter()
            .map(|c| c.trim().to_lowercase())
            .collect();
        if let Some(bad) = cols
            .iter()
            .find(|c| !format::QUEUE_COLUMNS.contains(&c.as_str()))
        {
            return Err(fail(format!(
                "unknown column {bad:?} for -o; known: {}",
                format::QUEUE_COLUMNS.join(", ")
            )));
        }
        Ok(cols)
    }

    /// The listing request (`--me` asks the controller who you are).
    pub async fn request(&self, client: &mut Client) -> Result<pb::ListJobsRequest, Failure> {
        let f = Filters {
            me: self.me,
            users: &self.users,
            states: &self.states,
            names: &self.names,
            accounts: &self.accounts,
            partitions: &self.partitions,
        };
        let mut req = f.request(client).await?;
        req.all = self.all;
        Ok(req)
    }
}

/// squeue's filters as the CLI takes them (`queue`, and `cancel` by filter).
pub struct Filters<'a> {
    pub me: bool,
    pub users: &'a [String],
    pub states: &'a [String],
    pub names: &'a [String],
    pub accounts: &'a [String],
    pub partitions: &'a [String],
}

impl Filters<'_> {
    /// The filter as a request (unfinished jobs; `--me` asks the controller who you are).
    pub async fn request(&self, client: &mut Client) -> Result<pb::ListJobsRequest, Failure> {
        let mut users = self.users.to_vec();
        if self.me {
            let me = client
                .who_am_i(pb::WhoAmIRequest {})
                .await?
                .into_inner()
                .user;
            users.push(me);
        }
        let states = self
            .states
            .iter()
            .map(|s| parse_state(s).map(|s| s as i32))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(pb::ListJobsRequest {
            all: false,
            users,
            states,
            names: self.names.to_vec(),
            accounts: self.accounts.to_vec(),
            partitions: self.partitions.to_vec(),
        })
    }
}

/// The text form: every page collected into one table.
pub struct Queue {
    jobs: Vec<pb::Job>,
    columns: Vec<String>,
    header: bool,
    steps: bool,
}

impl serde::Serialize for Queue {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq(self.jobs.iter().map(format::JobJson::new))
    }
}

impl View for Queue {
    fn text(&self) -> String {
        if self.steps {
            return steps_table(&self.jobs, format::now_ms(), self.header);
        }
        format::queue_table(&self.jobs, &self.columns, self.header)
    }
}

/// `queue --steps`: a row for each step running now (begun, its end not written).
pub fn steps_table(jobs: &[pb::Job], now: i64, header: bool) -> String {
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .filter(|j| j.state() == pb::JobState::Running)
        .flat_map(|j| {
            j.steps.iter().filter(|s| s.end_ms == 0).map(move |s| {
                vec![
                    format!("{}.{}", format::job_id_text(j), s.id),
                    format::printable(&s.name).into_owned(),
                    j.spec.as_ref().map(|x| x.user.clone()).unwrap_or_default(),
                    s.tasks.to_string(),
                    s.nodes.join(","),
                    format::slurm_duration((now - s.start_ms).max(0)),
                ]
            })
        })
        .collect();
    let header_row = ["STEPID", "NAME", "USER", "TASKS", "NODES", "TIME"];
    let table = format::table(&header_row, rows);
    if header {
        table
    } else {
        table.lines().skip(1).collect::<Vec<_>>().join("\n")
    }
}

pub async fn run(client: &mut Client, args: &QueueArgs) -> Result<Queue, Failure> {
    let columns = args.columns()?;
    let req = args.request(client).await?;
    let mut pages = client.list_jobs_paged(req).await?.into_inner();
    let mut jobs = Vec::new();
    while let Some(page) = pages.message().await? {
        jobs.extend(page.jobs);
    }
    Ok(Queue {
        jobs,
        columns,
        header: !args.noheader,
        steps: args.steps,
    })
}

/// `--json`: pages are printed as they arrive; receiving them, decoding them and
/// writing their JSON overlap, two pages decoded at a time (`json_pages`). The first
/// page decides a failure before any output.
pub async fn stream_json(client: &mut Client, args: &QueueArgs) -> Result<(), Failure> {
    let req = args.request(client).await?;
    client
        .raw
        .ready()
        .await
        .map_err(|e| fail(format!("the connection is not ready: {e}")))?;
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_static("/gpuctl.v1.Controller/ListJobsPaged");
    let mut pages = client
        .raw
        .server_streaming(tonic::Request::new(req), path, json_pages::RawPages)
        .await?
        .into_inner();
    let first = pages.message().await?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, bytes::Bytes)>(4);
    let writer = tokio::task::spawn_blocking(move || json_pages::print(rx));
    let mut failed = None;
    if let Some(p) = first {
        let _ = tx.send((0, p));
        let mut n = 1;
        loop {
            match pages.message().await {
                Ok(Some(p)) => {
                    if tx.send((n, p)).is_err() {
                        break;
                    }
                    n += 1;
                }
                Ok(None) => break,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
    }
    drop(tx);
    match writer.await {
        Ok(Ok(())) => {}
        Ok(Err(why)) => return Err(fail(format!("{why}; the output above is incomplete"))),
        Err(_) => {
            return Err(fail(
                "writing the JSON failed; the output above is incomplete",
            ));
        }
    }
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
