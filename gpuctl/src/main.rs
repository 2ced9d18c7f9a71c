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
    // And as `salloc`: `gpuctl alloc`; as sbatch, squeue, ...: those tools.
    let called = args.first().and_then(|a| gpuctl::slurm::tool_of(a));
    match called {
        Some("srun") => drop(args.splice(0..1, ["gpuctl".into(), "run".into()])),
        Some("salloc") => drop(args.splice(0..1, ["gpuctl".into(), "alloc".into()])),
        Some(tool) => {
            let code = gpuctl::slurm::main(tool, args).await;
            let _ = std::io::Write::flush(&mut std::io::stdout());
            std::process::exit(code.into());
        }
        None => {}
    }
    let cli = gpuctl::cli::Cli::parse_from(args);
    let code = match gpuctl::cli::run(cli).await {
        Ok(()) => 0,
        Err(f) => {
            eprintln!("gpuctl: error: {}", f.message);
            f.code
        }
    };
    // Ends here, without the runtime's teardown (closing its connection gracefully,
    // freeing each allocation): the process's end does it all. After a submit's answer
    // that teardown was about 0.4 ms of CPU competing with the job's launch on a small
    // host (docs/benchmarks.md, "Fast paths, third round"). The command's own state
    // (a terminal in raw mode, say) was restored as `run` returned.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    std::process::exit(code.into())
}
