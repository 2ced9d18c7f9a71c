use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use gpuctld::config::Config;
use gpuctld::sched::packing::Policy;

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
    #[arg(long, global = true, env = "GPUCTL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
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
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the scheduler on a virtual clock over a trace (no daemons).
    Simulate {
        #[command(subcommand)]
        mode: SimMode,
    },
}

#[derive(Subcommand)]
enum SimMode {
    /// The FGD paper's fragmentation experiment: arrivals only, inflated to 130% of capacity.
    Inflation {
        /// Nodes CSV (openb_node_list_gpu_node.csv).
        #[arg(long)]
        nodes: PathBuf,
        /// Pods CSV(s) (openb_pod_list_*.csv); repeat or comma-separate for several workloads.
        #[arg(long, value_delimiter = ',', required = true)]
        pods: Vec<PathBuf>,
        /// Packing policies to compare (first-fit, best-fit, fgd); default: the scheduler's default.
        #[arg(long, value_delimiter = ',')]
        policy: Vec<Policy>,
        /// Seeds, e.g. 42-51.
        #[arg(long, default_value = "42-51", value_parser = gpuctld::sim::parse_seeds)]
        seeds: std::vec::Vec<u64>,
        /// Inflation target as a multiple of GPU capacity.
        #[arg(long, default_value_t = 1.3)]
        tune: f64,
        /// The FGD authors' analysis_allo_discrete.csv to compare with (default: next to the pods).
        #[arg(long)]
        expected: Option<PathBuf>,
        #[arg(long)]
        out: PathBuf,
    },
    /// A time-based replay with queueing, priority and backfill.
    Replay(gpuctld::sim::replay::Args),
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    init_logging(args.log_format);
    let result = match args.command {
        Some(Command::Simulate { mode }) => simulate(mode),
        None => {
            async {
                let config = match &args.config {
                    Some(p) => Config::load(p)?,
                    None => Config::default(),
                };
                gpuctld::daemon::run(
                    gpuctld::daemon::Options {
                        listen: args.listen,
                        state_dir: args.state_dir,
                        config,
                        socket: args.socket,
                        metrics_listen: args.metrics_listen,
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

fn simulate(mode: SimMode) -> anyhow::Result<()> {
    match mode {
        SimMode::Inflation {
            nodes,
            pods,
            policy,
            seeds,
            tune,
            expected,
            out,
        } => {
            let expected = expected.or_else(|| {
                let p = pods
                    .first()?
                    .parent()?
                    .join("fgd_expected_results/analysis_allo_discrete.csv");
                p.exists().then_some(p)
            });
            let opts = gpuctld::sim::inflation::Options {
                nodes,
                pods,
                policies: if policy.is_empty() {
                    vec![Policy::default()]
                } else {
                    policy
                },
                seeds,
                tune,
                out: out.clone(),
                expected,
            };
            let rows = gpuctld::sim::inflation::run(&opts)?;
            print!("{}", gpuctld::sim::inflation::summary_table(&rows));
            println!(
                "wrote {}/analysis_allo_discrete.csv, analysis_frag_discrete.csv, summary.md",
                out.display()
            );
            Ok(())
        }
        SimMode::Replay(a) => gpuctld::sim::replay::main(a),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr, filtered by `GPUCTL_LOG` (default info): text with colours only on
/// a terminal (log files and journald get plain text), or JSON lines.
fn init_logging(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("GPUCTL_LOG").unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}
