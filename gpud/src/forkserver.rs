//! The launch server: `gpud __forkserver`, a small single-threaded process that the
//! agent starts once and keeps. Each job's shim is a fork of it rather than a new
//! executable: forking the agent (many threads, its whole heap) and exec'ing `gpud`
//! again for the shim cost about 3 ms of every launch on the development VM; a fork
//! of this small process costs a fraction of one (docs/benchmarks.md, "Submit to
//! launch").
//!
//! The agent sends a `Request` (a length-prefixed JSON body) and, as SCM_RIGHTS, the
//! write end of a pipe over a socket pair (the server's stdin). The server forks and
//! goes back to reading; it never waits for a child (SIGCHLD is ignored, so the kernel
//! reaps them) and never touches a path a user named. Where the job has a cgroup2
//! directory the child is created inside it (`clone3` with `CLONE_INTO_CGROUP`, Linux
//! 5.7+): moving a process into a cgroup waits for an RCU grace period (10-50 ms on this
//! project's hosts without `favordynmods`), creating it there does not. The child, in
//! this order: leads its own process group, joins the job's other (v1) cgroups, opens
//! the status file as root,
//! becomes the job's user, enters the workdir and opens the outputs as that user
//! (`launch::open_output`: never a FIFO, socket or symlink), then is the job's shim
//! (`shim::supervise`). Through the pipe it answers `ok PID MS` once the program was
//! started (MS: when, Unix ms) or `err STEP ERRNO` for the step that failed, and it
//! holds the pipe until it ends: the agent sees the job's end as the pipe's end of
//! file, then reads how it ended from the status file.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use nix::sys::signal::{SigHandler, Signal, signal};
use serde::{Deserialize, Serialize};

/// The first argument that selects the server.
pub const ARG: &str = "__forkserver";

/// The largest request body read (a job's spec is bounded far below by the
/// controller's `limits.max_job_bytes`).
const MAX_REQUEST: usize = 64 << 20;

/// The step a child reports when the request itself could not be read or the fork
/// failed (after the steps of `launch::job::STEPS`).
pub const STEP_SERVER: usize = 7;

/// One job's launch.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: PathBuf,
    pub stdout: PathBuf,
    /// `None`: stderr goes to the stdout file.
    pub stderr: Option<PathBuf>,
    pub append: bool,
    /// Where the shim records the job's wait status (opened as root).
    pub status: PathBuf,
    /// The `cgroup.procs` files of the job's cgroup, one per hierarchy.
    pub cgroup_procs: Vec<PathBuf>,
    /// The job's cgroup2 directory (also among `cgroup_procs`): the child is created
    /// there when the kernel can, and then does not join it again.
    #[serde(default)]
    pub cgroup_v2: Option<PathBuf>,
    /// The user to become; `None`: stay root (the agent's user).
    pub user: Option<Become>,
    /// A step's standard input, output and error come with the request (three fds
    /// after the answer's pipe) instead of `stdout`/`stderr`'s files.
    #[serde(default)]
    pub passed_stdio: bool,
    /// With `passed_stdio`: they are a pseudo-terminal, which becomes the step's
    /// controlling terminal (a session of its own, not only a process group).
    #[serde(default)]
    pub tty: bool,
    /// Written to the output once it is open (a requeued job's attempt line).
    #[serde(default)]
    pub banner: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Become {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// How a launch went, as the child answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// The shim is `pid`; it started the program at `at_ms` (Unix ms).
    Started { pid: u32, at_ms: i64 },
    /// `step` (an index of `launch::job::STEPS`, or `STEP_SERVER`) failed with `errno`.
    Failed { step: usize, errno: i32 },
}

impl Answer {
    fn parse(line: &str) -> Option<Answer> {
        let mut w = line.split_whitespace();
        let (kind, a, b) = (w.next()?, w.next()?, w.next()?);
        match kind {
            "ok" => Some(Answer::Started {
                pid: a.parse().ok()?,
                at_ms: b.parse().ok()?,
            }),
            "err" => Some(Answer::Failed {
                step: a.parse().ok()?,
                errno: b.parse().ok()?,
            }),
            _ => None,
        }
    }
}

/// The agent's side: starts the server on first use (and again if it went away).
pub struct Client {
    exe: PathBuf,
    server: std::sync::Mutex<Option<(UnixStream, std::process::Child)>>,
}

impl Client {
    /// A client that runs `exe __forkserver` (this agent's own executable).
    pub fn new(exe: PathBuf) -> Client {
        Client {
            exe,
            server: std::sync::Mutex::new(None),
        }
    }

    fn start(&self) -> std::io::Result<(UnixStream, std::process::Child)> {
        let (ours, theirs) = UnixStream::pair()?;
        let child = std::process::Command::new(&self.exe)
            .arg(ARG)
            .stdin(OwnedFd::from(theirs))
            .spawn()?;
        Ok((ours, child))
    }

    /// Starts one job's shim. Answers the pipe whose end of file is the shim's end,
    /// and what the child answered. Blocks until the child has started the program or
    /// failed (its steps run as the job's user on the job's paths: call it off the
    /// async threads).
    pub fn launch(&self, req: &Request) -> std::io::Result<(OwnedFd, Answer)> {
        self.launch_with(req, &[])
    }

    /// `launch`, with the step's stdio (`Request::passed_stdio`) sent along.
    pub fn launch_with(
        &self,
        req: &Request,
        stdio: &[OwnedFd],
    ) -> std::io::Result<(OwnedFd, Answer)> {
        let body = serde_json::to_vec(req).map_err(std::io::Error::other)?;
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        {
            let mut server = self.server.lock().unwrap_or_else(|p| p.into_inner());
            let mut tries = 0;
            loop {
                if server.is_none() {
                    *server = Some(self.start()?);
                }
                let (sock, _) = server.as_ref().expect("started above");
                match send(sock, &body, &w, stdio) {
                    Ok(()) => break,
                    Err(e) if tries == 0 => {
                        tracing::warn!("the launch server went away ({e}); starting another");
                        if let Some((_, mut child)) = server.take() {
                            let _ = child.kill();
                            let _ = child.wait();
                        }
                        tries += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        // Only the server (and then the child) hold the write end now.
        drop(w);
        let mut line = Vec::new();
        let mut f = std::fs::File::from(r);
        let mut b = [0u8; 64];
        while !line.contains(&b'\n') {
            match f.read(&mut b) {
                Ok(0) => {
                    return Err(std::io::Error::other(
                        "the launch server ended before the job's process started",
                    ));
                }
                Ok(n) => line.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let answer = Answer::parse(&String::from_utf8_lossy(&line)).ok_or_else(|| {
            std::io::Error::other(format!(
                "the launch server answered {:?}",
                String::from_utf8_lossy(&line)
            ))
        })?;
        Ok((OwnedFd::from(f), answer))
    }
}

/// The body's length, then the body; the pipe's write end (and a step's stdio) ride on
/// the first bytes.
fn send(sock: &UnixStream, body: &[u8], fd: &OwnedFd, stdio: &[OwnedFd]) -> std::io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let len = (body.len() as u32).to_le_bytes();
    let fds: Vec<i32> = std::iter::once(fd)
        .chain(stdio)
        .map(AsRawFd::as_raw_fd)
        .collect();
    let iov = [std::io::IoSlice::new(&len)];
    let n = sendmsg::<()>(
        sock.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    let mut w = sock;
    w.write_all(&len[n..])?;
    w.write_all(body)
}

/// One request: its body and the fds that came with it (the answer's pipe first).
type Received = (Vec<u8>, Vec<OwnedFd>);

/// Reads one request. `None` at end of file (the agent is gone).
fn recv(sock: &UnixStream) -> std::io::Result<Option<Received>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut len = [0u8; 4];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 4]);
    let (n, mut fd) = {
        let mut iov = [std::io::IoSliceMut::new(&mut len)];
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut fd = Vec::new();
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for raw in fds {
                    // SAFETY: the kernel just installed this fd for us; we own it.
                    fd.push(unsafe { OwnedFd::from_raw_fd(raw) });
                }
            }
        }
        (msg.bytes, fd)
    };
    if n == 0 {
        return Ok(None);
    }
    let mut r = sock;
    r.read_exact(&mut len[n..])?;
    let size = u32::from_le_bytes(len) as usize;
    if size > MAX_REQUEST {
        fd.clear();
        return Err(std::io::Error::other(format!("request of {size} bytes")));
    }
    let mut body = vec![0u8; size];
    r.read_exact(&mut body)?;
    Ok(Some((body, fd)))
}

/// Runs the server on stdin (never returns).
pub fn serve() -> ! {
    // SAFETY: setting a standard disposition; no handler runs.
    unsafe {
        let _ = signal(Signal::SIGCHLD, SigHandler::SigIgn);
    }
    // SAFETY: the agent handed us the socket as stdin; nothing else owns fd 0.
    let sock = unsafe { UnixStream::from_raw_fd(0) };
    loop {
        let (body, mut fds) = match recv(&sock) {
            Ok(Some(x)) => x,
            Ok(None) => std::process::exit(0),
            Err(e) => {
                eprintln!("gpud {ARG}: {e}");
                std::process::exit(1);
            }
        };
        // A request without its pipe has nobody to answer.
        if fds.is_empty() {
            continue;
        }
        let result = fds.remove(0);
        let req: Request = match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("gpud {ARG}: unreadable request: {e}");
                answer_failed(&result, STEP_SERVER, nix::libc::EINVAL);
                continue;
            }
        };
        match spawn_child(req.cgroup_v2.as_deref()) {
            Ok(Forked::Child { entered }) => {
                drop(sock);
                child(req, entered, result, fds)
            }
            Ok(Forked::Parent) => drop((result, fds)),
            Err(e) => answer_failed(&result, STEP_SERVER, e as i32),
        }
    }
}

/// Which side of `spawn_child` this is.
enum Forked {
    Parent,
    /// `entered`: the child was created in the cgroup2 directory asked for.
    Child {
        entered: bool,
    },
}

/// `struct clone_args` of clone3(2), up to `cgroup` (Linux 5.7).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// clone3's flag: create the child in the cgroup2 directory `cgroup` names.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Forks this (single-threaded) process; with `cgroup2`, creates the child inside that
/// cgroup2 directory where the kernel can (else an ordinary fork: the child then joins
/// it by `cgroup.procs`, as on kernels before 5.7).
fn spawn_child(cgroup2: Option<&std::path::Path>) -> nix::Result<Forked> {
    if let Some(dir) = cgroup2 {
        let flags = nix::fcntl::OFlag::O_RDONLY
            | nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_CLOEXEC;
        match nix::fcntl::open(dir, flags, nix::sys::stat::Mode::empty()) {
            Ok(fd) => match clone_into(&fd) {
                Ok(f) => return Ok(f),
                Err(e) => {
                    eprintln!("gpud {ARG}: clone3 into {}: {e}; forking", dir.display())
                }
            },
            Err(e) => eprintln!("gpud {ARG}: {}: {e}", dir.display()),
        }
    }
    // SAFETY: this process has one thread; the child runs ordinary code.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => Ok(Forked::Child { entered: false }),
        nix::unistd::ForkResult::Parent { .. } => Ok(Forked::Parent),
    }
}

/// clone3(2) with `CLONE_INTO_CGROUP`: like fork(2) (no new stack, SIGCHLD at the end),
/// the child created inside `dir`'s cgroup.
fn clone_into(dir: &OwnedFd) -> nix::Result<Forked> {
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: nix::libc::SIGCHLD as u64,
        cgroup: dir.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 with a fork's semantics (no CLONE_VM, no stack given: the child
    // runs on a copy of this stack) from a process with one thread; the arguments are
    // a valid `clone_args` of the size passed.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match r {
        0 => Ok(Forked::Child { entered: true }),
        r if r > 0 => Ok(Forked::Parent),
        _ => Err(nix::errno::Errno::last()),
    }
}

fn answer_failed(fd: &OwnedFd, step: usize, errno: i32) {
    // One short write to a pipe: all of it or nothing (PIPE_BUF).
    let _ = nix::unistd::write(fd, format!("err {step} {errno}\n").as_bytes());
}

/// The forked child: the launch's steps, then the shim (never returns). `entered`: it
/// was created in the job's cgroup2 directory already; `stdio`: a step's, passed.
fn child(req: Request, entered: bool, result: OwnedFd, stdio: Vec<OwnedFd>) -> ! {
    // Out of the way of fds 0-3, which the steps fill.
    let result = match nix::fcntl::fcntl(&result, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10)) {
        // SAFETY: fcntl answered a fresh fd that we own.
        Ok(high) => unsafe { OwnedFd::from_raw_fd(high) },
        Err(_) => result,
    };
    let fail = |step: usize, e: std::io::Error| -> ! {
        answer_failed(&result, step, e.raw_os_error().unwrap_or(nix::libc::EIO));
        std::process::exit(126);
    };
    // Its own children are waited for again; the job leads its own process group.
    // SAFETY: standard dispositions and process-group calls in a single thread.
    unsafe {
        let _ = signal(Signal::SIGCHLD, SigHandler::SigDfl);
    }
    // On a terminal: a session of its own, the terminal its controlling one (so that
    // Ctrl-C and a hang-up reach the step's processes from it).
    let led = if req.tty {
        nix::unistd::setsid().map(drop)
    } else {
        nix::unistd::setpgid(nix::unistd::Pid::from_raw(0), nix::unistd::Pid::from_raw(0))
    };
    if let Err(e) = led {
        fail(0, e.into());
    }
    if let Err(e) = steps(&req, entered, stdio) {
        fail(e.0, e.1);
    }
    crate::shim::supervise(&req.program, &req.args, &req.env, result)
}

/// Everything before the shim proper; a failure names its step (`launch::job::STEPS`).
fn steps(req: &Request, entered: bool, stdio: Vec<OwnedFd>) -> Result<(), (usize, std::io::Error)> {
    use std::os::unix::fs::OpenOptionsExt;
    if req.passed_stdio {
        let [input, out, err]: [OwnedFd; 3] = stdio
            .try_into()
            .map_err(|_| (6, std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
        // Out of the way of 0-2 first: one of them may be another's number.
        let high = |fd: OwnedFd| {
            nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10))
                // SAFETY: fcntl answered a fresh fd that we own.
                .map(|h| unsafe { OwnedFd::from_raw_fd(h) })
                .map_err(|e| (4, std::io::Error::from(e)))
        };
        let (input, out, err) = (high(input)?, high(out)?, high(err)?);
        install(input, 0).map_err(|e| (4, e))?;
        install(out, 1).map_err(|e| (4, e))?;
        install(err, 2).map_err(|e| (5, e))?;
        if req.tty {
            // SAFETY: TIOCSCTTY on our own fd 0 with argument 0 (do not steal).
            if unsafe { nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) } < 0 {
                return Err((4, std::io::Error::last_os_error()));
            }
        }
    } else {
        // stdin: /dev/null (fd 0 was the server's socket).
        let null = std::fs::File::open("/dev/null").map_err(|e| (0, e))?;
        install(null.into(), 0).map_err(|e| (0, e))?;
    }
    let created_in = |p: &PathBuf| entered && p.parent() == req.cgroup_v2.as_deref();
    for p in req.cgroup_procs.iter().filter(|p| !created_in(p)) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .and_then(|mut f| f.write_all(b"0"))
            .map_err(|e| (0, e))?;
    }
    // The status file, opened as root before becoming the job's user, as fd 3.
    let status = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&req.status)
        .map_err(|e| (1, e))?;
    install(status.into(), crate::shim::STATUS_FD).map_err(|e| (1, e))?;
    if let Some(u) = &req.user {
        let groups: Vec<nix::unistd::Gid> = u
            .groups
            .iter()
            .map(|g| nix::unistd::Gid::from_raw(*g))
            .collect();
        nix::unistd::setgroups(&groups)
            .and_then(|()| nix::unistd::setgid(nix::unistd::Gid::from_raw(u.gid)))
            .and_then(|()| nix::unistd::setuid(nix::unistd::Uid::from_raw(u.uid)))
            .map_err(|e| (2, e.into()))?;
    }
    // Every path from here on is resolved as the job's user.
    std::env::set_current_dir(&req.workdir).map_err(|e| (3, e))?;
    if req.passed_stdio {
        return cloexec_from(3).map_err(|e| (6, e));
    }
    let out = crate::launch::open_output(&cstr(&req.stdout)?, req.append).map_err(|e| (4, e))?;
    // SAFETY: open_output answered a fresh fd that we own.
    let out = unsafe { OwnedFd::from_raw_fd(out) };
    match &req.stderr {
        Some(p) => {
            let err = crate::launch::open_output(&cstr(p)?, req.append).map_err(|e| (5, e))?;
            // SAFETY: as above.
            let err = unsafe { OwnedFd::from_raw_fd(err) };
            install(out, 1).map_err(|e| (4, e))?;
            install(err, 2).map_err(|e| (5, e))?;
        }
        None => {
            install(out.try_clone().map_err(|e| (4, e))?, 2).map_err(|e| (4, e))?;
            install(out, 1).map_err(|e| (4, e))?;
        }
    }
    if let Some(b) = &req.banner {
        // A regular file or /dev/null (open_output took nothing else): never blocks.
        let _ = nix::unistd::write(std::io::stdout(), b.as_bytes());
    }
    // The program gets its stdio and nothing else: the status fd, the pipe and any fd
    // the agent itself inherited (a job server's pipe, say) close on exec.
    cloexec_from(3).map_err(|e| (6, e))
}

/// Marks every fd from `first` up close-on-exec.
fn cloexec_from(first: u32) -> std::io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC closes nothing, it sets a flag.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_close_range,
            first,
            u32::MAX,
            nix::libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return Ok(());
    }
    // Kernels before 5.11: one fd at a time.
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd: &i32| fd >= first as i32)
        .collect();
    for fd in fds {
        // SAFETY: setting a flag on an fd number; a stale one (the directory's own)
        // answers EBADF, which is fine.
        unsafe {
            nix::libc::fcntl(fd, nix::libc::F_SETFD, nix::libc::FD_CLOEXEC);
        }
    }
    Ok(())
}

fn cstr(p: &std::path::Path) -> Result<std::ffi::CString, (usize, std::io::Error)> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| (6, std::io::ErrorKind::InvalidInput.into()))
}

/// Makes `fd` the process's fd number `target`, inherited across exec (the program's
/// stdio, the shim's status fd).
fn install(fd: OwnedFd, target: i32) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    let raw = fd.as_raw_fd();
    if raw == target {
        // Already there: keep it open, only drop close-on-exec.
        nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )?;
        let _ = fd.into_raw_fd();
        return Ok(());
    }
    // SAFETY: dup2 of our own fd onto a number this process owns from here on.
    if unsafe { nix::libc::dup2(raw, target) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse() {
        assert_eq!(
            Answer::parse("ok 12 1700000000123\n"),
            Some(Answer::Started {
                pid: 12,
                at_ms: 1_700_000_000_123
            })
        );
        assert_eq!(
            Answer::parse("err 4 6"),
            Some(Answer::Failed { step: 4, errno: 6 })
        );
        assert_eq!(Answer::parse("ok 12"), None);
        assert_eq!(Answer::parse("what 1 2"), None);
    }
}
