//! The job shim: `gpud __shim PROGRAM ARGS...` runs as the job's top process (in its
//! cgroup, as its user) and waits for PROGRAM. When PROGRAM ends, the shim writes its
//! raw wait status to fd 3 (a file the agent opened, as root, in the agent's state dir)
//! and ends the same way (same exit code, or the same signal). The agent normally
//! waits for the shim as its child; an agent restarted after a crash is no longer the
//! parent, so it watches the pid and reads the status the shim left: a job's real end
//! survives the agent.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};

use nix::sys::signal::{SigHandler, Signal, signal};

/// The first argument that selects the shim.
pub const ARG: &str = "__shim";

/// A status file line that says the program could not be started.
pub const LAUNCH_ERROR: &str = "error: ";

/// The fd the status is written to.
pub const STATUS_FD: i32 = 3;

/// Runs the shim (never returns).
pub fn run(args: Vec<OsString>) -> ! {
    let Some((program, rest)) = args.split_first() else {
        eprintln!("gpud {ARG}: no program");
        std::process::exit(127);
    };
    // The status fd must not leak into the job.
    // SAFETY: fcntl on an fd number; harmless if it is not open.
    unsafe {
        nix::libc::fcntl(STATUS_FD, nix::libc::F_SETFD, nix::libc::FD_CLOEXEC);
    }
    // The shim outlives the signals the agent sends the job's group (the kill's TERM,
    // and the checkpoint signals a job may ask for before a preemption), so that it
    // records how the job ended; SIGKILL still ends it.
    let ignored = [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ];
    for s in ignored {
        // SAFETY: installing SIG_IGN for a standard signal.
        unsafe {
            let _ = signal(s, SigHandler::SigIgn);
        }
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest);
    // SAFETY: only resets signal dispositions (async-signal-safe) before exec.
    unsafe {
        cmd.pre_exec(move || {
            for s in ignored {
                let _ = signal(s, SigHandler::SigDfl);
            }
            Ok(())
        });
    }
    // SAFETY: fd 3 was opened for us by the agent; we own it from here.
    let mut f = unsafe { std::fs::File::from_raw_fd(STATUS_FD) };
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => {
            let msg = if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "{}: command not found (PATH={})",
                    program.to_string_lossy(),
                    std::env::var("PATH").unwrap_or_default()
                )
            } else {
                format!("cannot run {}: {e}", program.to_string_lossy())
            };
            eprintln!("gpuctl: {msg}");
            let _ = writeln!(f, "{LAUNCH_ERROR}{msg}");
            // 127: like a shell's "command not found".
            std::process::exit(127);
        }
    };
    // The wait status and when the job ended (Unix ms): an agent that was down when
    // the job ended reports the real end, not the time it came back.
    let end_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    // Not synced: the file outlives the agent (a process), not the node; after a crash
    // of the node the job is gone with it (the agent's own records are not synced
    // either). An fsync here was the job's end waiting for the disk.
    let _ = writeln!(f, "{} {end_ms}", status.into_raw());
    drop(f);
    if let Some(sig) = status.signal() {
        if let Ok(s) = Signal::try_from(sig) {
            // SAFETY: restore the default action, then end the same way the job did.
            unsafe {
                let _ = signal(s, SigHandler::SigDfl);
            }
            let _ = nix::sys::signal::raise(s);
        }
        std::process::exit(128 + sig);
    }
    std::process::exit(status.code().unwrap_or(1));
}

/// Why the shim could not start the program, if that is what happened.
pub fn read_launch_error(path: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.trim().strip_prefix(LAUNCH_ERROR).map(str::to_string)
}

/// Reads a status file the shim wrote.
pub fn read_status(path: &std::path::Path) -> Option<std::process::ExitStatus> {
    let text = std::fs::read_to_string(path).ok()?;
    text.split_whitespace()
        .next()?
        .parse::<i32>()
        .ok()
        .map(std::process::ExitStatus::from_raw)
}

/// When the job ended (Unix ms), as the shim recorded it.
pub fn read_end_ms(path: &std::path::Path) -> Option<i64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}
