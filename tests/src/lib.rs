//! Harness for the integration tests in `tests/tests/`: starts the real `gpuctld` and
//! `gpud` binaries on loopback ports in temp dirs and drives them with the real `gpuctl`.
//!
//! The binaries are built once per test process with `cargo build` (same target dir), so
//! `cargo test --workspace` always tests the current code.

use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod faults;
pub mod replicated;
mod tools;
pub use tools::{scrape, venv_python};

static BUILD: Once = Once::new();

/// Directory holding the built binaries.
pub fn bin_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    BUILD.call_once(|| {
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args([
                "build",
                "--quiet",
                "-p",
                "gpuctl",
                "-p",
                "gpuctld",
                "-p",
                "gpud",
                "-p",
                "gpuctl-sim",
            ])
            .current_dir(&root)
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building the binaries failed");
    });
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    target.join("debug")
}

pub fn bin(name: &str) -> PathBuf {
    bin_dir().join(name)
}

/// A controller config for tests: short grace, and a periodic pass so rare that any
/// prompt start proves the event-driven path.
pub const TEST_CONFIG: &str = r#"
kill_grace = "1s"
sched_interval = "1h"
default_time_limit = "10m"
"#;

pub struct Agent {
    pub name: String,
    child: Child,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub port: u16,
    ctld: Option<(Child, ChildStdout)>,
    pub agents: Vec<Agent>,
    /// Agents killed during the test (their cgroups are cleaned up at the end too).
    gone: Vec<String>,
    /// More arguments for gpuctld (every start).
    pub ctld_args: Vec<String>,
    /// TLS and joined nodes (the product's default). `false` (most tests): the
    /// controller runs with `--insecure-shared-key --insecure`, and agents sign with
    /// the cluster key over plain TCP, which is what those tests exercise.
    pub secure: bool,
}

impl Cluster {
    /// A controller and one agent per `(name, fake GPU spec)`, all registered.
    pub fn start(agents: &[(&str, &str)]) -> Cluster {
        let mut c = Cluster::controller_only();
        for (name, spec) in agents {
            c.add_agent(name, spec, &[]);
        }
        c.wait_nodes_up(agents.len());
        c
    }

    pub fn controller_only() -> Cluster {
        Cluster::controller_with_config("")
    }

    /// A controller whose config is `TEST_CONFIG` plus `extra` (TOML).
    pub fn controller_with_config(extra: &str) -> Cluster {
        Cluster::build(extra, false)
    }

    /// A controller in the default mode: TLS on TCP, nodes join with tokens
    /// ([`Cluster::join_agent`]).
    pub fn secure_controller() -> Cluster {
        Cluster::build("", true)
    }

    /// `secure_controller` whose config is `TEST_CONFIG` plus `extra` (TOML).
    pub fn secure_controller_with_config(extra: &str) -> Cluster {
        Cluster::build(extra, true)
    }

    fn build(extra: &str, secure: bool) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        // Other users (the tests' job users) must reach the socket inside.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        }
        std::fs::write(
            dir.path().join("gpuctld.toml"),
            format!("{TEST_CONFIG}{extra}\n"),
        )
        .unwrap();
        let mut c = Cluster {
            dir,
            port: 0,
            ctld: None,
            agents: Vec::new(),
            gone: Vec::new(),
            ctld_args: Vec::new(),
            secure,
        };
        c.start_controller();
        c
    }

    /// A controller started with more arguments (e.g. `--metrics-listen ADDR`).
    pub fn controller_with_args(args: &[&str]) -> Cluster {
        let mut c = Cluster::controller_with_config("");
        c.kill9_controller();
        c.ctld_args = args.iter().map(|a| a.to_string()).collect();
        c.start_controller();
        c
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Where gpuctl talks to the controller: its Unix socket (callers are who their uid is).
    pub fn url(&self) -> String {
        format!("unix:{}", self.path("gpuctld.sock").display())
    }

    /// The controller's TCP address (agents; token clients).
    pub fn tcp_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The cluster key gpuctld created in its state dir.
    pub fn key_file(&self) -> PathBuf {
        self.path("ctld-state/cluster.key")
    }

    /// Starts gpuctld (on the port it had before, after the first start).
    pub fn start_controller(&mut self) {
        assert!(self.ctld.is_none(), "controller already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("gpuctld.log"))
            .unwrap();
        let mut child = Command::new(bin("gpuctld"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--state-dir")
            .arg(self.path("ctld-state"))
            .arg("--socket")
            .arg(self.path("gpuctld.sock"))
            .arg("--config")
            .arg(self.path("gpuctld.toml"))
            .args(&self.ctld_args)
            .args(if self.secure {
                &[][..]
            } else {
                &["--insecure-shared-key", "--insecure"][..]
            })
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start gpuctld");
        let stdout = child.stdout.take().unwrap();
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line).expect("read gpuctld stdout");
        let addr = line
            .trim()
            .strip_prefix("gpuctld listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "unexpected gpuctld output {line:?}; see {}",
                    self.path("gpuctld.log").display()
                )
            });
        self.port = addr.rsplit(':').next().unwrap().parse().unwrap();
        self.ctld = Some((child, reader.into_inner()));
    }

    /// The controller's pid.
    pub fn controller_pid(&self) -> nix::unistd::Pid {
        let (child, _) = self.ctld.as_ref().expect("controller running");
        nix::unistd::Pid::from_raw(child.id() as i32)
    }

    /// `kill -9` the controller.
    pub fn kill9_controller(&mut self) {
        if let Some((mut child, _)) = self.ctld.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// SIGTERM the controller and wait for it to exit; returns its exit status.
    pub fn stop_controller(&mut self) -> std::process::ExitStatus {
        let (mut child, _) = self.ctld.take().expect("controller running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        child.wait().unwrap()
    }

    pub fn add_agent(&mut self, name: &str, spec: &str, extra: &[&str]) {
        let key = self.key_file();
        self.add_agent_with_key(name, spec, &key, extra);
    }

    /// Starts gpud with only `args` for its GPUs (e.g. `--fake-gpus-file F`).
    pub fn add_agent_raw(&mut self, name: &str, args: &[&str]) {
        let key = self.key_file();
        self.spawn_agent(name, None, &key, args);
    }

    /// Starts gpud `name` on the fake GPUs (and scripted metrics) of `gpus`, a
    /// `--fake-gpus-file` written to `<name>-gpus.toml`, sampling every `sample`.
    pub fn add_agent_gpus_file(&mut self, name: &str, gpus: &str, sample: &str) {
        let file = self.path(&format!("{name}-gpus.toml"));
        std::fs::write(&file, gpus).unwrap();
        let file = file.to_str().unwrap().to_string();
        self.add_agent_raw(
            name,
            &["--fake-gpus-file", &file, "--sample-interval", sample],
        );
    }

    /// A join token for `node` (empty: any), created over the socket: (token, CA
    /// fingerprint).
    pub fn join_token(&self, node: &str, ttl: &str) -> (String, String) {
        let t = self.json(&[
            "admin",
            "join-token",
            "create",
            "--node",
            node,
            "--ttl",
            ttl,
        ]);
        (
            t["token"].as_str().unwrap().to_string(),
            t["ca_fingerprint"].as_str().unwrap().to_string(),
        )
    }

    /// The controller's TLS URL.
    pub fn https_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Starts gpud that joins a secure cluster with a fresh token for `name` (given in a
    /// join file, as an operator does).
    pub fn join_agent(&mut self, name: &str, spec: &str) {
        let (token, fp) = self.join_token(name, "1h");
        let file = join_file(&self.path(&format!("join-{name}.json")), &token, &fp);
        self.spawn_gpud(
            name,
            &["--fake-gpus", spec, "--join-file", file.to_str().unwrap()],
        );
    }

    /// Starts gpud for a secure cluster with `args` (its URL, name, state dir and
    /// cgroup parent are given).
    pub fn spawn_gpud(&mut self, name: &str, args: &[&str]) {
        self.spawn_gpud_at(name, name, args);
    }

    /// The same, the harness knowing it as `label` (its state dir `gpud-<label>`).
    pub fn spawn_gpud_at(&mut self, label: &str, name: &str, args: &[&str]) {
        let mut cmd = Command::new(bin("gpud"));
        cmd.args(["--controller", &self.https_url(), "--name", name])
            .args(["--heartbeat-interval", "1s", "--allow-root-jobs"])
            .arg("--cgroup-parent")
            .arg(self.cgroup_parent(name))
            .arg("--state-dir")
            .arg(self.path(&format!("gpud-{label}")))
            .args(args);
        self.launch_gpud(label, cmd);
    }

    /// Starts `cmd` (a gpud) logging to `gpud-<label>.log`; the harness knows it as
    /// `label`.
    fn launch_gpud(&mut self, label: &str, mut cmd: Command) {
        let log = std::fs::File::create(self.path(&format!("gpud-{label}.log"))).unwrap();
        let child = cmd.stderr(log).spawn().expect("start gpud");
        self.agents.push(Agent {
            name: label.to_string(),
            child,
        });
    }

    /// Starts gpud with the given cluster key file.
    pub fn add_agent_with_key(&mut self, name: &str, spec: &str, key: &Path, extra: &[&str]) {
        self.spawn_agent(name, Some(spec), key, extra);
    }

    fn spawn_agent(&mut self, name: &str, spec: Option<&str>, key: &Path, extra: &[&str]) {
        let mut cmd = Command::new(bin("gpud"));
        cmd.args(["--controller", &self.tcp_url(), "--name", name])
            .args(spec.map(|s| ["--fake-gpus", s]).into_iter().flatten())
            .args([
                "--cpus",
                "16",
                "--memory",
                "64GiB",
                "--heartbeat-interval",
                "1s",
                // The tests run as root and submit as root.
                "--allow-root-jobs",
            ])
            .arg("--cgroup-parent")
            .arg(self.cgroup_parent(name))
            .arg("--state-dir")
            .arg(self.path(&format!("gpud-{name}")))
            .arg("--key-file")
            .arg(key)
            .args(extra);
        self.launch_gpud(name, cmd);
    }

    /// Starts gpud with only its name, the cluster key and `args` (no fake GPUs, state
    /// dir, cgroup parent or `--allow-root-jobs` unless `args` give them), logging to
    /// `gpud-<label>.log`; the harness knows it as `label`.
    pub fn add_agent_custom(&mut self, label: &str, name: &str, args: &[&str]) {
        let mut cmd = Command::new(bin("gpud"));
        cmd.args(["--name", name, "--heartbeat-interval", "1s"])
            .arg("--key-file")
            .arg(self.key_file())
            .args(args);
        self.launch_gpud(label, cmd);
    }

    /// The text an agent logged so far.
    pub fn agent_log(&self, label: &str) -> String {
        std::fs::read_to_string(self.path(&format!("gpud-{label}.log"))).unwrap_or_default()
    }

    /// The text the controller logged so far.
    pub fn controller_log(&self) -> String {
        std::fs::read_to_string(self.path("gpuctld.log")).unwrap_or_default()
    }

    /// Runs gpuctl in the cluster's dir and returns its output, whatever the exit code.
    pub fn gpuctl(&self, args: &[&str]) -> Output {
        Command::new(bin("gpuctl"))
            .args(args)
            .env("GPUCTL_CONTROLLER", self.url())
            .current_dir(self.dir.path())
            .output()
            .expect("run gpuctl")
    }

    /// Runs gpuctl in the cluster's dir with `input` on its standard input; its output,
    /// whatever the exit code.
    pub fn gpuctl_stdin(&self, args: &[&str], input: &[u8]) -> Output {
        use std::io::Write as _;
        let mut child = Command::new(bin("gpuctl"))
            .args(args)
            .env("GPUCTL_CONTROLLER", self.url())
            .current_dir(self.dir.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run gpuctl");
        child
            .stdin
            .take()
            .expect("its stdin")
            .write_all(input)
            .expect("write gpuctl's stdin");
        child.wait_with_output().expect("gpuctl's output")
    }

    /// Runs gpuctl, asserts success, returns stdout.
    pub fn gpuctl_ok(&self, args: &[&str]) -> String {
        let out = self.gpuctl(args);
        assert!(
            out.status.success(),
            "gpuctl {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        serde_json::from_str(&self.gpuctl_ok(&a)).expect("gpuctl --json output is JSON")
    }

    /// Writes a job file into the cluster dir and submits it; returns the job id.
    pub fn submit(&self, file: &str, toml: &str) -> u64 {
        std::fs::write(self.path(file), toml).unwrap();
        let v = self.json(&["submit", file]);
        v["job_id"].as_u64().expect("job_id")
    }

    pub fn job(&self, id: u64) -> Value {
        self.json(&["show", &id.to_string()])
    }

    pub fn nodes(&self) -> Value {
        self.json(&["nodes"])
    }

    pub fn node_state(&self, name: &str) -> String {
        self.nodes()
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .map(|n| n["state"].as_str().unwrap().to_string())
            .unwrap_or_default()
    }

    /// Waits until job `id` is in `state`; returns the job object.
    pub fn wait_state(&self, id: u64, state: &str, timeout: Duration) -> Value {
        let mut last = Value::Null;
        let found = wait_for(timeout, || {
            last = self.job(id);
            last["state"] == state
        });
        assert!(found, "job {id} never reached {state}; last seen: {last:#}");
        last
    }

    pub fn wait_nodes_up(&self, n: usize) {
        let ok = wait_for(Duration::from_secs(20), || {
            let out = self.gpuctl(&["nodes", "--json"]);
            out.status.success()
                && serde_json::from_slice::<Value>(&out.stdout)
                    .ok()
                    .and_then(|v| v.as_array().cloned())
                    .is_some_and(|a| a.iter().filter(|n| n["state"] != "DOWN").count() >= n)
        });
        assert!(ok, "agents did not register");
    }

    /// A cgroup parent no other test cluster uses (tests run in parallel, and every
    /// cluster has its own job 1).
    pub fn cgroup_parent(&self, node: &str) -> String {
        let tag = self
            .dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace('.', "");
        format!("gpuctl-test/{tag}-{node}")
    }

    /// Sends `sig` to an agent (SIGSTOP freezes it, SIGCONT thaws it).
    /// The agent's exit status once it has exited.
    pub fn agent_exited(&mut self, name: &str) -> Option<std::process::ExitStatus> {
        let a = self.agents.iter_mut().find(|a| a.name == name).unwrap();
        a.child.try_wait().unwrap()
    }

    pub fn signal_agent(&self, name: &str, sig: nix::sys::signal::Signal) {
        let a = self.agents.iter().find(|a| a.name == name).unwrap();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(a.child.id() as i32), sig).unwrap();
    }

    /// The agent's process id.
    pub fn agent_pid(&self, name: &str) -> i32 {
        let a = self.agents.iter().find(|a| a.name == name).unwrap();
        a.child.id() as i32
    }

    pub fn kill9_agent(&mut self, name: &str) {
        let i = self.agents.iter().position(|a| a.name == name).unwrap();
        let mut a = self.agents.remove(i);
        a.child.kill().unwrap();
        a.child.wait().unwrap();
        self.gone.push(a.name);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut names: Vec<String> = self.agents.iter().map(|a| a.name.clone()).collect();
        names.extend(self.gone.iter().cloned());
        for a in &mut self.agents {
            let _ = a.child.kill();
            let _ = a.child.wait();
        }
        self.kill9_controller();
        // Jobs still running when a test ends (their agent was killed) and the cgroup
        // parents are ours to remove.
        for hierarchy in CGROUP_HIERARCHIES {
            for n in &names {
                let dir = Path::new("/sys/fs/cgroup")
                    .join(hierarchy)
                    .join(self.cgroup_parent(n));
                remove_cgroup_tree(&dir);
            }
        }
    }
}

/// Where under /sys/fs/cgroup an agent's job cgroups can be: the cgroup2 root (pure
/// v2), the v1 controllers and the hybrid cgroup2 mount.
pub const CGROUP_HIERARCHIES: [&str; 5] = ["", "cpu", "memory", "pids", "unified"];

/// Kills every process in the job cgroups under `dir`, then removes them and `dir`.
pub(crate) fn remove_cgroup_tree(dir: &Path) {
    let Ok(jobs) = std::fs::read_dir(dir) else {
        return;
    };
    for job in jobs.flatten().filter(|e| e.path().is_dir()) {
        for _ in 0..50 {
            let procs =
                std::fs::read_to_string(job.path().join("cgroup.procs")).unwrap_or_default();
            if procs.trim().is_empty() {
                break;
            }
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = std::fs::remove_dir(job.path());
    }
    let _ = std::fs::remove_dir(dir);
}

/// The value of the metric named `name` (a whole line's first word, e.g.
/// `gpuctl_schedule_pass_seconds_sum`) of the controller that `start_bench_controller`
/// started in `dir`.
pub fn bench_metric(dir: &Path, name: &str) -> Option<f64> {
    use std::io::{Read as _, Write as _};
    let addr = std::fs::read_to_string(dir.join("metrics-addr")).ok()?;
    let mut conn = std::net::TcpStream::connect(addr.trim()).ok()?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    text.lines().find_map(|l| {
        let (metric, value) = l.split_once(' ')?;
        (metric == name).then(|| value.trim().parse().ok())?
    })
}

/// A TCP port on loopback that was free a moment ago (for `--metrics-listen`,
/// `--web-listen`, a Prometheus).
pub fn free_port() -> u16 {
    // The kernel may hand a port just released back out at once: a test that asked
    // for two (a controller's gRPC and metrics ports) got the same one twice. Never
    // the same port twice in one test process.
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if given.insert(port) {
            return port;
        }
    }
}

/// Polls `f` every 50 ms until it is true or `timeout` passes.
pub fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether a process with this pid exists (and is not a zombie).
/// Waits until `path` holds a process id (a job writes it with `echo $$ > FILE`: the
/// file exists, empty, before the number is in it) and answers it.
pub fn wait_for_pid(path: &Path, timeout: Duration) -> i32 {
    let read = || {
        std::fs::read_to_string(path)
            .ok()?
            .trim()
            .parse::<i32>()
            .ok()
    };
    assert!(
        wait_for(timeout, || read().is_some()),
        "no pid in {}",
        path.display()
    );
    read().expect("read above")
}

pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// Writes a join file for `gpud --join-file` at `path` (mode 0600, as the JSON that
/// `gpuctl admin join-token create --json` prints) and answers the path.
pub fn join_file(path: &Path, token: &str, ca_fingerprint: &str) -> PathBuf {
    use std::os::unix::fs::OpenOptionsExt as _;
    let text = serde_json::json!({ "token": token, "ca_fingerprint": ca_fingerprint });
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .expect("create the join file");
    std::io::Write::write_all(&mut f, text.to_string().as_bytes()).unwrap();
    path.to_path_buf()
}

/// Says that a test did not run (or ran in part) for want of `what`, where a person
/// running the tests sees it (the harness captures `eprintln!`, not stderr itself),
/// and fails instead where `require` names an environment variable that is set (CI
/// sets them after installing what the tests use).
pub fn skipped(require: &str, what: &str) {
    assert!(
        std::env::var_os(require).is_none(),
        "{require} is set, and this test needs {what}"
    );
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED (in part): {} needs {what}",
        std::thread::current().name().unwrap_or("a test")
    );
}

/// Creates (once) a non-root user for the tests and returns its uid; `None` when the
/// tests do not run as root. Several test processes may race here: useradd holds a
/// lock on /etc/passwd, so a failed attempt is retried.
pub fn ensure_user(name: &str) -> Option<u32> {
    if !nix::unistd::geteuid().is_root() {
        skipped(
            "GPUCTL_REQUIRE_ROOT",
            &format!("root (to create user {name})"),
        );
        return None;
    }
    for _ in 0..50 {
        if let Some(u) = nix::unistd::User::from_name(name).ok().flatten() {
            return Some(u.uid.as_raw());
        }
        let _ = Command::new("useradd")
            .args(["--create-home", "--shell", "/bin/sh", name])
            .stderr(Stdio::null())
            .status();
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("cannot create user {name}");
}

impl Cluster {
    /// Runs gpuctl as `user` (through runuser) in `cwd`, against the controller's socket.
    pub fn gpuctl_as(&self, user: &str, cwd: &Path, args: &[&str]) -> Output {
        Command::new("runuser")
            .args(["-u", user, "--"])
            .arg(bin("gpuctl"))
            .arg("--controller")
            .arg(self.url())
            .args(args)
            .env_remove("GPUCTL_TOKEN")
            .current_dir(cwd)
            .output()
            .expect("run gpuctl through runuser")
    }

    /// A directory `user` owns, inside the cluster dir.
    pub fn user_dir(&self, user: &str) -> PathBuf {
        let dir = self.path(&format!("home-{user}"));
        std::fs::create_dir_all(&dir).unwrap();
        let u = nix::unistd::User::from_name(user).unwrap().unwrap();
        nix::unistd::chown(&dir, Some(u.uid), Some(u.gid)).unwrap();
        dir
    }
}

/// For the benchmarks in `tests/benches`: the value of `--name N` on the command line.
pub fn bench_arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// For the benchmarks: builds `packages` in release mode and returns the directory of
/// the binaries (the tests use debug builds; numbers come from release ones).
/// `GPUCTL_BENCH_BINS=DIR` takes DIR's binaries instead (another build, to compare).
pub fn release_bins(packages: &[&str]) -> PathBuf {
    if let Some(dir) = std::env::var_os("GPUCTL_BENCH_BINS") {
        return std::fs::canonicalize(dir).expect("GPUCTL_BENCH_BINS");
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let st = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--quiet"])
        .args(packages.iter().flat_map(|p| ["-p", p]))
        .current_dir(root)
        .status()
        .expect("cargo build --release");
    assert!(st.success(), "release build failed");
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("release")
}

/// For the benchmarks: a release `gpuctld` (`bin`) with its state in `dir/ctld`, its Unix
/// socket at `dir/gpuctld.sock`, a 1-hour default time limit, no cap on one user's
/// pending jobs to speak of, and quiet logs, on an
/// ephemeral loopback port. Answers the process and its agent address (HOST:PORT).
pub fn start_bench_controller(bin: &Path, dir: &Path) -> (std::process::Child, String) {
    start_bench_controller_in(bin, dir, false)
}

/// `start_bench_controller`, in the default mode (TLS, nodes join with tokens) when
/// `tls`, else with `--insecure-shared-key --insecure` (plain TCP, the cluster key).
pub fn start_bench_controller_in(
    bin: &Path,
    dir: &Path,
    tls: bool,
) -> (std::process::Child, String) {
    // Room for the latency bench's 100,000 queued jobs (arrays of 10,000).
    std::fs::write(
        dir.join("gpuctld.toml"),
        "default_time_limit = \"1h\"\n[limits]\nmax_pending_per_user = 1000000\n",
    )
    .unwrap();
    // Its Prometheus endpoint, for what only it measures (`bench_metric`).
    let metrics = format!("127.0.0.1:{}", free_port());
    std::fs::write(dir.join("metrics-addr"), &metrics).unwrap();
    let mut ctld = Command::new(bin.join("gpuctld"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            &metrics,
            "--state-dir",
        ])
        .arg(dir.join("ctld"))
        .arg("--socket")
        .arg(dir.join("gpuctld.sock"))
        .arg("--config")
        .arg(dir.join("gpuctld.toml"))
        .args(if tls {
            &[][..]
        } else {
            &["--insecure-shared-key", "--insecure"][..]
        })
        .env("GPUCTL_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(ctld.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let addr = line.trim().rsplit(' ').next().unwrap().to_string();
    (ctld, addr)
}

/// For the benchmarks: a release `gpud` named `bench` attached to the controller at
/// `addr` (as `start_bench_controller` answers it), with 8 fake A100s, 64 CPUs and
/// 512 GiB, running root's jobs, its state in `dir/gpud`, quiet logs; `extra` adds
/// flags (its cgroup parent, intervals).
pub fn start_bench_agent(bin: &Path, dir: &Path, addr: &str, extra: &[&str]) -> Child {
    start_bench_node(bin, dir, addr, "bench", extra)
}

/// `start_bench_agent` for one of several nodes on this host: named `name`, its state
/// in `dir/gpud-NAME` (`dir/gpud` for `bench`).
pub fn start_bench_node(bin: &Path, dir: &Path, addr: &str, name: &str, extra: &[&str]) -> Child {
    let key = dir.join("ctld/cluster.key");
    let auth = ["--key-file", key.to_str().unwrap()];
    start_bench_node_as(bin, dir, &format!("http://{addr}"), name, &auth, extra)
}

/// `start_bench_node` for a controller in the default mode: it joins with a fresh
/// token made over the controller's socket and dials `https://addr`.
pub fn start_bench_node_joined(
    bin: &Path,
    dir: &Path,
    addr: &str,
    name: &str,
    extra: &[&str],
) -> Child {
    let out = bench_cli(
        bin,
        dir,
        &["admin", "join-token", "create", "--node", name, "--json"],
    );
    let t: Value = serde_json::from_str(&out).unwrap();
    let file = join_file(
        &dir.join(format!("join-{name}.json")),
        t["token"].as_str().unwrap(),
        t["ca_fingerprint"].as_str().unwrap(),
    );
    let auth = ["--join-file", file.to_str().unwrap()];
    start_bench_node_as(bin, dir, &format!("https://{addr}"), name, &auth, extra)
}

fn start_bench_node_as(
    bin: &Path,
    dir: &Path,
    url: &str,
    name: &str,
    auth: &[&str],
    extra: &[&str],
) -> Child {
    let state = if name == "bench" {
        dir.join("gpud")
    } else {
        dir.join(format!("gpud-{name}"))
    };
    Command::new(bin.join("gpud"))
        .args(["--controller", url, "--name", name])
        .args(["--fake-gpus", "8xA100-80GB", "--cpus", "64"])
        .args(["--memory", "512GiB", "--allow-root-jobs"])
        .args(extra)
        .args(auth)
        .arg("--state-dir")
        .arg(state)
        .env("GPUCTL_LOG", "warn")
        .spawn()
        .unwrap()
}

/// For the benchmarks: runs the release `gpuctl` in `bin` against the controller that
/// `start_bench_controller` started in `dir` (its Unix socket), from `dir`, and answers
/// its stdout; panics with its stderr (and its first arguments) when it fails.
pub fn bench_cli(bin: &Path, dir: &Path, args: &[&str]) -> String {
    let out = Command::new(bin.join("gpuctl"))
        .arg("--controller")
        .arg(format!("unix:{}", dir.join("gpuctld.sock").display()))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpuctl {:?}...: {}",
        &args[..args.len().min(3)],
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// For the benchmarks: Unix ms of an RFC 3339 UTC time as the CLI prints it (`2026-12-02T03:31:35.123Z`).
pub fn unix_ms(v: &Value) -> i64 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a time: {v}"));
    let n = |r: std::ops::Range<usize>| s[r].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let secs = n(11..13) * 3600 + n(14..16) * 60 + n(17..19);
    let frac = s[19..]
        .strip_prefix('.')
        .map_or(0, |f| f.trim_end_matches('Z')[..3].parse::<i64>().unwrap());
    (days * 86_400 + secs) * 1000 + frac
}

/// The job id a `gpuctl submit --json` answered; panics with its stderr when it failed.
pub fn submitted_id(out: &Output) -> u64 {
    assert!(
        out.status.success(),
        "gpuctl submit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("submit --json answers JSON");
    v["job_id"].as_u64().expect("job_id")
}

/// For the benchmarks: a text argument of the bench (`--name VALUE`).
pub fn bench_text_arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

/// For the benchmarks: the job files they submit, in `dir`: `true.toml`, `date.toml`
/// (the program's own clock in microseconds, into `out/<id>.txt`), `sleep.toml` (1 s)
/// and `hold.toml` (an hour), each one GPU and one CPU.
pub fn write_bench_jobs(dir: &Path) {
    std::fs::create_dir_all(dir.join("out")).unwrap();
    for (file, command, stdout) in [
        ("true.toml", "\"true\"", "/dev/null"),
        ("date.toml", "\"date\", \"+%s%6N\"", "out/%j.txt"),
        ("sleep.toml", "\"sleep\", \"1\"", "/dev/null"),
        ("hold.toml", "\"sleep\", \"3600\"", "/dev/null"),
    ] {
        std::fs::write(
            dir.join(file),
            format!(
                "command = [{command}]\nstdout = \"{stdout}\"\n[resources]\ngpus = 1\ncpus = 1\n"
            ),
        )
        .unwrap();
    }
}
