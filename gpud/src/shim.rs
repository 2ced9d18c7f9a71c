//! The job shim: each job's top process (in its cgroup, as its user), a fork of the
//! launch server (`forkserver`) that starts the job's program and waits for it. When
//! the program ends, the shim writes its raw wait status to fd 3 (a file opened as
//! root in the agent's state dir) and ends the same way (same exit code, or the same
//! signal). The agent sees the shim's end as the end of file of a pipe the shim holds;
//! an agent restarted after a crash watches the pid instead. Either way it reads the
//! status the shim left: a job's real end survives the agent.

use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;

use nix::sys::signal::{SigHandler, Signal, signal};

/// A status file line that says the program could not be started.
pub const LAUNCH_ERROR: &str = "error: ";

/// The fd the status is written to.
pub const STATUS_FD: i32 = 3;

/// Starts `program` and waits for it; answers `ok PID MS` on `result` once it was
/// started (or could not be: the status file then says why), and holds `result` open
/// until the end (never returns).
pub fn supervise(program: &Path, args: &[String], env: &[(String, String)], result: OwnedFd) -> ! {
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
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)));
    // SAFETY: only resets signal dispositions (async-signal-safe) before exec.
    unsafe {
        cmd.pre_exec(move || {
            for s in ignored {
                let _ = signal(s, SigHandler::SigDfl);
            }
            Ok(())
        });
    }
    // SAFETY: fd 3 was installed for us by the launch's steps; we own it from here.
    let mut f = unsafe { std::fs::File::from_raw_fd(STATUS_FD) };
    let spawned = cmd.spawn();
    let mut result = std::fs::File::from(result);
    // The agent may be gone (restarted): then nobody reads this, and that is fine.
    let _ = writeln!(result, "ok {} {}", std::process::id(), now_ms());
    let status = match spawned.and_then(|mut c| c.wait()) {
        Ok(s) => s,
        Err(e) => {
            let msg = if e.kind() == std::io::ErrorKind::NotFound {
                format!(
                    "{}: command not found (PATH={})",
                    program.display(),
                    env.iter()
                        .find(|(k, _)| k == "PATH")
                        .map_or("", |(_, v)| v.as_str())
                )
            } else {
                format!("cannot run {}: {e}", program.display())
            };
            let _ = writeln!(f, "{LAUNCH_ERROR}{msg}");
            drop(f);
            // Where the job's stderr goes (opened as its user by the launch).
            eprintln!("gpuctl: {msg}");
            // 127: like a shell's "command not found".
            std::process::exit(127);
        }
    };
    // The wait status and when the job ended (Unix ms): an agent that was down when
    // the job ended reports the real end, not the time it came back.
    // Not synced: the file outlives the agent (a process), not the node; after a crash
    // of the node the job is gone with it (the agent's own records are not synced
    // either). An fsync here was the job's end waiting for the disk.
    let _ = writeln!(f, "{} {}", status.into_raw(), now_ms());
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

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// What the shim left in its status file: the wait status and when the job ended, or
/// why it could not start the program.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    pub status: Option<std::process::ExitStatus>,
    /// Unix ms.
    pub end_ms: Option<i64>,
    pub launch_error: Option<String>,
}

/// Reads a status file the shim wrote (an empty record where there is none).
pub fn read_record(path: &Path) -> Record {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    if let Some(e) = text.trim().strip_prefix(LAUNCH_ERROR) {
        return Record {
            launch_error: Some(e.to_string()),
            ..Record::default()
        };
    }
    let mut words = text.split_whitespace();
    Record {
        status: words
            .next()
            .and_then(|w| w.parse::<i32>().ok())
            .map(std::process::ExitStatus::from_raw),
        end_ms: words.next().and_then(|w| w.parse().ok()),
        launch_error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("1.1.status");
        assert_eq!(read_record(&p), Record::default(), "no file yet");
        std::fs::write(&p, "256 1700000000123\n").unwrap();
        let r = read_record(&p);
        assert_eq!(r.status.and_then(|s| s.code()), Some(1));
        assert_eq!(r.end_ms, Some(1_700_000_000_123));
        assert_eq!(r.launch_error, None);
        std::fs::write(&p, "error: x: command not found (PATH=/bin)\n").unwrap();
        let r = read_record(&p);
        assert_eq!(
            r.launch_error.as_deref(),
            Some("x: command not found (PATH=/bin)")
        );
        assert_eq!((r.status, r.end_ms), (None, None));
    }
}
