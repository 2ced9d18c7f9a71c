//! Nobody acts for another: agents need the cluster key, users are who the socket or
//! their token says, only owners and admins touch jobs, only admins touch nodes.

use std::time::Duration;

use gpuctl_proto::auth::{ClusterKey, MAC_HEADER, NODE_HEADER, TIME_HEADER};
use gpuctl_proto::{self as pb, agent_link_client::AgentLinkClient};
use gpuctl_tests::{Cluster, ensure_user, submitted_id as job_id, wait_for};

const T: Duration = Duration::from_secs(30);
const ALICE: &str = "gpuctlalice";
const BOB: &str = "gpuctlbob";

fn users() -> bool {
    ensure_user(ALICE).is_some() && ensure_user(BOB).is_some()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn submit_as(c: &Cluster, user: &str, toml: &str, extra: &[&str]) -> std::process::Output {
    let dir = c.user_dir(user);
    std::fs::write(dir.join("job.toml"), toml).unwrap();
    let mut args = vec!["submit", "--json"];
    args.extend_from_slice(extra);
    args.push("job.toml");
    c.gpuctl_as(user, &dir, &args)
}

const SLEEP: &str = "script = \"sleep 30\"\n[resources]\ngpus = 1\n";

#[test]
fn owners_and_admins_only() {
    if !users() {
        return;
    }
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let home = c.user_dir(ALICE);

    // The socket tells the controller who is calling.
    let me = c.gpuctl_as(ALICE, &home, &["whoami", "--json"]);
    let me: serde_json::Value = serde_json::from_slice(&me.stdout).unwrap();
    assert_eq!(me["user"], ALICE);
    assert_eq!(me["admin"], false);
    assert_eq!(me["via"], "unix-socket");

    let running = job_id(&submit_as(&c, ALICE, SLEEP, &[]));
    let pending = job_id(&submit_as(&c, ALICE, SLEEP, &[]));
    assert_eq!(c.job(running)["user"], ALICE);
    c.wait_state(running, "RUNNING", T);

    // Bob may not cancel Alice's jobs, running or pending, alone or with his own.
    let bobs = job_id(&submit_as(&c, BOB, SLEEP, &[]));
    for ids in [
        vec![running.to_string()],
        vec![pending.to_string()],
        vec![bobs.to_string(), pending.to_string()],
    ] {
        let mut args = vec!["cancel"];
        args.extend(ids.iter().map(String::as_str));
        let out = c.gpuctl_as(BOB, &c.user_dir(BOB), &args);
        assert_eq!(out.status.code(), Some(1));
        let err = stderr(&out);
        assert!(
            err.contains("permission denied for user gpuctlbob")
                && err.contains(&format!("job {} belongs to {ALICE}", ids.last().unwrap())),
            "{err}"
        );
    }
    assert_eq!(c.job(running)["state"], "RUNNING");
    assert_eq!(c.job(pending)["state"], "PENDING");
    assert_eq!(
        c.job(bobs)["state"],
        "PENDING",
        "nothing is cancelled when one id is refused"
    );

    // A forged user name is refused, and nothing is queued.
    let before = c.json(&["queue", "--all"]).as_array().unwrap().len();
    let out = submit_as(&c, ALICE, SLEEP, &["--user", BOB]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("cannot submit a job as user \"gpuctlbob\""),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        c.json(&["queue", "--all"]).as_array().unwrap().len(),
        before
    );

    // Only admins drain and resume.
    for args in [
        &["node", "drain", "n1", "--reason", "mine now"][..],
        &["node", "resume", "n1"][..],
    ] {
        let out = c.gpuctl_as(ALICE, &home, args);
        assert_eq!(out.status.code(), Some(1));
        assert!(stderr(&out).contains("only admins may"), "{}", stderr(&out));
    }
    assert_eq!(c.node_state("n1"), "ALLOCATED");

    // The owner may cancel; root (an admin) may cancel anyone's.
    let out = c.gpuctl_as(ALICE, &home, &["cancel", &pending.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    c.gpuctl_ok(&["cancel", &running.to_string(), &bobs.to_string()]);
    c.wait_state(running, "CANCELLED", T);
    c.wait_state(bobs, "CANCELLED", T);

    // Denials are logged.
    let log = std::fs::read_to_string(c.path("gpuctld.log")).unwrap();
    assert!(log.contains("permission denied"), "{log}");
}

#[test]
fn admins_from_config_and_admin_submits_for_others() {
    if !users() {
        return;
    }
    let c = {
        let mut c = Cluster::controller_with_config(&format!("admins = [\"{BOB}\"]"));
        c.add_agent("n1", "1xA100-80GB", &[]);
        c.wait_nodes_up(1);
        c
    };
    let bob_dir = c.user_dir(BOB);
    let out = c.gpuctl_as(BOB, &bob_dir, &["node", "drain", "n1", "--reason", "maint"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(c.node_state("n1"), "DRAINED");
    let out = c.gpuctl_as(BOB, &bob_dir, &["node", "resume", "n1"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // An admin may submit for another user: the job is that user's. Its workdir is the
    // user's own (a shared /tmp may hold another test's gpuctl-1.out).
    let alice_dir = c.user_dir(ALICE);
    let id = job_id(&submit_as(
        &c,
        BOB,
        &format!(
            "command = [\"true\"]\nworkdir = {:?}\n",
            alice_dir.display().to_string()
        ),
        &["--user", ALICE],
    ));
    let j = c.wait_state(id, "COMPLETED", T);
    assert_eq!(j["user"], ALICE);
}

#[test]
fn tokens_over_tcp() {
    if !users() {
        return;
    }
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let tcp = c.tcp_url();
    let run = |token: Option<&str>, args: &[&str]| {
        let mut cmd = std::process::Command::new(gpuctl_tests::bin("gpuctl"));
        cmd.arg("--controller").arg(&tcp).args(args);
        // This cluster runs the old mode (plain TCP, --insecure): the CLI sends a token
        // there only when told to (tests/tests/tls.rs covers the default).
        cmd.env_remove("GPUCTL_TOKEN")
            .env("HOME", c.path("nohome"))
            .env("GPUCTL_INSECURE", "true");
        if let Some(t) = token {
            cmd.env("GPUCTL_TOKEN", t);
        }
        cmd.current_dir(c.dir.path()).output().unwrap()
    };

    // No credentials over TCP: refused, with what to do.
    let out = run(None, &["queue"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no credentials"), "{}", stderr(&out));
    let out = run(Some("gpuctl_forged_0000"), &["queue"]);
    assert!(
        stderr(&out).contains("unknown or revoked API token"),
        "{}",
        stderr(&out)
    );

    // Only admins create tokens.
    let out = c.gpuctl_as(
        ALICE,
        &c.user_dir(ALICE),
        &["admin", "token", "create", "--user", ALICE],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("only admins may create tokens"),
        "{}",
        stderr(&out)
    );

    let t = c.json(&[
        "admin", "token", "create", "--user", ALICE, "--note", "laptop",
    ]);
    let token = t["token"].as_str().unwrap().to_string();
    let tid = t["id"].as_str().unwrap().to_string();
    let me = run(Some(&token), &["whoami", "--json"]);
    let me: serde_json::Value = serde_json::from_slice(&me.stdout).unwrap();
    assert_eq!(me["user"], ALICE);
    assert_eq!(me["via"], "token");
    let list = c.json(&["admin", "token", "list"]);
    assert_eq!(list[0]["user"], ALICE);
    assert!(
        !list.to_string().contains(&token),
        "a token list never shows secrets"
    );

    // The token's user is who the job runs as, whatever the local user is (root here).
    let alice_dir = c.user_dir(ALICE);
    std::fs::write(
        c.path("t.toml"),
        format!(
            "command = [\"true\"]\nworkdir = {:?}\n",
            alice_dir.display().to_string()
        ),
    )
    .unwrap();
    let out = run(Some(&token), &["submit", "--json", "t.toml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["job_id"]
        .as_u64()
        .unwrap();
    assert_eq!(c.job(id)["user"], ALICE);
    // `queue --json` takes its pages undecoded, on the same authenticated channel.
    let out = run(Some(&token), &["queue", "--json", "--all"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let q: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(q.as_array().unwrap().iter().any(|j| j["id"] == id), "{q}");
    let out = run(Some(&token), &["submit", "--user", "root", "t.toml"]);
    assert!(
        stderr(&out).contains("permission denied"),
        "{}",
        stderr(&out)
    );

    // Revoked: refused from then on, with nothing printed before the refusal.
    c.gpuctl_ok(&["admin", "token", "revoke", &tid]);
    for args in [&["queue"][..], &["queue", "--json"]] {
        let out = run(Some(&token), args);
        assert!(
            stderr(&out).contains("unknown or revoked API token"),
            "{}",
            stderr(&out)
        );
        assert_eq!(out.status.code(), Some(1));
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

#[test]
fn agent_without_the_key_cannot_register_or_report() {
    let mut c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let id = c.submit("s.toml", SLEEP);
    c.wait_state(id, "RUNNING", T);

    // gpud with another key: refused at registration, and it says why.
    let wrong = c.path("wrong.key");
    let (_, created) = ClusterKey::load_or_create(&wrong).unwrap();
    assert!(created);
    c.add_agent_with_key("intruder", "1xA100-80GB", &wrong, &[]);
    assert!(wait_for(T, || c.agent_exited("intruder").is_some()));
    assert!(!c.agent_exited("intruder").unwrap().success());
    let log = std::fs::read_to_string(c.path("gpud-intruder.log")).unwrap();
    assert!(log.contains("bad signature"), "{log}");
    assert!(
        c.nodes()
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["name"] != "intruder"),
        "the intruder's node must not be known"
    );

    // Forged reports (unsigned, or signed with another key) do not end the job.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tcp = c.tcp_url();
    let codes = rt.block_on(async move {
        let mut client = AgentLinkClient::connect(tcp).await.unwrap();
        let report = pb::JobReport {
            node: "n1".into(),
            job_id: id,
            kind: pb::job_report::Kind::Ended as i32,
            state: pb::JobState::Completed as i32,
            exit_code: Some(0),
            attempt: 1,
            ..pb::JobReport::default()
        };
        let unsigned = client.report_job(report.clone()).await.unwrap_err();
        let key = ClusterKey::load(&wrong).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let mut req = tonic::Request::new(report.clone());
        use prost::Message;
        let signed = gpuctl_proto::auth::Signed {
            session: vec![1; 16],
            seq: 1,
        };
        let mac = key.sign_request("report", "n1", now, &signed, &report.encode_to_vec());
        req.metadata_mut()
            .insert(NODE_HEADER, "n1".parse().unwrap());
        req.metadata_mut().insert(
            gpuctl_proto::auth::SESSION_HEADER,
            "01010101010101010101010101010101".parse().unwrap(),
        );
        req.metadata_mut()
            .insert(gpuctl_proto::auth::SEQ_HEADER, 1u64.into());
        req.metadata_mut().insert(TIME_HEADER, now.into());
        req.metadata_mut().insert(MAC_HEADER, mac.parse().unwrap());
        let forged = client.report_job(req).await.unwrap_err();
        (unsigned, forged)
    });
    assert_eq!(codes.0.code(), tonic::Code::Unauthenticated);
    assert!(
        codes.0.message().contains("missing x-gpuctl-node"),
        "{:?}",
        codes.0
    );
    assert_eq!(codes.1.code(), tonic::Code::Unauthenticated);
    assert!(codes.1.message().contains("bad signature"), "{:?}", codes.1);
    assert_eq!(c.job(id)["state"], "RUNNING");
    c.gpuctl_ok(&["cancel", &id.to_string()]);
    c.wait_state(id, "CANCELLED", T);
}

#[test]
fn limits_and_path_rules_give_clear_errors() {
    let c = Cluster::controller_with_config(
        "[limits]\nmax_pending_per_user = 2\nmax_job_bytes = \"2KiB\"\nmax_list_len = 8\n",
    );
    let ok = "command = [\"true\"]\n";
    c.submit("a.toml", ok);
    c.submit("b.toml", ok);
    let refused = |name: &str, toml: &str, want: &str| {
        std::fs::write(c.path(name), toml).unwrap();
        let out = c.gpuctl(&["submit", name]);
        assert_eq!(out.status.code(), Some(1), "{name}");
        let err = stderr(&out);
        assert!(err.contains(want), "{name}: {err}");
    };
    refused(
        "c.toml",
        ok,
        "already has 2 pending jobs, the most allowed (limits.max_pending_per_user)",
    );
    let id = c.json(&["queue"])[0]["id"].as_u64().unwrap();
    c.gpuctl_ok(&["cancel", &id.to_string()]);
    refused(
        "big.toml",
        &format!("script = \"echo {}\"\n", "x".repeat(4000)),
        "over the controller's limit of 2.0 KiB (limits.max_job_bytes)",
    );
    refused(
        "args.toml",
        "command = [\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]\n",
        "`command` has 9 entries, over the limit of 8",
    );
    refused(
        "escape.toml",
        "command = [\"true\"]\nstdout = \"../../etc/cron.d/x\"\n",
        "leaves the workdir",
    );
    // Refusals queue nothing.
    assert_eq!(c.json(&["queue"]).as_array().unwrap().len(), 1);
    c.submit("d.toml", ok);
}
