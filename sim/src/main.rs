//! `gpuctl-sim`: the simulator's own binary. `gpuctld simulate MODE ...` runs it (so
//! that the daemon links no simulator: its plots, progress bars and trace readers), and
//! it answers to the same arguments as `gpuctl-sim MODE ...`.

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs the scheduler on a virtual clock over a trace (no daemons).
#[derive(Parser)]
#[command(version)]
struct Args {
    #[command(subcommand)]
    mode: gpuctl_sim::Mode,
}

fn main() -> std::process::ExitCode {
    gpuctl_sim::alloc::tune();
    let args = Args::parse();
    // A simulation drives the controller's state machine through thousands of jobs:
    // its per-job log lines would cost more than the simulation (GPUCTL_LOG=info shows
    // them).
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("GPUCTL_LOG").unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match gpuctl_sim::run(args.mode) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuctld simulate: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
