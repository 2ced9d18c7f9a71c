//! End-to-end behaviour of the first complete path: real gpuctld + gpud + gpuctl.

use std::time::{Duration, Instant};

use gpuctl_tests::{Cluster, bin, process_alive, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(20);

fn gpus_of(job: &Value) -> Vec<String> {
    job["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn job_runs_with_its_gpus_env_and_output_files() {
    let c = Cluster::start(&[("n1", "4xA100-80GB")]);
    let id = c.submit(
        "job.toml",
        r#"
name = "envcheck"
script = """
echo "CVD=$CUDA_VISIBLE_DEVICES"
echo "ORDER=$CUDA_DEVICE_ORDER"
echo "JOB=$GPUCTL_JOB_ID NODE=$GPUCTL_NODE FOO=$FOO"
echo "to-stderr" >&2
"""
stdout = "out-%j.txt"
stderr = "err-%j.txt"
env = { FOO = "bar" }
[resources]
gpus = 2
"#,
    );
    let job = c.wait_state(id, "COMPLETED", T);
    assert_eq!(job["exit_code"], 0);
    assert_eq!(job["node"], "n1");
    // Dispatched, then launched on the node, then ended (RFC 3339 in UTC, so the
    // strings order as the times do).
    let t = |k: &str| {
        job[k]
            .as_str()
            .unwrap_or_else(|| panic!("{k}: {job}"))
            .to_string()
    };
    assert!(
        t("start_time") <= t("launch_time") && t("launch_time") <= t("end_time"),
        "{job}"
    );
    let gpus = gpus_of(&job);
    assert_eq!(gpus.len(), 2);
    let node_gpus: Vec<String> = c.nodes()[0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_string())
        .collect();
    assert!(
        gpus.iter()
            .all(|g| g.starts_with("GPU-") && node_gpus.contains(g))
    );
    for k in ["submit_time", "start_time", "end_time"] {
        assert!(job[k].as_str().unwrap().ends_with('Z'), "{k}: {}", job[k]);
    }

    let out = std::fs::read_to_string(c.path(&format!("out-{id}.txt"))).unwrap();
    assert_eq!(
        out,
        format!(
            "CVD={}\nORDER=PCI_BUS_ID\nJOB={id} NODE=n1 FOO=bar\n",
            gpus.join(",")
        )
    );
    let err = std::fs::read_to_string(c.path(&format!("err-{id}.txt"))).unwrap();
    assert_eq!(err, "to-stderr\n");
    // The GPUs are free again.
    assert_eq!(c.node_state("n1"), "IDLE");
}

#[test]
fn exit_codes_decide_completed_or_failed() {
    let c = Cluster::start(&[("n1", "1xT4-16GB")]);
    let ok = c.submit("ok.toml", "command = [\"true\"]\n");
    let bad = c.submit("bad.toml", "command = [\"sh\", \"-c\", \"exit 3\"]\n");
    let missing = c.submit("missing.toml", "command = [\"/no/such/program\"]\n");
    assert_eq!(c.wait_state(ok, "COMPLETED", T)["exit_code"], 0);
    let j = c.wait_state(bad, "FAILED", T);
    assert_eq!(j["exit_code"], 3);
    let j = c.wait_state(missing, "FAILED", T);
    assert!(
        j["reason"].as_str().unwrap().contains("/no/such/program"),
        "{j}"
    );
    // Default output file, stderr merged into it.
    assert!(c.path(&format!("gpuctl-{ok}.out")).exists());
}

#[test]
fn bad_job_files_are_refused_and_nothing_is_queued() {
    let c = Cluster::start(&[("n1", "4xA100-80GB")]);
    std::fs::write(
        c.path("job.toml"),
        "name = \"x\"\ncommand = [\"true\"]\ngpu = 1\n",
    )
    .unwrap();
    let out = c.gpuctl(&["submit", "job.toml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("job.toml:3:1: unknown field `gpu`"), "{err}");

    std::fs::write(
        c.path("typo.toml"),
        "command = [\"true\"]\n[resources]\ngpus = \"two\"\n",
    )
    .unwrap();
    let err = String::from_utf8_lossy(&c.gpuctl(&["submit", "typo.toml"]).stderr).to_string();
    assert!(err.contains("typo.toml:3:8:"), "{err}");

    std::fs::write(
        c.path("huge.toml"),
        "command = [\"true\"]\n[resources]\ngpus = 9\n",
    )
    .unwrap();
    let out = c.gpuctl(&["submit", "huge.toml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("huge.toml: rejected: impossible request")
            && err.contains("largest node has 4 GPUs"),
        "{err}"
    );

    assert_eq!(c.json(&["queue", "--all"]), serde_json::json!([]));
    // Nothing was consumed: the next job is job 1.
    assert_eq!(c.submit("ok.toml", "command = [\"true\"]\n"), 1);
}

#[test]
fn several_files_are_all_checked_then_queued_in_order() {
    let c = Cluster::start(&[("n1", "4xA100-80GB")]);
    let job = |name: &str, gpus: u32| {
        std::fs::write(
            c.path(&format!("{name}.toml")),
            format!("name = \"{name}\"\ncommand = [\"true\"]\n[resources]\ngpus = {gpus}\n"),
        )
        .unwrap();
    };
    for n in ["a", "b", "c", "d", "e"] {
        job(n, 1);
    }
    job("huge", 9);
    std::fs::write(c.path("open.toml"), "command = [\"x\"\n").unwrap();
    std::fs::write(c.path("typo.toml"), "command = [\"x\"]\ngpu = 1\n").unwrap();

    // Every bad file is named, with its line and column, and nothing is queued.
    let out = c.gpuctl(&["submit", "a.toml", "open.toml", "b.toml", "typo.toml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("open.toml:1:15:"), "{err}");
    assert!(err.contains("typo.toml:2:1: unknown field `gpu`"), "{err}");
    assert!(
        err.contains("nothing submitted: 2 of 4 files have errors"),
        "{err}"
    );
    assert_eq!(c.json(&["queue", "--all"]), serde_json::json!([]));

    // Queued in the order given, one job each.
    let v = c.json(&["submit", "a.toml", "b.toml", "c.toml"]);
    assert_eq!(
        v,
        serde_json::json!([
            {"file": "a.toml", "job_id": 1},
            {"file": "b.toml", "job_id": 2},
            {"file": "c.toml", "job_id": 3},
        ])
    );
    let names = |v: Value| -> Vec<(u64, String)> {
        let mut jobs: Vec<(u64, String)> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|j| {
                (
                    j["id"].as_u64().unwrap(),
                    j["name"].as_str().unwrap().into(),
                )
            })
            .collect();
        jobs.sort();
        jobs
    };
    let queued = names(c.json(&["queue", "--all"]));
    assert_eq!(queued, [(1, "a".into()), (2, "b".into()), (3, "c".into())]);

    // The controller's refusal stops the rest; what went before is queued and said.
    let out = c.gpuctl(&["submit", "d.toml", "huge.toml", "e.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Submitted job 4\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("huge.toml: rejected: impossible request"),
        "{err}"
    );
    assert!(
        err.contains("1 of 3 jobs submitted; not submitted: huge.toml and the file after it"),
        "{err}"
    );
    let queued = names(c.json(&["queue", "--all"]));
    assert_eq!(queued.len(), 4, "{queued:?}");
    assert_eq!(queued[3], (4, "d".into()));
}

#[test]
fn reservation_holds_while_small_jobs_backfill() {
    let c = Cluster::start(&[("n1", "2xA100-80GB")]);
    let job = |name: &str, gpus: u32, limit: &str, prio: i32| {
        format!(
            "name = \"{name}\"\npriority = {prio}\nscript = \"sleep 60\"\n[resources]\ngpus = {gpus}\ntime_limit = \"{limit}\"\n"
        )
    };
    let a = c.submit("a.toml", &job("a", 1, "10m", 0));
    c.wait_state(a, "RUNNING", T);
    // The big job needs both GPUs: it waits for `a` and reserves both from a's end.
    let big = c.submit("big.toml", &job("big", 2, "10m", 5));
    assert!(wait_for(T, || c.job(big)["reason"] == "Resources"));
    // Its expected start comes with the next pass that plans every waiting job
    // (`expected_starts_every`, 10 s; the passes between stop once nothing can start).
    assert!(wait_for(T, || c.job(big)["expected_start"].is_string()));
    let a_start = c.job(a)["start_time"].as_str().unwrap().to_string();
    let expected = c.job(big)["expected_start"].as_str().unwrap().to_string();
    assert!(expected > a_start, "{expected} vs {a_start}");

    // A long small job would fit now but run into the reservation: it waits (Priority).
    let long = c.submit("long.toml", &job("long", 1, "30m", 0));
    assert!(wait_for(T, || c.job(long)["reason"] == "Priority"));
    let ex = c.gpuctl_ok(&["explain", &long.to_string()]);
    assert!(ex.contains("reason: Priority"), "{ex}");
    assert!(ex.contains(&format!("n1: reserved for job {big}")), "{ex}");
    // A short one ends before the reservation starts: it backfills now.
    let short = c.submit("short.toml", &job("short", 1, "2m", 0));
    c.wait_state(short, "RUNNING", T);
    assert_eq!(c.job(big)["state"], "PENDING");
    assert_eq!(c.job(big)["expected_start"].as_str().unwrap(), expected);

    let table = c.gpuctl_ok(&["queue", "--start"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "JOBID",
            "PARTITION",
            "NAME",
            "USER",
            "STATE",
            "START_TIME",
            "TIME",
            "GPUS",
            "NODE",
            "REASON"
        ]
    );

    let ex = c.json(&["explain", &big.to_string()]);
    assert_eq!(ex["reason"], "Resources");
    assert_eq!(ex["rank"], 0);
    assert!(
        ex["nodes"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("not enough free GPUs (need 2, free 0)"),
        "{ex}"
    );

    let prio = c.json(&["priority"]);
    let first = &prio.as_array().unwrap()[0];
    assert_eq!(first["job_id"], big);
    assert_eq!(first["factors"]["user"], 5000);

    // Freeing the node starts the big job, not the long one.
    c.gpuctl_ok(&["cancel", &a.to_string(), &short.to_string()]);
    c.wait_state(big, "RUNNING", T);
    assert_eq!(c.job(long)["state"], "PENDING");
    c.gpuctl_ok(&["cancel", &big.to_string(), &long.to_string()]);
}

#[test]
fn cancel_removes_pending_and_kills_running_trees() {
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    // The job's child ignores SIGTERM: only SIGKILL after the grace ends it.
    let run = c.submit(
        "run.toml",
        r#"
script = """
sh -c 'trap "" TERM; echo $$ > child.pid; while true; do sleep 1; done' &
wait
"""
[resources]
gpus = 1
"#,
    );
    let pending = c.submit("p.toml", "command = [\"true\"]\n[resources]\ngpus = 1\n");
    c.wait_state(run, "RUNNING", T);
    let child = gpuctl_tests::wait_for_pid(&c.path("child.pid"), T);
    assert!(process_alive(child));

    let out = c.gpuctl_ok(&["cancel", &pending.to_string()]);
    assert!(out.contains("removed from the queue"), "{out}");
    let p = c.job(pending);
    assert_eq!(p["state"], "CANCELLED");
    let queue = c.json(&["queue"]);
    assert!(queue.as_array().unwrap().iter().all(|j| j["id"] != pending));
    let all = c.json(&["queue", "--all"]);
    assert!(all.as_array().unwrap().iter().any(|j| j["id"] == pending));

    c.gpuctl_ok(&["cancel", &run.to_string()]);
    c.wait_state(run, "CANCELLED", T);
    assert!(
        wait_for(T, || !process_alive(child)),
        "child {child} survived the cancel"
    );
    assert_eq!(c.node_state("n1"), "IDLE");

    // Cancelling a finished or unknown job says so and fails.
    let out = c.gpuctl(&["cancel", &run.to_string(), "999"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already finished (CANCELLED)") && err.contains("job 999: no such job"),
        "{err}"
    );
}

#[test]
fn a_finished_jobs_leftover_processes_die_with_its_cgroup() {
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    // The job's main process exits at once and leaves a child behind that ignores
    // SIGTERM and SIGHUP, detached from the job's process group.
    let id = c.submit(
        "j.toml",
        r#"
script = """
setsid sh -c 'trap "" TERM HUP; echo $$ > left.pid; exec sleep 300' < /dev/null > /dev/null 2>&1 &
while [ ! -s left.pid ]; do sleep 0.05; done
"""
[resources]
gpus = 1
"#,
    );
    c.wait_state(id, "COMPLETED", T);
    let left = gpuctl_tests::wait_for_pid(&c.path("left.pid"), T);
    assert!(
        wait_for(T, || !process_alive(left)),
        "process {left} outlived its job"
    );
    // Every hierarchy's job directory is gone (hybrid here: v1 controllers and the
    // cgroup2 mount; on a pure v2 host, the one directory).
    let dirs: Vec<std::path::PathBuf> = gpuctl_tests::CGROUP_HIERARCHIES
        .iter()
        .map(|h| {
            std::path::Path::new("/sys/fs/cgroup")
                .join(h)
                .join(c.cgroup_parent("n1"))
                .join(format!("job-{id}"))
        })
        .collect();
    assert!(
        wait_for(T, || dirs.iter().all(|d| !d.exists())),
        "job cgroups left: {:?}",
        dirs.iter().filter(|d| d.exists()).collect::<Vec<_>>()
    );
    assert_eq!(c.node_state("n1"), "IDLE");
}

#[test]
fn time_limit_ends_job_as_timeout() {
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let id = c.submit(
        "t.toml",
        "script = \"sleep 60\"\n[resources]\ngpus = 1\ntime_limit = \"1s\"\n",
    );
    let j = c.wait_state(id, "TIMEOUT", T);
    assert!(j["reason"].as_str().unwrap().contains("time limit"), "{j}");
    assert_eq!(c.node_state("n1"), "IDLE");
}

#[test]
fn drain_stops_placements_and_resume_restarts_them() {
    let c = Cluster::start(&[("n1", "2xA100-80GB")]);
    let running = c.submit("r.toml", "script = \"sleep 2\"\n[resources]\ngpus = 1\n");
    c.wait_state(running, "RUNNING", T);
    c.gpuctl_ok(&["node", "drain", "n1", "--reason", "maintenance"]);
    assert_eq!(c.node_state("n1"), "DRAINING");
    let waiting = c.submit("w.toml", "command = [\"true\"]\n[resources]\ngpus = 1\n");
    assert!(wait_for(T, || c.job(waiting)["reason"] == "Nodes_Unavailable"));
    // The running job finishes; then the node is DRAINED and still takes nothing.
    c.wait_state(running, "COMPLETED", T);
    assert!(wait_for(T, || c.node_state("n1") == "DRAINED"));
    let node = &c.nodes()[0];
    assert_eq!(node["reason"], "maintenance");
    assert_eq!(c.job(waiting)["state"], "PENDING");

    c.gpuctl_ok(&["node", "resume", "n1"]);
    c.wait_state(waiting, "COMPLETED", T);
    assert_eq!(c.node_state("n1"), "IDLE");

    let out = c.gpuctl(&["node", "drain", "nope", "--reason", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no node named \"nope\""));
}

#[test]
fn controller_kill9_keeps_every_acknowledged_job() {
    let mut c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let running = c.submit(
        "r.toml",
        "script = \"sleep 3; echo finished\"\nstdout = \"r.out\"\n[resources]\ngpus = 1\n",
    );
    c.wait_state(running, "RUNNING", T);
    let pending: Vec<u64> = (0..3)
        .map(|i| {
            c.submit(
                &format!("p{i}.toml"),
                "command = [\"true\"]\n[resources]\ngpus = 1\n",
            )
        })
        .collect();
    let cancelled = c.submit("x.toml", "command = [\"true\"]\n[resources]\ngpus = 1\n");
    c.gpuctl_ok(&["cancel", &cancelled.to_string()]);
    let before: Vec<(u64, String)> = c
        .json(&["queue", "--all"])
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["id"].as_u64().unwrap(),
                j["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();

    c.kill9_controller();
    c.start_controller();
    let after: Vec<(u64, String)> = c
        .json(&["queue", "--all"])
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["id"].as_u64().unwrap(),
                j["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(before, after);

    // The agent reconnects by itself; the running job is not started again and completes.
    c.wait_nodes_up(1);
    let j = c.wait_state(running, "COMPLETED", T);
    assert_eq!(j["exit_code"], 0);
    assert_eq!(
        std::fs::read_to_string(c.path("r.out")).unwrap(),
        "finished\n"
    );
    for id in &pending {
        c.wait_state(*id, "COMPLETED", T);
    }
    let next = c.submit("n.toml", "command = [\"true\"]\n");
    assert_eq!(next, cancelled + 1);
}

#[test]
fn job_that_ends_while_controller_is_down_gets_its_real_state() {
    let mut c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let id = c.submit(
        "r.toml",
        "script = \"sleep 1; exit 7\"\n[resources]\ngpus = 1\n",
    );
    c.wait_state(id, "RUNNING", T);
    c.kill9_controller();
    std::thread::sleep(Duration::from_secs(2));
    c.start_controller();
    let j = c.wait_state(id, "FAILED", T);
    assert_eq!(j["exit_code"], 7);
}

#[test]
fn sigterm_stops_the_controller_cleanly() {
    let mut c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let id = c.submit("a.toml", "command = [\"true\"]\n");
    c.wait_state(id, "COMPLETED", T);
    let status = c.stop_controller();
    assert!(status.success(), "{status}");
    c.start_controller();
    assert_eq!(c.job(id)["state"], "COMPLETED");
}

#[test]
fn submit_to_start_is_event_driven() {
    // The periodic pass is 1h in the test config: a prompt start comes from the event.
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let t0 = Instant::now();
    let id = c.submit("a.toml", "script = \"sleep 5\"\n");
    c.wait_state(id, "RUNNING", Duration::from_secs(5));
    assert!(t0.elapsed() < Duration::from_secs(5));
    c.gpuctl_ok(&["cancel", &id.to_string()]);
}

#[test]
fn nodes_report_gpus_and_states() {
    let mut c = Cluster::start(&[("n1", "2xA100-80GB,1xT4-16GB"), ("n2", "1xA100-80GB")]);
    let nodes = c.nodes();
    let n1 = &nodes.as_array().unwrap()[0];
    assert_eq!(n1["name"], "n1");
    assert_eq!(n1["state"], "IDLE");
    assert_eq!(n1["gpu_backend"], "fake");
    let gpus = n1["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 3);
    assert_eq!(gpus[2]["model"], "T4-16GB");
    assert_eq!(gpus[2]["memory_mib"], 16384);
    assert_eq!(gpus[0]["allocated"], false);
    let table = c.gpuctl_ok(&["nodes"]);
    assert!(table.contains("2xA100-80GB,1xT4-16GB"), "{table}");

    c.kill9_agent("n2");
    assert!(wait_for(T, || c.node_state("n2") == "DOWN"));
    // A job too big for the up node waits; it is not refused (n2 may return).
    c.add_agent("n2b", "4xA100-80GB", &[]);
    c.wait_nodes_up(2);
    let id = c.submit("big.toml", "command = [\"true\"]\n[resources]\ngpus = 4\n");
    c.wait_state(id, "COMPLETED", T);
}

#[test]
fn cli_errors_are_clear() {
    let out = std::process::Command::new(gpuctl_tests::bin("gpuctl"))
        .args(["--controller", "http://127.0.0.1:1", "queue"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach the controller at http://127.0.0.1:1"),
        "{err}"
    );

    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let out = c.gpuctl(&["show", "42"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no job 42"));
}

#[test]
fn gpud_without_nvml_says_so_and_exits_nonzero() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        gpuctl_tests::skipped(
            "GPUCTL_REQUIRE_NO_GPU",
            "a machine without an NVIDIA driver",
        );
        return;
    }
    let out = std::process::Command::new(gpuctl_tests::bin("gpud"))
        .args([
            "--controller",
            "http://127.0.0.1:1",
            "--name",
            "x",
            "--state-dir",
        ])
        .arg(tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot load NVML") && err.contains("--fake-gpus"),
        "{err}"
    );
}

/// A job's program starts with no signal blocked and with the signals its shim ignores
/// (and SIGPIPE, which the Rust runtime ignores) at their defaults: the shim starts it
/// with `posix_spawn`, which resets them.
#[test]
fn a_jobs_program_starts_with_default_signals() {
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let id = c.submit(
        "sig.toml",
        "command = [\"grep\", \"-E\", \"^Sig(Blk|Ign)\", \"/proc/self/status\"]\nstdout = \"sig.out\"\n",
    );
    c.wait_state(id, "COMPLETED", T);
    let out = std::fs::read_to_string(c.path("sig.out")).unwrap();
    let mask = |name: &str| {
        let line = out.lines().find(|l| l.starts_with(name)).expect(name);
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    assert_eq!(mask("SigBlk:"), 0, "{out}");
    // HUP, INT, QUIT, USR1, USR2, PIPE, TERM: bit (signal - 1).
    let defaults = [1u32, 2, 3, 10, 12, 13, 15]
        .iter()
        .fold(0u64, |m, s| m | 1 << (s - 1));
    assert_eq!(mask("SigIgn:") & defaults, 0, "{out}");
}

/// `--json` to a pipe is compact (one line, as `gh` writes it), pretty with
/// `GPUCTL_JSON=pretty` (and on a terminal); both are the same JSON, for a paged
/// listing and a single answer alike.
#[test]
fn json_is_compact_in_pipes_and_pretty_on_request() {
    let c = Cluster::controller_only();
    for _ in 0..3 {
        c.submit("j.toml", "command = [\"true\"]\n[resources]\ngpus = 1\n");
    }
    let run = |layout: Option<&str>, args: &[&str]| {
        let mut cmd = std::process::Command::new(bin("gpuctl"));
        cmd.args(args)
            .env("GPUCTL_CONTROLLER", c.url())
            .current_dir(c.path(""));
        if let Some(l) = layout {
            cmd.env("GPUCTL_JSON", l);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    for args in [&["queue", "--json"][..], &["show", "1", "--json"][..]] {
        let piped = run(None, args);
        let compact = run(Some("compact"), args);
        let pretty = run(Some("pretty"), args);
        assert_eq!(piped.lines().count(), 1, "{piped}");
        assert!(piped.contains("\"id\":1,"), "{piped}");
        assert!(pretty.lines().count() > 10, "{pretty}");
        assert!(pretty.contains("\"id\": 1,"), "{pretty}");
        // The same JSON but for what the scheduler may change between the calls.
        let value = |s: &str| {
            let v = serde_json::from_str::<Value>(s).unwrap();
            let strip = |mut j: Value| {
                let o = j.as_object_mut().unwrap();
                o.remove("reason");
                o.remove("expected_start");
                j
            };
            match v {
                Value::Array(a) => Value::Array(a.into_iter().map(strip).collect()),
                j => strip(j),
            }
        };
        assert_eq!(value(&piped), value(&pretty));
        assert_eq!(value(&piped), value(&compact));
        assert_eq!(compact.lines().count(), 1);
    }
    let listed = serde_json::from_str::<Value>(&run(None, &["queue", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 3);
}
