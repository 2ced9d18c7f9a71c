//! The job shim: each job's top process (in its cgroup, as its user), a fork of the
//! launch server (`forkserver`) that starts the job's program and waits for it. When
//! the program ends, the shim writes its raw wait status to fd 3 (a file opened as
//! root in the agent's state dir) and ends the same way (same exit code, or the same
//! signal). The agent sees the shim's end as the end of file of a pipe the shim holds;
//! an agent restarted after a crash watches the pid instead. Either way it reads the
//! status the shim left: a job's real end survives the agent.

use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
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
    // SAFETY: fd 3 was installed for us by the launch's steps; we own it from here.
    let mut f = unsafe { std::fs::File::from_raw_fd(STATUS_FD) };
    let spawned = resolve(program, env).and_then(|path| spawn(&path, program, args, env, &ignored));
    let mut result = std::fs::File::from(result);
    // The agent may be gone (restarted): then nobody reads this, and that is fine.
    let _ = writeln!(result, "ok {} {}", std::process::id(), now_ms());
    let status = match spawned.and_then(wait) {
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

/// Starts the program with `posix_spawn` (a vfork: no copy of the shim's page tables;
/// a fork, the signal resets in `pre_exec` and `exec` took 0.3 ms of every launch, p90
/// 1.2 ms): an empty signal mask, and at their defaults the signals the shim ignores
/// and SIGPIPE (which the Rust runtime ignores), whatever the shim inherited.
fn spawn(
    path: &Path,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
    ignored: &[Signal],
) -> std::io::Result<nix::unistd::Pid> {
    use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags};
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |b: &[u8]| {
        CString::new(b).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a NUL byte in the command or its environment",
            )
        })
    };
    let argv = std::iter::once(program.as_os_str().as_bytes())
        .chain(args.iter().map(|a| a.as_bytes()))
        .map(c)
        .collect::<std::io::Result<Vec<_>>>()?;
    let envp = env
        .iter()
        .map(|(k, v)| c(format!("{k}={v}").as_bytes()))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut defaults = nix::sys::signal::SigSet::empty();
    for &s in ignored.iter().chain(&[Signal::SIGPIPE]) {
        defaults.add(s);
    }
    let mut attr = PosixSpawnAttr::init()?;
    attr.set_sigmask(&nix::sys::signal::SigSet::empty())?;
    attr.set_sigdefault(&defaults)?;
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF,
    )?;
    let actions = PosixSpawnFileActions::init()?;
    Ok(nix::spawn::posix_spawn(
        path, &actions, &attr, &argv, &envp,
    )?)
}

/// Waits for the program; its raw wait status.
fn wait(pid: nix::unistd::Pid) -> std::io::Result<std::process::ExitStatus> {
    let mut raw = 0;
    loop {
        // SAFETY: waitpid on our own child with a valid status pointer.
        if unsafe { nix::libc::waitpid(pid.as_raw(), &mut raw, 0) } == pid.as_raw() {
            return Ok(std::process::ExitStatus::from_raw(raw));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `program` as `execvp` finds it in the job's `PATH` (glibc's default where the job
/// has none), not the shim's: a name with a slash as it is (relative to the workdir).
/// Answers `NotFound`, or `PermissionDenied` when only files the user may not run were
/// found (`posix_spawn` takes a path).
fn resolve(program: &Path, env: &[(String, String)]) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if program.as_os_str().as_bytes().contains(&b'/') {
        return Ok(program.to_path_buf());
    }
    let search = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or("/bin:/usr/bin", |(_, v)| v.as_str());
    let mut denied = false;
    // An empty entry is the working directory: "" joined with the name is relative.
    for dir in std::env::split_paths(search) {
        let candidate = dir.join(program);
        match nix::unistd::access(&candidate, nix::unistd::AccessFlags::X_OK) {
            Ok(()) if candidate.is_file() => return Ok(candidate),
            Err(nix::errno::Errno::EACCES) => denied = true,
            _ => {}
        }
    }
    Err(std::io::Error::from(if denied {
        std::io::ErrorKind::PermissionDenied
    } else {
        std::io::ErrorKind::NotFound
    }))
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

    /// The program is found as `execvp` would find it, in the job's PATH.
    #[test]
    fn programs_are_found_in_the_jobs_path() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(b.join("tool")).unwrap(); // a directory is not a program
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        };
        std::fs::write(a.join("tool"), "#!/bin/sh\n").unwrap();
        mode(&a.join("tool"), 0o755);
        let env = |path: String| vec![("PATH".to_string(), path)];
        let both = env(format!("{}:{}", b.display(), a.display()));
        assert_eq!(resolve(Path::new("tool"), &both).unwrap(), a.join("tool"));
        assert_eq!(
            resolve(Path::new("./tool"), &both).unwrap(),
            Path::new("./tool"),
            "a path is used as it is"
        );
        let missing = resolve(Path::new("no-such-tool"), &both).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
        // Not the shim's own PATH: `sh` is on it, not on the job's.
        let only_a = env(a.display().to_string());
        assert_eq!(
            resolve(Path::new("sh"), &only_a).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
        // Without a PATH, glibc's default.
        assert_eq!(resolve(Path::new("sh"), &[]).unwrap(), Path::new("/bin/sh"));
        // No execute bit: not a program (for root too).
        mode(&a.join("tool"), 0o644);
        assert_eq!(
            resolve(Path::new("tool"), &only_a).unwrap_err().kind(),
            std::io::ErrorKind::PermissionDenied
        );
    }

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
