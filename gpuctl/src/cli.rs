//! The `gpuctl` command line: arguments and what each subcommand does.

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use gpuctl_proto::{self as pb, controller_client::ControllerClient};
use serde_json::json;
use tonic::transport::Channel;

use crate::format;
use crate::jobfile;

/// Exit codes (documented in docs/cli.md).
pub mod exit {
    pub const OK: u8 = 0;
    /// The controller refused the request, or a job file is bad.
    pub const FAILED: u8 = 1;
    /// Bad command line (clap's own code).
    pub const USAGE: u8 = 2;
    /// The controller cannot be reached.
    pub const UNREACHABLE: u8 = 3;
}

#[derive(Parser)]
#[command(
    name = "gpuctl",
    version,
    about = "Submit and manage GPU jobs on a gpuctl cluster"
)]
pub struct Cli {
    /// Controller URL.
    #[arg(
        long,
        global = true,
        env = "GPUCTL_CONTROLLER",
        default_value = "http://127.0.0.1:7817"
    )]
    pub controller: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Submit a job file (job.toml).
    Submit {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Pending and running jobs (like squeue).
    Queue {
        /// Include finished jobs.
        #[arg(long)]
        all: bool,
        /// Show expected start times of pending jobs (like squeue --start).
        #[arg(long)]
        start: bool,
        #[arg(long)]
        json: bool,
    },
    /// Why a job waits, node by node, and when it is expected to start.
    Explain {
        job_id: u64,
        #[arg(long)]
        json: bool,
    },
    /// Pending jobs' priorities and the factors behind them (like sprio).
    Priority {
        #[arg(long)]
        json: bool,
    },
    /// Everything known about one job (like scontrol show job).
    Show {
        job_id: u64,
        #[arg(long)]
        json: bool,
    },
    /// Cancel jobs (like scancel).
    Cancel {
        #[arg(required = true)]
        job_ids: Vec<u64>,
    },
    /// Nodes and their GPUs (like sinfo).
    Nodes {
        #[arg(long)]
        json: bool,
        /// Print cluster figures (GPU totals, fragmentation) instead of the node list.
        #[arg(long)]
        stats: bool,
    },
    /// Drain or resume a node.
    Node {
        #[command(subcommand)]
        action: NodeAction,
    },
}

#[derive(Subcommand)]
pub enum NodeAction {
    /// Stop new placements on a node; running jobs finish.
    Drain {
        name: String,
        #[arg(long, required = true)]
        reason: String,
    },
    /// Make a drained node schedulable again.
    Resume { name: String },
}

/// A failure with the exit code it maps to.
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        let code = if s.code() == tonic::Code::Unavailable {
            exit::UNREACHABLE
        } else {
            exit::FAILED
        };
        Failure {
            code,
            message: s.message().to_string(),
        }
    }
}

fn fail(message: impl Into<String>) -> Failure {
    Failure {
        code: exit::FAILED,
        message: message.into(),
    }
}

/// Writes to stdout; a closed pipe (`gpuctl queue | head`) ends the program cleanly.
fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("gpuctl: cannot write output: {e}");
        std::process::exit(exit::FAILED.into());
    }
}

fn print_json(v: &serde_json::Value) {
    print(&format!(
        "{}\n",
        serde_json::to_string_pretty(v).expect("JSON values serialize")
    ));
}

async fn connect(url: &str) -> Result<ControllerClient<Channel>, Failure> {
    let unreachable = |e: String| Failure {
        code: exit::UNREACHABLE,
        message: format!(
            "cannot reach the controller at {url}: {e} (is gpuctld running? set --controller or GPUCTL_CONTROLLER)"
        ),
    };
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_string())
        .map_err(|e| Failure {
            code: exit::USAGE,
            message: format!("bad controller URL {url:?}: {e}"),
        })?
        .connect_timeout(std::time::Duration::from_secs(5));
    let channel = endpoint.connect().await.map_err(|e| {
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg = format!("{msg}: {s}");
            src = s.source();
        }
        unreachable(msg)
    })?;
    Ok(ControllerClient::new(channel))
}

fn current_user() -> (String, u32, u32) {
    let uid = nix::unistd::getuid();
    let gid = nix::unistd::getgid();
    let name = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name);
    (name, uid.as_raw(), gid.as_raw())
}

pub async fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Submit { file, json } => {
            let job = jobfile::load(&file).map_err(|e| fail(e.to_string()))?;
            let cwd = std::env::current_dir()
                .map_err(|e| fail(format!("cannot read the current directory: {e}")))?;
            let (user, uid, gid) = current_user();
            let spec = job.into_spec(&cwd, &user, uid, gid);
            let mut client = connect(&cli.controller).await?;
            let resp = client
                .submit(pb::SubmitRequest { spec: Some(spec) })
                .await
                .map_err(|s| {
                    let mut f = Failure::from(s);
                    f.message = format!("{}: rejected: {}", file.display(), f.message);
                    f
                })?;
            let id = resp.into_inner().job_id;
            if json {
                print_json(&json!({ "job_id": id }));
            } else {
                print(&format!("Submitted job {id}\n"));
            }
        }
        Command::Queue { all, start, json } => {
            let mut client = connect(&cli.controller).await?;
            let jobs = client
                .list_jobs(pb::ListJobsRequest { all })
                .await?
                .into_inner()
                .jobs;
            if json {
                print_json(&jobs.iter().map(format::job_json).collect());
            } else {
                print(&format::queue_table(&jobs, start));
            }
        }
        Command::Show { job_id, json } => {
            let mut client = connect(&cli.controller).await?;
            let job = client
                .get_job(pb::GetJobRequest { job_id })
                .await?
                .into_inner();
            if json {
                print_json(&format::job_json(&job));
            } else {
                print(&format::show_job(&job));
            }
        }
        Command::Cancel { job_ids } => {
            let mut client = connect(&cli.controller).await?;
            let results = client
                .cancel(pb::CancelRequest { job_ids })
                .await?
                .into_inner()
                .results;
            let mut failed = false;
            for r in results {
                if r.ok {
                    print(&format!("Job {}: {}\n", r.job_id, r.message));
                } else {
                    failed = true;
                    eprintln!("gpuctl: job {}: {}", r.job_id, r.message);
                }
            }
            if failed {
                return Err(Failure {
                    code: exit::FAILED,
                    message: "some jobs were not cancelled".into(),
                });
            }
        }
        Command::Nodes { json, stats } => {
            let mut client = connect(&cli.controller).await?;
            let resp = client
                .list_nodes(pb::ListNodesRequest {})
                .await?
                .into_inner();
            let nodes = &resp.nodes;
            let total: usize = nodes.iter().map(|n| n.gpus.len()).sum();
            let used: f64 = nodes
                .iter()
                .flat_map(|n| &n.gpus)
                .map(|g| f64::from(g.compute_allocated_milli.min(1000)) / 1000.0)
                .sum();
            if stats {
                let v = json!({
                    "nodes": nodes.len(),
                    "gpus_total": total,
                    "gpus_allocated": used,
                    "fragmentation_gpus": resp.fragmentation_gpus,
                    "fragmentation_pct_of_idle": resp.fragmentation_pct_of_idle,
                });
                if json {
                    print_json(&v);
                } else {
                    print(&format!(
                        "nodes: {}\ngpus: {used:.2} of {total} allocated\nfragmentation: {:.2} GPUs ({:.1}% of idle)\n",
                        nodes.len(),
                        resp.fragmentation_gpus,
                        resp.fragmentation_pct_of_idle
                    ));
                }
            } else if json {
                print_json(&nodes.iter().map(format::node_json).collect());
            } else {
                print(&format::nodes_table(nodes));
            }
        }
        Command::Explain { job_id, json } => {
            let mut client = connect(&cli.controller).await?;
            let e = client
                .explain(pb::GetJobRequest { job_id })
                .await?
                .into_inner();
            if json {
                print_json(&json!({
                    "job_id": e.job_id,
                    "state": format::state_name(e.state()),
                    "reason": e.reason,
                    "summary": e.summary,
                    "rank": e.rank,
                    "priority": e.priority,
                    "expected_start": if e.expected_start_ms > 0 {
                        json!(humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(e.expected_start_ms as u64)).to_string())
                    } else { serde_json::Value::Null },
                    "nodes": e.nodes.iter().map(|n| json!({"node": n.node, "reason": if n.reason.is_empty() { serde_json::Value::Null } else { json!(n.reason) }})).collect::<Vec<_>>(),
                }));
            } else {
                print(&format::explain_text(&e));
            }
        }
        Command::Priority { json } => {
            let mut client = connect(&cli.controller).await?;
            let jobs = client
                .priorities(pb::PrioritiesRequest {})
                .await?
                .into_inner()
                .jobs;
            if json {
                print_json(
                    &jobs
                        .iter()
                        .map(|j| {
                            json!({
                                "job_id": j.job_id,
                                "user": j.user,
                                "priority": j.total,
                                "factors": j.factors,
                            })
                        })
                        .collect(),
                );
            } else {
                print(&format::priority_table(&jobs));
            }
        }
        Command::Node { action } => {
            let mut client = connect(&cli.controller).await?;
            let node = match action {
                NodeAction::Drain { name, reason } => {
                    client
                        .drain_node(pb::DrainNodeRequest { name, reason })
                        .await?
                }
                NodeAction::Resume { name } => {
                    client.resume_node(pb::ResumeNodeRequest { name }).await?
                }
            }
            .into_inner();
            print(&format!(
                "Node {} is {}\n",
                node.name,
                format::node_state_name(node.state())
            ));
        }
    }
    Ok(())
}
