use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use gpuctld::config::Config;

/// gpuctld: the gpuctl controller. Keeps the job queue, schedules jobs onto GPU slices
/// reported by gpud agents, and serves the gpuctl CLI over gRPC.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Address to serve gRPC on (port 0 picks a free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:7817")]
    listen: SocketAddr,
    /// Directory for the job queue and node records (sled).
    #[arg(long, default_value = "./gpuctl-state")]
    state_dir: PathBuf,
    /// Controller configuration (TOML); embedded defaults otherwise.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPUCTL_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let result = async {
        let config = match &args.config {
            Some(p) => Config::load(p)?,
            None => Config::default(),
        };
        gpuctld::daemon::run(
            gpuctld::daemon::Options {
                listen: args.listen,
                state_dir: args.state_dir,
                config,
            },
            gpuctld::daemon::signal(),
        )
        .await
    }
    .await;
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuctld: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
