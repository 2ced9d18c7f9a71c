//! Interactive work from outside a job, on real gpuctld, gpud and gpuctl: `gpuctl run
//! --pty` driven through a pseudo-terminal (input, window size, Ctrl-C, exit code),
//! `gpuctl alloc` with two steps in it (history shows `N.0`, `N.1`), steps into a
//! running job by `--jobid` (stdin, exit codes, the job's user, others refused), and a
//! cancel ending a step.

use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_tests::{Cluster, bin, bin_dir, ensure_user, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

/// A process on a pseudo-terminal of its own (its session's controlling terminal), as
/// a user's shell would run it; everything it writes is collected.
struct OnPty {
    child: std::process::Child,
    master: std::fs::File,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl OnPty {
    fn spawn(mut cmd: Command, rows: u16, cols: u16) -> OnPty {
        use std::os::unix::process::CommandExt as _;
        let ws = nix::pty::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&ws), None).unwrap();
        let slave: OwnedFd = pty.slave;
        cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        // SAFETY: setsid and TIOCSCTTY are async-signal-safe syscalls on our own fd 0.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn on the pty");
        drop(cmd);
        let master = std::fs::File::from(pty.master);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (mut r, s) = (master.try_clone().unwrap(), seen.clone());
        std::thread::spawn(move || {
            let mut b = [0u8; 4096];
            while let Ok(n) = r.read(&mut b) {
                if n == 0 {
                    break;
                }
                s.lock().unwrap().extend_from_slice(&b[..n]);
            }
        });
        OnPty {
            child,
            master,
            seen,
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().unwrap()).into_owned()
    }

    fn wait_text(&self, want: &str) {
        let ok = wait_for(T, || self.text().contains(want));
        assert!(
            ok,
            "never saw {want:?}; the terminal shows: {:?}",
            self.text()
        );
    }

    fn type_in(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).unwrap();
    }

    fn resize(&self, rows: u16, cols: u16) {
        let ws = nix::libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ on our own terminal with a valid winsize; the kernel then
        // sends SIGWINCH to the terminal's foreground group (gpuctl).
        unsafe {
            nix::libc::ioctl(self.master.as_raw_fd(), nix::libc::TIOCSWINSZ, &ws);
        }
    }

    fn exit_code(&mut self) -> i32 {
        let ok = wait_for(T, || matches!(self.child.try_wait(), Ok(Some(_))));
        assert!(
            ok,
            "gpuctl never ended; the terminal shows: {:?}",
            self.text()
        );
        self.child.wait().unwrap().code().unwrap_or(-1)
    }
}

/// `gpuctl run --pty` outside any job: an allocation of its own, a terminal on the node
/// with this terminal's size (and its changes), input forwarded, Ctrl-C as the step's
/// SIGINT (its trap runs), the step's exit code as gpuctl's, the allocation released.
#[test]
fn a_pty_step_forwards_input_window_size_and_ctrl_c() {
    let c = Cluster::start(&[("n1", "2xA100-80GB")]);
    let script = "stty size; read x; echo got:$x; tty; read y; stty size; \
                  trap 'echo trapped-int; exit 7' INT; echo waiting; sleep 60 & wait";
    let mut cmd = Command::new(bin("gpuctl"));
    cmd.args(["run", "--pty", "-G", "1", "--", "sh", "-c", script])
        .env("GPUCTL_CONTROLLER", c.url())
        .env("TERM", "xterm-256color")
        .current_dir(c.path(""));
    let mut p = OnPty::spawn(cmd, 30, 100);
    p.wait_text("granted job allocation");
    p.wait_text("30 100");
    p.type_in(b"hello\r");
    p.wait_text("got:hello");
    p.wait_text("/dev/pts/");
    p.resize(40, 132);
    // SIGWINCH travels as its own message; give it a moment before the next line.
    std::thread::sleep(Duration::from_millis(300));
    p.type_in(b"\r");
    p.wait_text("40 132");
    p.wait_text("waiting");
    p.type_in(b"\x03");
    p.wait_text("trapped-int");
    assert_eq!(p.exit_code(), 7, "{}", p.text());
    // The allocation ended when the step did: COMPLETED, its step recorded.
    let rows = c.json(&["history"]);
    let ids: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["job_id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"1.0"), "{ids:?}");
    c.wait_state(1, "COMPLETED", T);
    assert_eq!(c.job(1)["interactive"], true);
}

/// `gpuctl alloc` runs its command here with the allocation's id; two `gpuctl run`s in
/// it are steps 0 and 1 of the allocation, on its GPUs, in history as `N.0` and `N.1`
/// (no `N.batch`: an allocation has no script), and a third is ended at its own time
/// limit; the allocation ends COMPLETED, and the command's exit code is alloc's.
#[test]
fn alloc_then_two_steps_are_in_history() {
    let c = Cluster::start(&[("n1", "2xA100-80GB")]);
    let path = format!("{}:{}", bin_dir().display(), std::env::var("PATH").unwrap());
    // `srun` is on the shell's PATH, as in salloc's (the test's PATH has none).
    let inner = "srun hostname > steps.out && \
                 gpuctl run -- sh -c 'echo step=$SLURM_STEP_ID gpus=$CUDA_VISIBLE_DEVICES job=$SLURM_JOB_ID' >> steps.out; \
                 gpuctl run -t 0:2 -- sleep 60; echo timed=$? >> steps.out; exit 3";
    let out = Command::new(bin("gpuctl"))
        .args([
            "alloc", "-G", "2", "-t", "10", "-J", "debug", "--", "sh", "-c", inner,
        ])
        .env("GPUCTL_CONTROLLER", c.url())
        .env("PATH", &path)
        .current_dir(c.path(""))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("granted job allocation 1"), "{err}");
    let steps = std::fs::read_to_string(c.path("steps.out")).unwrap();
    let lines: Vec<&str> = steps.lines().collect();
    assert_eq!(lines.len(), 3, "{steps}");
    // A step's own time limit (srun -t): TERM after 2 s.
    assert_eq!(lines[2], "timed=143", "{steps}");
    assert!(lines[1].starts_with("step=1 gpus=GPU-"), "{steps}");
    assert_eq!(lines[1].matches("GPU-").count(), 2, "both GPUs: {steps}");
    assert!(lines[1].ends_with("job=1"), "{steps}");
    let j = c.wait_state(1, "COMPLETED", T);
    assert_eq!(j["interactive"], true, "{j}");
    // No empty output file of the allocation's was left in the directory.
    assert!(!c.path("slurm-1.out").exists() && !c.path("gpuctl-1.out").exists());
    assert_eq!(j["resources"]["gpus"], 2, "{j}");
    let rows = c.json(&["history"]);
    let rows: Vec<&Value> = rows.as_array().unwrap().iter().collect();
    let ids: Vec<&str> = rows.iter().map(|r| r["job_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["1", "1.0", "1.1", "1.2"]);
    assert_eq!(rows[0]["name"], "debug");
    assert_eq!(rows[1]["name"], "hostname");
    assert_eq!(rows[2]["state"], "COMPLETED");
    assert_eq!(rows[3]["exit_code"], 143, "{:?}", rows[3]);
    // Efficiency (seff) has the steps, and how much of the allocation they kept busy.
    let e = c.json(&["efficiency", "1"]);
    assert_eq!(e["steps"].as_array().map_or(0, Vec::len), 3, "{e}");
    assert_eq!(e["steps"][2]["exit_code"], 143, "{e}");
    let busy = e["steps_busy"].as_f64().unwrap();
    assert!(busy > 0.0 && busy <= 1.0, "{e}");
    let text = c.gpuctl_ok(&["efficiency", "1"]);
    assert!(text.contains("Steps: 3") && text.contains("1.2"), "{text}");
}

/// Steps into a running job by id: stdin reaches the step, its exit code is gpuctl's,
/// it runs as the job's user in the job's workdir; another user is refused; a cancel
/// of the job ends a step still running.
#[test]
fn steps_by_job_id_are_the_owners_and_end_with_the_job() {
    let Some(_) = ensure_user("gpuctl-alice") else {
        return;
    };
    ensure_user("gpuctl-bob");
    let c = Cluster::start(&[("n1", "2xA100-80GB")]);
    let home = c.user_dir("gpuctl-alice");
    std::fs::write(
        home.join("job.toml"),
        "name = \"hold\"\ncommand = [\"sleep\", \"600\"]\n[resources]\ngpus = 1\n",
    )
    .unwrap();
    let out = c.gpuctl_as("gpuctl-alice", &home, &["submit", "--json", "job.toml"]);
    let id = gpuctl_tests::submitted_id(&out);
    assert!(wait_for(T, || c.job(id)["launch_time"].is_string()));
    let ids = id.to_string();
    // As alice, through her own CLI: stdin in, the code out, her identity there.
    let mut child = Command::new("runuser")
        .args(["-u", "gpuctl-alice", "--"])
        .arg(bin("gpuctl"))
        .args(["--controller", &c.url(), "run", "--jobid", &ids, "--"])
        .args([
            "sh",
            "-c",
            "cat; id -un; pwd; echo $CUDA_VISIBLE_DEVICES >&2; exit 5",
        ])
        .current_dir(&home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"line one\nline two\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stdout} {stderr}");
    assert_eq!(
        stdout,
        format!("line one\nline two\ngpuctl-alice\n{}\n", home.display())
    );
    assert!(stderr.starts_with("GPU-"), "{stderr}");
    // Bob may not step into alice's job.
    let out = c.gpuctl_as("gpuctl-bob", &home, &["run", "--jobid", &ids, "--", "id"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("belongs to gpuctl-alice"), "{err}");
    // Without a terminal, a TERM to gpuctl is passed on to the step by name.
    let mut termed = Command::new(bin("gpuctl"))
        .args(["run", "--jobid", &ids, "--", "sh", "-c"])
        .arg("trap 'echo got-term; exit 4' TERM; echo ready; sleep 60 & wait")
        .env("GPUCTL_CONTROLLER", c.url())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(termed.stdout.take().unwrap()));
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(termed.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "got-term");
    assert_eq!(termed.wait().unwrap().code(), Some(4));
    // A step still running when the job is cancelled ends with it.
    let started = || {
        c.agent_log("n1")
            .matches("step from outside the job started")
            .count()
    };
    let before = started();
    let mut long = Command::new(bin("gpuctl"))
        .args(["run", "--jobid", &ids, "--", "sleep", "300"])
        .env("GPUCTL_CONTROLLER", c.url())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let opened = wait_for(T, || started() > before);
    assert!(opened, "{}", c.agent_log("n1"));
    c.gpuctl_ok(&["cancel", &ids]);
    let ended = wait_for(T, || matches!(long.try_wait(), Ok(Some(_))));
    assert!(ended, "the step outlived its job");
    let status = long.wait().unwrap();
    assert!(!status.success(), "{status}");
    c.wait_state(id, "CANCELLED", T);
}

/// On the wire: a StepIo that is not signed by a node is refused (UNAUTHENTICATED); one
/// that opens with anything but its step's name, and an Interact that does not open a
/// step first, are INVALID_ARGUMENT; a step into a job that does not exist is NOT_FOUND.
#[test]
fn forged_or_malformed_step_streams_are_refused() {
    use gpuctl_proto::{self as pb, step_input::Input, step_output::Output};
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let tcp = c.tcp_url();
    let url = c.url();
    let codes = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async move {
            let channel = tonic::transport::Endpoint::from_shared(tcp)
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut agent = pb::agent_link_client::AgentLinkClient::new(channel);
            let hello = pb::StepOutput {
                output: Some(Output::Hello(pb::StepHello {
                    node: "n1".into(),
                    step: vec![7; 16],
                })),
            };
            let unsigned = agent
                .step_io(tokio_stream::iter(vec![hello]))
                .await
                .unwrap_err()
                .code();
            let stdout_first = pb::StepOutput {
                output: Some(Output::Stdout(b"x".to_vec())),
            };
            let no_hello = agent
                .step_io(tokio_stream::iter(vec![stdout_first]))
                .await
                .unwrap_err()
                .code();
            let path = url.strip_prefix("unix:").unwrap().to_string();
            let channel = tonic::transport::Endpoint::from_static("http://local")
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await
                .unwrap();
            let mut user = pb::controller_client::ControllerClient::new(channel);
            let stdin_first = pb::StepInput {
                input: Some(Input::Stdin(b"x".to_vec())),
            };
            let no_open = user
                .interact(tokio_stream::iter(vec![stdin_first]))
                .await
                .unwrap_err()
                .code();
            let open = pb::StepInput {
                input: Some(Input::Open(pb::OpenStep {
                    job_id: 999,
                    args: vec!["--".into(), "true".into()],
                    ..Default::default()
                })),
            };
            let missing = user
                .interact(tokio_stream::iter(vec![open]))
                .await
                .unwrap_err()
                .code();
            (unsigned, no_hello, no_open, missing)
        });
    use tonic::Code;
    assert_eq!(
        codes,
        (
            Code::Unauthenticated,
            Code::InvalidArgument,
            Code::InvalidArgument,
            Code::NotFound
        )
    );
}

/// An allocation over two nodes: `gpuctl run` in its shell runs on both (as srun in it
/// would), each node's tasks with their ranks and GPUs, output from both; `-N 1` runs on
/// the first node only; the exit code is the worst node's.
#[test]
fn a_two_node_allocation_runs_its_steps_on_both_nodes() {
    let c = Cluster::start(&[
        ("node-a.invalid", "2xA100-80GB"),
        ("node-b.invalid", "2xA100-80GB"),
    ]);
    let path = format!("{}:{}", bin_dir().display(), std::env::var("PATH").unwrap());
    let inner = "gpuctl run -- sh -c 'echo R=$SLURM_PROCID L=$SLURM_LOCALID N=$SLURM_NODEID W=$SLURM_NTASKS H=$GPUCTL_NODE G=$CUDA_VISIBLE_DEVICES' > all.out; \
                 gpuctl run -N 1 -n 1 -- sh -c 'echo one=$GPUCTL_NODE' > one.out; \
                 gpuctl run -- sh -c 'test $SLURM_NODEID = 0 || exit 9'; echo worst=$? >> one.out";
    let out = Command::new(bin("gpuctl"))
        .args([
            "alloc",
            "-N",
            "2",
            "--ntasks-per-node",
            "2",
            "-G",
            "4",
            "-t",
            "10",
        ])
        .args(["--", "sh", "-c", inner])
        .env("GPUCTL_CONTROLLER", c.url())
        .env("PATH", &path)
        .current_dir(c.path(""))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let all = std::fs::read_to_string(c.path("all.out")).unwrap();
    let mut lines: Vec<&str> = all.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines.len(), 4, "{all}");
    for (rank, l) in lines.iter().enumerate() {
        let node = rank / 2;
        let host = if node == 0 {
            "node-a.invalid"
        } else {
            "node-b.invalid"
        };
        let want = format!("R={rank} L={} N={node} W=4 H={host} G=GPU-", rank % 2);
        assert!(l.starts_with(&want), "{l} (want {want}...)");
        assert!(!l.contains(','), "one GPU a task: {l}");
    }
    let one = std::fs::read_to_string(c.path("one.out")).unwrap();
    assert_eq!(one, "one=node-a.invalid\nworst=9\n");
    let j = c.wait_state(1, "COMPLETED", T);
    let steps = j["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3, "{j}");
    assert_eq!(steps[0]["tasks"], 4, "{j}");
    assert_eq!(steps[0]["nodes"].as_array().unwrap().len(), 2, "{j}");
    assert_eq!(steps[1]["tasks"], 1, "{j}");
    // The node that took no part recorded it only to keep ids alike: not listed.
    assert_eq!(
        steps[1]["nodes"],
        serde_json::json!(["node-a.invalid"]),
        "{j}"
    );
    assert_eq!(steps[2]["exit_code"], 9, "{j}");
}

/// A controller stopping under an open step ends the step's relay: it stops at once
/// (exit 0, not after its shutdown bound), the client hears why, and the step on the
/// node is hung up (its process ends).
#[test]
fn a_stopping_controller_ends_its_relayed_steps() {
    let mut c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let id = c.submit(
        "hold.toml",
        "name = \"hold\"\ncommand = [\"sleep\", \"600\"]\n[resources]\ngpus = 1\n",
    );
    assert!(wait_for(T, || c.job(id)["launch_time"].is_string()));
    let marker = c.path("step.pid");
    let script = format!("echo $$ > {}; exec sleep 300", marker.display());
    let step = Command::new(bin("gpuctl"))
        .args(["run", "--jobid", &id.to_string(), "--", "sh", "-c", &script])
        .env("GPUCTL_CONTROLLER", c.url())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = gpuctl_tests::wait_for_pid(&marker, T);
    let t = std::time::Instant::now();
    let status = c.stop_controller();
    assert!(status.success(), "{status}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the open step held the controller up for {:?}",
        t.elapsed()
    );
    let out = step.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("shutting down"), "{err}");
    let gone = wait_for(T, || !gpuctl_tests::process_alive(pid));
    assert!(gone, "the step's process outlived its relay");
}
