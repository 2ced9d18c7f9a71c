//! What an unprivileged user, a careless one or a full disk can do must fail
//! cleanly (issue "Hardening"). Each test runs the real binaries, as real unprivileged
//! users where a user is involved, and names the defect it guards against.

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

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

/// Submits `toml` as `user` from their directory; the output, whatever happened.
fn submit_as(c: &Cluster, user: &str, toml: &str) -> std::process::Output {
    let dir = c.user_dir(user);
    std::fs::write(dir.join("job.toml"), toml).unwrap();
    c.gpuctl_as(user, &dir, &["submit", "--json", "job.toml"])
}

fn chown(p: &Path, user: &str) {
    let u = nix::unistd::User::from_name(user).unwrap().unwrap();
    nix::unistd::chown(p, Some(u.uid), Some(u.gid)).unwrap();
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Defect 1: a workdir inside a directory only its owner may enter is entered as the
/// job's user, so another user's job cannot read what lies there.
#[test]
fn workdir_is_entered_as_the_jobs_user() {
    if !users() {
        return;
    }
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let bob_home = c.path("bobhome");
    let proj = bob_home.join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::write(proj.join("secret.txt"), "bob's secret\n").unwrap();
    for p in [&bob_home, &proj, &proj.join("secret.txt")] {
        chown(p, BOB);
    }
    chmod(&bob_home, 0o700);
    chmod(&proj, 0o755);
    chmod(&proj.join("secret.txt"), 0o644);
    let out = c.user_dir(ALICE).join("stolen.out");
    let id = job_id(&submit_as(
        &c,
        ALICE,
        &format!(
            "command = [\"cat\", \"secret.txt\"]\nworkdir = {:?}\nstdout = {:?}\n",
            proj.display().to_string(),
            out.display().to_string()
        ),
    ));
    let j = c.wait_state(id, "FAILED", T);
    let reason = j["reason"].as_str().unwrap();
    assert!(
        reason.contains("cannot enter workdir") && reason.contains(ALICE),
        "{reason}"
    );
    let stolen = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(!stolen.contains("secret"), "{stolen}");
    // Bob's own job there runs.
    let bob = job_id(&submit_as(
        &c,
        BOB,
        &format!(
            "command = [\"cat\", \"secret.txt\"]\nworkdir = {:?}\n",
            proj.display().to_string()
        ),
    ));
    c.wait_state(bob, "COMPLETED", T);
}

/// Defect 2: a FIFO (or any non-regular file) as output fails the launch at once with
/// a clear reason; the node keeps heartbeating and other jobs run.
#[test]
fn fifo_outputs_fail_fast_and_never_wedge_the_node() {
    if !users() {
        return;
    }
    let c = Cluster::start(&[("n1", "4xA100-80GB")]);
    let dir = c.user_dir(ALICE);
    let fifo = dir.join("pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    chown(&fifo, ALICE);
    let ids: Vec<u64> = (0..3)
        .map(|_| {
            job_id(&submit_as(
                &c,
                ALICE,
                "command = [\"echo\", \"hi\"]\nstdout = \"pipe\"\n[resources]\ngpus = 1\n",
            ))
        })
        .collect();
    for id in ids {
        let j = c.wait_state(id, "FAILED", T);
        let reason = j["reason"].as_str().unwrap();
        assert!(
            reason.contains("FIFO") && reason.contains("pipe"),
            "{reason}"
        );
    }
    // A directory as stderr: refused the same way.
    std::fs::create_dir_all(dir.join("adir")).unwrap();
    let id = job_id(&submit_as(
        &c,
        ALICE,
        "command = [\"true\"]\nstderr = \"adir\"\n",
    ));
    let j = c.wait_state(id, "FAILED", T);
    assert!(
        j["reason"].as_str().unwrap().contains("not a regular file"),
        "{j}"
    );
    // /dev/null is fine, and the node is up and runs other jobs.
    let ok = job_id(&submit_as(
        &c,
        ALICE,
        "command = [\"echo\", \"x\"]\nstdout = \"/dev/null\"\n",
    ));
    c.wait_state(ok, "COMPLETED", T);
    assert_ne!(c.node_state("n1"), "DOWN");
}

/// Defect 4: absurd time limits are refused at submit, with the cap named.
#[test]
fn absurd_time_limits_are_refused() {
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    for limit in ["10000years", "500000000000years", "31days"] {
        std::fs::write(
            c.path("t.toml"),
            format!("script = \"true\"\n[resources]\ntime_limit = \"{limit}\"\n"),
        )
        .unwrap();
        let out = c.gpuctl(&["submit", "t.toml"]);
        assert_eq!(out.status.code(), Some(1), "{limit}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("over the cluster's maximum of 30days"),
            "{}",
            stderr(&out)
        );
    }
    let id = c.submit(
        "ok.toml",
        "script = \"true\"\n[resources]\ntime_limit = \"30days\"\n",
    );
    c.wait_state(id, "COMPLETED", T);
    let q = c.gpuctl(&["queue", "--all", "--start", "--json"]);
    assert!(q.status.success());
    serde_json::from_slice::<serde_json::Value>(&q.stdout).expect("whole JSON");
}

/// Defect 5: another user sees a job's metadata, not its env, script or arguments;
/// on the node, what the agent writes is private and gone after the job.
#[test]
fn other_users_see_metadata_only() {
    if !users() {
        return;
    }
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let id = job_id(&submit_as(
        &c,
        ALICE,
        "script = \"sleep 30 # hunter2\"\n[env]\nAPI_KEY = \"s3cr3t\"\n",
    ));
    c.wait_state(id, "RUNNING", T);
    let bob = c.user_dir(BOB);
    let ids = id.to_string();
    for args in [
        vec!["show", "--json", ids.as_str()],
        vec!["queue", "--all", "--json"],
    ] {
        let out = c.gpuctl_as(BOB, &bob, &args);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(ALICE), "{text}");
        assert!(
            !text.contains("s3cr3t") && !text.contains("hunter2"),
            "{text}"
        );
    }
    // Her own, shown and listed (a listing's pages are encoded from the records when
    // the caller sees the jobs whole).
    for args in [
        vec!["show", "--json", ids.as_str()],
        vec!["queue", "--json"],
    ] {
        let mine = c.gpuctl_as(ALICE, &c.user_dir(ALICE), &args);
        assert!(String::from_utf8_lossy(&mine.stdout).contains("s3cr3t"));
    }
    // On the node: the job record is root's alone, the script the job user's alone.
    let state = c.path("gpud-n1");
    let jobs = std::fs::read_dir(state.join("jobs")).unwrap();
    for e in jobs.flatten() {
        let mode = e.metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{} is {mode:o}", e.path().display());
    }
    let script = state.join(format!("scripts/job-{id}.1.sh"));
    let meta = std::fs::metadata(&script).unwrap();
    assert_eq!(meta.permissions().mode() & 0o077, 0);
    let bob_reads = std::process::Command::new("runuser")
        .args(["-u", BOB, "--", "cat"])
        .arg(&script)
        .output()
        .unwrap();
    assert!(!bob_reads.status.success());
    c.gpuctl_ok(&["cancel", &id.to_string()]);
    c.wait_state(id, "CANCELLED", T);
    assert!(wait_for(T, || !script.exists()), "script left behind");
}

/// Defect 7: users may lower their priority but not raise it; QoS is the admins'
/// to hand out; unknown QoS names are refused with the list.
#[test]
fn priority_and_qos_are_governed() {
    if !users() {
        return;
    }
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let cases = [
        (
            "priority = 2147483647\n",
            "only admins raise a job's priority",
        ),
        ("qos = \"high\"\n", "may not use qos \"high\""),
        (
            "qos = \"platinum\"\n",
            "unknown qos \"platinum\"; this cluster has: high, low, normal",
        ),
    ];
    for (line, want) in cases {
        let out = submit_as(&c, ALICE, &format!("script = \"true\"\n{line}"));
        assert!(!out.status.success());
        assert!(stderr(&out).contains(want), "{line}: {}", stderr(&out));
    }
    let id = job_id(&submit_as(
        &c,
        ALICE,
        "script = \"true\"\npriority = -5\nqos = \"low\"\n",
    ));
    c.wait_state(id, "COMPLETED", T);
    // An admin (root) may.
    let id = c.submit(
        "a.toml",
        "script = \"true\"\npriority = 100\nqos = \"high\"\n",
    );
    c.wait_state(id, "COMPLETED", T);
}

/// Defect 10: control characters and oversized values are refused by the server;
/// tables escape whatever is unprintable (unit-tested in gpuctl's format module).
#[test]
fn control_characters_and_bad_env_are_refused() {
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let cases = [
        // gpuctl itself refuses these names already; the server is tested below.
        ("name = \"evil\\u001b[2J\"\n", "printable characters"),
        ("[env]\n\"A B\" = \"x\"\n", "is not a variable name"),
    ];
    for (line, want) in cases {
        std::fs::write(c.path("e.toml"), format!("script = \"true\"\n{line}")).unwrap();
        let out = c.gpuctl(&["submit", "e.toml"]);
        assert_eq!(out.status.code(), Some(1), "{line}");
        assert!(stderr(&out).contains(want), "{line}: {}", stderr(&out));
    }
    let big = "x".repeat(40 * 1024);
    std::fs::write(
        c.path("e.toml"),
        format!("script = \"true\"\n[env]\nBIG = \"{big}\"\n"),
    )
    .unwrap();
    let out = c.gpuctl(&["submit", "e.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("over 32768 bytes"),
        "{}",
        stderr(&out)
    );

    // Raw gRPC, past any client-side check: the server refuses with a reason.
    let token = c.json(&["admin", "token", "create", "--user", "root"])["token"]
        .as_str()
        .unwrap()
        .to_string();
    let tcp = c.tcp_url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let spec = |name: &str, qos: &str, env: &[(&str, &str)]| gpuctl_proto::JobSpec {
        name: name.into(),
        qos: qos.into(),
        script: "true".into(),
        workdir: "/tmp".into(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        resources: Some(gpuctl_proto::Resources {
            cpus: 1,
            ..Default::default()
        }),
        ..Default::default()
    };
    let cases = [
        (spec("evil\u{1b}[2J", "", &[]), "holds control characters"),
        (spec("row\n42 forged", "", &[]), "holds control characters"),
        (spec("nul\0", "", &[]), "holds control characters"),
        (spec("&x".repeat(200).as_str(), "", &[]), "over 256"),
        (spec("ok", "low\u{1b}", &[]), "holds control characters"),
        (
            spec("ok", "", &[("K\u{1b}", "v")]),
            "is not a variable name",
        ),
        (spec("ok", "", &[("", "v")]), "is not a variable name"),
        (
            spec("ok", "", &[("K", &"v".repeat(100_000))]),
            "over 32768 bytes",
        ),
    ];
    rt.block_on(async {
        let mut client = gpuctl_proto::controller_client::ControllerClient::connect(tcp)
            .await
            .unwrap();
        for (s, want) in cases {
            let mut req = tonic::Request::new(gpuctl_proto::SubmitRequest {
                spec: Some(s),
                ..Default::default()
            });
            req.metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            let e = client.submit(req).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
            assert!(e.message().contains(want), "{want}: {}", e.message());
        }
    });
    assert!(c.json(&["queue", "--all"]).as_array().unwrap().is_empty());
}

/// Defects 11 and 19 (paths): `%x` never adds a path separator; unknown `%` patterns
/// are refused at submit.
#[test]
fn expanded_names_stay_in_the_workdir() {
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let _ = std::fs::remove_file("/var/tmp/gpuctl-x.out");
    let id = c.submit(
        "x.toml",
        "name = \"../../../var/tmp/gpuctl-x\"\nscript = \"echo climbed\"\nstdout = \"%x.out\"\n",
    );
    c.wait_state(id, "COMPLETED", T);
    assert!(!Path::new("/var/tmp/gpuctl-x.out").exists());
    let inside = c.path(".._.._.._var_tmp_gpuctl-x.out");
    assert_eq!(std::fs::read_to_string(&inside).unwrap(), "climbed\n");
    std::fs::write(
        c.path("p.toml"),
        "script = \"true\"\nstdout = \"out-%q.txt\"\n",
    )
    .unwrap();
    let out = c.gpuctl(&["submit", "p.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("unknown pattern %q"),
        "{}",
        stderr(&out)
    );
}

/// Defect 14: jobs get a login-like environment, never the agent's PATH, and a missing
/// program is reported as such.
#[test]
fn jobs_get_a_login_environment_and_clear_missing_program_errors() {
    if !users() {
        return;
    }
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let id = job_id(&submit_as(
        &c,
        ALICE,
        "script = \"echo PATH=$PATH; echo HOME=$HOME; echo SHELL=$SHELL; echo LANG=$LANG; echo TMPDIR=$TMPDIR\"\nstdout = \"env.out\"\n",
    ));
    c.wait_state(id, "COMPLETED", T);
    let text = std::fs::read_to_string(c.user_dir(ALICE).join("env.out")).unwrap();
    // The login PATH, after the agent's own directory holding `srun` alone.
    let tools = c.path("gpud-n1").join("bin");
    assert!(
        text.contains(&format!(
            "PATH={}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
            tools.display()
        )),
        "{text}"
    );
    let listed: Vec<_> = std::fs::read_dir(&tools)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(listed, ["srun"]);
    assert!(!text.contains("/root"), "{text}");
    assert!(text.contains(&format!("HOME=/home/{ALICE}")), "{text}");
    assert!(text.contains("SHELL=/bin/sh"), "{text}");
    assert!(
        text.contains("TMPDIR=/tmp") && text.contains("LANG="),
        "{text}"
    );
    let id = job_id(&submit_as(
        &c,
        ALICE,
        "command = [\"no-such-program-gpuctl\"]\n",
    ));
    let j = c.wait_state(id, "FAILED", T);
    assert!(
        j["reason"].as_str().unwrap().contains("command not found"),
        "{j}"
    );
}

/// Moves the controller's state dir onto a tmpfs of `size` (after starting one agent),
/// restarts the controller there and waits for the agent; `None` (having said so)
/// where no tmpfs can be mounted (not root, or the kernel refuses).
fn state_on_tmpfs(c: &mut Cluster, size: &str) -> Option<Mounted> {
    if !nix::unistd::geteuid().is_root() {
        gpuctl_tests::skipped("GPUCTL_REQUIRE_ROOT", "root (to mount a tmpfs)");
        return None;
    }
    c.add_agent("n1", "1xA100-80GB", &[]);
    c.wait_nodes_up(1);
    c.stop_controller();
    let state = c.path("ctld-state");
    let saved = c.path("ctld-state.saved");
    std::fs::rename(&state, &saved).unwrap();
    std::fs::create_dir(&state).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(&state)
        .status()
        .unwrap();
    if !mounted.success() {
        gpuctl_tests::skipped("GPUCTL_REQUIRE_ROOT", "a tmpfs mount");
        return None;
    }
    let guard = Mounted(state.clone());
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", saved.display()))
        .arg(&state)
        .status()
        .unwrap();
    assert!(cp.success());
    c.start_controller();
    c.wait_nodes_up(1);
    Some(guard)
}

/// Unmounts a tmpfs when dropped.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Defect 6: with the state dir's disk nearly full, submits are refused with a clear
/// reason (not "unreachable"), the controller recovers by itself once space is freed,
/// and SIGTERM always finishes.
#[test]
fn a_full_disk_refuses_submits_and_recovers() {
    let mut c = Cluster::controller_with_config("[limits]\nmin_free_disk = \"4MiB\"");
    let Some(_guard) = state_on_tmpfs(&mut c, "20m") else {
        return;
    };
    let state = c.path("ctld-state");
    let ok = c.submit("a.toml", "script = \"true\"\n");
    c.wait_state(ok, "COMPLETED", T);

    // Fill the disk until 2 MiB are left.
    let st = nix::sys::statvfs::statvfs(&state).unwrap();
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    let filler = state.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut left = free.saturating_sub(2 << 20);
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        if f.write_all(&chunk[..n]).is_err() {
            break;
        }
        left -= n as u64;
    }
    drop(f);
    std::fs::write(c.path("b.toml"), "script = \"true\"\n").unwrap();
    let out = c.gpuctl(&["submit", "b.toml"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("disk is nearly full"),
        "{}",
        stderr(&out)
    );
    assert_eq!(c.json(&["queue", "--all"]).as_array().unwrap().len(), 1);

    // Space back: submits work again, with no restart.
    std::fs::remove_file(&filler).unwrap();
    let again = c.submit("c.toml", "script = \"true\"\n");
    c.wait_state(again, "COMPLETED", T);
    let t0 = std::time::Instant::now();
    let status = c.stop_controller();
    assert!(status.success(), "{status}");
    assert!(t0.elapsed() < Duration::from_secs(35));
}

/// Defect 6, the hard case: the disk fills up anyway (here: with no reserve) and sled
/// hits ENOSPC. Submits fail at once with the reason (never hang), and once space is
/// back the controller restarts itself from its durable state: acknowledged jobs are
/// all there and new submits work, with nobody restarting it. (64 MiB: the restart
/// waits for room for two of sled's 8 MiB segments.)
#[test]
fn a_disk_that_fills_up_anyway_recovers_by_itself() {
    let mut c = Cluster::controller_with_config("[limits]\nmin_free_disk = \"0B\"");
    let Some(_guard) = state_on_tmpfs(&mut c, "64m") else {
        return;
    };
    let state = c.path("ctld-state");
    let acked = c.submit("a.toml", "script = \"sleep 600\"\n");
    c.wait_state(acked, "RUNNING", T);
    let filler = state.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 1 << 20];
    while f.write_all(&chunk).is_ok() {}
    drop(f);
    std::fs::write(
        c.path("b.toml"),
        format!("script = \"{}\"\n", "x".repeat(200_000)),
    )
    .unwrap();
    // sled may still have room in a segment it allocated: submits succeed (and are
    // acknowledged) until it does not; then they fail at once, never hang.
    let mut acked_here = Vec::new();
    let mut failures = 0;
    for _ in 0..60 {
        let t0 = std::time::Instant::now();
        let out = c.gpuctl(&["submit", "--json", "b.toml"]);
        assert!(t0.elapsed() < Duration::from_secs(5));
        if out.status.success() {
            acked_here.push(
                serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["job_id"]
                    .as_u64()
                    .unwrap(),
            );
            continue;
        }
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let e = stderr(&out);
        assert!(
            e.contains("No space left on device") || e.contains("state store failed"),
            "{e}"
        );
        failures += 1;
        if failures == 3 {
            break;
        }
    }
    assert_eq!(failures, 3, "the disk never filled up");
    std::fs::remove_file(&filler).unwrap();
    std::fs::write(c.path("c.toml"), "script = \"true\"\n").unwrap();
    let mut id = None;
    assert!(
        wait_for(T, || {
            let out = c.gpuctl(&["submit", "--json", "c.toml"]);
            if out.status.success() {
                id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["job_id"]
                    .as_u64();
            }
            id.is_some()
        }),
        "no recovery: {}",
        c.controller_log()
    );
    assert!(
        c.controller_log()
            .contains("restarting from the durable state")
    );
    c.wait_state(id.unwrap(), "COMPLETED", T);
    assert_eq!(c.job(acked)["state"], "RUNNING");
    c.gpuctl_ok(&["cancel", &acked.to_string()]);
    c.wait_state(acked, "CANCELLED", T);
    assert!(c.stop_controller().success());
}

/// Defect 8: finished jobs keep their metadata only, and no more of them than the
/// retention allows; it holds after a restart.
#[test]
fn finished_jobs_are_compacted_and_retained_as_configured() {
    let mut c = Cluster::controller_with_config("[retention]\nmax_jobs = 3\nmax_age = \"1h\"");
    c.add_agent("n1", "4xA100-80GB", &[]);
    c.wait_nodes_up(1);
    let big = format!("true # {}", "x".repeat(200 * 1024));
    let toml = format!("script = \"{big}\"\n[env]\nTOKEN = \"s3cr3t\"\n");
    // One after the other, so that "the newest three" is well defined.
    let ids: Vec<u64> = (0..6)
        .map(|_| {
            let id = c.submit("b.toml", &toml);
            c.wait_state(id, "COMPLETED", T);
            id
        })
        .collect();
    let check = |c: &Cluster| {
        assert!(wait_for(T, || {
            c.json(&["queue", "--all"]).as_array().unwrap().len() == 3
        }));
        let out = c.gpuctl(&["queue", "--all", "--json"]);
        assert!(out.stdout.len() < 20_000, "{} bytes", out.stdout.len());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("s3cr3t") && !text.contains("xxxxxxxx"));
        let kept: Vec<u64> = c
            .json(&["queue", "--all"])
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_u64().unwrap())
            .collect();
        assert_eq!(kept, ids[3..].to_vec());
        for id in kept {
            assert_eq!(c.job(id)["state"], "COMPLETED");
        }
    };
    check(&c);
    c.kill9_controller();
    c.start_controller();
    check(&c);
    let out = c.gpuctl(&["show", &ids[0].to_string()]);
    assert_eq!(out.status.code(), Some(1));
}

/// Defect 15: submits are idempotent by request id; a submit cut off by a controller
/// crash is retried by the CLI and queued once; the CLI never hangs on a stopped
/// controller; on the socket no token file is read; a port that is not gRPC is named
/// as such; tokens exist only for real users.
#[test]
fn submits_retry_safely_and_errors_say_what_happened() {
    let mut c = Cluster::start(&[("n1", "1xA100-80GB")]);
    // The same request id twice: one job.
    let token = c.json(&["admin", "token", "create", "--user", "root"])["token"]
        .as_str()
        .unwrap()
        .to_string();
    let tcp = c.tcp_url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ids = rt.block_on(async {
        let mut client = gpuctl_proto::controller_client::ControllerClient::connect(tcp)
            .await
            .unwrap();
        let mut ids = Vec::new();
        for _ in 0..2 {
            let mut req = tonic::Request::new(gpuctl_proto::SubmitRequest {
                spec: Some(gpuctl_proto::JobSpec {
                    script: "true".into(),
                    workdir: "/tmp".into(),
                    resources: Some(gpuctl_proto::Resources {
                        cpus: 1,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                request_id: "retry-me".into(),
                hold: false,
            });
            req.metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
            ids.push(client.submit(req).await.unwrap().into_inner().job_id);
        }
        ids
    });
    assert_eq!(ids[0], ids[1]);
    assert_eq!(c.json(&["queue", "--all"]).as_array().unwrap().len(), 1);

    // A submit sent to a frozen controller that then crashes: the CLI retries against
    // the restarted one and the job is queued once.
    std::fs::write(c.path("s.toml"), "script = \"true\"\n").unwrap();
    let pid = c.controller_pid();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let cli = std::process::Command::new(gpuctl_tests::bin("gpuctl"))
        .args(["--controller", &c.url(), "submit", "--json", "s.toml"])
        .current_dir(c.dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    c.kill9_controller();
    c.start_controller();
    let out = cli.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(c.json(&["queue", "--all"]).as_array().unwrap().len(), 2);

    // A stopped controller: the CLI gives up after --timeout, saying so.
    let pid = c.controller_pid();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let t0 = std::time::Instant::now();
    let out = c.gpuctl(&["--timeout", "2s", "queue"]);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(t0.elapsed() < Duration::from_secs(10));
    let t0 = std::time::Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let out = c.gpuctl(&["--timeout", "2s", "submit", "s.toml"]);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("may or may not have been queued"),
        "{}",
        stderr(&out)
    );
    assert!(t0.elapsed() < Duration::from_secs(15));

    // On the socket, an unreadable token file does not matter.
    let home = c.path("home-with-bad-token");
    std::fs::create_dir_all(home.join(".config/gpuctl/token")).unwrap();
    let out = std::process::Command::new(gpuctl_tests::bin("gpuctl"))
        .args(["--controller", &c.url(), "queue"])
        .env("HOME", &home)
        .env_remove("GPUCTL_TOKEN")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    // Something that is not gpuctld.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let mut s = s;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi");
        }
    });
    let out = std::process::Command::new(gpuctl_tests::bin("gpuctl"))
        .args(["--controller", &format!("http://127.0.0.1:{port}"), "queue"])
        .env("GPUCTL_TOKEN", "x")
        .env("GPUCTL_INSECURE", "true")
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("does not speak gRPC there"),
        "{}",
        stderr(&out)
    );

    // Tokens only for users that exist.
    let out = c.gpuctl(&["admin", "token", "create", "--user", "nosuchuser4711"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
}
