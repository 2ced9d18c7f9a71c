use std::process::ExitCode;

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = gpuctl::cli::Cli::parse();
    match gpuctl::cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("gpuctl: error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
