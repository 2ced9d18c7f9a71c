//! Hardening, third round (issue 55): a node's identity, GPU memory and connections no
//! user can take. Each test fails without its fix.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use gpuctl_tests::{Cluster, bin, ensure_user, join_file, wait_for};

const T: Duration = Duration::from_secs(30);

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// gpud with `args`, run to its end.
fn gpud_exits(c: &Cluster, name: &str, args: &[&str]) -> std::process::Output {
    Command::new(bin("gpud"))
        .args(["--controller", &c.https_url(), "--name", name])
        .args(["--fake-gpus", "1xA100-80GB"])
        .arg("--state-dir")
        .arg(c.path(&format!("gpud-{name}")))
        .args(args)
        .output()
        .unwrap()
}

/// A join token is never taken from the command line (every local user reads
/// /proc/PID/cmdline), nor from a file others can read; a node that joined restarts
/// with its first start's options and says the token was not needed.
#[test]
fn join_tokens_stay_off_command_lines_and_a_joined_node_restarts_with_the_same_options() {
    use std::os::unix::fs::PermissionsExt as _;
    let mut c = Cluster::secure_controller();
    let (token, fp) = c.join_token("j1", "1h");

    let out = gpud_exits(&c, "j1", &["--join", &token, "--ca-fingerprint", &fp]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/proc/PID/cmdline") && stderr(&out).contains("--join-file"),
        "{}",
        stderr(&out)
    );

    let file = join_file(&c.path("join-j1.json"), &token, &fp);
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = gpud_exits(&c, "j1", &["--join-file", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("chmod 600"), "{}", stderr(&out));

    // Refused before it was sent: the token is still good, from a private file.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let args = [
        "--fake-gpus",
        "1xA100-80GB",
        "--join-file",
        file.to_str().unwrap(),
    ];
    c.spawn_gpud("j1", &args);
    c.wait_nodes_up(1);
    let first = c.submit("a.toml", "command = [\"true\"]\n[resources]\ngpus = 1\n");
    c.wait_state(first, "COMPLETED", T);

    // Restarted with the same options (a unit's GPUD_OPTS, Restart=on-failure).
    c.kill9_agent("j1");
    c.spawn_gpud("j1", &args);
    let id = c.submit("b.toml", "command = [\"true\"]\n[resources]\ngpus = 1\n");
    c.wait_state(id, "COMPLETED", T);
    let log = c.agent_log("j1");
    assert!(log.contains("the join token was not needed"), "{log}");

    // The token from the environment works too, and never from argv.
    let (t2, _) = c.join_token("j2", "1h");
    let child = Command::new(bin("gpud"))
        .args(["--controller", &c.https_url(), "--name", "j2"])
        .args(["--fake-gpus", "1xA100-80GB", "--ca-fingerprint", &fp])
        .args(["--heartbeat-interval", "1s"])
        .arg("--state-dir")
        .arg(c.path("gpud-j2"))
        .env("GPUD_JOIN_TOKEN", &t2)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let guard = KillOnDrop(child);
    let mut cmdline = std::fs::read(format!("/proc/{}/cmdline", guard.0.id())).unwrap();
    cmdline.retain(|b| *b != 0);
    assert!(!String::from_utf8_lossy(&cmdline).contains(&t2));
    c.wait_nodes_up(2);
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TCP port on loopback, forwarded to the controller's Unix socket by a process of
/// `user`: what that user's own client would be, to the controller.
fn socket_as(user: &str, socket: &str) -> (KillOnDrop, u16) {
    let script = r#"
import socket, sys, threading
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(8)
print(ls.getsockname()[1], flush=True)
def pump(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d: break
            b.sendall(d)
    except OSError: pass
    for s in (a, b):
        try: s.shutdown(socket.SHUT_RDWR)
        except OSError: pass
while True:
    c, _ = ls.accept()
    u = socket.socket(socket.AF_UNIX); u.connect(sys.argv[1])
    threading.Thread(target=pump, args=(c, u), daemon=True).start()
    threading.Thread(target=pump, args=(u, c), daemon=True).start()
"#;
    use std::os::unix::process::CommandExt as _;
    let u = nix::unistd::User::from_name(user).unwrap().unwrap();
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", script, socket])
        .uid(u.uid.as_raw())
        .gid(u.gid.as_raw())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 as another user");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().parse().expect("the forwarder's port");
    (KillOnDrop(child), port)
}

/// A local user who read a token (off a screen, a log, a command line) cannot join
/// over the controller's Unix socket: only root may join there, agents join over TLS.
/// The token is not used up by the attempt.
#[test]
fn a_local_user_cannot_join_over_the_socket() {
    let Some(_) = ensure_user("gpuctl-mallory") else {
        gpuctl_tests::skipped("GPUCTL_REQUIRE_ROOT", "root (to act as another user)");
        return;
    };
    let mut c = Cluster::secure_controller();
    let (token, fp) = c.join_token("victim", "1h");
    let socket = c.path("gpuctld.sock");
    let (_fwd, port) = socket_as("gpuctl-mallory", socket.to_str().unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let refused = rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let req = gpuctl_proto::tls::NodeRequest::new("victim").unwrap();
        gpuctl_proto::agent_link_client::AgentLinkClient::new(ch)
            .join(gpuctl_proto::JoinRequest {
                token: token.clone(),
                node: "victim".into(),
                csr: req.csr_der,
            })
            .await
            .expect_err("a join over the socket from a user")
    });
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("only root"), "{refused:?}");
    // The real node joins with the same token.
    let file = join_file(&c.path("join-victim.json"), &token, &fp);
    c.spawn_gpud(
        "victim",
        &[
            "--fake-gpus",
            "1xA100-80GB",
            "--join-file",
            file.to_str().unwrap(),
        ],
    );
    c.wait_nodes_up(1);
}

/// A job's child that leaves its session (`setsid`) and holds GPU memory still counts
/// for the job: over its share it is warned and ended, and the child with it.
#[test]
fn gpu_memory_of_a_child_in_its_own_session_counts_for_its_job() {
    let mut c = Cluster::controller_only();
    c.add_agent(
        "setsid",
        "1xA100-80GB",
        &["--sample-interval", "500ms", "--gpu-memory-grace", "2s"],
    );
    c.wait_nodes_up(1);
    let mark = format!("escaped-{}", std::process::id());
    let id = c.submit(
        "escape.toml",
        &format!(
            "script = '''\nsetsid sh -c 'exec env GPUCTL_FAKE_GPU_MEMORY_MIB=12000 MARK={mark} sleep 120' </dev/null >/dev/null 2>&1 &\nsleep 120\n'''\n[resources]\ngpu_memory = \"10GiB\"\n"
        ),
    );
    c.wait_state(id, "RUNNING", T);
    let j = c.wait_state(id, "FAILED", T);
    let reason = j["reason"].as_str().unwrap();
    assert!(
        reason.contains("GPU memory 12000 MiB") && reason.contains("over its share of 10240 MiB"),
        "{reason}"
    );
    // The escaped child went with its job (its cgroup).
    let left = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("environ")).is_ok_and(|env| {
                env.split(|b| *b == 0)
                    .any(|kv| kv == format!("MARK={mark}").as_bytes())
            })
        })
    };
    assert!(wait_for(T, || !left()), "the setsid child outlived its job");
}

/// One address's unauthenticated connections (every local user and every job of a
/// node share its address) fill the per-address cap: the node's agent, restarting,
/// still attaches with its certificate, and a user with an API token is served (its
/// connection takes the place of the oldest unauthenticated one, then authenticates).
#[test]
fn a_full_address_locks_out_neither_the_agent_nor_token_users() {
    let mut c = Cluster::secure_controller_with_config(
        "[limits]\nmax_connections_per_address = 6\nunauthenticated_timeout = \"120s\"\n",
    );
    c.join_agent("crowded", "1xA100-80GB");
    c.wait_nodes_up(1);
    let token = c.json(&["admin", "token", "create", "--user", "root"])["token"]
        .as_str()
        .unwrap()
        .to_string();
    c.kill9_agent("crowded");
    let ca = std::fs::read_to_string(c.path("ctld-state/ca.pem")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = c.https_url();
    // Six connections that sent a request (refused: no token) and stay open.
    let squatters = rt.block_on(async {
        let tls = gpuctl_proto::tls::ClientTls::new(&ca, None).unwrap();
        let mut held = Vec::new();
        for _ in 0..6 {
            let ep = tonic::transport::Endpoint::from_shared(url.clone()).unwrap();
            let ch = tls.connect(ep).await.expect("under the cap");
            let mut client = gpuctl_proto::controller_client::ControllerClient::new(ch.clone());
            let _ = client
                .who_am_i(gpuctl_proto::WhoAmIRequest::default())
                .await;
            held.push(ch);
        }
        held
    });
    // The agent comes back and runs a job.
    c.spawn_gpud("crowded", &["--fake-gpus", "1xA100-80GB"]);
    let id = c.submit(
        "after.toml",
        "command = [\"true\"]\n[resources]\ngpus = 1\n",
    );
    let j = c.wait_state(id, "COMPLETED", T);
    assert_eq!(j["state"], "COMPLETED");
    // A token's user over TCP, from the same address.
    let out = Command::new(bin("gpuctl"))
        .args(["--controller", &url, "queue"])
        .env("GPUCTL_TOKEN", &token)
        .env("GPUCTL_CA", c.path("ctld-state/ca.pem"))
        .env("HOME", c.path("nohome"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    drop(squatters);
}

/// A node started without `--allow-root-jobs` is given root's jobs (another node runs
/// them, drained for now): the launch is the node's refusal, not the jobs' failure.
/// Each job goes back to the queue (none FAILED) and the node is drained with the
/// reason; the jobs run once a node that takes them is back.
#[test]
fn a_launch_the_node_refuses_requeues_the_job_and_drains_the_node() {
    let mut c = Cluster::controller_only();
    c.add_agent("lenient", "1xA100-80GB", &[]);
    c.wait_nodes_up(1);
    c.gpuctl_ok(&["node", "drain", "lenient", "--reason", "not yet"]);
    let state = c.path("gpud-strict");
    let parent = c.cgroup_parent("strict");
    let tcp = c.tcp_url();
    let args = [
        "--controller",
        &tcp,
        "--fake-gpus",
        "2xA100-80GB",
        "--state-dir",
        state.to_str().unwrap(),
        "--cgroup-parent",
        &parent,
    ];
    c.add_agent_custom("strict", "strict", &args);
    c.wait_nodes_up(2);
    let ids: Vec<u64> = (0..3)
        .map(|i| {
            c.submit(
                &format!("root{i}.toml"),
                "command = [\"true\"]\n[resources]\ngpus = 1\n",
            )
        })
        .collect();
    assert!(
        wait_for(T, || c.node_state("strict").starts_with("DRAIN")),
        "the node was not drained: {}",
        c.nodes()
    );
    let node = c.nodes();
    assert!(
        node.to_string().contains("refusing to run a job as root"),
        "{node}"
    );
    // Drained: the node stays so (its agent reports the refusal with its heartbeats).
    std::thread::sleep(Duration::from_secs(3));
    assert!(c.node_state("strict").starts_with("DRAIN"), "{}", c.nodes());
    for id in &ids {
        let j = c.job(*id);
        assert_eq!(j["state"], "PENDING", "job {id}: {j}");
    }
    c.gpuctl_ok(&["node", "resume", "lenient"]);
    for id in ids {
        c.wait_state(id, "COMPLETED", T);
    }
}

fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Attack 4: large Raft messages from anyone. The peer service checks a member's MAC in
/// the request's headers before reading a byte of the body: four 64 MiB messages without
/// it are refused (UNAUTHENTICATED) and leave the leader's memory where it was (before,
/// each was read whole first: 65 -> 580 MB for four). The users' Unix socket has no peer
/// service at all.
#[test]
fn unauthenticated_raft_messages_are_refused_before_they_are_read() {
    let r = gpuctl_tests::replicated::Replicated::start(3);
    let leader = r.wait_leader(Duration::from_secs(20)).expect("a leader");
    let pid = r.pid(leader).unwrap();
    let port = r.ports[leader as usize - 1];
    let socket = r.socket(leader);
    let before = rss_kib(pid);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (codes, on_socket) = rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut peer = gpuctl_proto::raft_peer_client::RaftPeerClient::new(ch)
            .max_encoding_message_size(usize::MAX);
        let mut codes = Vec::new();
        for _ in 0..4 {
            let big = gpuctl_proto::RaftMessage {
                json: vec![b' '; 64 << 20],
                mac: vec![0; 32],
            };
            codes.push(peer.append(big).await.unwrap_err().code());
        }
        let path = socket.clone();
        let ch = tonic::transport::Endpoint::from_static("http://local")
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
        let small = gpuctl_proto::RaftMessage::default();
        let on_socket = gpuctl_proto::raft_peer_client::RaftPeerClient::new(ch)
            .ping(small)
            .await
            .unwrap_err()
            .code();
        (codes, on_socket)
    });
    assert!(
        codes.iter().all(|c| *c == tonic::Code::Unauthenticated),
        "{codes:?}"
    );
    assert_eq!(on_socket, tonic::Code::Unimplemented);
    let after = rss_kib(pid);
    assert!(
        after < before + 64 * 1024,
        "the leader's memory grew from {before} KiB to {after} KiB"
    );
    // Still the leader, undisturbed.
    assert_eq!(r.wait_leader(Duration::from_secs(5)), Some(leader));
}
