//! The `gpuctl` command line: arguments and what each subcommand does.

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use gpuctl_proto::{self as pb, controller_client::ControllerClient};
use serde_json::json;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::format;

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
    /// Controller: unix:PATH (the controller's socket; you are who your uid is) or
    /// http://HOST:PORT (needs an API token). Default: unix:/run/gpuctl/gpuctld.sock
    /// when that exists, else http://127.0.0.1:7817.
    #[arg(long, global = true, env = "GPUCTL_CONTROLLER")]
    pub controller: Option<String>,
    /// File holding an API token for TCP controllers (default ~/.config/gpuctl/token;
    /// or set GPUCTL_TOKEN).
    #[arg(long, global = true)]
    pub token_file: Option<PathBuf>,
    /// Give up on a request the controller has not answered after this long (a
    /// stopped controller never hangs the CLI).
    #[arg(long, global = true, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: std::time::Duration,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Submit a job file (job.toml or a script with #SBATCH lines), or --wrap "cmd".
    Submit(crate::submit::SubmitArgs),
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
    /// Print shell completions: `gpuctl completions bash > /etc/bash_completion.d/gpuctl`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff): `gpuctl man > /usr/share/man/man1/gpuctl.1`.
    Man,
    /// Who the controller takes you to be, and whether you are an admin.
    Whoami {
        #[arg(long)]
        json: bool,
    },
    /// Administration (admins only).
    Admin {
        #[command(subcommand)]
        action: AdminAction,
    },
}

#[derive(Subcommand)]
pub enum AdminAction {
    /// API tokens for clients that reach the controller over TCP.
    Token {
        #[command(subcommand)]
        action: TokenAction,
    },
}

#[derive(Subcommand)]
pub enum TokenAction {
    /// Create a token for a user; the secret is printed once.
    Create {
        #[arg(long)]
        user: String,
        #[arg(long, default_value = "")]
        note: String,
        #[arg(long)]
        json: bool,
    },
    /// List tokens (ids and users, never secrets).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by id.
    Revoke { id: String },
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
        use tonic::Code;
        let m = s.message();
        // tonic reports its own request timeout as CANCELLED "Timeout expired".
        let timed_out = s.code() == Code::DeadlineExceeded || m.contains("Timeout expired");
        let code = if s.code() == Code::Unavailable || timed_out {
            exit::UNREACHABLE
        } else {
            exit::FAILED
        };
        let broken = [
            "transport error",
            "h2 protocol error",
            "operation was canceled",
        ];
        let message = if !timed_out && broken.iter().any(|b| m.contains(b)) {
            format!(
                "{m}: the connection broke: the controller did not answer as gRPC (is --controller / GPUCTL_CONTROLLER gpuctld's address?) or it went away"
            )
        } else if timed_out {
            format!(
                "{m}: no answer from the controller within --timeout (is it stopped or overloaded?)"
            )
        } else {
            m.to_string()
        };
        Failure { code, message }
    }
}

/// Whether a failed request may or may not have reached the controller (the
/// connection broke, or no answer came): only then is a retry needed to know.
fn outcome_unknown(s: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        s.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    )
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

/// Serializes straight into a buffered stdout (large outputs: `queue --json`).
fn print_json_streamed(v: &impl serde::Serialize) {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let result = serde_json::to_writer_pretty(&mut out, v)
        .map_err(std::io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(e) = result {
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

/// Adds the API token (if any) to every request.
#[derive(Clone)]
pub struct Auth(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub type Client = ControllerClient<InterceptedService<Channel, Auth>>;

/// The socket gpuctld conventionally listens on.
pub const DEFAULT_SOCKET: &str = "/run/gpuctl/gpuctld.sock";

fn controller_url(cli: &Cli) -> String {
    cli.controller.clone().unwrap_or_else(|| {
        if std::path::Path::new(DEFAULT_SOCKET).exists() {
            format!("unix:{DEFAULT_SOCKET}")
        } else {
            "http://127.0.0.1:7817".into()
        }
    })
}

/// The API token: GPUCTL_TOKEN, --token-file, or ~/.config/gpuctl/token.
fn token(cli: &Cli) -> Result<Option<String>, Failure> {
    if let Ok(t) = std::env::var("GPUCTL_TOKEN")
        && !t.trim().is_empty()
    {
        return Ok(Some(t.trim().to_string()));
    }
    let (path, explicit) = match &cli.token_file {
        Some(p) => (p.clone(), true),
        None => match std::env::var_os("HOME") {
            Some(h) => (PathBuf::from(h).join(".config/gpuctl/token"), false),
            None => return Ok(None),
        },
    };
    match std::fs::read_to_string(&path) {
        Ok(t) => Ok(Some(t.trim().to_string())),
        Err(e) if !explicit && e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(fail(format!(
            "cannot read token file {}: {e}",
            path.display()
        ))),
    }
}

async fn connect(cli: &Cli) -> Result<Client, Failure> {
    let url = controller_url(cli);
    // On the socket the caller is their uid: no token is read (nor required readable).
    let token = if url.starts_with("unix:") {
        None
    } else {
        token(cli)?
    };
    let token = token
        .map(|t| {
            format!("Bearer {t}").parse().map_err(|_| Failure {
                code: exit::USAGE,
                message: "the API token has characters a header cannot carry".into(),
            })
        })
        .transpose()?;
    let channel = channel(&url, cli.timeout).await?;
    Ok(ControllerClient::with_interceptor(channel, Auth(token))
        // `queue --json` of a 100,000-job queue is tens of MB.
        .max_decoding_message_size(1 << 30))
}

async fn channel(url: &str, timeout: std::time::Duration) -> Result<Channel, Failure> {
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
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(timeout)
        // Large replies (the queue of a busy cluster) arrive without waiting on HTTP/2
        // flow control every 64 KiB.
        .initial_stream_window_size(16 << 20)
        .initial_connection_window_size(32 << 20)
        .max_frame_size(1 << 20);
    endpoint.connect().await.map_err(|e| {
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg = format!("{msg}: {s}");
            src = s.source();
        }
        unreachable(msg)
    })
}

/// Submits, and when the answer is lost (the connection broke, the controller
/// restarted), asks again with the same request id for up to `--timeout`: the
/// controller answers a repeat with the job it already queued, so the job is queued
/// once. Only if the controller stays silent is the outcome reported as unknown.
async fn submit_with_retry(
    cli: &Cli,
    client: &mut Client,
    file: &str,
    req: pb::SubmitRequest,
) -> Result<u64, Failure> {
    let started = std::time::Instant::now();
    loop {
        let s = match client.submit(req.clone()).await {
            Ok(r) => return Ok(r.into_inner().job_id),
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

pub async fn run(cli: Cli) -> Result<(), Failure> {
    // A bad job file is reported before anything is contacted.
    let spec = match &cli.command {
        Command::Submit(args) => {
            let cwd = std::env::current_dir()
                .map_err(|e| fail(format!("cannot read the current directory: {e}")))?;
            Some(args.spec(&cwd).map_err(fail)?)
        }
        _ => None,
    };
    if let Command::Man = cli.command {
        let mut out = Vec::new();
        clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
            .render(&mut out)
            .map_err(|e| fail(format!("cannot render the manual: {e}")))?;
        print(&String::from_utf8_lossy(&out));
        return Ok(());
    }
    if let Command::Completions { shell } = cli.command {
        let mut out = Vec::new();
        clap_complete::generate(
            shell,
            &mut <Cli as clap::CommandFactory>::command(),
            "gpuctl",
            &mut out,
        );
        print(&String::from_utf8_lossy(&out));
        return Ok(());
    }
    let mut client = connect(&cli).await?;
    match cli.command {
        // Printed above, without a controller.
        Command::Completions { .. } | Command::Man => {}
        Command::Submit(ref args) => {
            let spec = spec.expect("parsed above");
            let req = pb::SubmitRequest {
                spec: Some(spec),
                request_id: request_id(),
            };
            let id = submit_with_retry(&cli, &mut client, &args.label(), req).await?;
            if args.json {
                print_json(&json!({ "job_id": id }));
            } else {
                print(&format!("Submitted job {id}\n"));
            }
        }
        Command::Queue { all, start, json } => {
            let mut pages = client
                .list_jobs_paged(pb::ListJobsRequest { all })
                .await?
                .into_inner();
            if json {
                // Pages are printed as they arrive: receiving, decoding and writing
                // JSON overlap. The first page decides a failure before any output.
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
                if let Some(e) = failed {
                    return Err(e.into());
                }
            } else {
                let mut jobs = Vec::new();
                while let Some(page) = pages.message().await? {
                    jobs.extend(page.jobs);
                }
                print(&format::queue_table(&jobs, start));
            }
        }
        Command::Show { job_id, json } => {
            let job = client
                .get_job(pb::GetJobRequest { job_id })
                .await?
                .into_inner();
            let gpu_use = if job.state() == pb::JobState::Running {
                let nodes = client
                    .list_nodes(pb::ListNodesRequest {})
                    .await?
                    .into_inner()
                    .nodes;
                format::job_gpu_use(job_id, &nodes)
            } else {
                Vec::new()
            };
            if json {
                let mut v = format::job_json(&job);
                v["gpu_use"] = serde_json::Value::Array(gpu_use);
                print_json(&v);
            } else {
                let mut text = format::show_job(&job);
                for u in &gpu_use {
                    text.push_str(&format!(
                        "      GpuUse: {} {} util {}% job memory {} MiB ({} processes) temp {}C power {:.0}W\n",
                        u["node"].as_str().unwrap_or(""),
                        u["gpu"].as_str().unwrap_or(""),
                        u["util_pct"],
                        u["job_mem_used_mib"],
                        u["job_processes"],
                        u["temp_c"],
                        u["power_w"].as_f64().unwrap_or(0.0)
                    ));
                }
                print(&text);
            }
        }
        Command::Cancel { job_ids } => {
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
                let gpus = format::gpus_table(nodes);
                if gpus.is_empty() {
                    print(&format::nodes_table(nodes));
                } else {
                    print(&format!("{}\n{gpus}", format::nodes_table(nodes)));
                }
            }
        }
        Command::Explain { job_id, json } => {
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
                    "expected_start": format::time_string(e.expected_start_ms),
                    "nodes": e.nodes.iter().map(|n| json!({"node": n.node, "reason": if n.reason.is_empty() { serde_json::Value::Null } else { json!(n.reason) }})).collect::<Vec<_>>(),
                }));
            } else {
                print(&format::explain_text(&e));
            }
        }
        Command::Priority { json } => {
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
        Command::Whoami { json } => {
            let me = client.who_am_i(pb::WhoAmIRequest {}).await?.into_inner();
            if json {
                print_json(&json!({"user": me.user, "admin": me.admin, "via": me.via}));
            } else {
                print(&format!(
                    "{}{} (via {})\n",
                    me.user,
                    if me.admin { ", admin" } else { "" },
                    me.via
                ));
            }
        }
        Command::Admin {
            action: AdminAction::Token { action },
        } => match action {
            TokenAction::Create { user, note, json } => {
                let t = client
                    .create_token(pb::CreateTokenRequest { user, note })
                    .await?
                    .into_inner();
                if json {
                    print_json(&json!({"id": t.id, "user": t.user, "token": t.token}));
                } else {
                    print(&format!(
                        "Token {} for {} (shown once; give it to the user, who puts it in ~/.config/gpuctl/token or GPUCTL_TOKEN):\n{}\n",
                        t.id, t.user, t.token
                    ));
                }
            }
            TokenAction::List { json } => {
                let tokens = client
                    .list_tokens(pb::ListTokensRequest {})
                    .await?
                    .into_inner()
                    .tokens;
                if json {
                    print_json(
                        &tokens
                            .iter()
                            .map(|t| json!({"id": t.id, "user": t.user, "created_ms": t.created_ms, "note": t.note}))
                            .collect(),
                    );
                } else {
                    let mut out =
                        String::from("ID            USER         CREATED               NOTE\n");
                    for t in tokens {
                        let created = format::time_string(t.created_ms).unwrap_or_default();
                        out.push_str(&format!(
                            "{:<13} {:<12} {created}  {}\n",
                            t.id, t.user, t.note
                        ));
                    }
                    print(&out);
                }
            }
            TokenAction::Revoke { id } => {
                client
                    .revoke_token(pb::RevokeTokenRequest { id: id.clone() })
                    .await?;
                print(&format!("Token {id} revoked\n"));
            }
        },
    }
    Ok(())
}
