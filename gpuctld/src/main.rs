use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use gpuctld::config::Config;

/// A scheduling pass allocates and frees many small objects, pass after pass: with
/// mimalloc a pass takes about half the time it takes with the system allocator
/// (docs/benchmarks.md). The benchmark and the simulator measure with it too.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// gpuctld: the gpuctl controller. Keeps the job queue, schedules jobs onto GPU slices
/// reported by gpud agents, and serves the gpuctl CLI over gRPC.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Log lines as text (colours only on a terminal) or as JSON objects, one a line.
    #[arg(long, global = true, env = "GPUCTL_LOG_FORMAT", value_enum, default_value_t = gpuctl_proto::process::LogFormat::Text)]
    log_format: gpuctl_proto::process::LogFormat,
    /// Address to serve gRPC on (port 0 picks a free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:7817")]
    listen: SocketAddr,
    /// Directory for the job queue and node records (sled).
    #[arg(long, default_value = "./gpuctl-state")]
    state_dir: PathBuf,
    /// Also listen on this Unix socket; callers there are identified by their uid.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Controller configuration (TOML); embedded defaults otherwise.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (port 0 picks a free port, logged).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Serve a read-only web page (GPU heat map, utilisation and queue over time, jobs,
    /// users) at http://ADDR/. It has no login: bind it to loopback or put it behind
    /// the site's proxy.
    #[arg(long)]
    web_listen: Option<SocketAddr>,
    /// For tests: time-of-day windows see this instant (RFC 3339) at start, and time
    /// runs on from it. Nothing else uses it.
    #[arg(long, hide = true, value_parser = humantime::parse_rfc3339)]
    fake_time: Option<std::time::SystemTime>,
    /// Threads that serve requests, heartbeats and reports (0: half the host's cores,
    /// at least one). Passes over large queues and the store's flushes run on threads
    /// of their own; the requests mostly take the one state lock in turn, so more
    /// workers mostly add wake-ups (docs/benchmarks.md, "Fewer async workers").
    #[arg(long, env = "GPUCTLD_WORKERS", default_value_t = 0)]
    workers: usize,
    /// Serve plain TCP (no TLS), and let agents sign with the shared cluster key
    /// (`--key-file`) instead of joining: the old mode, kept for one release. Anyone
    /// on the network reads job specs, env and tokens, and root on any node is the
    /// whole cluster.
    #[arg(long)]
    insecure_shared_key: bool,
    /// With --insecure-shared-key: also accept API tokens over that plain TCP (they
    /// travel in clear).
    #[arg(long, requires = "insecure_shared_key")]
    insecure: bool,
    /// How long a node certificate is valid; agents renew theirs when a third of it
    /// is left.
    #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
    node_certificate_lifetime: std::time::Duration,
    /// More names for the controller's certificate (DNS names or addresses users and
    /// agents reach it by; clients verify the name `gpuctld`, which it always has).
    #[arg(long, value_delimiter = ',')]
    tls_name: Vec<String>,
    /// This controller's id among replicated controllers (with --peers).
    #[arg(long, requires = "peers")]
    id: Option<u64>,
    /// Replicated controllers (Raft): every member as ID=HOST:PORT (its gRPC address),
    /// comma-separated, this one's included: `--id 1 --peers 1=a:7817,2=b:7817,3=c:7817`.
    /// Every member's state dir holds the same cluster.key, and with TLS the same ca.pem
    /// and ca.key (docs/operations.md).
    #[arg(long, requires = "id", value_parser = gpuctld::daemon::RaftOptions::parse_peers)]
    peers: Option<std::collections::BTreeMap<u64, String>>,
    /// How often a leader reaches its followers.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    raft_heartbeat: std::time::Duration,
    /// Election timeouts are drawn between this and twice it: a follower that hears no
    /// leader for twice this (the leader's lease) plus its draw stands for election, so
    /// a lost leader is replaced after 3-4 times this.
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    raft_election_timeout: std::time::Duration,
    /// A Raft snapshot every this many log entries; the log before it is purged, and a
    /// member that needs what was purged (a wiped disk, a new member) gets the snapshot.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(10..))]
    raft_snapshot_entries: u64,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Print the effective configuration (the embedded defaults with --config applied)
    /// as TOML, and exit; a bad config fails with its file, line and column.
    Config {
        /// The configuration file to check (the same as gpuctld --config FILE config).
        #[arg(long = "config", value_name = "CONFIG")]
        file: Option<PathBuf>,
    },
    /// Run the scheduler on a virtual clock over a trace (no daemons): runs the
    /// simulator's binary, gpuctl-sim, installed beside gpuctld (`gpuctld simulate help`
    /// lists its modes).
    #[command(disable_help_flag = true)]
    Simulate {
        /// The mode and its arguments (inflation, replay, bankday, ...).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<std::ffi::OsString>,
    },
}

fn main() -> std::process::ExitCode {
    gpuctl_alloc::tune();
    let mut args = Args::parse();
    if let Some(Command::Simulate { args }) = &args.command {
        return simulate(args);
    }
    let workers = match args.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
        n => n,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build();
    match runtime {
        Ok(rt) => {
            args.workers = workers;
            rt.block_on(run(args))
        }
        Err(e) => {
            eprintln!("gpuctld: error: cannot start the async runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> std::process::ExitCode {
    // openraft logs each vote and election at info: its warnings are enough. Its
    // replication logs an ERROR for every message to a member that is down (hundreds a
    // minute): the peer network says it once a period instead (raft::net).
    gpuctl_proto::process::init_logging(
        args.log_format,
        "info,openraft=warn,openraft::replication=off",
    );
    let result = match args.command {
        Some(Command::Simulate { .. }) => unreachable!("run by main before the runtime"),
        Some(Command::Config { file }) => match file.as_ref().or(args.config.as_ref()) {
            Some(p) => Config::load(p).map_err(anyhow::Error::from),
            None => Ok(Config::default()),
        }
        .map(|c| print!("{}", c.to_toml())),
        None => {
            async {
                let mut config = match &args.config {
                    Some(p) => Config::load(p)?,
                    None => Config::default(),
                };
                tracing::info!(workers = args.workers, "async worker threads");
                if let Some(t) = args.fake_time {
                    let ms = |t: std::time::SystemTime| {
                        t.duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as i64)
                    };
                    config.clock_offset_ms = ms(t) - ms(std::time::SystemTime::now());
                    tracing::warn!(
                        offset_ms = config.clock_offset_ms,
                        "--fake-time: windows run on a shifted clock"
                    );
                }
                gpuctld::daemon::run(
                    gpuctld::daemon::Options {
                        listen: args.listen,
                        state_dir: args.state_dir,
                        config,
                        config_path: args
                            .config
                            .clone()
                            .map(|p| std::path::absolute(&p).unwrap_or(p)),
                        socket: args.socket,
                        metrics_listen: args.metrics_listen,
                        web_listen: args.web_listen,
                        tls: gpuctld::daemon::TlsOptions {
                            insecure_shared_key: args.insecure_shared_key,
                            clear_tokens: args.insecure,
                            node_lifetime: args.node_certificate_lifetime,
                            names: args.tls_name,
                        },
                        raft: match (args.id, args.peers) {
                            (Some(id), Some(peers)) => Some(gpuctld::daemon::RaftOptions {
                                id,
                                peers,
                                heartbeat: args.raft_heartbeat,
                                election: (
                                    args.raft_election_timeout,
                                    args.raft_election_timeout * 2,
                                ),
                                snapshot_entries: args.raft_snapshot_entries,
                            }),
                            _ => None,
                        },
                    },
                    gpuctld::daemon::signal(),
                )
                .await
            }
            .await
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuctld: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `gpuctld simulate ARGS`: replaces this process with `gpuctl-sim ARGS`, found beside
/// this binary (a build's target dir, the package's /usr/bin) or else on `PATH`.
fn simulate(args: &[std::ffi::OsString]) -> std::process::ExitCode {
    use std::os::unix::process::CommandExt as _;
    let beside = std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name("gpuctl-sim"))
        .filter(|p| p.is_file());
    let program = beside.clone().unwrap_or_else(|| "gpuctl-sim".into());
    // Its usage lines name the command the user typed.
    let e = std::process::Command::new(&program)
        .arg0("gpuctld simulate")
        .args(args)
        .exec();
    eprintln!(
        "gpuctld: error: `gpuctld simulate` runs the simulator's binary, gpuctl-sim, which could not be run ({}: {e}); build it with `cargo build -p gpuctl-sim` (it lands beside gpuctld) or install the gpuctld package",
        program.display()
    );
    std::process::ExitCode::FAILURE
}
