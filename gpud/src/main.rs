use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use gpud::gpu::{FakeGpus, GpuBackend, Nvml};

/// gpud: the gpuctl node agent. Reports this node's GPUs to gpuctld and runs the jobs it
/// is given.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Log lines as text (colours only on a terminal) or as JSON objects, one a line.
    #[arg(long, global = true, env = "GPUCTL_LOG_FORMAT", value_enum, default_value_t = gpuctl_proto::process::LogFormat::Text)]
    log_format: gpuctl_proto::process::LogFormat,
    /// Controller URL.
    #[arg(
        long,
        env = "GPUCTL_CONTROLLER",
        default_value = "https://127.0.0.1:7817"
    )]
    controller: String,
    /// Join the cluster with the single-use token in this file: the JSON of a join
    /// token made by gpuctl admin join-token create (token and CA fingerprint) or the
    /// bare token. Refused unless the file is this agent's own, mode 0600 or stricter.
    /// Later starts use the identity the join left in --state-dir (the file is then not
    /// read, and may be deleted).
    #[arg(long, env = "GPUD_JOIN_FILE", conflicts_with_all = ["key_file", "join"])]
    join_file: Option<PathBuf>,
    /// The join token, from the environment only (GPUD_JOIN_TOKEN, e.g. a systemd
    /// credential or an EnvironmentFile of mode 0600): on the command line every local
    /// user could read it from /proc and join as this node first, so `--join TOKEN` is
    /// refused.
    #[arg(
        long,
        env = "GPUD_JOIN_TOKEN",
        hide = true,
        hide_env_values = true,
        conflicts_with = "key_file"
    )]
    join: Option<String>,
    /// The cluster CA's fingerprint (sha256:..., printed with the join token): the
    /// controller is trusted only if its certificate chains to that CA (read from
    /// the join file's JSON when it has one).
    #[arg(long, env = "GPUD_CA_FINGERPRINT")]
    ca_fingerprint: Option<String>,
    /// Node name (default: the hostname).
    #[arg(long)]
    name: Option<String>,
    /// Directory for the agent's own state.
    #[arg(long, default_value = "./gpud-state")]
    state_dir: PathBuf,
    /// Fake GPUs instead of NVML, e.g. 4xA100-80GB or 2xA100-80GB,1xT4-16GB.
    #[arg(long, conflicts_with = "fake_gpus_file")]
    fake_gpus: Option<String>,
    /// Fake GPUs from a TOML file: models, MIG layouts and scripted metric curves.
    #[arg(long)]
    fake_gpus_file: Option<PathBuf>,
    /// How often to sample GPU metrics.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    sample_interval: Duration,
    /// How often to discover the GPUs again (a changed inventory or MIG layout is
    /// reported to the controller).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    inventory_interval: Duration,
    /// A job using more GPU memory than its share this long is ended.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    gpu_memory_grace: Duration,
    /// Serve Prometheus metrics (DCGM exporter names) at http://ADDR/metrics.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// The site's node check, like Slurm's HealthCheckProgram: run every
    /// --health-interval; a non-zero exit drains the node with the program's first line
    /// of output as the reason, and the drain is lifted once it passes again.
    #[arg(long)]
    health_program: Option<PathBuf>,
    /// How often the health program runs.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    health_interval: Duration,
    /// A health program still running after this is killed and counts as failed.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    health_timeout: Duration,
    /// The CUDA MPS control program for fractional GPU shares (default:
    /// nvidia-cuda-mps-control on $PATH; without it shares run without MPS, with a
    /// warning on the job).
    #[arg(long)]
    mps_control: Option<PathBuf>,
    /// CPUs to offer (default: all of this host's).
    #[arg(long)]
    cpus: Option<u32>,
    /// Memory to offer, e.g. 64GiB (default: all of this host's).
    #[arg(long)]
    memory: Option<bytesize::ByteSize>,
    /// How often to heartbeat.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    heartbeat_interval: Duration,
    /// Run jobs submitted by root as root (refused otherwise).
    #[arg(long)]
    allow_root_jobs: bool,
    /// The cgroup filesystem to put jobs in.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    cgroup_base: PathBuf,
    /// Job cgroups are PARENT/job-ID in each hierarchy (default gpuctl/NODE-AGENTID,
    /// AGENTID from the state dir, so that two agents or clusters on one host never share
    /// one).
    #[arg(long)]
    cgroup_parent: Option<String>,
    /// Remount the host's cgroup2 mount with `favordynmods` at start if it lacks it: job
    /// launches stop waiting 10-50 ms for an RCU grace period to enter their cgroup,
    /// at a small cost to every fork and exit on the host (kernel 6.0 or later; the
    /// setting is the host's, and stays after gpud stops).
    #[arg(long)]
    cgroup_favordynmods: bool,
    /// The old mode, for a controller run with --insecure-shared-key: sign with the
    /// shared cluster key (a copy of the controller's <state-dir>/cluster.key, mode 0600)
    /// over plain TCP or the Unix socket, instead of joining.
    #[arg(long, env = "GPUD_KEY_FILE")]
    key_file: Option<PathBuf>,
    /// The address other nodes reach this one at (MASTER_ADDR of gang jobs; default:
    /// this host's address on the route to the controller).
    #[arg(long)]
    address: Option<String>,
    /// Node features that jobs ask for with a constraint (`--constraint a100&nvlink`):
    /// names of letters, digits and _ . : + -, comma-separated.
    #[arg(long, env = "GPUD_FEATURES", value_delimiter = ',')]
    features: Vec<String>,
    /// Print the GPUs the backend finds and exit (non-zero when it finds none).
    #[arg(long)]
    list_gpus: bool,
    /// MIG layouts: `static` (the node's own, as set by hand) or `dynamic` (the
    /// controller changes the layout of GPUs that hold no job, from what waits).
    #[arg(long, value_enum, default_value = "static")]
    mig: MigMode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum MigMode {
    Static,
    Dynamic,
}

fn main() -> ExitCode {
    // `gpud __forkserver` (the agent starts it once; it forks each job's shim): no
    // runtime, no logging, one thread.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == gpud::forkserver::ARG)
    {
        gpud::forkserver::serve();
    }
    // Two async workers whatever the host: the agent's async work is light (heartbeats,
    // reports, the command stream), launches and /proc reads run on blocking threads,
    // and tokio's default (a worker per core: 128 on a large GPU node) would only add
    // threads that wake each other (docs/benchmarks.md, "Fewer async workers").
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("start the tokio runtime")
        .block_on(agent_main())
}

async fn agent_main() -> ExitCode {
    use clap::{CommandFactory as _, FromArgMatches as _};
    let matches = Args::command().get_matches();
    let token_on_argv =
        matches.value_source("join") == Some(clap::parser::ValueSource::CommandLine);
    let args = match Args::from_arg_matches(&matches) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    if token_on_argv {
        eprintln!(
            "gpud: error: --join TOKEN puts the token on the command line, where every local user can read it (/proc/PID/cmdline) and join as this node first; save the JSON of `gpuctl admin join-token create --json` with umask 077 and pass --join-file FILE, or set GPUD_JOIN_TOKEN (with --ca-fingerprint)"
        );
        return ExitCode::from(2);
    }
    gpuctl_proto::process::init_logging(args.log_format, "info");
    let name = args.name.unwrap_or_else(gpud::host::hostname);
    // Fake GPU UUIDs derive from this agent's identity (its state dir's agent-id), not
    // its name: two clusters on one host with a `node1` each must not share UUIDs.
    let fake_identity = || match gpud::agent::identity(&args.state_dir) {
        Ok(id) => format!("{name}/{id}"),
        Err(e) => {
            eprintln!("gpud: warning: {e:#}; fake GPU UUIDs derive from the node name alone");
            name.clone()
        }
    };
    let fake = match (&args.fake_gpus, &args.fake_gpus_file) {
        (Some(spec), _) => Some(FakeGpus::parse(spec, &fake_identity())),
        (None, Some(file)) => Some(FakeGpus::from_file(file, &fake_identity())),
        (None, None) => None,
    };
    let backend: std::sync::Arc<dyn GpuBackend> = match fake {
        Some(Ok(f)) => std::sync::Arc::new(f),
        Some(Err(e)) => {
            eprintln!("gpud: error: {e}");
            return ExitCode::from(2);
        }
        None => match Nvml::init() {
            Ok(n) => std::sync::Arc::new(n),
            Err(e) => {
                eprintln!("gpud: error: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    if args.list_gpus {
        return match backend.discover() {
            Ok(gpus) if !gpus.is_empty() => {
                for g in gpus {
                    println!(
                        "{} {} {} {}MiB {}",
                        g.index, g.uuid, g.model, g.memory_mib, g.pci_bus_id
                    );
                }
                ExitCode::SUCCESS
            }
            Ok(_) => {
                eprintln!("gpud: no GPUs found");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("gpud: error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let features = match node_features(&args.features) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("gpud: error: --features: {e}");
            return ExitCode::from(2);
        }
    };
    let how = how(
        args.key_file,
        args.join_file,
        args.join,
        args.ca_fingerprint,
    );
    if let Err(e) = gpuctl_proto::statedir::prepare(&args.state_dir, 0o711) {
        eprintln!(
            "gpud: error: cannot create state dir {}: {e}",
            args.state_dir.display()
        );
        return ExitCode::FAILURE;
    }
    let creds =
        match gpud::identity::credentials(&args.state_dir, &name, &args.controller, how).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("gpud: error: {e:#}");
                return ExitCode::FAILURE;
            }
        };
    let opts = gpud::agent::Options {
        key: creds.key,
        tls: creds.tls,
        sample_interval: args.sample_interval,
        gpu_memory_grace: args.gpu_memory_grace,
        metrics_listen: args.metrics_listen,
        health: args
            .health_program
            .map(|program| gpud::health::HealthProgram {
                program,
                every: args.health_interval,
                timeout: args.health_timeout,
            }),
        mps_control: args.mps_control,
        inventory_interval: args.inventory_interval,
        controller: args.controller,
        name: name.clone(),
        state_dir: args.state_dir,
        backend,
        cpus: args.cpus.unwrap_or_else(gpud::host::cpus),
        memory_bytes: args
            .memory
            .map(|m| m.as_u64())
            .or_else(gpud::host::memory_bytes)
            .unwrap_or(0),
        heartbeat: args.heartbeat_interval,
        allow_root_jobs: args.allow_root_jobs,
        cgroup_base: args.cgroup_base,
        cgroup_parent: args.cgroup_parent,
        cgroup_favordynmods: args.cgroup_favordynmods,
        address: args.address,
        features,
        mig_dynamic: args.mig == MigMode::Dynamic,
    };
    match gpud::agent::run(opts, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpud: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// How the agent proves who it is, from its options: the shared key, a join token
/// (from --join-file or GPUD_JOIN_TOKEN, never the command line), or the identity an
/// earlier join left.
fn how(
    key_file: Option<PathBuf>,
    join_file: Option<PathBuf>,
    join_env: Option<String>,
    fingerprint: Option<String>,
) -> gpud::identity::How {
    use gpud::identity::{How, Token};
    match (key_file, join_file, join_env) {
        (Some(path), _, _) => How::SharedKey(path),
        (None, Some(path), _) => How::Join {
            token: Token::File(path),
            fingerprint,
        },
        (None, None, Some(token)) => How::Join {
            token: Token::Env(token),
            fingerprint,
        },
        (None, None, None) => How::Joined,
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// `--features`, trimmed, empty entries dropped (`a100,` is `a100`), checked as the
/// controller checks them (it refuses the attach of an agent with a bad one).
fn node_features(given: &[String]) -> Result<Vec<String>, String> {
    let features: Vec<String> = given
        .iter()
        .map(|f| f.trim().to_string())
        .filter(|f| !f.is_empty())
        .collect();
    gpuctl_sched::features::check_offered(&features)?;
    Ok(features)
}
