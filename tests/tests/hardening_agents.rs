//! What a copied agent, a replayed connection or a stalled node can do must fail
//! cleanly, and what ranks and agents see of each other must be right (issue
//! "Hardening", the agent side; the user side is in `hardening.rs`). Each test runs the
//! real binaries and names the defect it guards against.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_tests::{Cluster, wait_for};

const T: Duration = Duration::from_secs(30);

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Records what a client sends through it to `target` (first connection only).
fn recording_proxy(target: u16) -> (u16, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let captured = Arc::new(Mutex::new(Vec::new()));
    let cap = captured.clone();
    std::thread::spawn(move || {
        let mut first = true;
        for client in l.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                return;
            };
            let record = first.then(|| cap.clone());
            first = false;
            let (mut c_r, mut s_w) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut b = [0u8; 16384];
                while let Ok(n) = c_r.read(&mut b) {
                    if n == 0 || s_w.write_all(&b[..n]).is_err() {
                        break;
                    }
                    if let Some(r) = &record {
                        r.lock().unwrap().extend_from_slice(&b[..n]);
                    }
                }
                let _ = s_w.shutdown(std::net::Shutdown::Write);
            });
            let (mut s_r, mut c_w) = (server, client);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s_r, &mut c_w);
                let _ = c_w.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (port, captured)
}

/// Defect 3: replaying, byte for byte, everything an agent sent on its connection
/// (challenge, attach, heartbeats, reports) does nothing: the attach's nonce is used,
/// the requests' numbers were seen, and the node's jobs keep running.
#[test]
fn replayed_agent_connection_does_nothing() {
    let mut c = Cluster::controller_with_config("node_timeout = \"5s\"");
    let (proxy, captured) = recording_proxy(c.port);
    let state = c.path("gpud-n1");
    c.add_agent_custom(
        "n1",
        "n1",
        &[
            "--controller",
            &format!("http://127.0.0.1:{proxy}"),
            "--fake-gpus",
            "2xA100-80GB",
            "--allow-root-jobs",
            "--state-dir",
            state.to_str().unwrap(),
            "--cgroup-parent",
            &c.cgroup_parent("n1"),
        ],
    );
    c.wait_nodes_up(1);
    let id = c.submit("s.toml", "script = \"sleep 60\"\n[resources]\ngpus = 1\n");
    c.wait_state(id, "RUNNING", T);
    std::thread::sleep(Duration::from_secs(2));
    let bytes = captured.lock().unwrap().clone();
    assert!(bytes.len() > 100, "nothing captured");
    // The replay: a new connection straight to the controller, the same bytes.
    let mut s = TcpStream::connect(("127.0.0.1", c.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s.write_all(&bytes).unwrap();
    let mut sink = [0u8; 65536];
    for _ in 0..15 {
        let _ = s.read(&mut sink);
    }
    drop(s);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(c.job(id)["state"], "RUNNING");
    assert_ne!(c.node_state("n1"), "DOWN");
    let log = c.controller_log();
    assert!(
        log.contains("attach with an unknown, used or expired nonce refused"),
        "{log}"
    );
    assert!(!log.contains('\u{1b}'), "colour codes in a log file");
    // The real agent is undisturbed: new work still starts there.
    let id2 = c.submit("t.toml", "script = \"true\"\n[resources]\ngpus = 1\n");
    c.wait_state(id2, "COMPLETED", T);
    c.gpuctl_ok(&["cancel", &id.to_string()]);
    c.wait_state(id, "CANCELLED", T);
}

/// Defect 9: a second agent under a live name is refused with the other agent named,
/// and the first agent's jobs keep running. Two agents whose cgroup parents collide
/// never share (or kill) each other's job cgroups.
#[test]
fn a_second_agent_cannot_take_a_live_name() {
    let mut c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let id = c.submit("s.toml", "script = \"sleep 60\"\n[resources]\ngpus = 1\n");
    c.wait_state(id, "RUNNING", T);
    let other = c.path("other-state");
    let tcp = c.tcp_url();
    c.add_agent_custom(
        "copy",
        "n1",
        &[
            "--controller",
            &tcp,
            "--fake-gpus",
            "1xA100-80GB",
            "--state-dir",
            other.to_str().unwrap(),
        ],
    );
    assert!(wait_for(T, || c.agent_exited("copy").is_some()));
    assert!(!c.agent_exited("copy").unwrap().success());
    let log = c.agent_log("copy");
    assert!(log.contains("is held by another agent"), "{log}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(c.job(id)["state"], "RUNNING");
    assert_ne!(c.node_state("n1"), "DOWN");

    // A second cluster whose agent is (mis)configured with the same cgroup parent: its
    // job 1 may not join (and later kill) the first cluster's job 1.
    let mut c2 = Cluster::controller_only();
    let parent = c.cgroup_parent("n1");
    let state2 = c2.path("gpud-m1");
    let tcp2 = c2.tcp_url();
    c2.add_agent_custom(
        "m1",
        "m1",
        &[
            "--controller",
            &tcp2,
            "--fake-gpus",
            "1xA100-80GB",
            "--allow-root-jobs",
            "--state-dir",
            state2.to_str().unwrap(),
            "--cgroup-parent",
            &parent,
        ],
    );
    c2.wait_nodes_up(1);
    if c2.agent_log("m1").contains("no writable cgroup hierarchy") {
        gpuctl_tests::skipped(
            "GPUCTL_REQUIRE_CGROUPS",
            "a writable cgroup hierarchy (for its cgroup half)",
        );
        return;
    }
    let j2 = c2.submit("s.toml", "script = \"sleep 1\"\n");
    assert_eq!(j2, id, "both clusters' first job");
    let done = c2.wait_state(j2, "FAILED", T);
    assert!(
        done["reason"]
            .as_str()
            .unwrap()
            .contains("already holds processes"),
        "{done}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(c.job(id)["state"], "RUNNING");
    drop(c2);
    c.gpuctl_ok(&["cancel", &id.to_string()]);
    c.wait_state(id, "CANCELLED", T);
}

/// Defect 12: starts sent to an agent that is stalled past the node timeout never run
/// when it wakes; the recorded NODE_FAIL stays the truth.
#[test]
fn stale_starts_never_run() {
    let mut c = Cluster::controller_with_config("node_timeout = \"3s\"");
    c.add_agent("n1", "1xA100-80GB", &[]);
    c.wait_nodes_up(1);
    // Let a heartbeat be answered first, then freeze the agent.
    std::thread::sleep(Duration::from_millis(1500));
    c.signal_agent("n1", nix::sys::signal::Signal::SIGSTOP);
    let marker = c.path("ran.txt");
    let id = c.submit(
        "s.toml",
        &format!(
            "script = \"touch {}\"\n[resources]\ngpus = 1\n",
            marker.display()
        ),
    );
    c.wait_state(id, "NODE_FAIL", T);
    c.signal_agent("n1", nix::sys::signal::Signal::SIGCONT);
    assert!(wait_for(T, || c.node_state("n1") != "DOWN"));
    std::thread::sleep(Duration::from_secs(2));
    assert!(!marker.exists(), "a start of a failed node ran");
    assert_eq!(c.job(id)["state"], "NODE_FAIL");
}

/// Defect 13: ranks of a gang job never clobber each other's output.
#[test]
fn gang_outputs_are_kept_per_rank_or_appended() {
    let c = Cluster::start(&[("n1", "1xA100-80GB"), ("n2", "1xA100-80GB")]);
    let id = c.submit(
        "g.toml",
        "script = \"echo rank $RANK\"\n[resources]\ngpus = 1\nnodes = 2\n",
    );
    c.wait_state(id, "COMPLETED", T);
    for r in 0..2 {
        let f = c.path(&format!("gpuctl-{id}.{r}.out"));
        assert_eq!(std::fs::read_to_string(f).unwrap(), format!("rank {r}\n"));
    }
    let id = c.submit(
        "h.toml",
        "script = \"echo rank $RANK\"\nstdout = \"shared.txt\"\n[resources]\ngpus = 1\nnodes = 2\n",
    );
    c.wait_state(id, "COMPLETED", T);
    let text = std::fs::read_to_string(c.path("shared.txt")).unwrap();
    assert!(
        text.contains("rank 0\n") && text.contains("rank 1\n"),
        "{text}"
    );
    let id = c.submit(
        "i.toml",
        "script = \"echo $GPUCTL_NODE\"\nstdout = \"o-%N-%t.txt\"\n[resources]\ngpus = 1\nnodes = 2\n",
    );
    c.wait_state(id, "COMPLETED", T);
    assert_eq!(
        std::fs::read_to_string(c.path("o-n1-0.txt")).unwrap(),
        "n1\n"
    );
    assert_eq!(
        std::fs::read_to_string(c.path("o-n2-1.txt")).unwrap(),
        "n2\n"
    );
}

/// Defect 16: a job that ends while its agent is down gets its real end time.
#[test]
fn end_time_is_the_real_end_when_the_agent_was_down() {
    let mut c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let id = c.submit("s.toml", "script = \"sleep 2\"\n");
    c.wait_state(id, "RUNNING", T);
    c.kill9_agent("n1");
    std::thread::sleep(Duration::from_secs(6));
    c.add_agent("n1", "1xA100-80GB", &[]);
    let j = c.wait_state(id, "COMPLETED", T);
    let elapsed = j["elapsed_secs"].as_i64().unwrap();
    assert!((1..=4).contains(&elapsed), "elapsed {elapsed}: {j}");
}

/// Defect 17: a root job no agent would run is refused at submit.
#[test]
fn root_jobs_are_refused_at_submit_without_an_agent_that_runs_them() {
    let mut c = Cluster::controller_only();
    let state = c.path("gpud-n1");
    let tcp = c.tcp_url();
    c.add_agent_custom(
        "n1",
        "n1",
        &[
            "--controller",
            &tcp,
            "--fake-gpus",
            "1xA100-80GB",
            "--state-dir",
            state.to_str().unwrap(),
            "--cgroup-parent",
            &c.cgroup_parent("n1"),
        ],
    );
    c.wait_nodes_up(1);
    std::fs::write(c.path("r.toml"), "script = \"true\"\n").unwrap();
    let out = c.gpuctl(&["submit", "r.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no agent of this cluster runs them"),
        "{}",
        stderr(&out)
    );
}

/// Defect 18: a start with many env entries verifies (the MAC covers the bytes sent)
/// and runs.
#[test]
fn starts_with_many_env_entries_run() {
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let mut toml =
        String::from("script = \"echo $A1-$A2-$A3-$A4-$A5-$A6\"\nstdout = \"env.txt\"\n[env]\n");
    for i in 1..=6 {
        toml.push_str(&format!("A{i} = \"v{i}\"\n"));
    }
    for _ in 0..4 {
        let id = c.submit("e.toml", &toml);
        c.wait_state(id, "COMPLETED", T);
        assert_eq!(
            std::fs::read_to_string(c.path("env.txt")).unwrap(),
            "v1-v2-v3-v4-v5-v6\n"
        );
    }
}

/// Defect 19: ranks rendezvous over TCP at MASTER_ADDR:MASTER_PORT (as torch.distributed
/// does) though the node names resolve nowhere; RANK and WORLD_SIZE are set.
#[test]
fn gang_ranks_rendezvous_at_master_addr() {
    let c = Cluster::start(&[
        ("node-a.invalid", "1xA100-80GB"),
        ("node-b.invalid", "1xA100-80GB"),
    ]);
    let py = r#"
import os, socket, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(world); s.settimeout(20)
    got = sorted(int(s.accept()[0].recv(16)) for _ in range(world - 1))
    print("rank0 got", got, "world", world)
else:
    for _ in range(200):
        try:
            c = socket.create_connection((addr, port), timeout=1); break
        except OSError:
            time.sleep(0.1)
    c.sendall(str(rank).encode()); print("rank", rank, "sent")
"#;
    std::fs::write(c.path("rdv.py"), py).unwrap();
    let id = c.submit(
        "r.toml",
        &format!(
            "command = [\"/usr/bin/python3\", \"{}\"]\nstdout = \"rdv-%t.out\"\n[resources]\ngpus = 1\nnodes = 2\n",
            c.path("rdv.py").display()
        ),
    );
    let j = c.wait_state(id, "COMPLETED", Duration::from_secs(60));
    assert_eq!(j["state"], "COMPLETED");
    assert_eq!(
        std::fs::read_to_string(c.path("rdv-0.out")).unwrap(),
        "rank0 got [1] world 2\n"
    );
}

/// Logs in files carry no colour codes; `--log-format json` gives one JSON object a line.
#[test]
fn logs_are_plain_text_or_json_lines() {
    let mut c = Cluster::controller_only();
    c.add_agent("n1", "1xA100-80GB", &["--log-format", "json"]);
    c.wait_nodes_up(1);
    let id = c.submit("s.toml", "script = \"true\"\n");
    c.wait_state(id, "COMPLETED", T);
    let log = c.agent_log("n1");
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 3, "{log}");
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(
            v["level"].is_string() && v["fields"]["message"].is_string(),
            "{l}"
        );
    }
    assert!(!c.controller_log().contains('\u{1b}'));
}
