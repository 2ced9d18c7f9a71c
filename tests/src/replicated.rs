//! Replicated controllers for the end-to-end tests and the failover bench: three (or
//! more) real `gpuctld` on loopback with `--id`/`--peers`, each with its own state dir
//! and Unix socket, sharing one cluster key; agents that know every controller; `gpuctl`
//! given every socket (it finds the leader itself).

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{TEST_CONFIG, bin, free_port};

pub struct Replicated {
    pub dir: tempfile::TempDir,
    /// Each member's gRPC port, by id (index id - 1).
    pub ports: Vec<u16>,
    ctlds: std::sync::Mutex<Vec<Option<Child>>>,
    agents: Vec<(String, Child)>,
    /// The gpud binary's directory (debug for tests, release for the bench).
    bins: PathBuf,
}

impl Replicated {
    /// `n` controllers (ids 1..=n), started and waited for until one leads.
    pub fn start(n: usize) -> Replicated {
        Replicated::start_with(n, bin("gpuctld").parent().unwrap().to_path_buf())
    }

    /// `start`, with the binaries of `bins`.
    pub fn start_with(n: usize, bins: PathBuf) -> Replicated {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("gpuctld.toml"), TEST_CONFIG).unwrap();
        let key: String = (0..32)
            .map(|i| format!("{:02x}", (i * 37 + 11) as u8 ^ std::process::id() as u8))
            .collect();
        let key_file = dir.path().join("cluster.key");
        write_private(&key_file, &key);
        let r = Replicated {
            ports: (0..n).map(|_| free_port()).collect(),
            dir,
            ctlds: std::sync::Mutex::new((0..n).map(|_| None).collect()),
            agents: Vec::new(),
            bins,
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

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `--peers` for every member.
    fn peers(&self) -> String {
        (self.ports.iter().enumerate())
            .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
            .collect::<Vec<_>>()
            .join(",")
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
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(&format!("gpuctld-{id}.log")))
            .unwrap();
        let child = Command::new(self.bins.join("gpuctld"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.ports[i]))
            .arg("--state-dir")
            .arg(&state)
            .arg("--socket")
            .arg(self.socket(id))
            .arg("--config")
            .arg(self.path("gpuctld.toml"))
            .args(["--insecure-shared-key", "--insecure"])
            .args(["--id", &id.to_string(), "--peers", &self.peers()])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start gpuctld");
        ctlds[i] = Some(child);
    }

    fn socket(&self, id: u64) -> PathBuf {
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
        assert!(self.ctlds.lock().unwrap()[id as usize - 1].is_none(), "stop {id} first");
        std::fs::remove_dir_all(self.path(&format!("ctld-{id}"))).unwrap();
    }

    /// Every controller, for gpuctl (their Unix sockets).
    pub fn controllers(&self) -> String {
        (1..=self.ports.len() as u64)
            .map(|id| format!("unix:{}", self.socket(id).display()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every controller, for agents (TCP).
    pub fn agent_controllers(&self) -> String {
        (self.ports.iter())
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts an agent `name` on fake GPUs `spec`, knowing every controller.
    pub fn add_agent(&mut self, name: &str, spec: &str) {
        let log = std::fs::File::create(self.path(&format!("gpud-{name}.log"))).unwrap();
        let child = Command::new(self.bins.join("gpud"))
            .args(["--controller", &self.agent_controllers(), "--name", name])
            .args(["--heartbeat-interval", "1s", "--allow-root-jobs"])
            .arg("--key-file")
            .arg(self.path("cluster.key"))
            .args(["--fake-gpus", spec, "--cpus", "64", "--memory", "64GiB"])
            .arg("--cgroup-parent")
            .arg(format!("gpuctl-raft-test/{name}-{}", std::process::id()))
            .arg("--state-dir")
            .arg(self.path(&format!("gpud-{name}")))
            .stderr(log)
            .spawn()
            .expect("start gpud");
        self.agents.push((name.to_string(), child));
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

    /// The text member `id` logged.
    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(self.path(&format!("gpuctld-{id}.log"))).unwrap_or_default()
    }

    /// The text agent `name` logged.
    pub fn agent_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(&format!("gpud-{name}.log"))).unwrap_or_default()
    }
}

impl Drop for Replicated {
    fn drop(&mut self) {
        for (_, a) in &mut self.agents {
            let _ = a.kill();
            let _ = a.wait();
        }
        for c in self.ctlds.get_mut().unwrap().iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // The jobs' processes (fake GPUs run real processes): their cgroups' members.
        for hierarchy in crate::CGROUP_HIERARCHIES {
            for (name, _) in &self.agents {
                let dir = std::path::Path::new("/sys/fs/cgroup")
                    .join(hierarchy)
                    .join(format!("gpuctl-raft-test/{name}-{}", std::process::id()));
                crate::remove_cgroup_tree(&dir);
            }
        }
    }
}

fn write_private(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    writeln!(f, "{text}").unwrap();
}
