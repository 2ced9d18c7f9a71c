//! The `gpuctl` command line: arguments and what each subcommand does.

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use gpuctl_proto::controller_client::ControllerClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::commands::{self, emit};

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
    /// https://HOST:PORT (TLS, the cluster CA pinned with --ca; needs an API token).
    /// Several, comma-separated (replicated controllers): the one that leads is found and
    /// used (one of an unreplicated kind: the first that answers). Default:
    /// unix:/run/gpuctl/gpuctld.sock when that exists, else https://127.0.0.1:7817.
    #[arg(long, global = true, env = "GPUCTL_CONTROLLER")]
    pub controller: Option<String>,
    /// The cluster CA (the controller's <state-dir>/ca.pem): the only certificate an
    /// https:// controller is trusted under. Default: ~/.config/gpuctl/ca.pem, else
    /// /etc/gpuctl/ca.pem.
    #[arg(long, global = true, env = "GPUCTL_CA")]
    pub ca: Option<PathBuf>,
    /// Send the API token over http:// (in clear) to a controller run with
    /// --insecure-shared-key --insecure.
    #[arg(long, global = true, env = "GPUCTL_INSECURE")]
    pub insecure: bool,
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
    Submit(Box<crate::submit::SubmitArgs>),
    /// Pending and running jobs (like squeue).
    Queue(commands::queue::QueueArgs),
    /// Inside a job: run a command as the job's tasks on this node, each with its rank
    /// and its GPUs, and wait for them (like srun in a batch script; `srun` is this
    /// command under that name).
    Run(Box<commands::run::RunArgs>),
    /// An interactive allocation (like salloc): queued and scheduled like any job; once
    /// it runs, your $SHELL (or the command) runs here, and its `gpuctl run`s run in
    /// it; released when that ends (`salloc` is this command under that name).
    Alloc(commands::interactive::AllocArgs),
    /// Accounting: every job active in a time window, finished ones included, with what
    /// it used (like sacct).
    History(commands::history::HistoryArgs),
    /// Where the GPU-hours went: allocated against used, idle, unused GPU memory, time
    /// limit accuracy, top wasters and the load by weekday and hour.
    Report(commands::report::ReportArgs),
    /// A live view of nodes, GPUs (utilisation and memory bars, temperature, power,
    /// owners) and the queue; q quits. --once prints one frame as text.
    Top(commands::top::TopArgs),
    /// Fair share per account and user (like sshare).
    Share {
        #[arg(long)]
        json: bool,
    },
    /// Partitions: their nodes, limits and jobs (like sinfo -s); * marks the default.
    Partitions {
        #[arg(long)]
        json: bool,
    },
    /// Time-of-day windows: which are open and when each next changes.
    Windows {
        #[arg(long)]
        json: bool,
    },
    /// Keep pending jobs from starting (like scontrol hold): job ids, array tasks
    /// (12_3) or task lists (12_[1-5,9]).
    Hold {
        #[arg(required = true, value_name = "JOB")]
        job_ids: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Let held jobs start again (like scontrol release); jobs as for hold.
    Release {
        #[arg(required = true, value_name = "JOB")]
        job_ids: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Stop running jobs and put them back in the queue (like scontrol requeue); jobs
    /// as for hold.
    Requeue {
        #[arg(required = true, value_name = "JOB")]
        job_ids: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Change jobs after their submit (like scontrol update): time limit, partition,
    /// name, comment, nice. Owners lower a limit or priority; admins also raise them.
    Update(commands::update::UpdateArgs),
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
    /// What a job asked for against what it used, and the job-file lines to use next
    /// time (like seff, with GPUs).
    Efficiency {
        job_id: u64,
        #[arg(long)]
        json: bool,
    },
    /// Everything known about one job (like scontrol show job).
    Show {
        job_id: u64,
        #[arg(long)]
        json: bool,
    },
    /// Cancel jobs (like scancel): job ids, an array's id (every task), array tasks
    /// (12_3) or task lists (12_[1-5,9]); or every unfinished job a filter matches, in
    /// one request (--me, -u, -t, --name, -A, -p; scancel's).
    Cancel {
        #[command(flatten)]
        args: commands::cancel::CancelArgs,
        /// Send this signal (USR1, USR2, HUP, CONT, ...) to the running jobs' processes
        /// and leave them running, instead of cancelling (like scancel -s).
        #[arg(long, value_name = "SIG")]
        signal: Option<String>,
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
    /// Make links named after Slurm's tools (sbatch, squeue, scancel, sacct, sinfo,
    /// scontrol, sshare, sprio, srun, salloc) to this gpuctl in DIR: called by those
    /// names, gpuctl takes their options and prints their formats.
    SlurmLinks { dir: PathBuf },
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
    /// Read the controller's configuration file again (like scontrol reconfigure; a
    /// bad file changes nothing). SIGHUP to gpuctld does the same.
    Reconfigure {
        #[arg(long)]
        json: bool,
    },
    /// Tokens with which nodes join the cluster (`gpud --join`).
    JoinToken {
        #[command(subcommand)]
        action: JoinTokenAction,
    },
    /// Node identities.
    Node {
        #[command(subcommand)]
        action: AdminNodeAction,
    },
    /// Replicated controllers (gpuctld --id N --peers ...): members, leader, terms.
    Controllers {
        #[command(subcommand)]
        action: Option<ControllersAction>,
        /// A list of `{"id", "address", "leader", "term", "commit_index", "state", "voter"}`.
        #[arg(long, global = true)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum ControllersAction {
    /// The members as the leader knows them (the default).
    List,
    /// Add a controller: it catches up as a learner, then votes. Start it first with
    /// its own --id and the new --peers list.
    Add {
        id: u64,
        /// Its gRPC HOST:PORT.
        address: String,
    },
    /// Remove a controller from the membership (stop it afterwards).
    Remove { id: u64 },
}

#[derive(Subcommand)]
pub enum JoinTokenAction {
    /// A single-use, expiring join token, printed with the CA's fingerprint.
    Create {
        /// How long it may be used (at most 7 days).
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        ttl: std::time::Duration,
        /// The node that may join with it (default: any name not yet joined).
        #[arg(long, default_value = "")]
        node: String,
        /// `{"token", "ca_fingerprint"}`.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum AdminNodeAction {
    /// Refuse a node's certificates and key at once; its jobs are handled as on a
    /// failed node.
    Revoke { name: String },
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

#[derive(Subcommand, Clone)]
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
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl From<gpuctl_proto::convert::UnknownState> for Failure {
    /// A job the controller answered with in a state this `gpuctl` does not know (a
    /// newer controller's).
    fn from(e: gpuctl_proto::convert::UnknownState) -> Self {
        Failure {
            code: exit::FAILED,
            message: format!(
                "the controller answered with a job in an {e}: is gpuctl older than the controller?"
            ),
        }
    }
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        use tonic::Code;
        let m = s.message();
        // tonic reports its own request timeout as CANCELLED "Timeout expired".
        let timed_out = s.code() == Code::DeadlineExceeded || m.contains("Timeout expired");
        let broken = !timed_out && connection_broke(&s);
        let code = if s.code() == Code::Unavailable || timed_out || broken {
            exit::UNREACHABLE
        } else {
            exit::FAILED
        };
        let message = if broken {
            format!(
                "{m}: the connection broke: the controller went away (a restart or failover: try again), closed it (too many connections of yours or of this host open: its per-uid or per-address cap), or does not speak gRPC there (is --controller / GPUCTL_CONTROLLER gpuctld's address?)"
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

/// Whether `s` says the connection itself failed (reset, closed, not HTTP/2) rather
/// than the controller answering: the request's outcome is unknown.
pub(crate) fn connection_broke(s: &tonic::Status) -> bool {
    let m = s.message();
    [
        "transport error",
        "h2 protocol error",
        "operation was canceled",
        "connection reset",
        "broken pipe",
        "connection closed",
    ]
    .iter()
    .any(|b| m.contains(b))
}

pub(crate) fn fail(message: impl Into<String>) -> Failure {
    Failure {
        code: exit::FAILED,
        message: message.into(),
    }
}

/// Writes to stdout; a closed pipe (`gpuctl queue | head`) ends the program cleanly.
pub(crate) fn print(text: &str) {
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
pub(crate) fn print_json_streamed(v: &impl serde::Serialize) {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let layout = crate::pretty::Layout::for_stdout();
    let result = crate::pretty::to_writer(&mut out, v, layout)
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

/// The connection to the controller: its generated client, and the same channel for
/// calls whose answers are taken undecoded (`queue --json` decodes its pages on worker
/// threads: `commands::queue`).
pub struct Client {
    api: ControllerClient<InterceptedService<Channel, Auth>>,
    pub(crate) raw: tonic::client::Grpc<InterceptedService<Channel, Auth>>,
}

impl std::ops::Deref for Client {
    type Target = ControllerClient<InterceptedService<Channel, Auth>>;
    fn deref(&self) -> &Self::Target {
        &self.api
    }
}

impl std::ops::DerefMut for Client {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.api
    }
}

/// The socket gpuctld conventionally listens on.
pub const DEFAULT_SOCKET: &str = "/run/gpuctl/gpuctld.sock";

pub(crate) fn controller_url(cli: &Cli) -> String {
    cli.controller.clone().unwrap_or_else(|| {
        if std::path::Path::new(DEFAULT_SOCKET).exists() {
            format!("unix:{DEFAULT_SOCKET}")
        } else {
            "https://127.0.0.1:7817".into()
        }
    })
}

/// The cluster CA's PEM text for an https:// controller.
fn ca_pem(cli: &Cli) -> Result<String, Failure> {
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/gpuctl/ca.pem"));
    let path = match &cli.ca {
        Some(p) => p.clone(),
        None => home
            .into_iter()
            .chain([PathBuf::from("/etc/gpuctl/ca.pem")])
            .find(|p| p.exists())
            .ok_or_else(|| Failure {
                code: exit::USAGE,
                message: "an https:// controller is trusted only under the cluster CA: set GPUCTL_CA or --ca to a copy of the controller's <state-dir>/ca.pem (or put it in ~/.config/gpuctl/ca.pem)".into(),
            })?,
    };
    std::fs::read_to_string(&path).map_err(|e| Failure {
        code: exit::USAGE,
        message: format!("cannot read the cluster CA {}: {e}", path.display()),
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

/// Refuses unknown schemes.
fn check_scheme(url: &str) -> Result<(), Failure> {
    if !(url.starts_with("unix:") || url.starts_with("https://") || url.starts_with("http://")) {
        return Err(Failure {
            code: exit::USAGE,
            message: format!("bad controller URL {url:?}: write unix:PATH or https://HOST:PORT"),
        });
    }
    Ok(())
}

/// The text of an error and its causes, each once (a connection error's chain repeats
/// its cause at every level).
fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let t = s.to_string();
        if !msg.contains(&t) {
            msg = format!("{msg}: {t}");
        }
        src = s.source();
    }
    msg
}

/// The controllers to try, in order: `--controller` (or `GPUCTL_CONTROLLER`) split at
/// its commas, each a URL of a known scheme.
fn controller_urls(cli: &Cli) -> Result<Vec<String>, Failure> {
    let all = controller_url(cli);
    let urls: Vec<String> = all.split(',').map(|u| u.trim().to_string()).collect();
    if urls.iter().any(String::is_empty) {
        return Err(Failure {
            code: exit::USAGE,
            message: format!("bad controller list {all:?}: an empty address between commas"),
        });
    }
    for u in &urls {
        check_scheme(u)?;
    }
    Ok(urls)
}

/// A client of the first of the controllers that answers (`--controller a,b,c`): a
/// controller that cannot be reached is passed over; any other failure (a bad CA, a
/// token that cannot be sent) stops at once.
pub(crate) async fn connect(cli: &Cli) -> Result<Client, Failure> {
    const HINT: &str = "is gpuctld running? set --controller or GPUCTL_CONTROLLER";
    let urls = controller_urls(cli)?;
    // Replicated controllers: the leader, found by asking each (one controller is
    // taken as it answers, with no question asked).
    let find_leader = urls.len() > 1;
    let deadline = std::time::Instant::now() + LEADER_WAIT;
    loop {
        let mut missed = Vec::new();
        let mut followers = Vec::new();
        for url in &urls {
            let mut client = match connect_to(cli, url).await {
                Err(f) if f.code == exit::UNREACHABLE => {
                    missed.push(f.message);
                    continue;
                }
                Err(f) => return Err(f),
                Ok(c) if !find_leader => return Ok(c),
                Ok(c) => c,
            };
            // A controller that accepts but does not answer (frozen, overloaded) is
            // passed over after a while, not waited for to the request timeout.
            let asked = client.controllers(gpuctl_proto::ControllersRequest {});
            let answer = tokio::time::timeout(ASK_TIMEOUT, asked)
                .await
                .unwrap_or_else(|_| Err(tonic::Status::unavailable("no answer within 2 s")));
            match answer {
                Ok(r) => {
                    let r = r.into_inner();
                    if !r.replicated || r.members.iter().any(|m| m.leader && m.id == r.id) {
                        return Ok(client);
                    }
                    followers.push(url.clone());
                }
                // A controller older than replication leads itself.
                Err(s) if s.code() == tonic::Code::Unimplemented => return Ok(client),
                Err(s) if s.code() == tonic::Code::Unavailable => {
                    missed.push(format!("{url}: {}", s.message()));
                }
                Err(s) => return Err(Failure::from(s)),
            }
        }
        if followers.is_empty() || std::time::Instant::now() >= deadline {
            let message = match (missed.as_slice(), followers.is_empty()) {
                ([one], true) => format!("{one} ({HINT})"),
                (all, true) => format!(
                    "no controller of {} answered: {} ({HINT})",
                    urls.join(","),
                    all.join("; ")
                ),
                _ => format!(
                    "no controller of {} leads (followers: {}) within {LEADER_WAIT:?}: has a quorum of them stopped?",
                    urls.join(","),
                    followers.join(", ")
                ),
            };
            return Err(Failure {
                code: exit::UNREACHABLE,
                message,
            });
        }
        // An election is under way.
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    }
}

/// How long one controller has to say whether it leads.
const ASK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long the CLI waits for replicated controllers to elect a leader.
const LEADER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

async fn connect_to(cli: &Cli, url: &str) -> Result<Client, Failure> {
    let url = url.to_string();
    // On the socket the caller is their uid: no token is read (nor required readable).
    let token = if url.starts_with("unix:") {
        None
    } else {
        token(cli)?
    };
    if token.is_some() && url.starts_with("http://") && !cli.insecure {
        return Err(Failure {
            code: exit::USAGE,
            message: format!(
                "{url}: an API token is sent over TLS only (write https://, with the cluster CA in GPUCTL_CA); --insecure sends it in clear to a controller run with --insecure-shared-key --insecure"
            ),
        });
    }
    let tls = if url.starts_with("https://") {
        let ca = ca_pem(cli)?;
        Some(
            gpuctl_proto::tls::ClientTls::new(&ca, None).map_err(|e| Failure {
                code: exit::USAGE,
                message: format!("the cluster CA: {e}"),
            })?,
        )
    } else {
        None
    };
    let token = token
        .map(|t| {
            format!("Bearer {t}").parse().map_err(|_| Failure {
                code: exit::USAGE,
                message: "the API token has characters a header cannot carry".into(),
            })
        })
        .transpose()?;
    let channel = channel(&url, cli.timeout, tls).await?;
    let auth = Auth(token);
    Ok(Client {
        raw: tonic::client::Grpc::new(InterceptedService::new(channel.clone(), auth.clone()))
            .max_decoding_message_size(1 << 30),
        api: ControllerClient::with_interceptor(channel, auth)
            // `queue --json` of a 100,000-job queue is tens of MB.
            .max_decoding_message_size(1 << 30),
    })
}

async fn channel(
    url: &str,
    timeout: std::time::Duration,
    tls: Option<gpuctl_proto::tls::ClientTls>,
) -> Result<Channel, Failure> {
    let unreachable = |e: String| Failure {
        code: exit::UNREACHABLE,
        message: format!("cannot reach the controller at {url}: {e}"),
    };
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_string())
        .map_err(|e| Failure {
            code: exit::USAGE,
            message: format!("bad controller URL {url:?}: {e}"),
        })?
        .connect_timeout(std::time::Duration::from_secs(5))
        .tcp_nodelay(true)
        .timeout(timeout)
        // Large replies (the queue of a busy cluster) arrive without waiting on HTTP/2
        // flow control every 64 KiB.
        .initial_stream_window_size(16 << 20)
        .initial_connection_window_size(32 << 20)
        .max_frame_size(1 << 20);
    match tls {
        Some(tls) => tls.connect(endpoint).await,
        None => endpoint.connect().await,
    }
    .map_err(|e| unreachable(chain(&e)))
}

pub async fn run(cli: Cli) -> Result<(), Failure> {
    // A bad job file is reported before anything is contacted.
    let specs = match &cli.command {
        Command::Submit(args) => {
            let cwd = std::env::current_dir()
                .map_err(|e| fail(format!("cannot read the current directory: {e}")))?;
            args.specs(&cwd).map_err(fail)?
        }
        _ => Vec::new(),
    };
    match &cli.command {
        Command::Man => return print_manual(),
        Command::SlurmLinks { dir } => {
            for l in crate::slurm::links(dir)? {
                print(&format!("{}\n", l.display()));
            }
            return Ok(());
        }
        // The job's own processes: no controller is asked.
        Command::Run(args) if args.local() => {
            let code = commands::run::run(args).await?;
            std::process::exit(code.into());
        }
        Command::Completions { shell } => {
            let mut out = Vec::new();
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut cmd, "gpuctl", &mut out);
            print(&String::from_utf8_lossy(&out));
            return Ok(());
        }
        _ => {}
    }
    let mut client = connect(&cli).await?;
    let c = &mut client;
    match &cli.command {
        // Done above, without a controller.
        Command::Completions { .. } | Command::Man | Command::SlurmLinks { .. } => {}
        Command::Run(args) => {
            let code = commands::interactive::run_step(&cli, c, args).await?;
            std::process::exit(code.into());
        }
        Command::Alloc(args) => {
            let code = commands::interactive::alloc(&cli, c, args).await?;
            std::process::exit(code.into());
        }
        Command::Submit(args) => {
            commands::submit::run_all(&cli, c, specs, args.json, args.parsable).await?;
        }
        Command::Queue(q) if q.json => commands::queue::stream_json(c, q).await?,
        Command::Queue(q) => emit(&commands::queue::run(c, q).await?, false),
        Command::History(h) => emit(&commands::history::run(c, h).await?, h.json),
        Command::Report(r) => emit(&commands::report::run(c, r).await?, r.json),
        Command::Top(t) => commands::top::run(c, t).await?,
        &Command::Share { json } => emit(&commands::share::run(c).await?, json),
        &Command::Windows { json } => emit(&commands::windows::run(c).await?, json),
        &Command::Partitions { json } => emit(&commands::partitions::run(c).await?, json),
        Command::Hold { job_ids, json } => {
            let view = commands::hold::run(c, commands::hold::Action::Hold, job_ids).await?;
            emit(&view, *json);
        }
        Command::Release { job_ids, json } => {
            let view = commands::hold::run(c, commands::hold::Action::Release, job_ids).await?;
            emit(&view, *json);
        }
        Command::Requeue { job_ids, json } => {
            let view = commands::hold::run(c, commands::hold::Action::Requeue, job_ids).await?;
            emit(&view, *json);
        }
        Command::Update(u) => {
            let update = commands::update::Update::of(u)?;
            emit(
                &commands::update::run(c, &u.job_ids, &update).await?,
                u.json,
            );
        }
        &Command::Show { job_id, json } => emit(&commands::show::run(c, job_id).await?, json),
        &Command::Efficiency { job_id, json } => {
            emit(&commands::efficiency::run(c, job_id).await?, json)
        }
        Command::Cancel { args, signal } => {
            let view = commands::cancel::run(c, args, signal.as_deref()).await?;
            emit(&view, false);
            if let Some(f) = view.failure() {
                return Err(f);
            }
        }
        &Command::Nodes { json, stats: true } => emit(&commands::nodes::stats(c).await?, json),
        &Command::Nodes { json, .. } => emit(&commands::nodes::run(c).await?, json),
        &Command::Explain { job_id, json } => emit(&commands::explain::run(c, job_id).await?, json),
        &Command::Priority { json } => emit(&commands::priority::run(c).await?, json),
        Command::Node { action } => emit(&commands::node::run(c, action.clone()).await?, false),
        &Command::Whoami { json } => emit(&commands::whoami::run(c).await?, json),
        Command::Admin {
            action: AdminAction::Token { action },
        } => match action {
            TokenAction::Create { user, note, json } => {
                let view = commands::admin::create(c, user.clone(), note.clone()).await?;
                emit(&view, *json);
            }
            TokenAction::List { json } => emit(&commands::admin::list(c).await?, *json),
            TokenAction::Revoke { id } => {
                emit(&commands::admin::revoke(c, id.clone()).await?, false)
            }
        },
        &Command::Admin {
            action: AdminAction::Reconfigure { json },
        } => emit(&commands::admin::reconfigure(c).await?, json),
        Command::Admin {
            action:
                AdminAction::JoinToken {
                    action: JoinTokenAction::Create { ttl, node, json },
                },
        } => emit(&commands::join::create(c, *ttl, node.clone()).await?, *json),
        Command::Admin {
            action:
                AdminAction::Node {
                    action: AdminNodeAction::Revoke { name },
                },
        } => emit(&commands::join::revoke(c, name.clone()).await?, false),
        Command::Admin {
            action: AdminAction::Controllers { action, json },
        } => {
            let view = match action {
                None | Some(ControllersAction::List) => commands::controllers::list(c).await?,
                Some(ControllersAction::Add { id, address }) => {
                    commands::controllers::add(c, *id, address.clone()).await?
                }
                Some(ControllersAction::Remove { id }) => {
                    commands::controllers::remove(c, *id).await?
                }
            };
            emit(&view, *json);
        }
    }
    Ok(())
}

fn print_manual() -> Result<(), Failure> {
    let mut out = Vec::new();
    clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
        .render(&mut out)
        .map_err(|e| fail(format!("cannot render the manual: {e}")))?;
    print(&String::from_utf8_lossy(&out));
    Ok(())
}
