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
    // Called as `srun` (the name job scripts written for Slurm use): `gpuctl run`.
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // And as `salloc`: `gpuctl alloc`.
    let called = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .and_then(|n| match n {
            "srun" => Some("run"),
            "salloc" => Some("alloc"),
            _ => None,
        });
    if let Some(sub) = called {
        args.splice(0..1, ["gpuctl".into(), sub.into()]);
    }
    let cli = gpuctl::cli::Cli::parse_from(args);
    match gpuctl::cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("gpuctl: error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
