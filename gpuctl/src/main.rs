use std::process::ExitCode;

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // A bug must never look like success: whatever thread panics, the process ends
    // non-zero at once (no partial output followed by exit 0).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        eprintln!("gpuctl: internal error; the output above (if any) is incomplete");
        std::process::exit(101);
    }));
    let cli = gpuctl::cli::Cli::parse();
    match gpuctl::cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("gpuctl: error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
