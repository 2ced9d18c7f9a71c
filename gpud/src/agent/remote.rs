//! Steps opened from outside their jobs (`gpuctl run --jobid`, `srun` inside
//! `gpuctl alloc`): the controller's `StepSession` names a running job and a random
//! number; the agent calls `StepIo` with that number (signed like every request),
//! starts the step and relays: the client's input to it, its output to the client.
//!
//! The step is the job's own `srun` (`launch::job_tools`) with the client's options and
//! command, started through the launch server like the job itself (in the job's cgroup,
//! as its user, in its workdir, with its environment), so its tasks, ranks, GPUs and
//! accounting (the job's step file) are those of a step started inside the job. Its
//! stdio is a pseudo-terminal (`--pty`: the step's controlling terminal, in a session
//! of its own) or three pipes. The client going away is a hang-up: HUP to the step's
//! processes, KILL after `HANGUP_GRACE`. Nothing here waits on a path the user names.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use gpuctl_proto::{self as pb, agent_link_client::AgentLinkClient};
use gpuctl_proto::{step_input::Input, step_output::Output};
use nix::sys::signal::Signal;
use prost::Message as _;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use super::{Agent, now_ms, numbered};
use crate::launch::{LaunchSpec, Launched, launch_env, resolve_user};

/// How many times (20 ms apart) a step waits for its job's record on this node.
const RECORD_WAITS: u32 = 100;
/// Bytes of output per message.
const CHUNK: usize = 32 << 10;
/// After a hang-up (the client went away), how long before the step is killed.
const HANGUP_GRACE: Duration = Duration::from_secs(5);
/// After the step's process ended, how long output still held open by something it
/// left running is relayed before the step's end is sent.
const DRAIN: Duration = Duration::from_millis(300);

/// Steps from outside running at once on this node, per job and per user: each holds
/// a few descriptors in the agent and processes on the node, so a loop of `srun`s in
/// an allocation must not take the agent's descriptors or the node's process table.
const MAX_STEPS_PER_JOB: usize = 128;
const MAX_STEPS_PER_USER: usize = 256;

/// Running steps by job and by user.
static RUNNING: std::sync::Mutex<(
    std::collections::BTreeMap<u64, usize>,
    std::collections::BTreeMap<String, usize>,
)> = std::sync::Mutex::new((
    std::collections::BTreeMap::new(),
    std::collections::BTreeMap::new(),
));

/// A running step's place under the caps; given back when dropped.
struct StepSlot {
    job: u64,
    user: String,
}

impl StepSlot {
    fn take(job: u64, user: &str) -> Result<StepSlot, String> {
        let mut r = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        let (by_job, by_user) = &mut *r;
        let (j, u) = (
            by_job.get(&job).copied().unwrap_or(0),
            by_user.get(user).copied().unwrap_or(0),
        );
        if j >= MAX_STEPS_PER_JOB {
            return Err(format!(
                "job {job} already runs {j} steps started from outside it on this node (at most {MAX_STEPS_PER_JOB}): wait for some to end"
            ));
        }
        if u >= MAX_STEPS_PER_USER {
            return Err(format!(
                "user {user} already runs {u} steps started from outside their jobs on this node (at most {MAX_STEPS_PER_USER}): wait for some to end"
            ));
        }
        *by_job.entry(job).or_default() += 1;
        *by_user.entry(user.to_string()).or_default() += 1;
        Ok(StepSlot {
            job,
            user: user.to_string(),
        })
    }
}

impl Drop for StepSlot {
    fn drop(&mut self) {
        let mut r = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        let (by_job, by_user) = &mut *r;
        if let Some(n) = by_job.get_mut(&self.job) {
            *n -= 1;
            if *n == 0 {
                by_job.remove(&self.job);
            }
        }
        if let Some(n) = by_user.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                by_user.remove(&self.user);
            }
        }
    }
}

/// Opens step `s` in the background.
pub(super) fn open(agent: &Arc<Agent>, s: pb::StepSession) {
    let agent = agent.clone();
    tokio::spawn(async move {
        let job = s.job_id;
        if let Err(e) = serve(&agent, s).await {
            tracing::warn!(job, "step from outside the job: {e:#}");
        }
    });
}

fn output(o: Output) -> pb::StepOutput {
    pb::StepOutput { output: Some(o) }
}

async fn serve(agent: &Arc<Agent>, s: pb::StepSession) -> anyhow::Result<()> {
    let channel = agent.channel();
    let session = agent.current_session().context("not attached")?;
    let hello = pb::StepHello {
        node: agent.name.clone(),
        step: s.step.clone(),
    };
    let (tx, rx) = mpsc::channel::<pb::StepOutput>(16);
    tx.send(output(Output::Hello(hello.clone()))).await?;
    let req = agent.key.signed_stream(
        "step_io",
        &agent.name,
        now_ms(),
        &numbered(Some(&session)),
        &hello.encode_to_vec(),
        tokio_stream::wrappers::ReceiverStream::new(rx),
    )?;
    let mut input = AgentLinkClient::new(channel)
        .step_io(req)
        .await
        .context("StepIo")?
        .into_inner();
    let open = s.open.unwrap_or_default();
    let (a, job, attempt) = (agent.clone(), s.job_id, s.attempt);
    let started = tokio::task::spawn_blocking(move || start(&a, job, attempt, &open))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
    let step = match started {
        Ok(step) => step,
        Err(e) => {
            tracing::info!(job, "step not started: {e}");
            tx.send(output(Output::Error(e))).await?;
            // Until the controller has it (dropping the stream would reset it).
            while let Ok(Some(_)) = input.message().await {}
            return Ok(());
        }
    };
    tracing::info!(
        job,
        pid = step.pgid,
        tty = step.master.is_some(),
        "step from outside the job started"
    );
    let status = step.status.clone();
    let code = relay(step, &mut input, &tx).await;
    let _ = std::fs::remove_file(status);
    tracing::info!(job, code, "step from outside the job ended");
    tx.send(output(Output::ExitCode(code))).await?;
    // The stream ends once the controller has the end: wait for it to close.
    while let Ok(Some(_)) = input.message().await {}
    Ok(())
}

/// A started step and the agent's ends of its stdio.
struct Step {
    launched: Launched,
    /// Its process group (the shim leads it).
    pgid: i32,
    out: AsyncFd<File>,
    err: Option<AsyncFd<File>>,
    input: Option<AsyncFd<File>>,
    /// The terminal's master (`--pty`), for window sizes.
    master: Option<OwnedFd>,
    status: PathBuf,
    /// Its place under the caps on running steps.
    _slot: StepSlot,
}

fn nonblocking(fd: OwnedFd) -> std::io::Result<AsyncFd<File>> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(&fd, FcntlArg::F_GETFL)?);
    fcntl(&fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    // SAFETY: the File owns the fd for as long as the AsyncFd lives.
    unsafe { AsyncFd::register(File::from(fd)) }.map_err(|e| e.into_parts().1)
}

/// Starts the step (on a blocking thread: the launch waits for the step's process).
fn start(
    agent: &Arc<Agent>,
    job_id: u64,
    attempt: u32,
    open: &pb::OpenStep,
) -> Result<Step, String> {
    let running = agent
        .jobs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(&(job_id, attempt));
    if !running {
        return Err(format!("job {job_id} does not run on {} now", agent.name));
    }
    // A rank whose launch is still being written (the step came as its job started
    // elsewhere) has its record in a moment.
    let mut tries = 0;
    let (start, extra_env) = loop {
        match super::jobs::start_of(&agent.state_dir, job_id, attempt) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < RECORD_WAITS => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            r => {
                break r.map_err(|e| {
                    format!("cannot read job {job_id}'s record on {}: {e}", agent.name)
                })?;
            }
        }
    };
    let spec = start.spec.clone().unwrap_or_default();
    let slot = StepSlot::take(job_id, &spec.user)?;
    let tools = agent.tools.as_ref().ok_or_else(|| {
        format!(
            "node {} has no gpuctl next to gpud: steps start through its srun",
            agent.name
        )
    })?;
    let run_as = resolve_user(&spec.user, agent.allow_root_jobs)?;
    let mut env = launch_env(&start, &agent.name, run_as.as_ref());
    env.extend(extra_env);
    // The step is recorded in the job's step file (made now if the job has none yet).
    let steps = crate::steps::path(&agent.state_dir, job_id, attempt);
    let owner = run_as.as_ref().map(|u| (u.uid, u.gid));
    crate::steps::ensure(&steps, owner).map_err(|e| {
        format!(
            "cannot make job {job_id}'s step file on {}: {e}",
            agent.name
        )
    })?;
    env.insert("GPUCTL_STEPS_FILE".into(), steps.display().to_string());
    if open.pty {
        let term = if open.term.is_empty() {
            "xterm"
        } else {
            &open.term
        };
        env.insert("TERM".into(), term.to_string());
    }
    let name = format!("{:016x}", rand::random::<u64>());
    let status = agent
        .state_dir
        .join("jobs")
        .join(format!("{job_id}.{attempt}.step-{name}.status"));
    let launch = LaunchSpec {
        job_id,
        attempt,
        program: tools.join("srun"),
        args: open.args.clone(),
        workdir: PathBuf::from(&spec.workdir),
        env,
        stdout: PathBuf::from("/dev/null"),
        stderr: None,
        append: false,
        script: None,
        run_as,
        limits: crate::cgroup::Limits {
            cpu_milli: 0,
            memory_bytes: 0,
            pids: 0,
        },
        status_file: Some(status.clone()),
        devices: None,
        tasks_per_node: 1,
        banner: None,
    };
    let failed = |e: std::io::Error| format!("cannot start the step on {}: {e}", agent.name);
    // `srun` first on its PATH, as for the job itself.
    let launch = launch.with_tools(Some(tools)).map_err(failed)?;
    let (fds, ours) = stdio(open).map_err(failed)?;
    let launched = agent
        .launcher
        .spawn_step(&launch, &fds, open.pty)
        .map_err(failed)?;
    drop(fds);
    let pgid = launched.id().map_or(0, |p| p as i32);
    Ok(Step {
        launched,
        pgid,
        out: ours.out,
        err: ours.err,
        input: ours.input,
        master: ours.master,
        status,
        _slot: slot,
    })
}

/// The agent's ends of a step's stdio.
struct Ours {
    out: AsyncFd<File>,
    err: Option<AsyncFd<File>>,
    input: Option<AsyncFd<File>>,
    master: Option<OwnedFd>,
}

/// The step's stdio (its three fds) and the agent's ends.
fn stdio(open: &pb::OpenStep) -> std::io::Result<(Vec<OwnedFd>, Ours)> {
    use nix::fcntl::OFlag;
    if open.pty {
        let size = open.size.unwrap_or(pb::WindowSize { rows: 24, cols: 80 });
        let ws = nix::pty::Winsize {
            ws_row: size.rows.clamp(1, 4096) as u16,
            ws_col: size.cols.clamp(1, 4096) as u16,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&ws), None)?;
        set_cloexec(&pty.master)?;
        set_cloexec(&pty.slave)?;
        let fds = vec![pty.slave.try_clone()?, pty.slave.try_clone()?, pty.slave];
        let ours = Ours {
            out: nonblocking(pty.master.try_clone()?)?,
            err: None,
            input: Some(nonblocking(pty.master.try_clone()?)?),
            master: Some(pty.master),
        };
        return Ok((fds, ours));
    }
    let (in_r, in_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let ours = Ours {
        out: nonblocking(out_r)?,
        err: Some(nonblocking(err_r)?),
        input: Some(nonblocking(in_w)?),
        master: None,
    };
    Ok((vec![in_r, out_w, err_w], ours))
}

fn set_cloexec(fd: &OwnedFd) -> std::io::Result<()> {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    Ok(())
}

/// Some bytes from `fd`; 0 at its end (a terminal whose other side closed reads EIO:
/// the end too).
async fn read_some(fd: &AsyncFd<File>, buf: &mut [u8]) -> usize {
    loop {
        let Ok(mut ready) = fd.readable().await else {
            return 0;
        };
        match ready.try_io(|f| f.get_ref().read(buf)) {
            Ok(Ok(n)) => return n,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(_)) => return 0,
            Err(_would_block) => {}
        }
    }
}

/// `read_some` of `fd`; never ready without one (a select's branch that is off still
/// has its future made).
async fn read_opt(fd: Option<&AsyncFd<File>>, buf: &mut [u8]) -> usize {
    match fd {
        Some(fd) => read_some(fd, buf).await,
        None => std::future::pending().await,
    }
}

async fn write_all(fd: &AsyncFd<File>, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        let mut ready = fd.writable().await?;
        match ready.try_io(|f| f.get_ref().write(data)) {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {}
        }
    }
    Ok(())
}

fn signal_step(pgid: i32, sig: Signal) {
    if pgid > 0 {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), sig);
    }
}

/// Relays until the step has ended and its output is drained; answers its exit code.
async fn relay(
    mut step: Step,
    input: &mut tonic::Streaming<pb::StepInput>,
    tx: &mpsc::Sender<pb::StepOutput>,
) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    let (mut out_buf, mut err_buf) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let (mut out_open, mut err_open, mut in_open) = (true, step.err.is_some(), true);
    let mut code: Option<i32> = None;
    let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
    let (mut drain_by, mut kill_at) = (far, far);
    let pgid = step.pgid;
    while code.is_none() || out_open || err_open {
        tokio::select! {
            n = read_some(&step.out, &mut out_buf), if out_open => {
                if n == 0 {
                    out_open = false;
                } else if tx.send(output(Output::Stdout(out_buf[..n].to_vec()))).await.is_err() {
                    signal_step(pgid, Signal::SIGHUP);
                }
            }
            n = read_opt(step.err.as_ref(), &mut err_buf), if err_open => {
                if n == 0 {
                    err_open = false;
                } else {
                    let _ = tx.send(output(Output::Stderr(err_buf[..n].to_vec()))).await;
                }
            }
            m = input.message(), if in_open => match m {
                Ok(Some(m)) => client_input(&mut step, m).await,
                _ => {
                    // The client went away: a hang-up, then a kill.
                    in_open = false;
                    signal_step(pgid, Signal::SIGHUP);
                    kill_at = tokio::time::Instant::now() + HANGUP_GRACE;
                }
            },
            s = step.launched.wait(), if code.is_none() => {
                code = Some(match s {
                    Ok(s) => s.code().or_else(|| s.signal().map(|n| 128 + n)).unwrap_or(1),
                    Err(_) => 1,
                });
                drain_by = tokio::time::Instant::now() + DRAIN;
            }
            _ = tokio::time::sleep_until(drain_by), if code.is_some() => break,
            _ = tokio::time::sleep_until(kill_at), if code.is_none() => {
                signal_step(pgid, Signal::SIGKILL);
                kill_at = far;
            }
        }
    }
    code.unwrap_or(1)
}

/// One message of the client's: input, its end, a window size or a signal.
async fn client_input(step: &mut Step, m: pb::StepInput) {
    match m.input {
        Some(Input::Stdin(bytes)) => {
            let failed = match &step.input {
                Some(fd) => write_all(fd, &bytes).await.is_err(),
                None => false,
            };
            if failed {
                step.input = None;
            }
        }
        Some(Input::StdinClosed(_)) => {
            if step.master.is_some() {
                // A terminal's end of input is its EOF character (Ctrl-D).
                if let Some(fd) = &step.input {
                    let _ = write_all(fd, &[4]).await;
                }
            } else {
                step.input = None;
            }
        }
        Some(Input::Resize(w)) => {
            if let Some(master) = &step.master {
                let ws = nix::libc::winsize {
                    ws_row: w.rows.clamp(1, 4096) as u16,
                    ws_col: w.cols.clamp(1, 4096) as u16,
                    ws_xpixel: 0,
                    ws_ypixel: 0,
                };
                // SAFETY: TIOCSWINSZ on our own terminal fd with a valid winsize.
                unsafe {
                    nix::libc::ioctl(master.as_raw_fd(), nix::libc::TIOCSWINSZ, &ws);
                }
            }
        }
        Some(Input::Signal(name)) => {
            // By name, as a KillJob's (the controller passes only those a client may
            // send: `gpuctl_core::interactive::STEP_SIGNALS`).
            if let Ok(sig) = format!("SIG{name}").parse::<Signal>() {
                signal_step(step.pgid, sig);
            }
        }
        Some(Input::Open(_)) | None => {}
    }
}

#[cfg(test)]
mod step_cap_tests {
    use super::*;

    #[test]
    fn running_steps_are_capped_per_job_and_per_user_and_given_back() {
        let held: Vec<StepSlot> = (0..MAX_STEPS_PER_JOB)
            .map(|_| StepSlot::take(7_000_001, "capped-a").unwrap())
            .collect();
        let e = StepSlot::take(7_000_001, "capped-a").err().unwrap();
        assert!(e.contains("at most 128"), "{e}");
        // Another job of the same user, up to the user's cap.
        let more: Vec<StepSlot> = (0..MAX_STEPS_PER_USER - MAX_STEPS_PER_JOB)
            .map(|_| StepSlot::take(7_000_002, "capped-a").unwrap())
            .collect();
        let e = StepSlot::take(7_000_003, "capped-a").err().unwrap();
        assert!(e.contains("user capped-a"), "{e}");
        assert!(
            StepSlot::take(7_000_004, "capped-b").is_ok(),
            "others are not capped"
        );
        drop(held);
        drop(more);
        assert!(
            StepSlot::take(7_000_001, "capped-a").is_ok(),
            "slots come back"
        );
    }
}
