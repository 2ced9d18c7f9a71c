//! Lendable floors on the real binaries: a window's floor lends its idle GPUs to jobs
//! that checkpoint and requeue, and takes them back within `reclaim_within` when its
//! owner needs them: the borrower sees its signal first, is requeued keeping its age,
//! and the owner's job starts in time, even though the borrower is inside `min_run`.

use std::time::Duration;

use gpuctl_tests::{Cluster, ensure_user, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(40);
const ALICE: &str = "gpuctlalice";
const BOB: &str = "gpuctlbob";

fn users() -> bool {
    ensure_user(ALICE).is_some() && ensure_user(BOB).is_some()
}

fn submit_as(c: &Cluster, user: &str, file: &str, toml: &str) -> u64 {
    let dir = c.user_dir(user);
    std::fs::write(dir.join(file), toml).unwrap();
    let o = c.gpuctl_as(user, &dir, &["submit", "--json", file]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice::<Value>(&o.stdout).unwrap()["job_id"]
        .as_u64()
        .unwrap()
}

/// Monday 10:00 on the windows' clock; one node of 2 GPUs, half kept for inference
/// (alice) in business hours. Borrowers are protected for 5 minutes, far past the
/// 30 s bound: the owner's job is in time only because the bound overrides it.
fn lending_cluster() -> Cluster {
    let config = format!(
        "timezone = \"UTC\"\n\
         [accounts.inference]\nusers = [\"{ALICE}\"]\n\
         [accounts.training]\nusers = [\"{BOB}\"]\n\
         [preemption]\nmin_run = \"5m\"\nreclaim_within = \"30s\"\n\
         [windows.business]\ndays = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\"]\n\
         start = \"08:00\"\nend = \"20:00\"\nfloor = {{ inference = 0.5 }}\npreemption = true\n"
    );
    let mut c = Cluster::controller_with_config(&config);
    c.kill9_controller();
    c.ctld_args = vec!["--fake-time".into(), "2024-01-01T10:00:00Z".into()];
    c.start_controller();
    c.add_agent("n1", "2xA100-80GB", &[]);
    c.wait_nodes_up(1);
    c
}

/// A training job that checkpoints on USR1 (3 s before the kill) and says so.
fn checkpointing(name: &str) -> String {
    format!(
        "name = \"{name}\"\nrequeue = true\nsignal = \"USR1@3\"\n\
         script = \"\"\"\ntrap 'echo checkpoint-$GPUCTL_JOB_ID >> ckpt.log; exit 0' USR1\n\
         while true; do sleep 0.1; done\n\"\"\"\n[resources]\ngpus = 1\n"
    )
}

#[test]
fn a_borrowed_floor_is_reclaimed_within_its_bound() {
    if !users() {
        return;
    }
    let c = lending_cluster();
    // Training may hold one GPU of two; its second checkpointing job borrows the
    // inference floor's and says so.
    let t1 = submit_as(&c, BOB, "t1.toml", &checkpointing("t1"));
    c.wait_state(t1, "RUNNING", T);
    let t2 = submit_as(&c, BOB, "t2.toml", &checkpointing("t2"));
    c.wait_state(t2, "RUNNING", T);
    let borrowing = "Borrowing the inference floor (window business), may be reclaimed";
    assert_eq!(c.job(t2)["reason"], borrowing, "{}", c.job(t2));
    assert_eq!(c.job(t1)["reason"], "", "{}", c.job(t1));
    assert!(c.gpuctl_ok(&["queue"]).contains("Borrowing"));
    let e = c.json(&["explain", &t2.to_string()]);
    let summary = e["summary"].as_str().unwrap();
    assert!(
        summary.contains("borrowing the inference floor (window business), may be reclaimed"),
        "{e}"
    );
    let t2_submit = c.job(t2)["submit_time"].clone();

    // Inference needs its GPU: the borrower sees its signal, is requeued with its age,
    // and the inference job starts within 30 s of its submit.
    let inf = submit_as(
        &c,
        ALICE,
        "inf.toml",
        "name = \"inf\"\nscript = \"sleep 3\"\n[resources]\ngpus = 1\n",
    );
    let ckpt = c.user_dir(BOB).join("ckpt.log");
    assert!(
        wait_for(T, || std::fs::read_to_string(&ckpt)
            .is_ok_and(|s| s.contains(&format!("checkpoint-{t2}")))),
        "the borrower never saw USR1: {}\n{}",
        c.controller_log(),
        c.gpuctl_ok(&["queue", "--all"])
    );
    let i = c.wait_state(inf, "RUNNING", T);
    let at = |k: &str| humantime::parse_rfc3339(i[k].as_str().unwrap()).unwrap();
    let waited = at("start_time").duration_since(at("submit_time")).unwrap();
    assert!(
        waited <= Duration::from_secs(30),
        "the owner waited {waited:?}: {i}"
    );
    let t = c.job(t2);
    assert_eq!(t["state"], "PENDING", "{t}");
    assert_eq!(t["reason"], format!("Preempted by job {inf}"), "{t}");
    assert_eq!(
        t["submit_time"], t2_submit,
        "the borrower keeps its age: {t}"
    );
    // The other training job was within what training may hold: untouched.
    assert_eq!(c.job(t1)["state"], "RUNNING");
    assert_eq!(c.job(t1)["attempt"], 1);
    // When inference is done, the borrower runs again from its checkpoint.
    c.wait_state(inf, "COMPLETED", T);
    let again = c.wait_state(t2, "RUNNING", T);
    assert_eq!(again["attempt"], 2, "{again}");
    for id in [t1, t2] {
        let o = c.gpuctl_as(BOB, &c.user_dir(BOB), &["cancel", &id.to_string()]);
        assert!(o.status.success());
    }
}
