//! Three controllers on Raft (issue 40), on the real binaries: the leader `kill -9`ed
//! under load, a frozen leader (SIGSTOP: it hears nothing and says nothing, as behind a
//! partition) replaced and deposed when it wakes, and a follower whose disk was wiped
//! rejoining. Every time: a new leader serves, no acknowledged submit is lost, no job
//! starts twice, no running job is killed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuctl_tests::replicated::{Clients, Replicated};

const LONG: &str = "name = \"long\"\nscript = \"sleep 600\"\n[resources]\ngpus = 1\n";
const SHORT: &str = "name = \"short\"\nscript = \"sleep 0.3\"\n[resources]\ngpus = 0.25\n";

/// Three controllers, two agents of four GPUs, six long jobs running.
fn loaded() -> (Replicated, BTreeMap<u64, (u64, String)>) {
    loaded_on(Replicated::start(3))
}

/// `loaded`, on the controllers of `r`.
fn loaded_on(mut r: Replicated) -> (Replicated, BTreeMap<u64, (u64, String)>) {
    r.add_agent("a", "4xA100-80GB");
    r.add_agent("b", "4xA100-80GB");
    std::fs::write(r.dir.path().join("long.toml"), LONG).unwrap();
    std::fs::write(r.dir.path().join("short.toml"), SHORT).unwrap();
    assert!(
        r.wait_nodes_idle(2, Duration::from_secs(20)),
        "agents did not attach: {}",
        r.agent_log("a")
    );
    for _ in 0..6 {
        let out = r.gpuctl(&["submit", "long.toml"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut running = BTreeMap::new();
    let all = gpuctl_tests::wait_for(Duration::from_secs(20), || {
        running = (r.jobs().unwrap_or_default().into_iter())
            .filter(|j| j.1 == "RUNNING")
            .map(|(id, _, attempt, node)| (id, (attempt, node)))
            .collect();
        running.len() == 6
    });
    assert!(all, "six long jobs did not start: {running:?}");
    (r, running)
}

/// `gpuctl submit FILE ARGS --json`, which must succeed: the job's id.
fn submit(r: &Replicated, file: &str, args: &[&str]) -> u64 {
    let out = r.gpuctl(&[&["submit", file, "--json"], args].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["job_id"].as_u64().unwrap()
}

/// Waits until a controller leads again and serves a listing; how long from `since`.
fn serving_again(r: &Replicated, since: Instant) -> Duration {
    let ok = gpuctl_tests::wait_for(Duration::from_secs(30), || r.jobs().is_some());
    assert!(ok, "no controller served within 30 s");
    since.elapsed()
}

/// The checks after faults: every acknowledged job exactly once, the long jobs still
/// running their first attempt where they started, no job launched twice, and a new
/// job runs.
fn check(r: &Replicated, acked: &[u64], running: &BTreeMap<u64, (u64, String)>) {
    let jobs = r.jobs().expect("a listing");
    let mut seen = BTreeMap::new();
    for (id, state, attempt, node) in &jobs {
        assert!(
            seen.insert(*id, (state.clone(), *attempt, node.clone()))
                .is_none(),
            "job {id} listed twice"
        );
    }
    let lost: Vec<u64> = (acked.iter().copied())
        .filter(|id| !seen.contains_key(id))
        .collect();
    assert!(lost.is_empty(), "acknowledged jobs lost: {lost:?}");
    for (id, (attempt, node)) in running {
        let (state, a, n) = &seen[id];
        assert_eq!(
            (state.as_str(), a, n),
            ("RUNNING", attempt, node),
            "long job {id} was disturbed"
        );
    }
    // No job ran twice: each was launched by at most one agent, once. (A job may have
    // a second attempt: a start committed whose command never left a killed leader is
    // requeued when its agent attaches without it; it never ran.)
    let twice: Vec<_> = (r.launches().into_iter()).filter(|(_, n)| *n > 1).collect();
    assert!(twice.is_empty(), "jobs launched more than once: {twice:?}");
    // The agents follow the leader there is now: a new job starts and ends.
    let id = submit(r, "short.toml", &[]);
    let done = gpuctl_tests::wait_for(Duration::from_secs(30), || {
        (r.jobs().unwrap_or_default().iter()).any(|j| j.0 == id && j.1 == "COMPLETED")
    });
    assert!(
        done,
        "job {id} did not run after the faults: {:?}",
        r.jobs()
    );
}

#[test]
fn kill9_of_the_leader_under_load_loses_and_repeats_nothing() {
    let (r, running) = loaded();
    let shared = Arc::new(r);
    let clients = Clients::start(&shared, "short.toml");
    let mut took = Vec::new();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1500));
        let leader = shared
            .wait_leader(Duration::from_secs(20))
            .expect("a leader");
        let killed = Instant::now();
        shared.kill9(leader);
        took.push(serving_again(&shared, killed));
        let new = shared
            .wait_leader(Duration::from_secs(20))
            .expect("a new leader");
        assert_ne!(new, leader, "the killed controller cannot lead");
        shared.start_member(leader);
    }
    let acked = clients.finish();
    assert!(acked.len() > 10, "the clients were served: {}", acked.len());
    eprintln!(
        "failover (kill -9 to a listing served): {took:?}; {} submits acknowledged",
        acked.len()
    );
    for t in &took {
        assert!(*t < Duration::from_secs(10), "failover took {t:?}");
    }
    check(&shared, &acked, &running);
}

#[test]
fn a_frozen_leader_is_replaced_and_deposed_when_it_wakes() {
    let (r, running) = loaded();
    let r = Arc::new(r);
    let clients = Clients::start(&r, "short.toml");
    std::thread::sleep(Duration::from_millis(1500));
    let leader = r.wait_leader(Duration::from_secs(20)).expect("a leader");
    let pid = nix::unistd::Pid::from_raw(r.pid(leader).expect("its pid"));
    let frozen = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // Its socket still accepts connections (the kernel queues them), but it answers
    // nothing: clients pass over it once their connect times out... so the listing
    // waits on the others, which elect a new leader.
    let took = serving_again(&r, frozen);
    let new = r
        .wait_leader(Duration::from_secs(20))
        .expect("a new leader");
    assert_ne!(new, leader);
    std::thread::sleep(Duration::from_millis(1500));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    // Awake, it learns of the newer term and follows: one leader, not two.
    assert!(
        r.wait_settled(Duration::from_secs(20)),
        "members: {:?}",
        r.members()
    );
    assert!(
        r.log(leader).contains("this controller follows"),
        "the old leader did not step down"
    );
    let acked = clients.finish();
    eprintln!(
        "frozen leader replaced in {took:?}; {} submits acknowledged",
        acked.len()
    );
    check(&r, &acked, &running);
}

#[test]
fn a_follower_with_a_wiped_disk_rejoins_from_a_snapshot_and_can_lead() {
    // A snapshot every 50 entries, the log before it purged: the wiped member needs
    // entries the leader no longer has, so it gets the snapshot.
    let (r, running) = loaded_on(Replicated::start_args(
        3,
        &["--raft-snapshot-entries", "50"],
    ));
    for _ in 0..40 {
        assert!(r.gpuctl(&["submit", "short.toml"]).status.success());
    }
    let acked: Vec<u64> = (r.jobs().unwrap().into_iter()).map(|j| j.0).collect();
    let leader = r.wait_leader(Duration::from_secs(20)).expect("a leader");
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    r.kill9(follower);
    r.wipe(follower);
    r.start_member(follower);
    // It catches up from the leader: a snapshot, then the log after it. (The leader's
    // view of it is what it was before the wipe until they speak again: the snapshot
    // is waited for first.)
    let installed = gpuctl_tests::wait_for(Duration::from_secs(30), || {
        r.log(follower).contains("installed the leader's snapshot")
    });
    assert!(
        installed,
        "the wiped member got no snapshot: {}",
        r.log(follower)
    );
    let applied = |ms: &[serde_json::Value], id: u64| {
        ms.iter()
            .find(|m| m["id"] == id)
            .and_then(|m| m["commit_index"].as_u64())
    };
    let caught_up = gpuctl_tests::wait_for(Duration::from_secs(30), || {
        r.members().is_some_and(|ms| {
            let (l, f) = (applied(&ms, leader), applied(&ms, follower));
            l.is_some() && f.is_some() && f >= l.map(|l| l.saturating_sub(5))
        })
    });
    assert!(caught_up, "members: {:?}", r.members());
    // Now the leader is lost: the wiped member and the other elect one, and the jobs
    // are all there.
    r.kill9(leader);
    let new = r
        .wait_leader(Duration::from_secs(20))
        .expect("a new leader");
    assert_ne!(new, leader);
    check(&r, &acked, &running);
}

#[test]
fn a_leader_cut_off_by_a_partition_is_replaced_and_follows_once_healed() {
    if let Err(why) = gpuctl_tests::replicated::namespaces_available() {
        gpuctl_tests::skipped(
            "GPUCTL_REQUIRE_NETNS",
            &format!("network namespaces ({why})"),
        );
        return;
    }
    let (r, running) = loaded_on(Replicated::start_in_namespaces(3).expect("namespaces"));
    let r = Arc::new(r);
    let clients = Clients::start(&r, "short.toml");
    std::thread::sleep(Duration::from_millis(1500));
    let leader = r.wait_leader(Duration::from_secs(20)).expect("a leader");
    let cut = Instant::now();
    r.partition(leader);
    // The cut-off leader still answers on its Unix socket but leads nothing: the
    // clients' writes go to the new leader of the majority side.
    let new = {
        let mut new = None;
        gpuctl_tests::wait_for(Duration::from_secs(20), || {
            new = r
                .wait_leader(Duration::from_secs(1))
                .filter(|l| *l != leader);
            new.is_some()
        });
        new.expect("a new leader on the majority side")
    };
    let took = serving_again(&r, cut);
    std::thread::sleep(Duration::from_millis(1500));
    r.heal(leader);
    assert!(
        r.wait_settled(Duration::from_secs(20)),
        "members: {:?}",
        r.members()
    );
    assert!(r.log(leader).contains("this controller follows"));
    let acked = clients.finish();
    eprintln!(
        "partitioned leader {leader} replaced by {new} in {took:?}; {} submits acknowledged",
        acked.len()
    );
    check(&r, &acked, &running);
}

#[test]
fn a_member_is_added_and_removed_with_admin_controllers() {
    let mut r = Replicated::start(3);
    let before = r.members().expect("members");
    assert_eq!(before.len(), 3, "{before:?}");
    // Seen from outside: the leader's metrics say it leads, the others' that they do
    // not, all in one term; the web page lists the members.
    let mut leader = r.wait_leader(Duration::from_secs(10)).unwrap();
    // Within 30 s (a loaded CI machine): the leader named now, whichever it is.
    let seen = gpuctl_tests::wait_for(Duration::from_secs(30), || {
        leader = r.wait_leader(Duration::from_secs(5)).unwrap_or(leader);
        (1..=3).all(|id| {
            let m = r.http_get(id, false, "/metrics").unwrap_or_default();
            let want = format!("gpuctl_raft_is_leader {}", u8::from(id == leader));
            m.lines().any(|l| l == want)
                && m.contains("gpuctl_raft_commit_seconds_bucket")
                && m.lines()
                    .any(|l| l.starts_with("gpuctl_raft_term ") && l != "gpuctl_raft_term 0")
        })
    });
    let raft_lines = |id: u64| {
        (r.http_get(id, false, "/metrics")
            .unwrap_or_default()
            .lines())
        .filter(|l| l.starts_with("gpuctl_raft_is_leader") || l.starts_with("gpuctl_raft_term"))
        .collect::<Vec<_>>()
        .join(", ")
    };
    assert!(
        seen,
        "leader {leader}; members' metrics: 1: {}; 2: {}; 3: {}",
        raft_lines(1),
        raft_lines(2),
        raft_lines(3)
    );
    let state = r
        .http_get(leader, true, "/api/state")
        .expect("the web page's state");
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    let listed = state["controllers"].as_array().expect("controllers listed");
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(
        listed
            .iter()
            .any(|m| m["id"] == leader && m["leader"] == true)
    );
    let (id, addr) = r.new_member();
    r.start_member(id);
    // Only an admin may change the membership (the test runs as root: admin), and only
    // with one member named.
    let bad = r.gpuctl(&["admin", "controllers", "add", "0", &addr]);
    assert!(!bad.status.success());
    let out = r.gpuctl(&[
        "admin",
        "controllers",
        "add",
        &id.to_string(),
        &addr,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ms: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let new = ms
        .iter()
        .find(|m| m["id"] == id)
        .expect("the new member listed");
    assert_eq!(new["voter"], true, "{ms:?}");
    assert_eq!(new["address"], addr.as_str());
    // It holds the log: it catches up, and it answers as a follower.
    let caught_up = gpuctl_tests::wait_for(Duration::from_secs(20), || {
        r.members().is_some_and(|ms| {
            ms.iter().any(|m| {
                m["id"] == id && m["state"] == "follower" && m["commit_index"].as_u64() > Some(0)
            })
        })
    });
    assert!(caught_up, "{:?}", r.members());
    // Removed again: three voters; the removed one no longer listed.
    let out = r.gpuctl(&["admin", "controllers", "remove", &id.to_string(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ms: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(ms.iter().all(|m| m["id"] != id), "{ms:?}");
    assert_eq!(ms.len(), 3);
    // The leader does not remove itself.
    let leader = r.wait_leader(Duration::from_secs(10)).unwrap();
    let out = r.gpuctl(&["admin", "controllers", "remove", &leader.to_string()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not remove itself"));
}

/// docs/operations.md, "Turning one controller into three": a single controller's state
/// dir, started as member 1 of three, is adopted by the new cluster (its first entry):
/// every member holds its jobs, so they survive the loss of member 1, and member 1
/// restarted from that dir (its old records still there) follows the log.
#[test]
fn one_controller_becomes_three_and_every_member_holds_its_jobs() {
    let bins = gpuctl_tests::bin("gpuctld").parent().unwrap().to_path_buf();
    let mut r = Replicated::single_with(bins, "");
    r.add_agent("a", "2xA100-80GB");
    std::fs::write(r.dir.path().join("short.toml"), SHORT).unwrap();
    assert!(r.wait_nodes_idle(1, Duration::from_secs(20)));
    let (a, b) = (submit(&r, "short.toml", &[]), submit(&r, "short.toml", &[]));
    let held = submit(&r, "short.toml", &["-H"]);
    let cancelled = submit(&r, "short.toml", &["-H"]);
    assert!(
        r.gpuctl(&["cancel", &cancelled.to_string()])
            .status
            .success()
    );
    let ended = gpuctl_tests::wait_for(Duration::from_secs(30), || {
        let jobs = r.jobs().unwrap_or_default();
        [a, b]
            .iter()
            .all(|id| jobs.iter().any(|j| j.0 == *id && j.1 == "COMPLETED"))
    });
    assert!(ended, "{:?}", r.jobs());
    let before = r.jobs().expect("a listing");
    let states = |jobs: &[(u64, String, u64, String)]| -> Vec<(u64, String)> {
        jobs.iter().map(|j| (j.0, j.1.clone())).collect()
    };
    assert_eq!(
        states(&before),
        vec![
            (a, "COMPLETED".into()),
            (b, "COMPLETED".into()),
            (held, "PENDING".into()),
            (cancelled, "CANCELLED".into())
        ]
    );
    r.become_replicated(3);
    assert_eq!(
        r.wait_leader(Duration::from_secs(30)),
        Some(1),
        "member 1 forms the cluster"
    );
    let adopted = gpuctl_tests::wait_for(Duration::from_secs(20), || {
        r.jobs().is_some_and(|j| states(&j) == states(&before))
    });
    assert!(adopted, "member 1 serves the adopted jobs: {:?}", r.jobs());
    assert!(
        r.log(1).contains("adopted the single controller's state"),
        "{}",
        r.log(1)
    );
    // Every member holds them: member 1 lost, another leads with the same jobs.
    r.kill9(1);
    let other = r
        .wait_leader(Duration::from_secs(20))
        .expect("a new leader");
    assert_ne!(other, 1);
    let kept = gpuctl_tests::wait_for(Duration::from_secs(20), || {
        r.jobs().is_some_and(|j| states(&j) == states(&before))
    });
    assert!(
        kept,
        "controller {other} holds the adopted jobs: {:?}",
        r.jobs()
    );
    let next = submit(&r, "short.toml", &["-H"]);
    assert!(next > cancelled, "new ids follow the adopted ones: {next}");
    // Member 1 again from its dir (the single controller's records still in it): it
    // follows the log, adopting nothing twice.
    r.start_member(1);
    assert!(r.wait_settled(Duration::from_secs(20)), "{:?}", r.members());
    r.kill9(other);
    assert!(r.wait_leader(Duration::from_secs(20)).is_some());
    let after = gpuctl_tests::wait_for(Duration::from_secs(20), || {
        r.jobs()
            .is_some_and(|j| j.len() == before.len() + 1 && j.iter().any(|x| x.0 == next))
    });
    assert!(after, "{:?}", r.jobs());
    assert_eq!(
        (r.log(1)
            .matches("adopted the single controller's state")
            .count()),
        1,
        "adopted once"
    );
}

/// docs/operations.md, "Rolling upgrade", as the procedure runs (the same binary: the
/// restart is what is tested): one member at a time stopped with SIGTERM and started
/// on its state dir, the next only once the leader sees it caught up, the leader last;
/// clients submit and cancel throughout.
#[test]
fn a_rolling_restart_one_member_at_a_time_loses_and_repeats_nothing() {
    let (r, running) = loaded();
    let r = Arc::new(r);
    let clients = Clients::start(&r, "short.toml");
    let leader = r.wait_leader(Duration::from_secs(10)).expect("a leader");
    let order: Vec<u64> = (1..=3).filter(|id| *id != leader).chain([leader]).collect();
    for id in order {
        std::thread::sleep(Duration::from_millis(500));
        r.stop(id);
        r.start_member(id);
        assert!(
            r.wait_leader(Duration::from_secs(20)).is_some(),
            "no leader after restarting {id}"
        );
        assert!(
            r.wait_caught_up(id, Duration::from_secs(30)),
            "controller {id} did not catch up: {:?}",
            r.members()
        );
    }
    // (The leader restarted last may lead again, in its term: its vote is on its disk,
    // and it is back before the others stand.)
    let acked = clients.finish();
    assert!(acked.len() > 10, "the clients were served: {}", acked.len());
    check(&r, &acked, &running);
}

/// The default mode on Raft: the members serve TLS under one cluster CA and reach each
/// other over it; nodes join with tokens and users bring API tokens, at whichever
/// member leads. A failover keeps all of it: the joined node attaches to the new
/// leader (its running job undisturbed), an API token made before is honoured after, a
/// join token made before joins a node after, and a used one stays used.
#[test]
fn secure_members_keep_joined_nodes_and_tokens_across_a_failover() {
    let mut r = Replicated::start_secure(3);
    r.add_agent("a", "4xA100-80GB");
    std::fs::write(r.dir.path().join("long.toml"), LONG).unwrap();
    std::fs::write(r.dir.path().join("short.toml"), SHORT).unwrap();
    assert!(
        r.wait_nodes_idle(1, Duration::from_secs(30)),
        "node a did not join and attach: {}",
        r.agent_log("a")
    );
    let api = r
        .json(&["admin", "token", "create", "--user", "root"])
        .expect("an API token");
    let (token, token_id) = (api["token"].as_str().unwrap(), api["id"].as_str().unwrap());
    let whoami = |r: &Replicated| {
        let out = r.gpuctl_tcp(token, &["whoami", "--json"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (
            out.status.success(),
            text + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, text) = whoami(&r);
    assert!(ok && text.contains("\"token\""), "{text}");
    // A join token made now, used after the failover.
    let (join_b, fingerprint) = r.join_token("b");
    let long = submit(&r, "long.toml", &[]);
    let mut running = BTreeMap::new();
    let started = gpuctl_tests::wait_for(Duration::from_secs(20), || {
        running = (r.jobs().unwrap_or_default().into_iter())
            .filter(|j| j.0 == long && j.1 == "RUNNING")
            .map(|(id, _, attempt, node)| (id, (attempt, node)))
            .collect();
        !running.is_empty()
    });
    assert!(started, "the long job did not start: {:?}", r.jobs());

    let leader = r.wait_leader(Duration::from_secs(20)).expect("a leader");
    let killed = Instant::now();
    r.kill9(leader);
    let took = serving_again(&r, killed);
    eprintln!("leader {leader} killed: served again after {took:?}");
    // The job runs on, node a follows the new leader (its identity is replicated),
    // and a new job runs there.
    check(&r, &[long], &running);
    let (ok, text) = whoami(&r);
    assert!(
        ok,
        "the API token was not honoured after the failover: {text}"
    );

    let join_file = gpuctl_tests::join_file(&r.path("join-b.json"), &join_b, &fingerprint);
    let join_file = join_file.to_str().unwrap();
    r.add_agent_with("b", "2xA100-80GB", &["--join-file", join_file]);
    assert!(
        r.wait_nodes_idle(1, Duration::from_secs(30))
            && (r.json(&["nodes"]).unwrap_or_default().to_string()).contains("\"b\""),
        "node b did not join with a token made before the failover: {}",
        r.agent_log("b")
    );
    // The token b used is used up on every member.
    let again = r
        .gpud()
        .args(["--controller", &r.agent_controllers(), "--name", "b"])
        .args(["--join-file", join_file])
        .args(["--fake-gpus", "1xA100-80GB", "--allow-root-jobs"])
        .arg("--state-dir")
        .arg(r.dir.path().join("gpud-b-again"))
        .output()
        .expect("run gpud");
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && said.contains("already used"),
        "a used join token joined again: {said}"
    );
    // Revoked at this leader: refused from now on.
    let out = r.gpuctl(&["admin", "token", "revoke", token_id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ok, text) = whoami(&r);
    assert!(!ok, "a revoked API token was honoured: {text}");
}
