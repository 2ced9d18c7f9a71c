//! Policy on the real binaries: preemption with requeue (the victim sees its checkpoint
//! signal first), holds, queue filters, QoS caps and fair share.

use std::time::Duration;

use gpuctl_tests::{Cluster, ensure_user, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);
const ALICE: &str = "gpuctlalice";
const BOB: &str = "gpuctlbob";

fn users() -> bool {
    ensure_user(ALICE).is_some() && ensure_user(BOB).is_some()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Submits `toml` as `user` from their directory; the new job's id.
fn submit_as(c: &Cluster, user: &str, file: &str, toml: &str) -> u64 {
    let dir = c.user_dir(user);
    std::fs::write(dir.join(file), toml).unwrap();
    let o = c.gpuctl_as(user, &dir, &["submit", "--json", file]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice::<Value>(&o.stdout).unwrap()["job_id"]
        .as_u64()
        .unwrap()
}

fn as_user(c: &Cluster, user: &str, args: &[&str]) -> std::process::Output {
    let dir = c.user_dir(user);
    c.gpuctl_as(user, &dir, args)
}

/// A cluster of one node with `gpus` fake A100s and this extra controller config.
fn cluster(gpus: u32, config: &str) -> Cluster {
    let mut c = Cluster::controller_with_config(config);
    c.add_agent("n1", &format!("{gpus}xA100-80GB"), &[]);
    c.wait_nodes_up(1);
    c
}

const PREEMPTING: &str = r#"
[qos.scavenger]
priority = 0
[qos.normal]
priority = 1000
[qos.urgent]
priority = 10000
preempts = ["scavenger"]
[preemption]
min_run = "1s"
"#;

#[test]
fn preemption_signals_the_victim_then_requeues_it() {
    if !users() {
        return;
    }
    let c = cluster(1, PREEMPTING);
    // The victim checkpoints on USR1 (it has 5 s before the kill) and says so.
    let victim = submit_as(
        &c,
        ALICE,
        "scav.toml",
        "name = \"scav\"\nqos = \"scavenger\"\nrequeue = true\nsignal = \"USR1@5\"\n\
         script = \"\"\"\ntrap 'echo checkpoint-$GPUCTL_JOB_ID >> ckpt.log; exit 0' USR1\n\
         while true; do sleep 0.1; done\n\"\"\"\n[resources]\ngpus = 1\n",
    );
    c.wait_state(victim, "RUNNING", T);
    std::thread::sleep(Duration::from_millis(1500));
    let urgent = submit_as(
        &c,
        BOB,
        "urgent.toml",
        "name = \"urgent\"\nqos = \"urgent\"\nscript = \"sleep 3\"\n[resources]\ngpus = 1\n",
    );
    // The victim sees its signal, is requeued with its reason, and the urgent job runs.
    let ckpt = c.user_dir(ALICE).join("ckpt.log");
    assert!(
        wait_for(T, || std::fs::read_to_string(&ckpt)
            .is_ok_and(|s| s.contains("checkpoint"))),
        "the victim never saw USR1: {}\n{}\n{}",
        c.controller_log(),
        c.agent_log("n1"),
        c.gpuctl_ok(&["queue", "--all"])
    );
    assert!(wait_for(T, || {
        let j = c.job(victim);
        j["state"] == "PENDING"
            && j["reason"] == format!("Preempted by job {urgent}")
            && j["attempt"] == 1
    }));
    c.wait_state(urgent, "COMPLETED", T);
    // Then the victim runs again as the same job, its second attempt.
    let v = c.wait_state(victim, "RUNNING", T);
    assert_eq!(v["attempt"], 2);
    assert!(
        as_user(&c, ALICE, &["cancel", &victim.to_string()])
            .status
            .success()
    );
    c.wait_state(victim, "CANCELLED", T);
}

#[test]
fn holds_and_queue_filters() {
    if !users() {
        return;
    }
    let c = cluster(1, "");
    let job = "script = \"sleep 30\"\n[resources]\ngpus = 1\n";
    let first = submit_as(&c, ALICE, "a.toml", &format!("name = \"first\"\n{job}"));
    let second = submit_as(&c, ALICE, "b.toml", &format!("name = \"second\"\n{job}"));
    c.wait_state(first, "RUNNING", T);
    let o = as_user(&c, ALICE, &["hold", &second.to_string()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("JobHeldUser"), "{}", stdout(&o));
    // Bob may neither release nor hold alice's jobs.
    let o = as_user(&c, BOB, &["release", &second.to_string()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("only a job's owner or an admin"),
        "{}",
        stderr(&o)
    );
    // Filters: state, user, --me, name; columns without a header.
    let pd = c.gpuctl_ok(&["queue", "-t", "PD", "-o", "jobid,user,reason", "-h"]);
    assert_eq!(
        pd.split_whitespace().collect::<Vec<_>>(),
        [&second.to_string(), ALICE, "JobHeldUser"]
    );
    assert!(
        as_user(&c, BOB, &["queue", "--me", "--json"])
            .stdout
            .starts_with(b"[]")
    );
    let mine =
        serde_json::from_slice::<Value>(&as_user(&c, ALICE, &["queue", "--me", "--json"]).stdout)
            .unwrap();
    assert_eq!(mine.as_array().unwrap().len(), 2);
    let named = c.json(&["queue", "--name", "first", "-u", ALICE]);
    assert_eq!(named.as_array().unwrap().len(), 1);
    assert_eq!(named[0]["id"], first);
    assert_eq!(c.json(&["queue", "-u", BOB]).as_array().unwrap().len(), 0);
    let bad = c.gpuctl(&["queue", "-o", "jobid,colour"]);
    assert!(
        stderr(&bad).contains("unknown column \"colour\""),
        "{}",
        stderr(&bad)
    );
    // Released, it runs once the first ends.
    assert!(
        as_user(&c, ALICE, &["release", &second.to_string()])
            .status
            .success()
    );
    assert!(
        as_user(&c, ALICE, &["cancel", &first.to_string()])
            .status
            .success()
    );
    c.wait_state(second, "RUNNING", T);
    // Requeue: back to pending with the same id, then running again.
    assert!(
        as_user(&c, ALICE, &["requeue", &second.to_string()])
            .status
            .success()
    );
    assert!(wait_for(T, || {
        let j = c.job(second);
        j["state"] == "RUNNING" && j["attempt"] == 2
    }));
    assert!(
        as_user(&c, ALICE, &["cancel", &second.to_string()])
            .status
            .success()
    );
}

#[test]
fn a_qos_cap_holds_a_users_second_job_and_fair_share_counts_usage() {
    if !users() {
        return;
    }
    let c = cluster(2, "[qos.normal]\npriority = 1000\nmax_gpus_per_user = 1\n");
    let job = "script = \"sleep 3\"\n[resources]\ngpus = 1\n";
    let a1 = submit_as(&c, ALICE, "a1.toml", job);
    let a2 = submit_as(&c, ALICE, "a2.toml", job);
    c.wait_state(a1, "RUNNING", T);
    assert!(wait_for(T, || c.job(a2)["reason"] == "QOSMaxGpusPerUser"));
    let e = c.json(&["explain", &a2.to_string()]);
    assert!(
        e["summary"].as_str().unwrap().contains("max_gpus_per_user"),
        "{e}"
    );
    // Bob is not capped by alice's use: his job takes the second GPU.
    let b = submit_as(&c, BOB, "b.toml", job);
    c.wait_state(b, "RUNNING", T);
    c.wait_state(a1, "COMPLETED", T);
    c.wait_state(a2, "COMPLETED", T);
    // Fair share saw what ran.
    let share = c.json(&["share"]);
    let row = share["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["user"] == ALICE)
        .cloned()
        .unwrap_or_else(|| panic!("{share}"));
    assert_eq!(row["account"], ALICE);
    assert!(row["usage_gpu_hours"].as_f64().unwrap() > 0.001, "{row}");
    assert!(row["fair_share"].as_f64().unwrap() < 1.0, "{row}");
    assert!(c.gpuctl_ok(&["share"]).contains("FAIRSHARE"));
}

/// A controller whose windows' clock reads `at`, with a 2-GPU node, and a business
/// window that keeps half the GPUs for alice's account (inference).
fn windowed(at: &str) -> Cluster {
    let config = format!(
        "timezone = \"UTC\"\n\
         [accounts.inference]\nusers = [\"{ALICE}\"]\n\
         [accounts.training]\nusers = [\"{BOB}\"]\n\
         [windows.business]\ndays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\"]\n\
         start = \"08:00\"\nend = \"20:00\"\nfloor = {{ inference = 0.5 }}\n"
    );
    let mut c = Cluster::controller_with_config(&config);
    c.kill9_controller();
    c.ctld_args = vec!["--fake-time".into(), at.into()];
    c.start_controller();
    c.add_agent("n1", "2xA100-80GB", &[]);
    c.wait_nodes_up(1);
    c
}

#[test]
fn a_window_floor_keeps_gpus_for_its_account_while_open_and_across_its_opening() {
    if !users() {
        return;
    }
    // Monday 10:00: the window is open; training may hold one GPU of two.
    let c = windowed("2024-01-01T10:00:00Z");
    let w = c.json(&["windows"]);
    assert_eq!(w["windows"][0]["name"], "business");
    assert_eq!(w["windows"][0]["open"], true, "{w}");
    assert_eq!(
        w["windows"][0]["next_change"], "2024-01-01T20:00:00.000Z",
        "{w}"
    );
    let job = "script = \"sleep 20\"\n[resources]\ngpus = 1\n";
    let t1 = submit_as(&c, BOB, "t1.toml", job);
    let t2 = submit_as(&c, BOB, "t2.toml", job);
    c.wait_state(t1, "RUNNING", T);
    assert!(wait_for(T, || c.job(t2)["reason"] == "WindowFloor"));
    assert_eq!(c.job(t2)["account"], "training");
    let e = c.json(&["explain", &t2.to_string()]);
    assert!(e["summary"].as_str().unwrap().contains("business"), "{e}");
    // Inference takes its half at once.
    let i1 = submit_as(&c, ALICE, "i1.toml", job);
    c.wait_state(i1, "RUNNING", T);
    for id in [t1, t2] {
        assert!(
            as_user(&c, BOB, &["cancel", &id.to_string()])
                .status
                .success()
        );
    }
    assert!(
        as_user(&c, ALICE, &["cancel", &i1.to_string()])
            .status
            .success()
    );
    drop(c);

    // Monday 07:30: closed, but a 2-GPU training job of an hour would hold both GPUs
    // when it opens at 08:00; one of 20 minutes ends before and starts.
    let c = windowed("2024-01-01T07:30:00Z");
    let w = c.json(&["windows"]);
    assert_eq!(w["windows"][0]["open"], false, "{w}");
    let long = submit_as(
        &c,
        BOB,
        "long.toml",
        "script = \"sleep 20\"\n[resources]\ngpus = 2\ntime_limit = \"1h\"\n",
    );
    assert!(wait_for(T, || c.job(long)["reason"] == "WindowFloor"));
    let short = submit_as(
        &c,
        BOB,
        "short.toml",
        "script = \"sleep 1\"\n[resources]\ngpus = 2\ntime_limit = \"20m\"\n",
    );
    c.wait_state(short, "COMPLETED", T);
    assert_eq!(c.job(long)["state"], "PENDING");
    assert!(
        as_user(&c, BOB, &["cancel", &long.to_string()])
            .status
            .success()
    );
}
