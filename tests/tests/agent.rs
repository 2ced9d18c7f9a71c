//! The agent on the real OS: jobs run as their user, in cgroups with real limits.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use gpuctl_tests::{Cluster, bin, submitted_id};

const T: Duration = Duration::from_secs(30);

/// The tests' non-root user; `None` when not root.
fn test_user() -> Option<(String, u32)> {
    let name = "gpuctltest";
    gpuctl_tests::ensure_user(name).map(|uid| (name.to_string(), uid))
}

#[test]
fn job_runs_as_its_user_and_output_belongs_to_it() {
    let Some((user, uid)) = test_user() else {
        return;
    };
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let work = c.path("work");
    std::fs::create_dir(&work).unwrap();
    nix::unistd::chown(&work, Some(nix::unistd::Uid::from_raw(uid)), None).unwrap();
    std::fs::write(
        work.join("job.toml"),
        "script = \"id -u; id -un; echo $HOME\"\nstdout = \"me-%j.out\"\n",
    )
    .unwrap();
    // Submit as that user: the controller records the user gpuctl runs as.
    let out = std::process::Command::new("runuser")
        .args(["-u", &user, "--"])
        .arg(bin("gpuctl"))
        .args(["--controller", &c.url(), "submit", "--json", "job.toml"])
        .current_dir(&work)
        .output()
        .unwrap();
    let id = submitted_id(&out);
    let j = c.wait_state(id, "COMPLETED", T);
    assert_eq!(j["user"], user.as_str());
    let path = work.join(format!("me-{id}.out"));
    let text = std::fs::read_to_string(&path).unwrap();
    let home = nix::unistd::User::from_name(&user).unwrap().unwrap().dir;
    assert_eq!(text, format!("{uid}\n{user}\n{}\n", home.display()));
    assert_eq!(std::fs::metadata(&path).unwrap().uid(), uid);

    // The user cannot write where it has no right (a root-owned 0755 dir): the job fails
    // to start, saying why, and nothing is written there as root.
    let locked = c.path("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::write(
        work.join("bad.toml"),
        format!(
            "command = [\"true\"]\nstdout = \"{}/x.out\"\n",
            locked.display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new("runuser")
        .args(["-u", &user, "--"])
        .arg(bin("gpuctl"))
        .args(["--controller", &c.url(), "submit", "--json", "bad.toml"])
        .current_dir(&work)
        .output()
        .unwrap();
    let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["job_id"]
        .as_u64()
        .unwrap();
    let j = c.wait_state(id, "FAILED", T);
    let reason = j["reason"].as_str().unwrap();
    assert!(
        reason.contains("launch failed") && reason.contains("Permission denied"),
        "{reason}"
    );
    assert!(!locked.join("x.out").exists());
}

#[test]
fn job_over_its_memory_limit_is_ended() {
    // The same test the agent makes: a writable v1 memory hierarchy, or a writable v2 root
    // with the memory controller.
    let writable = |p: &str| nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).is_ok();
    let v1 = std::path::Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists()
        && writable("/sys/fs/cgroup/memory");
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .unwrap_or_default()
        .split_whitespace()
        .any(|c| c == "memory")
        && writable("/sys/fs/cgroup");
    if !v1 && !v2 {
        gpuctl_tests::skipped("GPUCTL_REQUIRE_CGROUPS", "a writable memory cgroup");
        return;
    }
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    // `tail -n 1` keeps the last line in memory; /dev/zero has no newline: it grows
    // until the kernel kills it at the limit.
    let id = c.submit(
        "oom.toml",
        "script = \"head -c 1073741824 /dev/zero | tail -n 1 > /dev/null\"\n[resources]\nmemory = \"64MiB\"\n",
    );
    let j = c.wait_state(id, "FAILED", T);
    let reason = j["reason"].as_str().unwrap();
    assert!(reason.contains("out of memory"), "{j}");
    // A job under its limit is unaffected.
    let ok = c.submit(
        "fine.toml",
        "script = \"head -c 16777216 /dev/zero | tail -n 1 > /dev/null\"\n[resources]\nmemory = \"256MiB\"\n",
    );
    c.wait_state(ok, "COMPLETED", T);
}

/// `kill -9 gpud` while jobs run, then start it again: the running job is found again
/// and ends with its real state; a job that ended while the agent was down gets its
/// real exit code; nothing runs twice.
#[test]
fn jobs_survive_an_agent_kill9_and_restart() {
    let mut c = Cluster::start(&[("readopt", "2xA100-80GB")]);
    let long = c.submit(
        "long.toml",
        "script = \"echo start >> long.log; sleep 4; echo end >> long.log; exit 3\"\n[resources]\ngpus = 1\n",
    );
    let short = c.submit(
        "short.toml",
        "script = \"echo start >> short.log; sleep 1; echo end >> short.log\"\n[resources]\ngpus = 1\n",
    );
    c.wait_state(long, "RUNNING", T);
    c.wait_state(short, "RUNNING", T);
    assert!(gpuctl_tests::wait_for(T, || c.path("short.log").exists()
        && c.path("long.log").exists()));
    c.kill9_agent("readopt");
    // The short job ends while no agent watches it.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        std::fs::read_to_string(c.path("short.log")).unwrap(),
        "start\nend\n"
    );
    c.add_agent("readopt", "2xA100-80GB", &[]);
    let s = c.wait_state(short, "COMPLETED", T);
    assert_eq!(s["exit_code"], 0);
    let l = c.wait_state(long, "FAILED", T);
    assert_eq!(l["exit_code"], 3, "{l}");
    assert_eq!(l["attempt"], 1);
    assert_eq!(
        std::fs::read_to_string(c.path("long.log")).unwrap(),
        "start\nend\n",
        "ran once"
    );
    let log = std::fs::read_to_string(c.path("gpud-readopt.log")).unwrap();
    assert!(
        log.contains("found a job from before the agent restarted"),
        "{log}"
    );
}

/// The children of `pid` whose command line has `arg`.
fn children_with_arg(pid: i32, arg: &str) -> Vec<i32> {
    let mut found = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        // pid (comm) state ppid ...
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
        if ppid == Some(pid) && cmdline.split(|&b| b == 0).any(|a| a == arg.as_bytes()) {
            found.push(child);
        }
    }
    found
}

/// Jobs' shims are forks of the agent's launch server: a job sees only its stdio
/// (no fd of the agent, the server or the shim leaks into it); a job running when the
/// server dies still ends with its real status, and the next launch starts a server
/// again.
#[test]
fn launch_server_death_loses_no_job() {
    let c = Cluster::start(&[("n1", "2xA100-80GB")]);
    let fds = c.submit(
        "fds.toml",
        "command = [\"ls\", \"/proc/self/fd\"]\nstdout = \"fds-%j.out\"\n[resources]\ngpus = 1\n",
    );
    c.wait_state(fds, "COMPLETED", T);
    // 0-2 and the directory `ls` itself opened to list them.
    let listed = std::fs::read_to_string(c.path(&format!("fds-{fds}.out"))).unwrap();
    assert_eq!(listed, "0\n1\n2\n3\n", "fds the job saw");

    let agent = c.agent_pid("n1");
    let servers = children_with_arg(agent, "__forkserver");
    assert_eq!(servers.len(), 1, "one launch server under the agent");
    let long = c.submit(
        "long.toml",
        "script = \"sleep 2; echo slept\"\nstdout = \"long-%j.out\"\n[resources]\ngpus = 1\n",
    );
    c.wait_state(long, "RUNNING", T);
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(servers[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let j = c.wait_state(long, "COMPLETED", T);
    assert_eq!(j["exit_code"], 0, "{j}");
    let text = std::fs::read_to_string(c.path(&format!("long-{long}.out"))).unwrap();
    assert_eq!(text, "slept\n");

    let next = c.submit(
        "next.toml",
        "command = [\"true\"]\nstdout = \"/dev/null\"\n[resources]\ngpus = 1\n",
    );
    c.wait_state(next, "COMPLETED", T);
    assert!(
        c.agent_log("n1").contains("the launch server went away"),
        "{}",
        c.agent_log("n1")
    );
    let again = children_with_arg(agent, "__forkserver");
    assert_eq!(again.len(), 1, "a new launch server");
    assert_ne!(again, servers);
}
