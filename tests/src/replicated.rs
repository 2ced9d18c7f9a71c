//! Replicated controllers for the end-to-end tests and the failover bench: three (or
//! more) real `gpuctld` on loopback with `--id`/`--peers`, each with its own state dir
//! and Unix socket, sharing one cluster key; agents that know every controller; `gpuctl`
//! given every socket (it finds the leader itself).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{TEST_CONFIG, bin, free_port};

pub struct Replicated {
    pub dir: tempfile::TempDir,
    /// Each member's gRPC port, by id (index id - 1).
    pub ports: Vec<u16>,
    /// Each member's metrics and web page ports (`--metrics-listen`, `--web-listen`).
    http_ports: Vec<(u16, u16)>,
    ctlds: std::sync::Mutex<Vec<Option<Child>>>,
    agents: Vec<(String, Child)>,
    /// The gpud binary's directory (debug for tests, release for the bench).
    bins: PathBuf,
    /// Each controller in a network namespace of its own (`start_in_namespaces`).
    net: Option<Net>,
    /// `false`: one controller without `--peers` (the default mode, for comparisons).
    raft: bool,
    /// Keep the logs at drop (a checker found violations; `keep_logs`).
    pub keep: std::sync::atomic::AtomicBool,
    /// TLS, joined nodes and API tokens (the default mode, `start_secure`), instead of
    /// `--insecure-shared-key --insecure`.
    secure: bool,
    /// More flags for every member (`start_args`).
    member_args: Vec<String>,
}

/// Network namespaces on a bridge: member `id` at 10.77.`subnet`.(10 + id), behind the
/// veth pair `g<tag>h<id>` (on the bridge, in this namespace) / `g<tag>n<id>`; the
/// bridge `g<tag>br` holds 10.77.`subnet`.1 (agents and the tests live here).
struct Net {
    tag: String,
    subnet: u8,
}

impl Net {
    fn create(n: usize) -> Result<Net, String> {
        static NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let subnet = (std::process::id() as u8)
            .wrapping_mul(7)
            .wrapping_add(k.wrapping_mul(31));
        let net = Net {
            tag: format!("{:x}{k}", std::process::id() % 0xfff),
            subnet,
        };
        let br = net.bridge();
        ip(&["link", "add", &br, "type", "bridge"])?;
        ip(&["addr", "add", &format!("10.77.{subnet}.1/24"), "dev", &br])?;
        ip(&["link", "set", &br, "up"])?;
        for id in 1..=n as u64 {
            let (ns, host, inner) = (net.ns(id), net.host_end(id), net.inner_end(id));
            ip(&["netns", "add", &ns])?;
            ip(&["link", "add", &host, "type", "veth", "peer", "name", &inner])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &host, "master", &br])?;
            ip(&["link", "set", &host, "up"])?;
            let addr = format!("{}/24", net.addr(id));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &inner])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    fn bridge(&self) -> String {
        format!("g{}br", self.tag)
    }
    fn ns(&self, id: u64) -> String {
        format!("gpuctl-{}-{id}", self.tag)
    }
    fn host_end(&self, id: u64) -> String {
        format!("g{}h{id}", self.tag)
    }
    fn inner_end(&self, id: u64) -> String {
        format!("g{}n{id}", self.tag)
    }
    fn addr(&self, id: u64) -> String {
        format!("10.77.{}.{}", self.subnet, 10 + id)
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether this machine lets tests make network namespaces (root, iproute2); `Err`
/// says why not.
pub fn namespaces_available() -> Result<(), String> {
    let name = format!("gpuctl-probe-{}", std::process::id());
    ip(&["netns", "add", &name])?;
    ip(&["netns", "del", &name])
}

impl Replicated {
    /// `n` controllers (ids 1..=n), started and waited for until one leads.
    pub fn start(n: usize) -> Replicated {
        Replicated::start_with(n, bin("gpuctld").parent().unwrap().to_path_buf(), "")
    }

    /// `start`, with the binaries of `bins` and `extra` configuration (TOML).
    pub fn start_with(n: usize, bins: PathBuf, extra: &str) -> Replicated {
        Replicated::build(n, bins, None, true, extra)
    }

    /// One controller without Raft (no `--id`, `--peers`), driven the same way: the
    /// baseline the bench compares replicas with.
    pub fn single_with(bins: PathBuf, extra: &str) -> Replicated {
        Replicated::build(1, bins, None, false, extra)
    }

    /// `start`, each controller in a network namespace of its own on a bridge, so that
    /// one can be cut off (`partition`) and joined again (`heal`).
    pub fn start_in_namespaces(n: usize) -> Result<Replicated, String> {
        Replicated::start_in_namespaces_with(n, None)
    }

    /// `start_in_namespaces`, on the binaries in `bins` (default: the tests' build).
    pub fn start_in_namespaces_with(n: usize, bins: Option<PathBuf>) -> Result<Replicated, String> {
        let net = Net::create(n)?;
        let bins = bins.unwrap_or_else(|| bin("gpuctld").parent().unwrap().to_path_buf());
        Ok(Replicated::build(n, bins, Some(net), true, ""))
    }

    /// `start` in the default mode: the members serve TLS under one cluster CA (made
    /// here and copied into each state dir with the cluster key, as an operator does),
    /// and agents join with tokens.
    pub fn start_secure(n: usize) -> Replicated {
        let bins = bin("gpuctld").parent().unwrap().to_path_buf();
        Replicated::build_as(n, bins, None, true, "", true, &[])
    }

    /// `n` controllers on the binaries in `bins` with `extra` configuration: in network
    /// namespaces of their own when `namespaces` (`partition` works then), and in the
    /// default mode (TLS, joined nodes) when `secure`.
    pub fn start_custom(
        n: usize,
        bins: PathBuf,
        extra: &str,
        namespaces: bool,
        secure: bool,
    ) -> Result<Replicated, String> {
        let net = if namespaces {
            Some(Net::create(n)?)
        } else {
            None
        };
        Ok(Replicated::build_as(n, bins, net, true, extra, secure, &[]))
    }

    /// `start`, with more gpuctld flags for every member.
    pub fn start_args(n: usize, args: &[&str]) -> Replicated {
        let bins = bin("gpuctld").parent().unwrap().to_path_buf();
        Replicated::build_as(n, bins, None, true, "", false, args)
    }

    fn build(n: usize, bins: PathBuf, net: Option<Net>, raft: bool, extra: &str) -> Replicated {
        Replicated::build_as(n, bins, net, raft, extra, false, &[])
    }

    fn build_as(
        n: usize,
        bins: PathBuf,
        net: Option<Net>,
        raft: bool,
        extra: &str,
        secure: bool,
        args: &[&str],
    ) -> Replicated {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(
            dir.path().join("gpuctld.toml"),
            format!("{TEST_CONFIG}{extra}\n"),
        )
        .unwrap();
        let key: String = (0..32)
            .map(|i| format!("{:02x}", (i * 37 + 11) as u8 ^ std::process::id() as u8))
            .collect();
        let key_file = dir.path().join("cluster.key");
        write_private(&key_file, &key);
        let r = Replicated {
            ports: (0..n).map(|_| free_port()).collect(),
            http_ports: (0..n).map(|_| (free_port(), free_port())).collect(),
            dir,
            ctlds: std::sync::Mutex::new((0..n).map(|_| None).collect()),
            agents: Vec::new(),
            bins,
            net,
            raft,
            keep: Default::default(),
            secure,
            member_args: args.iter().map(|a| a.to_string()).collect(),
        };
        for id in 1..=n as u64 {
            r.start_member(id);
        }
        assert!(
            r.wait_leader(Duration::from_secs(20)).is_some(),
            "no leader elected; see {}",
            r.dir.path().display()
        );
        r
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `--peers` for every member.
    fn peers(&self) -> String {
        (self.ports.iter().enumerate())
            .map(|(i, p)| format!("{}={}:{p}", i + 1, self.host(i as u64 + 1)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A new member's id and address (started: `start_member`), for `gpuctl admin
    /// controllers add`: every member's `--peers` from now on names it too.
    pub fn new_member(&mut self) -> (u64, String) {
        self.ports.push(free_port());
        self.http_ports.push((free_port(), free_port()));
        self.ctlds.get_mut().unwrap().push(None);
        let id = self.ports.len() as u64;
        (
            id,
            format!("{}:{}", self.host(id), self.ports[id as usize - 1]),
        )
    }

    /// Turns the one controller of `single_with` into `n` on Raft: it is killed (`-9`),
    /// and started again with `--id 1 --peers` on its state dir, with `n - 1` new
    /// members on empty ones (docs/operations.md: turning one controller into three).
    pub fn become_replicated(&mut self, n: usize) {
        assert!(
            !self.raft && self.ports.len() == 1,
            "one controller without Raft"
        );
        self.kill9(1);
        self.raft = true;
        for _ in 1..n {
            self.ports.push(free_port());
            self.http_ports.push((free_port(), free_port()));
            self.ctlds.get_mut().unwrap().push(None);
        }
        for id in 1..=n as u64 {
            self.start_member(id);
        }
    }

    /// Starts member `id` (again, after a kill: from its state dir).
    pub fn start_member(&self, id: u64) {
        let i = id as usize - 1;
        let mut ctlds = self.ctlds.lock().unwrap();
        assert!(ctlds[i].is_none(), "controller {id} is running");
        let state = self.path(&format!("ctld-{id}"));
        if !state.join("cluster.key").exists() {
            std::fs::create_dir_all(&state).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
            let key = std::fs::read_to_string(self.path("cluster.key")).unwrap();
            write_private(&state.join("cluster.key"), key.trim());
            if self.secure {
                self.copy_ca(id, &state);
            }
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(&format!("gpuctld-{id}.log")))
            .unwrap();
        let mut cmd = match &self.net {
            Some(net) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &net.ns(id)])
                    .arg(self.bins.join("gpuctld"));
                c
            }
            None => Command::new(self.bins.join("gpuctld")),
        };
        let child = cmd
            .arg("--listen")
            .arg(format!("{}:{}", self.host(id), self.ports[i]))
            .arg("--state-dir")
            .arg(&state)
            .arg("--socket")
            .arg(self.socket(id))
            .arg("--config")
            .arg(self.path("gpuctld.toml"))
            .args(if self.secure {
                &[][..]
            } else {
                &["--insecure-shared-key", "--insecure"][..]
            })
            .args(&self.member_args)
            .arg("--metrics-listen")
            .arg(format!("{}:{}", self.host(id), self.http_ports[i].0))
            .arg("--web-listen")
            .arg(format!("{}:{}", self.host(id), self.http_ports[i].1))
            .args(if self.raft {
                vec![
                    "--id".to_string(),
                    id.to_string(),
                    "--peers".into(),
                    self.peers(),
                ]
            } else {
                Vec::new()
            })
            .env(
                "GPUCTL_LOG",
                std::env::var("GPUCTL_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start gpuctld");
        ctlds[i] = Some(child);
    }

    /// Copies the cluster CA (`ca.pem`, `ca.key`) into member `id`'s new state dir
    /// from a member that has it, as an operator does (docs/operations.md); the first
    /// member makes it. Waits for the first member to have made it.
    fn copy_ca(&self, id: u64, state: &std::path::Path) {
        let from = |m: u64| self.path(&format!("ctld-{m}"));
        let others: Vec<u64> = (1..=self.ports.len() as u64).filter(|m| *m != id).collect();
        let mut found = None;
        crate::wait_for(Duration::from_secs(if id == 1 { 0 } else { 20 }), || {
            // Both written whole (the member writes one file, then the other).
            let made = |m: u64| {
                let read = |f: &str| std::fs::read_to_string(from(m).join(f)).unwrap_or_default();
                read("ca.pem").contains("END CERTIFICATE") && read("ca.key").contains("END")
            };
            found = others.iter().find(|m| made(**m)).copied();
            found.is_some()
        });
        let Some(m) = found else {
            assert_eq!(id, 1, "no member made the cluster CA");
            return;
        };
        for f in ["ca.pem", "ca.key"] {
            let text = std::fs::read_to_string(from(m).join(f)).unwrap();
            let text = text.trim_end();
            write_private(&state.join(f), text);
        }
    }

    /// Where member `id` listens: loopback, or its namespace's address.
    fn host(&self, id: u64) -> String {
        self.net
            .as_ref()
            .map_or_else(|| "127.0.0.1".to_string(), |n| n.addr(id))
    }

    /// Cuts member `id` off from every other (controllers and agents alike).
    pub fn partition(&self, id: u64) {
        let net = self.net.as_ref().expect("started in namespaces");
        ip(&["link", "set", &net.host_end(id), "down"]).unwrap();
    }

    /// Joins member `id` again.
    pub fn heal(&self, id: u64) {
        let net = self.net.as_ref().expect("started in namespaces");
        ip(&["link", "set", &net.host_end(id), "up"]).unwrap();
    }

    /// Member `id`'s Unix socket.
    pub fn socket(&self, id: u64) -> PathBuf {
        self.path(&format!("gpuctld-{id}.sock"))
    }

    /// `kill -9` member `id`.
    pub fn kill9(&self, id: u64) {
        if let Some(mut c) = self.ctlds.lock().unwrap()[id as usize - 1].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The pid of member `id`.
    pub fn pid(&self, id: u64) -> Option<i32> {
        (self.ctlds.lock().unwrap()[id as usize - 1].as_ref()).map(|c| c.id() as i32)
    }

    /// Member `id`'s state dir, removed (it must be stopped): a lost disk.
    pub fn wipe(&self, id: u64) {
        assert!(
            self.ctlds.lock().unwrap()[id as usize - 1].is_none(),
            "stop {id} first"
        );
        std::fs::remove_dir_all(self.path(&format!("ctld-{id}"))).unwrap();
    }

    /// Every controller, for gpuctl (their Unix sockets).
    pub fn controllers(&self) -> String {
        (1..=self.ports.len() as u64)
            .map(|id| format!("unix:{}", self.socket(id).display()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every controller, for agents (TCP; TLS in the default mode).
    pub fn agent_controllers(&self) -> String {
        let scheme = if self.secure { "https" } else { "http" };
        (self.ports.iter().enumerate())
            .map(|(i, p)| format!("{scheme}://{}:{p}", self.host(i as u64 + 1)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts an agent `name` on fake GPUs `spec`, knowing every controller.
    pub fn add_agent(&mut self, name: &str, spec: &str) {
        self.add_agent_with(name, spec, &[]);
    }

    /// `add_agent` with more gpud flags.
    pub fn add_agent_with(&mut self, name: &str, spec: &str, extra: &[&str]) {
        let log = std::fs::File::create(self.path(&format!("gpud-{name}.log"))).unwrap();
        let identity = if self.secure && extra.contains(&"--join-file") {
            Vec::new()
        } else if self.secure {
            let (token, fingerprint) = self.join_token(name);
            let file = self.path(&format!("join-{name}.json"));
            let file = crate::join_file(&file, &token, &fingerprint);
            vec!["--join-file".to_string(), file.display().to_string()]
        } else {
            let key = self.path("cluster.key").display().to_string();
            vec!["--key-file".to_string(), key]
        };
        let child = Command::new(self.bins.join("gpud"))
            .args(["--controller", &self.agent_controllers(), "--name", name])
            .args(["--heartbeat-interval", "1s", "--allow-root-jobs"])
            .args(identity)
            .args(["--fake-gpus", spec, "--cpus", "64", "--memory", "64GiB"])
            .arg("--cgroup-parent")
            .arg(self.cgroup_parent(name))
            .arg("--state-dir")
            .arg(self.path(&format!("gpud-{name}")))
            .args(extra)
            .stderr(log)
            .spawn()
            .expect("start gpud");
        self.agents.push((name.to_string(), child));
    }

    /// A join token for node `name` (made at the leader, wherever it is) and the CA's
    /// fingerprint.
    pub fn join_token(&self, name: &str) -> (String, String) {
        let t = self
            .json(&["admin", "join-token", "create", "--node", name])
            .expect("a join token");
        (
            t["token"].as_str().unwrap().to_string(),
            t["ca_fingerprint"].as_str().unwrap().to_string(),
        )
    }

    /// Agent `name`'s cgroup parent: this cluster's own (tests run side by side).
    fn cgroup_parent(&self, name: &str) -> String {
        let dir = self.dir.path().file_name().unwrap_or_default();
        format!(
            "gpuctl-raft-test/{name}-{}",
            dir.to_string_lossy().trim_start_matches('.')
        )
    }

    /// gpuctl against every controller; its output whatever the exit code.
    pub fn gpuctl(&self, args: &[&str]) -> Output {
        Command::new(self.bins.join("gpuctl"))
            .args(args)
            .env("GPUCTL_CONTROLLER", self.controllers())
            .current_dir(self.dir.path())
            .output()
            .expect("run gpuctl")
    }

    /// gpuctl over TCP (TLS under the cluster CA, `start_secure`) with the API token
    /// `token`, against every controller.
    pub fn gpuctl_tcp(&self, token: &str, args: &[&str]) -> Output {
        Command::new(self.bins.join("gpuctl"))
            .args(args)
            .env("GPUCTL_CONTROLLER", self.agent_controllers())
            .env("GPUCTL_CA", self.path("ctld-1/ca.pem"))
            .env("GPUCTL_TOKEN", token)
            .current_dir(self.dir.path())
            .output()
            .expect("run gpuctl")
    }

    /// The agents' binary (to run one by hand).
    pub fn gpud(&self) -> Command {
        Command::new(self.bins.join("gpud"))
    }

    /// `gpuctl ARGS --json`, when it succeeds.
    pub fn json(&self, args: &[&str]) -> Option<Value> {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.gpuctl(&a);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten()
    }

    /// The members as `gpuctl admin controllers --json` lists them.
    pub fn members(&self) -> Option<Vec<Value>> {
        self.json(&["admin", "controllers"])?.as_array().cloned()
    }

    /// The leader's id once one leads (within `timeout`).
    pub fn wait_leader(&self, timeout: Duration) -> Option<u64> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            let leader = self.members().and_then(|ms| {
                ms.iter()
                    .find(|m| m["leader"] == true)
                    .and_then(|m| m["id"].as_u64())
            });
            if leader.is_some() {
                return leader;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Every job in any state, by id: (state, attempt, node).
    pub fn jobs(&self) -> Option<Vec<(u64, String, u64, String)>> {
        let all = "PENDING,RUNNING,COMPLETED,FAILED,CANCELLED,TIMEOUT,NODE_FAIL,PREEMPTED";
        let v = self.json(&["queue", "-t", all])?;
        let jobs = v.as_array()?.iter().map(|j| {
            (
                j["id"].as_u64().unwrap_or_default(),
                j["state"].as_str().unwrap_or_default().to_string(),
                j["attempt"].as_u64().unwrap_or_default(),
                j["node"].as_str().unwrap_or_default().to_string(),
            )
        });
        Some(jobs.collect())
    }

    /// Waits until `n` agents are attached and idle (within `timeout`).
    pub fn wait_nodes_idle(&self, n: usize, timeout: Duration) -> bool {
        crate::wait_for(timeout, || {
            self.json(&["nodes"]).is_some_and(|v| {
                v.as_array()
                    .is_some_and(|ns| ns.iter().filter(|n| n["state"] == "IDLE").count() == n)
            })
        })
    }

    /// Waits until the leader sees member `id` holding at least what the leader had
    /// applied when asked (docs/operations.md: a rolling upgrade's "caught up").
    pub fn wait_caught_up(&self, id: u64, timeout: Duration) -> bool {
        let leader_index = |ms: &[Value]| {
            (ms.iter().find(|m| m["leader"] == true)).and_then(|m| m["commit_index"].as_u64())
        };
        let mut target = None;
        crate::wait_for(timeout, || {
            let Some(ms) = self.members() else {
                return false;
            };
            let Some(want) = target.or_else(|| leader_index(&ms)) else {
                return false;
            };
            target = Some(want);
            (ms.iter().find(|m| m["id"] == id))
                .and_then(|m| m["commit_index"].as_u64())
                .is_some_and(|i| i >= want)
        })
    }

    /// Stops member `id` as an operator does (SIGTERM), and waits for it to exit (a
    /// `kill -9` after 20 s).
    pub fn stop(&self, id: u64) {
        let Some(mut c) = self.ctlds.lock().unwrap()[id as usize - 1].take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(c.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let exited = crate::wait_for(Duration::from_secs(20), || {
            c.try_wait().ok().flatten().is_some()
        });
        if !exited {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits until one member leads and every member is reachable from it (after a
    /// fault heals).
    pub fn wait_settled(&self, timeout: Duration) -> bool {
        crate::wait_for(timeout, || {
            self.members().is_some_and(|ms| {
                ms.iter().filter(|m| m["leader"] == true).count() == 1
                    && ms.iter().all(|m| m["state"] != "unreachable")
            })
        })
    }

    /// Member `id`'s metrics (`web`: false) or web page (`web`: true) at `path`: the
    /// body of a 200 answer.
    pub fn http_get(&self, id: u64, web: bool, path: &str) -> Option<String> {
        use std::io::{Read as _, Write as _};
        let (metrics, page) = self.http_ports[id as usize - 1];
        let port = if web { page } else { metrics };
        let mut s = std::net::TcpStream::connect((self.host(id).as_str(), port)).ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let (head, body) = out.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_string())
    }

    /// The text member `id` logged.
    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(self.path(&format!("gpuctld-{id}.log"))).unwrap_or_default()
    }

    /// How many times the agents launched each job (their "job started" lines; an
    /// adopted instance after an agent's restart is not a launch).
    pub fn launches(&self) -> BTreeMap<u64, usize> {
        let mut n = BTreeMap::new();
        for (name, _) in &self.agents {
            let log = self.agent_log(name);
            for line in log
                .lines()
                .filter(|l| l.contains("job started") && !l.contains("adopted=true"))
            {
                let id = line
                    .split(" job=")
                    .nth(1)
                    .and_then(|t| t.split_whitespace().next());
                if let Some(id) = id.and_then(|i| i.parse().ok()) {
                    *n.entry(id).or_default() += 1;
                }
            }
        }
        n
    }

    /// The text agent `name` logged.
    pub fn agent_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(&format!("gpud-{name}.log"))).unwrap_or_default()
    }
}

impl Drop for Replicated {
    fn drop(&mut self) {
        if std::thread::panicking()
            || self.keep.load(std::sync::atomic::Ordering::SeqCst)
            || std::env::var_os("GPUCTL_KEEP_LOGS").is_some()
        {
            // The logs outlive a failed test, or any with GPUCTL_KEEP_LOGS set (the temp
            // dir does not).
            let keep = std::env::temp_dir().join(format!(
                "gpuctl-replicated-failed-{}",
                self.dir
                    .path()
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
            ));
            let _ = std::fs::create_dir_all(&keep);
            for e in std::fs::read_dir(self.dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = e.file_name();
                if e.path().extension().is_some_and(|x| x == "log")
                    || name == "conflicts"
                    || name == "ran"
                {
                    let _ = std::fs::copy(e.path(), keep.join(e.file_name()));
                }
            }
            eprintln!("logs kept in {}", keep.display());
        }
        for (_, a) in &mut self.agents {
            let _ = a.kill();
            let _ = a.wait();
        }
        let ctlds = self.ctlds.get_mut().unwrap_or_else(|p| p.into_inner());
        for c in ctlds.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(net) = &self.net {
            for id in 1..=self.ports.len() as u64 {
                let _ = ip(&["netns", "del", &net.ns(id)]);
            }
            let _ = ip(&["link", "del", &net.bridge()]);
        }
        // The jobs' processes (fake GPUs run real processes): their cgroups' members.
        for hierarchy in crate::CGROUP_HIERARCHIES {
            for (name, _) in &self.agents {
                let dir = std::path::Path::new("/sys/fs/cgroup")
                    .join(hierarchy)
                    .join(self.cgroup_parent(name));
                crate::remove_cgroup_tree(&dir);
            }
        }
    }
}

fn write_private(path: &std::path::Path, text: &str) {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    writeln!(f, "{text}").unwrap();
}

/// Three clients submitting a job file and cancelling every third of their own, until
/// `finish`. Each submit has a name of its own (`c<client>-<n>`, `-J`), so that a
/// submit queued twice shows.
pub struct Clients {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Vec<(u64, String)>>>,
}

impl Drop for Clients {
    /// A test that fails with clients running stops them (they hold the cluster, which
    /// is stopped when the last of them lets go).
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clients {
    /// Starts them on `job` (a file in the cluster's dir), submitting without pause.
    pub fn start(r: &std::sync::Arc<Replicated>, job: &str) -> Clients {
        Clients::start_paced(r, job, Duration::ZERO)
    }

    /// `start`, each client pausing `pause` after each of its submits.
    pub fn start_paced(r: &std::sync::Arc<Replicated>, job: &str, pause: Duration) -> Clients {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..3)
            .map(|client| {
                let (r, stop, job) = (r.clone(), stop.clone(), job.to_string());
                std::thread::spawn(move || {
                    let mut acked = Vec::new();
                    let mut n = 0;
                    while !stop.load(Ordering::SeqCst) {
                        n += 1;
                        let name = format!("c{client}-{n}");
                        let out = r.gpuctl(&["submit", &job, "-J", &name, "--json"]);
                        if !out.status.success() {
                            std::thread::sleep(Duration::from_millis(50));
                            continue;
                        }
                        let v: Value = serde_json::from_slice(&out.stdout).expect("submit's JSON");
                        let id = v["job_id"].as_u64().expect("an acknowledged id");
                        acked.push((id, name));
                        if acked.len() % 3 == 0 {
                            let _ = r.gpuctl(&["cancel", &id.to_string()]);
                        }
                        std::thread::sleep(pause);
                    }
                    acked
                })
            })
            .collect();
        Clients { stop, threads }
    }

    /// Lets them run a second more, stops them, and answers the ids whose submit was
    /// acknowledged.
    pub fn finish(self) -> Vec<u64> {
        self.finish_named().into_iter().map(|(id, _)| id).collect()
    }

    /// `finish`: each acknowledged id with its submit's name.
    pub fn finish_named(mut self) -> Vec<(u64, String)> {
        std::thread::sleep(Duration::from_secs(1));
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (std::mem::take(&mut self.threads).into_iter())
            .flat_map(|t| t.join().expect("a client"))
            .collect()
    }
}
