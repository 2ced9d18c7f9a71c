//! Steps and allocations from outside a job: `gpuctl run` with `--jobid`, inside
//! `gpuctl alloc`'s shell, or on its own (an allocation of its own for the one step,
//! as srun outside a job makes); `--pty` for a terminal; and `gpuctl alloc` (salloc).
//!
//! A step from outside travels through the controller (`Interact`): the job's first
//! node starts it as the job's own `srun` would, in the job's cgroup, as its user; its
//! output streams back and its exit code is this command's. An allocation is a job
//! that runs nothing of its own (`interactive`), queued and scheduled like any other;
//! it is released (ends COMPLETED) when the step or the shell ends.

use std::io::{Read as _, Write as _};

use gpuctl_proto::{self as pb, step_input::Input, step_output::Output};
use tokio::sync::mpsc;

use crate::cli::{Cli, Client, Failure, fail};

/// What an allocation asks for: sbatch's sizing options, as salloc takes them.
pub type AllocOptions = crate::submit::Sizes;

/// `gpuctl alloc` (also `salloc` by name).
#[derive(clap::Args, Debug)]
pub struct AllocArgs {
    #[command(flatten)]
    pub opts: AllocOptions,
    /// Nodes.
    #[arg(short = 'N', long)]
    pub nodes: Option<u32>,
    /// Tasks on each node (what `gpuctl run` starts by default).
    #[arg(long)]
    pub ntasks_per_node: Option<u32>,
    /// What to run with the allocation (default: your $SHELL); it runs here, and its
    /// `gpuctl run`s run in the allocation.
    #[arg(trailing_var_arg = true)]
    pub command: Vec<String>,
}

/// The job an allocation is: the options read as sbatch reads them (the same checks
/// and errors), then marked interactive, with nothing of its own to run.
pub fn allocation_spec(
    opts: &AllocOptions,
    nodes: Option<u32>,
    tasks_per_node: Option<u32>,
) -> Result<pb::JobSpec, Failure> {
    let args = crate::submit::SubmitArgs {
        wrap: Some(":".into()),
        sizes: crate::submit::Sizes {
            name: Some(opts.name.clone().unwrap_or_else(|| "interactive".into())),
            ..opts.clone()
        },
        nodes,
        ..Default::default()
    };
    let cwd = std::env::current_dir()
        .map_err(|e| fail(format!("cannot read the current directory: {e}")))?;
    let mut sub = args.specs(&cwd).map_err(fail)?;
    let mut spec = sub
        .pop()
        .ok_or_else(|| fail("no allocation was read"))?
        .spec;
    spec.interactive = true;
    spec.command.clear();
    spec.script.clear();
    if let Some(t) = tasks_per_node {
        let r = spec.resources.get_or_insert_default();
        r.tasks_per_node = t;
        // A CPU a task unless -c says how many the node has (as a job file's default).
        if opts.cpus.is_none() {
            r.cpus = r.cpus.max(t);
        }
    }
    Ok(spec)
}

/// Queues the allocation and waits until it runs (Ctrl-C while it waits gives it up).
pub async fn allocate(cli: &Cli, client: &mut Client, spec: pb::JobSpec) -> Result<u64, Failure> {
    let id = super::submit::run(cli, client, "allocation", spec, false)
        .await?
        .job_id;
    eprintln!("gpuctl: pending job allocation {id}");
    let mut said_waiting = false;
    let mut pause = std::time::Duration::from_millis(50);
    loop {
        let job = client
            .get_job(pb::GetJobRequest { job_id: id })
            .await
            .map_err(|s| fail(format!("job {id}: {}", s.message())))?
            .into_inner();
        match job.state() {
            // Running, and its node said so (a step goes to a job that runs there).
            pb::JobState::Running if job.launch_time_ms > 0 => {
                eprintln!("gpuctl: granted job allocation {id}");
                return Ok(id);
            }
            pb::JobState::Pending | pb::JobState::Running => {}
            s => {
                return Err(fail(format!(
                    "job allocation {id} ended before it started ({}{})",
                    s.as_str_name(),
                    if job.reason.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", job.reason)
                    }
                )));
            }
        }
        if !said_waiting && pause >= std::time::Duration::from_millis(400) {
            let why = if job.reason.is_empty() {
                "waiting for resources".into()
            } else {
                job.reason.clone()
            };
            eprintln!("gpuctl: job {id} queued: {why}");
            said_waiting = true;
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = tokio::signal::ctrl_c() => {
                let _ = client.cancel(pb::CancelRequest { job_ids: vec![id], ..Default::default() }).await;
                return Err(fail(format!("job allocation {id} given up (interrupted while it waited)")));
            }
        }
        pause = (pause * 2).min(std::time::Duration::from_secs(1));
    }
}

/// Ends the allocation (COMPLETED; `code`: how its command ended, for the record);
/// one that ended already is said, not an error.
pub async fn release(client: &mut Client, id: u64, code: Option<u8>) {
    let req = pb::JobActionRequest {
        job_id: id,
        task: None,
        exit_code: code.map(i32::from),
    };
    match client.release_allocation(req).await {
        Ok(_) => eprintln!("gpuctl: relinquishing job allocation {id}"),
        Err(s) => eprintln!("gpuctl: job allocation {id}: {}", s.message()),
    }
}

/// `gpuctl alloc`: an allocation, then the command (or $SHELL) here with the job's id
/// in its environment; released when it ends, whose exit code this is.
pub async fn alloc(cli: &Cli, client: &mut Client, args: &AllocArgs) -> Result<u8, Failure> {
    let spec = allocation_spec(&args.opts, args.nodes, args.ntasks_per_node)?;
    let id = allocate(cli, client, spec).await?;
    let command = if args.command.is_empty() {
        vec![std::env::var("SHELL").unwrap_or_else(|_| "/bin/sh".into())]
    } else {
        args.command.clone()
    };
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..]);
    for k in [
        "GPUCTL_JOB_ID",
        "GPUCTL_ALLOCATION",
        "SLURM_JOB_ID",
        "SLURM_JOBID",
    ] {
        cmd.env(k, id.to_string());
    }
    // Its `gpuctl run`s reach the same controller, trusted the same way.
    cmd.env("GPUCTL_CONTROLLER", crate::cli::controller_url(cli));
    if let Some(ca) = &cli.ca {
        cmd.env("GPUCTL_CA", ca);
    }
    if cli.insecure {
        cmd.env("GPUCTL_INSECURE", "true");
    }
    // `srun` on its PATH, as in salloc's shell: this gpuctl under that name, in a
    // directory of this allocation's own (the caller's alone), removed at its end.
    let tools = srun_dir(id);
    if let Some(dir) = &tools {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![dir.clone()];
        paths.extend(std::env::split_paths(&path));
        if let Ok(joined) = std::env::join_paths(paths) {
            cmd.env("PATH", joined);
        }
    }
    // Ctrl-C is the shell's (or its program's), never this process's: it would end the
    // allocation under them.
    let mut interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| fail(format!("cannot watch signals: {e}")))?;
    let code = match cmd.spawn() {
        Ok(mut child) => loop {
            tokio::select! {
                s = child.wait() => break exit_code(s),
                _ = interrupts.recv() => {}
            }
        },
        Err(e) => {
            eprintln!("gpuctl: cannot run {}: {e}", command[0]);
            127
        }
    };
    release(client, id, Some(code)).await;
    if let Some(dir) = tools {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(code)
}

/// A new private directory holding `srun`, a link to this gpuctl, for allocation `id`'s
/// shell; `None` (said once) where none can be made.
fn srun_dir(id: u64) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt as _;
    let dir = std::env::temp_dir().join(format!("gpuctl-alloc-{id}-{}", std::process::id()));
    let made = std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .and_then(|()| std::env::current_exe())
        .and_then(|me| std::os::unix::fs::symlink(me, dir.join("srun")));
    match made {
        Ok(()) => Some(dir),
        Err(e) => {
            eprintln!(
                "gpuctl: warning: no srun on the shell's PATH ({e}); `gpuctl run` is the same"
            );
            None
        }
    }
}

fn exit_code(s: std::io::Result<std::process::ExitStatus>) -> u8 {
    s.map_or(1, super::run::exit_code_of)
}

/// The terminal in raw mode while a `--pty` step runs (restored when dropped).
struct RawMode(Option<nix::sys::termios::Termios>);

impl RawMode {
    fn enter() -> RawMode {
        use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        let Ok(saved) = tcgetattr(&stdin) else {
            return RawMode(None);
        };
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        if tcsetattr(&stdin, SetArg::TCSANOW, &raw).is_err() {
            return RawMode(None);
        }
        RawMode(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin(),
                nix::sys::termios::SetArg::TCSADRAIN,
                t,
            );
        }
    }
}

/// This terminal's size (stdin's, else stdout's).
fn window_size() -> Option<pb::WindowSize> {
    for fd in [0, 1] {
        let mut ws = nix::libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ fills a winsize we own; a non-terminal fd answers an error.
        if unsafe { nix::libc::ioctl(fd, nix::libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_row > 0 {
            return Some(pb::WindowSize {
                rows: ws.ws_row.into(),
                cols: ws.ws_col.into(),
            });
        }
    }
    None
}

fn input(i: Input) -> pb::StepInput {
    pb::StepInput { input: Some(i) }
}

/// Runs a step of running job `job_id` from here: `args` are srun's on the node
/// (options, `--`, the command). Answers its exit code.
pub async fn remote_step(
    client: &mut Client,
    job_id: u64,
    args: Vec<String>,
    nodes: u32,
    pty: bool,
) -> Result<u8, Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let (tx, rx) = mpsc::channel::<pb::StepInput>(64);
    let open = pb::OpenStep {
        job_id,
        args,
        pty,
        size: pty.then(window_size).flatten(),
        term: if pty {
            std::env::var("TERM").unwrap_or_default()
        } else {
            String::new()
        },
        nodes,
    };
    tx.send(input(Input::Open(open)))
        .await
        .expect("the receiver is here");
    let mut out = client
        .interact(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|s| fail(format!("job {job_id}: {}", s.message())))?
        .into_inner();
    let _raw = pty.then(RawMode::enter);
    // Standard input, read on a thread of its own (a read blocks), to the step.
    let stdin_tx = tx.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 16 << 10];
        let mut stdin = std::io::stdin().lock();
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = stdin_tx.blocking_send(input(Input::StdinClosed(true)));
                    return;
                }
                Ok(n) => {
                    if stdin_tx
                        .blocking_send(input(Input::Stdin(buf[..n].to_vec())))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    // Signals: on a terminal, Ctrl-C is a byte of input (the step's terminal makes it
    // its signal); without one, INT, TERM and HUP are passed on by name.
    let mut signals = super::run::passed_signals()?;
    let signal_tx = tx.clone();
    tokio::spawn(async move {
        while let Some(sig) = signals.recv().await {
            let name = sig.as_str().trim_start_matches("SIG").to_string();
            if signal_tx.send(input(Input::Signal(name))).await.is_err() {
                return;
            }
        }
    });
    if pty {
        let mut winch = signal(SignalKind::window_change())
            .map_err(|e| fail(format!("cannot watch signals: {e}")))?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while winch.recv().await.is_some() {
                if let Some(w) = window_size()
                    && tx.send(input(Input::Resize(w))).await.is_err()
                {
                    return;
                }
            }
        });
    }
    // Keeps the request open until the step's end (its input may be over long before).
    let _keep = tx;
    loop {
        let m = out
            .message()
            .await
            .map_err(|s| fail(format!("job {job_id}'s step: {}", s.message())))?;
        let Some(m) = m else {
            return Err(fail(format!(
                "job {job_id}'s step ended without its exit code"
            )));
        };
        match m.output {
            Some(Output::Stdout(b)) => {
                let mut o = std::io::stdout().lock();
                let _ = o.write_all(&b);
                let _ = o.flush();
            }
            Some(Output::Stderr(b)) => {
                let _ = std::io::stderr().lock().write_all(&b);
            }
            Some(Output::ExitCode(c)) => return Ok(c.clamp(0, 255) as u8),
            Some(Output::Error(e)) => return Err(fail(format!("job {job_id}: {e}"))),
            Some(Output::Node(_) | Output::Hello(_)) | None => {}
        }
    }
}

/// `gpuctl run` from outside a job: in the job given or the allocation this shell is
/// in, else in an allocation of its own for this step (released when it ends).
pub async fn run_step(
    cli: &Cli,
    client: &mut Client,
    args: &super::run::RunArgs,
) -> Result<u8, Failure> {
    let step = args.step_args();
    let nodes = args.nodes.unwrap_or(0);
    if let Some(id) = args.target_job()? {
        let given = args.alloc.allocation_only();
        if !given.is_empty() {
            return Err(Failure {
                code: crate::cli::exit::USAGE,
                message: format!(
                    "{}: these size an allocation of the step's own; a step of job {id} has its job's resources (-G and -c size the step within it)",
                    given.join(", ")
                ),
            });
        }
        return remote_step(client, id, step, nodes, args.pty).await;
    }
    let tasks = args.ntasks_per_node.or(args.ntasks);
    let spec = allocation_spec(&args.alloc, Some(nodes.max(1)), tasks)?;
    let id = allocate(cli, client, spec).await?;
    let code = remote_step(client, id, step, nodes, args.pty).await;
    release(client, id, code.as_ref().ok().copied()).await;
    code
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(clap::Parser)]
    struct T {
        #[command(flatten)]
        run: crate::commands::run::RunArgs,
    }

    /// The options that size an allocation are named back (a step of an existing job
    /// refuses them rather than ignoring them); the step's own are not among them.
    #[test]
    fn allocation_options_are_named() {
        let t = T::parse_from(["run", "--jobid", "3", "-G", "1", "-t", "10", "-n", "2", "x"]);
        assert_eq!(t.run.alloc.given(), ["-G"]);
        let t = T::parse_from(["run", "--pty", "bash"]);
        assert!(t.run.alloc.given().is_empty());
        assert!(t.run.pty);
    }
}
