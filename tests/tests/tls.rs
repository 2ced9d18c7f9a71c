//! The default wire: TLS under the cluster's own CA, nodes that join with single-use
//! tokens and are known by their certificates, API tokens over TLS only.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_tests::{Cluster, bin, wait_for};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A gpud run to its end (a refused join exits).
fn gpud_exits(c: &Cluster, name: &str, args: &[&str]) -> Output {
    Command::new(bin("gpud"))
        .args([
            "--controller",
            &c.https_url(),
            "--name",
            name,
            "--fake-gpus",
            "1xA100-80GB",
        ])
        .arg("--state-dir")
        .arg(c.path(&format!("gpud-{name}")))
        .args(args)
        .output()
        .unwrap()
}

/// A proxy on loopback to `to` that keeps every byte it forwards, both ways.
fn recording_proxy(to: u16) -> (u16, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    std::thread::spawn(move || {
        for client in l.incoming().flatten() {
            let server = TcpStream::connect(("127.0.0.1", to)).unwrap();
            for (mut from, mut into) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                let keep = keep.clone();
                std::thread::spawn(move || {
                    let mut b = [0u8; 16384];
                    while let Ok(n) = from.read(&mut b) {
                        if n == 0 || into.write_all(&b[..n]).is_err() {
                            break;
                        }
                        keep.lock().unwrap().extend_from_slice(&b[..n]);
                    }
                    let _ = into.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
    (port, seen)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A submit with env and a token, over TLS through a proxy that records the traffic:
/// neither the token nor the env value is in what crossed the wire; a CLI that pins
/// another CA is refused; http:// gets no token.
#[test]
fn the_wire_holds_no_token_or_env_and_the_cli_pins_the_ca() {
    let mut c = Cluster::secure_controller();
    c.join_agent("n1", "1xA100-80GB");
    c.wait_nodes_up(1);
    let token = c.json(&["admin", "token", "create", "--user", "root"])["token"]
        .as_str()
        .unwrap()
        .to_string();
    let (proxy, seen) = recording_proxy(c.port);
    let secret = "env-value-that-must-not-travel-in-clear-4711";
    std::fs::write(
        c.path("job.toml"),
        format!("command = [\"sleep\", \"300\"]\n[env]\nMY_SECRET = \"{secret}\"\n"),
    )
    .unwrap();
    let run = |ca: &std::path::Path, args: &[&str]| {
        Command::new(bin("gpuctl"))
            .args(["--controller", &format!("https://127.0.0.1:{proxy}")])
            .args(args)
            .env("GPUCTL_TOKEN", &token)
            .env("GPUCTL_CA", ca)
            .env("HOME", c.path("nohome"))
            .current_dir(c.dir.path())
            .output()
            .unwrap()
    };
    let ca = c.path("ctld-state/ca.pem");
    let out = run(&ca, &["submit", "job.toml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Still running: an ended job's env is compacted away.
    let out = run(&ca, &["show", "1", "--json"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(secret),
        "the owner sees the env: {} {}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    let wire = seen.lock().unwrap().clone();
    assert!(
        wire.len() > 2000,
        "the proxy saw the traffic ({} bytes)",
        wire.len()
    );
    assert!(
        !contains(&wire, token.as_bytes()),
        "the token crossed the wire in clear"
    );
    assert!(
        !contains(&wire, secret.as_bytes()),
        "the env crossed the wire in clear"
    );
    assert!(
        !contains(&wire, b"MY_SECRET"),
        "the env's key crossed the wire in clear"
    );

    // A CA of another cluster: the controller's certificate is refused.
    let other = tempfile::tempdir().unwrap();
    gpuctl_proto::tls::Ca::load_or_create(other.path(), 1_800_000_000).unwrap();
    let out = run(&other.path().join("ca.pem"), &["queue"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("cannot reach the controller"),
        "{}",
        stderr(&out)
    );
}

/// Join tokens are single use and expire; a node's certificate does not work under
/// another node's name; a revoked node is refused at once and its jobs handled.
#[test]
fn joins_are_single_use_and_nodes_are_their_certificates() {
    let mut c = Cluster::secure_controller();
    c.join_agent("n1", "1xA100-80GB");
    c.wait_nodes_up(1);

    // A token used once is gone.
    let (token, fp) = c.join_token("", "1h");
    let file = gpuctl_tests::join_file(&c.path("join-any.json"), &token, &fp);
    let file = file.to_str().unwrap();
    c.spawn_gpud("n2", &["--fake-gpus", "1xA100-80GB", "--join-file", file]);
    c.wait_nodes_up(2);
    let out = gpud_exits(&c, "n3", &["--join-file", file]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unknown or already used join token"),
        "{}",
        stderr(&out)
    );

    // An expired one is refused.
    let (late, _) = c.join_token("n4", "1s");
    std::thread::sleep(Duration::from_millis(1500));
    let late = gpuctl_tests::join_file(&c.path("join-n4.json"), &late, &fp);
    let out = gpud_exits(&c, "n4", &["--join-file", late.to_str().unwrap()]);
    assert!(stderr(&out).contains("expired"), "{}", stderr(&out));

    // A wrong CA fingerprint: the token is never sent.
    let (t5, _) = c.join_token("n5", "1h");
    let wrong = gpuctl_proto::tls::fingerprint(b"not the CA");
    let t5 = gpuctl_tests::join_file(&c.path("join-n5.json"), &t5, &wrong);
    let out = gpud_exits(&c, "n5", &["--join-file", t5.to_str().unwrap()]);
    assert!(
        stderr(&out).contains("pinned fingerprint"),
        "{}",
        stderr(&out)
    );

    // n1's certificate and key presented as n2.
    let stolen = c.path("gpud-impostor");
    std::fs::create_dir_all(stolen.join("tls")).unwrap();
    for f in [
        "ca.pem",
        "node.pem",
        "node-key.pem",
        "node.key",
        "not-after",
    ] {
        std::fs::copy(
            c.path(&format!("gpud-n1/tls/{f}")),
            stolen.join("tls").join(f),
        )
        .unwrap();
    }
    std::fs::write(stolen.join("tls/node"), "n2").unwrap();
    c.spawn_gpud_at("impostor", "n2", &["--fake-gpus", "1xA100-80GB"]);
    assert!(
        wait_for(Duration::from_secs(10), || c
            .controller_log()
            .contains("the connection's certificate is not this node's")),
        "the impostor was not refused: {}",
        c.controller_log()
    );

    // Revoked: refused at once, the node DOWN, its running job handled as on a
    // failed node.
    std::fs::write(
        c.path("sleep.toml"),
        "command = [\"sleep\", \"300\"]\n[resources]\ngpus = 1\n",
    )
    .unwrap();
    let mut on_n2 = None;
    for _ in 0..2 {
        let id = c.gpuctl_ok(&["submit", "--parsable", "sleep.toml"]);
        let id: u64 = id.trim().parse().unwrap();
        let j = c.wait_state(id, "RUNNING", Duration::from_secs(20));
        if j["node"] == "n2" {
            on_n2 = Some(id);
        }
    }
    let id = on_n2.expect("one of the two jobs runs on n2");
    let out = c.gpuctl(&["admin", "node", "revoke", "n2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let j = c.job(id);
    assert_ne!(j["state"], "RUNNING", "{j:#}");
    assert!(
        wait_for(Duration::from_secs(10), || c
            .agent_log("n2")
            .contains("was revoked")),
        "{}",
        c.agent_log("n2")
    );
    let nodes = c.json(&["nodes"]);
    let n2 = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "n2")
        .unwrap();
    assert_eq!(n2["state"], "DOWN", "{n2:#}");
}

/// A certificate renews before it expires, without a restart: with a 60 s lifetime the
/// agent renews after about 40 s and stays up, under a new certificate.
#[test]
fn certificates_renew_without_a_restart() {
    let mut c = Cluster::secure_controller();
    c.kill9_controller();
    c.ctld_args = vec!["--node-certificate-lifetime".into(), "60s".into()];
    c.start_controller();
    c.join_agent("n1", "1xA100-80GB");
    c.wait_nodes_up(1);
    let first = std::fs::read_to_string(c.path("gpud-n1/tls/node.pem")).unwrap();
    assert!(
        wait_for(Duration::from_secs(55), || std::fs::read_to_string(
            c.path("gpud-n1/tls/node.pem")
        )
        .is_ok_and(|p| p != first)),
        "no renewal: {}",
        c.agent_log("n1")
    );
    // Past the first certificate's end, the node still works.
    std::thread::sleep(Duration::from_secs(25));
    std::fs::write(c.path("true.toml"), "command = [\"true\"]\n").unwrap();
    let id: u64 = c
        .gpuctl_ok(&["submit", "--parsable", "true.toml"])
        .trim()
        .parse()
        .unwrap();
    c.wait_state(id, "COMPLETED", Duration::from_secs(20));
}

/// A node's signing key alone (`tls/node.key` copied off the node) is not the node: over
/// a TLS connection that presents no node certificate, a challenge and a job's end
/// signed with that key are refused, and the job runs on.
#[test]
fn a_node_key_without_its_certificate_cannot_attach_or_report() {
    use gpuctl_proto as pb;
    use gpuctl_proto::agent_link_client::AgentLinkClient;
    use gpuctl_proto::auth::{ClusterKey, Signed};
    use gpuctl_proto::tls::ClientTls;

    let mut c = Cluster::secure_controller();
    c.join_agent("n1", "1xA100-80GB");
    c.wait_nodes_up(1);
    std::fs::write(
        c.path("sleep.toml"),
        "command = [\"sleep\", \"300\"]\n[resources]\ngpus = 1\n",
    )
    .unwrap();
    let id: u64 = c
        .gpuctl_ok(&["submit", "--parsable", "sleep.toml"])
        .trim()
        .parse()
        .unwrap();
    c.wait_state(id, "RUNNING", Duration::from_secs(20));
    let key = ClusterKey::load(&c.path("gpud-n1/tls/node.key")).unwrap();
    let ca = std::fs::read_to_string(c.path("ctld-state/ca.pem")).unwrap();
    let url = c.https_url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let refused = rt.block_on(async move {
        let endpoint = tonic::transport::Endpoint::from_shared(url).unwrap();
        let channel = ClientTls::new(&ca, None)
            .unwrap()
            .connect(endpoint)
            .await
            .unwrap();
        let mut client = AgentLinkClient::new(channel);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let unnumbered = Signed {
            session: Vec::new(),
            seq: 0,
        };
        let challenge = pb::ChallengeRequest { node: "n1".into() };
        let req = key
            .signed_request("challenge", "n1", now, &unnumbered, challenge)
            .unwrap();
        let a = client.challenge(req).await.unwrap_err();
        let report = pb::JobReport {
            node: "n1".into(),
            job_id: id,
            kind: pb::job_report::Kind::Ended as i32,
            state: pb::JobState::Completed as i32,
            exit_code: Some(0),
            attempt: 1,
            time_ms: now,
            ..pb::JobReport::default()
        };
        let numbered = Signed {
            session: vec![1; 16],
            seq: 1,
        };
        let req = key
            .signed_request("report", "n1", now, &numbered, report)
            .unwrap();
        let r = client.report_job(req).await.unwrap_err();
        [a, r]
    });
    for s in &refused {
        assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
        assert!(
            s.message().contains("presents no node certificate"),
            "{}",
            s.message()
        );
    }
    assert_eq!(c.job(id)["state"], "RUNNING");
}
