//! Issue "Hardening, second round": what an attacker or a careless user got through,
//! each test failing before its fix (device isolation is in `devices.rs`, the connection
//! flood in `flood.rs`).

use std::time::Duration;

use gpuctl_proto::{self as pb, agent_link_client::AgentLinkClient};
use gpuctl_tests::Cluster;

const T: Duration = Duration::from_secs(30);

/// Attack 3: unauthenticated Challenge calls with a 4 MiB node name wrote one WARN line
/// each with the whole name (1.5 GB of log in 10 s). Now: the name is refused before
/// anything is verified or logged, refusals are logged a line a period, and no line
/// carries more than a bounded piece of what the caller sent.
#[test]
fn unauthenticated_requests_do_not_flood_the_log() {
    let c = Cluster::controller_only();
    let before = c.controller_log().len();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tcp = c.tcp_url();
    let codes = rt.block_on(async move {
        let mut client = AgentLinkClient::connect(tcp)
            .await
            .unwrap()
            .max_encoding_message_size(8 << 20);
        let mut codes = Vec::new();
        for i in 0..60 {
            let node = if i % 2 == 0 {
                "n".repeat(3 << 20)
            } else {
                format!("node-{i}\n\u{1b}[31mFAKE LOG LINE")
            };
            let e = client
                .challenge(pb::ChallengeRequest { node })
                .await
                .unwrap_err();
            codes.push(e.code());
        }
        codes
    });
    assert!(codes.contains(&tonic::Code::InvalidArgument), "{codes:?}");
    assert!(codes.contains(&tonic::Code::Unauthenticated), "{codes:?}");
    let log = c.controller_log()[before..].to_string();
    assert!(log.len() < 8 * 1024, "{} bytes of log", log.len());
    let refused = log.lines().filter(|l| l.contains("refused")).count();
    assert!((1..=4).contains(&refused), "{refused} lines:\n{log}");
    assert!(
        !log.contains("FAKE LOG LINE\n"),
        "a caller's newline is escaped: {log}"
    );
    assert!(log.lines().all(|l| l.len() < 1024), "{log}");
}

/// Every path under `dir` whose mode gives anything to group or others, but what the
/// daemon opens on purpose (`allowed`).
fn open_to_others(dir: &std::path::Path, allowed: &[&str]) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        let name = p.strip_prefix(dir).unwrap().display().to_string();
        if meta.is_dir() {
            todo.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
        if mode & 0o077 != 0 && !allowed.contains(&name.as_str()) {
            out.push(format!("{name} {mode:03o}"));
        }
    }
    out
}

/// Attack 5: with the usual umask 022 a new state dir was 0755 and the database 0644
/// (another user read a job's env secret). Now the controller's state is 0700/0600
/// whatever the umask; the agent's dir is 0711 (job users pass through to their own
/// scripts) with nothing in it readable by others; a wider existing dir is warned about.
#[test]
fn state_dirs_are_private_whatever_the_umask() {
    // SAFETY: umask(2) only swaps the process's mask; the daemons inherit 022.
    let old = unsafe { nix::libc::umask(0o022) };
    let mut c = Cluster::start(&[("priv1", "1xA100-80GB")]);
    unsafe { nix::libc::umask(old) };
    let id = c.submit(
        "secret.toml",
        "script = \"echo hi\"\n[env]\nSECRET = \"hunter2\"\n",
    );
    c.wait_state(id, "COMPLETED", T);
    let ctld = c.path("ctld-state");
    // The cluster CA's certificate is public (users pin it), whatever the umask.
    assert_eq!(open_to_others(&ctld, &["ca.pem"]), Vec::<String>::new());
    let agent = c.path("gpud-priv1");
    // "" is the state dir itself (0711); scripts/ is 0711 by design; bin/ (0755) holds
    // one link, srun, to the public gpuctl binary, and nothing else.
    assert_eq!(
        open_to_others(&agent, &["", "scripts", "bin", "bin/srun"]),
        Vec::<String>::new()
    );
    let srun = std::fs::read_link(agent.join("bin/srun")).unwrap();
    assert_eq!(srun.file_name().unwrap(), "gpuctl");
    assert_eq!(std::fs::read_dir(agent.join("bin")).unwrap().count(), 1);
    // An existing dir opened wider is named at the next start.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ctld, std::fs::Permissions::from_mode(0o755)).unwrap();
    c.stop_controller();
    c.start_controller();
    assert!(
        c.controller_log().contains("is mode 755, wider than 700"),
        "{}",
        c.controller_log()
    );
}

/// A newcomer's stumble: `gpud --state-dir ./gpud-state` (the README's own line) made
/// every script job fail with "gpud-state/scripts/job-1.1.sh: command not found" when
/// the job's directory was another one: state dirs are absolute from the start.
#[test]
fn a_relative_agent_state_dir_runs_script_jobs_from_anywhere() {
    let c = Cluster::controller_only();
    let log = std::fs::File::create(c.path("gpud-rel.log")).unwrap();
    let mut agent = std::process::Command::new(gpuctl_tests::bin("gpud"))
        .args(["--controller", &c.tcp_url(), "--name", "rel1"])
        .args(["--fake-gpus", "1xA100-80GB", "--allow-root-jobs"])
        .args(["--state-dir", "./gpud-state", "--heartbeat-interval", "1s"])
        .arg("--cgroup-parent")
        .arg(c.cgroup_parent("rel1"))
        .arg("--key-file")
        .arg(c.key_file())
        .current_dir(c.path(""))
        .stderr(log)
        .spawn()
        .unwrap();
    c.wait_nodes_up(1);
    let elsewhere = c.path("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(
        elsewhere.join("s.toml"),
        "script = \"echo ran > ran.txt\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(gpuctl_tests::bin("gpuctl"))
        .args(["--controller", &c.url(), "submit", "--json", "s.toml"])
        .current_dir(&elsewhere)
        .output()
        .unwrap();
    let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["job_id"]
        .as_u64()
        .unwrap();
    let j = c.wait_state(id, "COMPLETED", T);
    assert_eq!(j["exit_code"], 0, "{j}");
    assert_eq!(
        std::fs::read_to_string(elsewhere.join("ran.txt")).unwrap(),
        "ran\n"
    );
    let _ = agent.kill();
    let _ = agent.wait();
}

/// Attack 6: the CLI sent a token in clear to an `https://` controller URL without a
/// word. It now speaks TLS, trusting only the cluster CA: without one it refuses before
/// connecting (nothing reaches the listener), and it sends no token over http:// unless
/// told `--insecure`; an unreachable controller is named once, not "Connection refused"
/// three times.
#[test]
fn the_cli_sends_no_token_to_an_https_url() {
    use std::io::Read;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    l.set_nonblocking(true).unwrap();
    let out = std::process::Command::new(gpuctl_tests::bin("gpuctl"))
        .args([
            "--controller",
            &format!("https://127.0.0.1:{port}"),
            "queue",
        ])
        .env("GPUCTL_TOKEN", "s3cret-token-value")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("trusted only under the cluster CA"), "{err}");
    let mut got = Vec::new();
    if let Ok((mut s, _)) = l.accept() {
        let _ = s.read_to_end(&mut got);
    }
    assert!(got.is_empty(), "sent {} bytes", got.len());
    let out = std::process::Command::new(gpuctl_tests::bin("gpuctl"))
        .args(["--controller", &format!("http://127.0.0.1:{port}"), "queue"])
        .env("GPUCTL_TOKEN", "s3cret-token-value")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("sent over TLS only"));
    if let Ok((mut s, _)) = l.accept() {
        let _ = s.read_to_end(&mut got);
    }
    assert!(got.is_empty(), "sent {} bytes over http", got.len());
    drop(l);
    let out = std::process::Command::new(gpuctl_tests::bin("gpuctl"))
        .args(["--controller", &format!("http://127.0.0.1:{port}"), "queue"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("Connection refused").count(), 1, "{err}");
}

/// Attack 7 (low): a copied agent identity (its state dir's agent-id) started twice
/// made the two agents take over from each other ten times a second. The second now
/// waits while the first is attached and heard from; the first keeps its connection.
#[test]
fn a_copied_agent_identity_does_not_take_over_a_live_one() {
    let mut c = Cluster::start(&[("twin", "1xA100-80GB")]);
    let id = std::fs::read_to_string(c.path("gpud-twin/agent-id")).unwrap();
    let copy = c.path("gpud-copy");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::write(copy.join("agent-id"), &id).unwrap();
    let parent = c.cgroup_parent("copy");
    let tcp = c.tcp_url();
    c.add_agent_custom(
        "copy",
        "twin",
        &[
            "--controller",
            &tcp,
            "--fake-gpus",
            "1xA100-80GB",
            "--state-dir",
            copy.to_str().unwrap(),
            "--cgroup-parent",
            &parent,
            "--allow-root-jobs",
        ],
    );
    assert!(
        gpuctl_tests::wait_for(T, || c
            .agent_log("copy")
            .contains("attached now under this agent identity")),
        "{}\n{}",
        c.agent_log("copy"),
        c.controller_log()
    );
    std::thread::sleep(Duration::from_secs(4));
    let connected = c
        .controller_log()
        .lines()
        .filter(|l| l.contains("agent connected"))
        .count();
    assert_eq!(connected, 1, "{}", c.controller_log());
    assert_eq!(c.node_state("twin"), "IDLE");
}

/// Attack 7 (low): `/dev/tty` as output was refused with the FIFO reason. A device is
/// named as a device; a FIFO is still a FIFO.
#[test]
fn a_device_as_output_is_named_a_device() {
    let c = Cluster::start(&[("tty1", "1xA100-80GB")]);
    for (path, want) in [("/dev/tty", "is a device"), ("/dev/zero", "is a device")] {
        let id = c.submit(
            "tty.toml",
            &format!("command = [\"echo\", \"x\"]\nstdout = \"{path}\"\n"),
        );
        let j = c.wait_state(id, "FAILED", T);
        let reason = j["reason"].as_str().unwrap();
        assert!(
            reason.contains(want) && !reason.contains("FIFO"),
            "{path}: {reason}"
        );
    }
}

/// Attack 7 (low): a request body that does not decode was answered INTERNAL (the
/// server's fault); it is the caller's: INVALID_ARGUMENT, and nothing changes.
#[test]
fn a_malformed_request_body_is_invalid_argument() {
    let c = Cluster::controller_only();
    let tcp = c.tcp_url();
    let status = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async move {
            let channel = tonic::transport::Endpoint::from_shared(tcp)
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.unwrap();
            // Field 1 as a varint where SubmitRequest has a message: not a SubmitRequest.
            let body = pb::JobActionRequest {
                job_id: 5,
                ..Default::default()
            };
            let path = tonic::codegen::http::uri::PathAndQuery::from_static(
                "/gpuctl.v1.Controller/Submit",
            );
            let codec =
                gpuctl_proto::codec::Codec::<pb::JobActionRequest, pb::SubmitResponse>::default();
            grpc.unary(tonic::Request::new(body), path, codec)
                .await
                .unwrap_err()
        });
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("malformed"), "{status:?}");
    assert_eq!(c.json(&["queue"]).as_array().map_or(0, Vec::len), 0);
}

/// Attack 7 (low): U+200B and other invisible characters were taken in names (a job
/// named "train\u{200b}" looks like another user's "train").
#[test]
fn invisible_characters_in_names_are_refused() {
    let c = Cluster::controller_only();
    for (key, value) in [
        ("name", "train\u{200b}"),
        ("name", "a\u{202e}txt.exe"),
        ("account", "risk\u{feff}"),
        ("name", "x\u{2060}y"),
    ] {
        std::fs::write(
            c.path("inv.toml"),
            format!("command = [\"true\"]\n{key} = \"{value}\"\n"),
        )
        .unwrap();
        let out = c.gpuctl(&["submit", "inv.toml"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("invisible character"),
            "{value:?}: {err}"
        );
    }
    // Visible non-ASCII is fine.
    c.submit(
        "ok.toml",
        "command = [\"true\"]\nname = \"entraînement-日本\"\n",
    );
}

/// A newcomer's stumble: fake GPU UUIDs derived from the node name, so two clusters on
/// one host with a `node1` each saw each other's jobs on their GPUs. They derive from
/// the agent's identity now, and stay the same across its restarts.
#[test]
fn fake_gpu_uuids_differ_between_agents_of_the_same_name() {
    let mut a = Cluster::start(&[("node1", "1xA100-80GB")]);
    let b = Cluster::start(&[("node1", "1xA100-80GB")]);
    let uuid = |c: &Cluster| {
        c.nodes()[0]["gpus"][0]["uuid"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let first = uuid(&a);
    assert_ne!(first, uuid(&b));
    a.kill9_agent("node1");
    a.add_agent("node1", "1xA100-80GB", &[]);
    assert!(gpuctl_tests::wait_for(T, || a.node_state("node1") == "IDLE"));
    assert_eq!(uuid(&a), first, "stable across a restart");
}

fn scrape_value(port: u16, prefix: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A newcomer's stumble: `gpuctl_gpus_allocated` said 2.25 while
/// `gpuctl_user_running_gpus{user="root"}` said 3.25 for the same jobs (quarter shares
/// and MIG instances). One definition now: a MIG instance is its slices of seven.
#[test]
fn allocated_gpus_mean_the_same_in_every_metric() {
    let port = gpuctl_tests::free_port();
    let mut c = Cluster::controller_with_args(&["--metrics-listen", &format!("127.0.0.1:{port}")]);
    c.add_agent("mig1", "1xA100-80GB:mig=3g.40gb+2g.20gb+2g.20gb", &[]);
    c.add_agent("whole1", "1xA100-80GB", &[]);
    c.wait_nodes_up(2);
    let mut ids = Vec::new();
    for r in [
        "mig = \"3g.40gb\"",
        "mig = \"2g.20gb\"",
        "gpus = 0.25",
        "gpus = 0.25",
    ] {
        ids.push(c.submit(
            "j.toml",
            &format!("script = \"sleep 60\"\n[resources]\n{r}\n"),
        ));
    }
    for &id in &ids {
        c.wait_state(id, "RUNNING", T);
    }
    let want = 3.0 / 7.0 + 2.0 / 7.0 + 0.5;
    let all = scrape_value(port, "gpuctl_gpus_allocated ").unwrap();
    let user = scrape_value(port, "gpuctl_user_running_gpus{user=\"root\"}").unwrap();
    assert!((all - want).abs() < 1e-6, "allocated {all}, want {want}");
    assert!((user - want).abs() < 1e-6, "user {user}, want {want}");
    // The CLI's figure is the same, and `gpuctl nodes` shows the MIG layout in use.
    let stats = c.json(&["nodes", "--stats"]);
    let cli = stats["gpus_allocated"].as_f64().unwrap();
    assert!(
        (cli - want).abs() < 1e-6,
        "nodes --stats {cli}, want {want}"
    );
    // A GPU's row shows once its agent has sampled it (each agent on its own clock).
    let shown = |t: &str| t.contains("MIG") && t.contains("3g.40gb*");
    gpuctl_tests::wait_for(T, || shown(&c.gpuctl_ok(&["nodes"])));
    let table = c.gpuctl_ok(&["nodes"]);
    assert!(shown(&table), "{table}");
    let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
    let mut args = vec!["cancel"];
    args.extend(ids.iter().map(String::as_str));
    c.gpuctl_ok(&args);
}

/// A newcomer's stumble: accounts, QoS, partitions or windows needed a controller
/// restart. `gpuctl admin reconfigure` (and SIGHUP) read the file again, validated
/// before anything changes, and say what applied and what waits for a restart.
#[test]
fn the_controller_takes_a_new_config_without_a_restart() {
    let c = Cluster::start(&[("rc1", "1xA100-80GB")]);
    let conf = c.path("gpuctld.toml");
    let base = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(c.path("a.toml"), "command = [\"true\"]\nqos = \"gold\"\n").unwrap();
    let refused = c.gpuctl(&["submit", "a.toml"]);
    assert!(!refused.status.success());
    // A bad file: refused with its line and column, nothing changes.
    std::fs::write(
        &conf,
        format!("{base}\n[qos.gold]\npriority = 5000\npreempts = [\"low\"\n"),
    )
    .unwrap();
    let out = c.gpuctl(&["admin", "reconfigure"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("not changed"),
        "{err}"
    );
    assert!(err.contains("line"), "{err}");
    // A good one: the account exists at once; a setting read at start is named.
    std::fs::write(
        &conf,
        format!("{base}\n[qos.normal]\npriority = 1000\n[qos.low]\npriority = 0\n[qos.high]\npriority = 10000\npreempts = [\"low\"]\n[qos.gold]\npriority = 5000\n[limits]\nmax_connections = 100\n"),
    )
    .unwrap();
    let done = c.json(&["admin", "reconfigure"]);
    let applied = done["applied"].as_array().unwrap();
    assert!(applied.contains(&serde_json::json!("qos.gold")), "{done}");
    assert_eq!(
        done["needs_restart"],
        serde_json::json!(["limits.max_connections"])
    );
    let id = c.submit("a.toml", "command = [\"true\"]\nqos = \"gold\"\n");
    c.wait_state(id, "COMPLETED", T);
    // SIGHUP does the same.
    std::fs::write(&conf, format!("{base}\n[qos.normal]\npriority = 1000\n[qos.low]\npriority = 0\n[qos.high]\npriority = 10000\npreempts = [\"low\"]\n[qos.gold]\npriority = 5000\n[qos.ops]\npriority = 1\n")).unwrap();
    nix::sys::signal::kill(c.controller_pid(), nix::sys::signal::Signal::SIGHUP).unwrap();
    assert!(gpuctl_tests::wait_for(T, || c
        .controller_log()
        .contains("configuration read again")
        && c.controller_log().contains("qos.ops")));
    let id = c.submit("o.toml", "command = [\"true\"]\nqos = \"ops\"\n");
    c.wait_state(id, "COMPLETED", T);
}

/// A newcomer's stumble: `gpuctl share` hid accounts and users without usage and had no
/// account-level rows (sshare shows every association, accounts above their users).
#[test]
fn share_lists_every_association_with_account_rows() {
    let c = Cluster::controller_with_config(
        "[accounts.risk]\nshares = 3\nusers = [\"bob\", \"carol\"]\n[accounts.ops]\nusers = [\"dave\"]\n",
    );
    let s = c.json(&["share"]);
    let rows = s["rows"].as_array().unwrap();
    for (a, u) in [("risk", "bob"), ("risk", "carol"), ("ops", "dave")] {
        assert!(
            rows.iter().any(|r| r["account"] == a && r["user"] == u),
            "{a}/{u} missing: {s}"
        );
    }
    let accounts = s["accounts"].as_array().unwrap();
    let risk = accounts.iter().find(|a| a["account"] == "risk").unwrap();
    assert_eq!(risk["account_shares"], 0.75, "{s}");
    let text = c.gpuctl_ok(&["share"]);
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with("risk"))
        .unwrap();
    assert!(lines[at + 1].contains("bob"), "{text}");
}
