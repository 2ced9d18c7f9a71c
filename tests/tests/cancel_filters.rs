//! `gpuctl cancel` by filter, in one request (scancel -u/--me/-t/-n/-p/-A; issues "Slurm
//! users at home" and "Fast paths, second round"): the ids were capped at 4,096 a call
//! and had to be listed first.

use std::time::Duration;

use gpuctl_tests::{Cluster, ensure_user};

const T: Duration = Duration::from_secs(30);

#[test]
fn cancel_by_filter_takes_what_matches_and_only_yours() {
    let c = Cluster::start(&[("cf1", "1xA100-80GB")]);
    let run = c.submit(
        "r.toml",
        "script = \"sleep 60\"\nname = \"keep\"\n[resources]\ngpus = 1\n",
    );
    c.wait_state(run, "RUNNING", T);
    let pend: Vec<u64> = ["a", "a", "b"]
        .iter()
        .map(|n| {
            c.submit(
                "p.toml",
                &format!("script = \"true\"\nname = \"{n}\"\n[resources]\ngpus = 1\n"),
            )
        })
        .collect();
    let out = c.gpuctl_ok(&["cancel", "-n", "a"]);
    assert_eq!(out.lines().count(), 2, "{out}");
    for &id in &pend[..2] {
        assert_eq!(c.job(id)["state"], "CANCELLED");
    }
    assert_eq!(c.job(pend[2])["state"], "PENDING");
    // Pending ones of mine: the running job stays.
    c.gpuctl_ok(&["cancel", "--me", "-t", "PD"]);
    assert_eq!(c.job(pend[2])["state"], "CANCELLED");
    assert_eq!(c.job(run)["state"], "RUNNING");
    // A finished state, or no filter at all, is refused with the reason.
    let bad = c.gpuctl(&["cancel", "-t", "CD"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("finished jobs"));
    assert!(!c.gpuctl(&["cancel"]).status.success());
    // Another user may not cancel root's jobs by naming them.
    if ensure_user("gpuctlcarol").is_some() {
        let dir = c.user_dir("gpuctlcarol");
        let o = c.gpuctl_as("gpuctlcarol", &dir, &["cancel", "-u", "root"]);
        assert!(!o.status.success(), "{o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("only admins"),
            "{o:?}"
        );
        // Their own filter matches their own jobs only: root's job is untouched.
        let o = c.gpuctl_as("gpuctlcarol", &dir, &["cancel", "-n", "keep"]);
        assert!(o.status.success(), "{o:?}");
        assert_eq!(c.job(run)["state"], "RUNNING");
    }
    c.gpuctl_ok(&["cancel", "--me"]);
    c.wait_state(run, "CANCELLED", T);
}

/// `gpuctl submit -H` (and `#SBATCH -H`) queues a job held, so that nothing starts it
/// before `release` (a `hold` right after a submit raced a job that starts at once);
/// `--parsable` prints the id alone, for `jid=$(gpuctl submit --parsable ...)`.
#[test]
fn submit_held_and_parsable() {
    let c = Cluster::start(&[("sh1", "1xA100-80GB")]);
    std::fs::write(
        c.path("j.toml"),
        "command = [\"true\"]\n[resources]\ngpus = 1\n",
    )
    .unwrap();
    let out = c.gpuctl_ok(&["submit", "-H", "--parsable", "j.toml"]);
    let id: u64 = out.trim().parse().unwrap_or_else(|_| panic!("{out:?}"));
    std::fs::write(c.path("s.sh"), "#!/bin/sh\n#SBATCH -H\ntrue\n").unwrap();
    let script: u64 = c
        .gpuctl_ok(&["submit", "--parsable", "s.sh"])
        .trim()
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    for held in [id, script] {
        let j = c.job(held);
        assert_eq!(j["state"], "PENDING", "{j}");
        assert_eq!(j["reason"], "JobHeldUser", "{j}");
    }
    c.gpuctl_ok(&["release", &id.to_string(), &script.to_string()]);
    c.wait_state(id, "COMPLETED", T);
    c.wait_state(script, "COMPLETED", T);
}

/// `gpuctl submit --begin` (sbatch's): the job waits with reason BeginTime and its
/// begin time as expected start, `release` does not lift it, and it starts by itself
/// once the time has come (the test config's periodic pass is an hour apart: the begin
/// time wakes a pass of its own), also after a controller restart.
#[test]
fn a_job_with_a_begin_time_waits_for_it() {
    let mut c = Cluster::start(&[("bg1", "1xA100-80GB")]);
    std::fs::write(
        c.path("j.toml"),
        "command = [\"true\"]\n[resources]\ngpus = 1\n",
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    let id: u64 = c
        .gpuctl_ok(&["submit", "--parsable", "--begin", "now+4", "j.toml"])
        .trim()
        .parse()
        .unwrap();
    let j = c.job(id);
    assert_eq!(j["state"], "PENDING", "{j}");
    assert_eq!(j["reason"], "BeginTime", "{j}");
    let refused = c.gpuctl(&["release", &id.to_string()]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("begin time"));
    // A restart keeps it waiting and still lets it go on time.
    c.stop_controller();
    c.start_controller();
    let done = c.wait_state(id, "COMPLETED", T);
    assert!(t0.elapsed() >= Duration::from_secs(4), "{done}");
    let late = c.gpuctl(&["submit", "--begin", "now+800days", "j.toml"]);
    assert!(!late.status.success());
    assert!(String::from_utf8_lossy(&late.stderr).contains("within a year"));
}
