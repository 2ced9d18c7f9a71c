//! The opportunistic class on the real binaries (issue 60), on one fake A100 whose
//! use each job's processes declare (GPUCTL_FAKE_GPU_BUSY / _MEMORY_MIB, read from
//! /proc as the driver's per-process samples would be):
//! - a guaranteed job at 40% busy has its GPU lent once measured; an opportunistic job
//!   runs beside it with the room its memory peak leaves as a hard limit; the
//!   guaranteed job's use rising to 95% signals and requeues the borrower within the
//!   bound, the guaranteed job untouched;
//! - an idle `gpuctl alloc` lends its GPU after `[idle] lend_after` and gets it back
//!   as soon as a step of it keeps the GPU busy;
//! - a guaranteed half-GPU share leaves the other half lent.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuctl_tests::{Cluster, bin, wait_for};

const T: Duration = Duration::from_secs(40);

/// The bound from a holder's rise to its borrower back in the queue: the average over
/// `yield_window` (2 s) crossing 80% from 40% (about 1.2 windows), a heartbeat (1 s),
/// the borrower's signal lead (2 s), its end report, and slack for a busy CI host.
const YIELD_BOUND: Duration = Duration::from_secs(15);

const CONFIG: &str = "[opportunistic]\nmeasure = \"3s\"\nyield_window = \"2s\"\nfree_after = \"3s\"\n\
                      [idle]\nlend_after = \"3s\"\n";

fn cluster() -> Cluster {
    let mut c = Cluster::controller_with_config(CONFIG);
    std::fs::write(
        c.path("gpus.toml"),
        "[[gpus]]\ncount = 1\nmodel = \"A100-80GB\"\n",
    )
    .unwrap();
    let file = c.path("gpus.toml");
    c.add_agent_raw(
        "lend",
        &[
            "--fake-gpus-file",
            file.to_str().unwrap(),
            "--sample-interval",
            "250ms",
        ],
    );
    c.wait_nodes_up(1);
    c
}

/// Waits for borrower `b` to run beside `holder`: both jobs as then.
fn lent(c: &Cluster, b: u64, holder: u64) -> (serde_json::Value, serde_json::Value) {
    if !wait_for(T, || c.job(b)["state"] == "RUNNING") {
        panic!(
            "never lent: {}\n{}\n{}",
            c.job(b),
            c.job(holder),
            c.gpuctl_ok(&["nodes", "--json"])
        );
    }
    (c.job(b), c.job(holder))
}

fn borrower(c: &Cluster) -> u64 {
    c.submit(
        "borrow.toml",
        "name = \"sweep\"\nclass = \"opportunistic\"\nsignal = \"USR1@2\"\nrequeue = true\n\
         script = \"GPUCTL_FAKE_GPU_BUSY=55 GPUCTL_FAKE_GPU_MEMORY_MIB=8000 sleep 300\"\n\
         [resources]\ngpus = 1\n",
    )
}

#[test]
fn a_borrower_runs_in_a_held_gpus_idle_and_yields_when_the_holder_needs_it() {
    let c = cluster();
    // 40% busy and 20,000 MiB for 14 s, then 95%.
    let holder = c.submit(
        "holder.toml",
        "name = \"train\"\n\
         script = \"GPUCTL_FAKE_GPU_BUSY=40 GPUCTL_FAKE_GPU_MEMORY_MIB=20000 sleep 14; \
         GPUCTL_FAKE_GPU_BUSY=95 GPUCTL_FAKE_GPU_MEMORY_MIB=20000 sleep 300\"\n\
         [resources]\ngpus = 1\n",
    );
    let started = Instant::now();
    c.wait_state(holder, "RUNNING", T);
    let b = borrower(&c);
    // Not on the free GPU (there is none) nor before the holder was measured: it waits.
    let j = c.job(b);
    assert_eq!(j["state"], "PENDING", "{j}");
    assert_eq!(j["class"], "opportunistic", "{j}");
    let (jb, jh) = lent(&c, b, holder);
    assert_eq!(jb["gpus"], jh["gpus"], "the holder's GPU: {jb}\n{jh}");
    assert!(
        jb["reason"]
            .as_str()
            .unwrap()
            .starts_with("Borrowing idle: lend GPU"),
        "{jb}"
    );
    // Its hard limit: 80 GiB less the holder's 20,000 MiB peak with its 25% margin.
    let slot = &jb["allocations"][0]["slots"][0];
    assert_eq!(slot["memory_mib"], 81_920 - 25_000, "{jb}");
    let shown = c.gpuctl_ok(&["show", &b.to_string()]);
    assert!(
        shown.contains("Class") && shown.contains("opportunistic"),
        "{shown}"
    );
    // The holder rises to 95% at 14 s: the borrower is signalled and requeued.
    let rise = Duration::from_secs(14).saturating_sub(started.elapsed());
    std::thread::sleep(rise);
    let from = Instant::now();
    assert!(
        wait_for(T, || c.job(b)["state"] == "PENDING"),
        "{}",
        c.job(b)
    );
    let took = from.elapsed();
    assert!(took <= YIELD_BOUND, "yielded {took:?} after the rise");
    let j = c.job(b);
    let why = j["reason"].as_str().unwrap();
    assert!(why.contains("busy share rose"), "{j}");
    // The guaranteed job is untouched: still its first attempt, running.
    let jh = c.job(holder);
    assert_eq!(jh["state"], "RUNNING", "{jh}");
    assert_eq!(jh["attempt"], 1, "{jh}");
    // While the holder stays busy, the GPU is not lent again.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(c.job(b)["state"], "PENDING");
    c.gpuctl_ok(&["cancel", &holder.to_string(), &b.to_string()]);
}

#[test]
fn an_idle_allocation_lends_its_gpu_until_its_use_resumes() {
    let c = cluster();
    let path = format!(
        "{}:{}",
        bin("gpuctl").parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // An allocation idle for 12 s, then a step keeping its GPU 30% busy.
    let mut alloc = Command::new(bin("gpuctl"))
        .args([
            "alloc", "-G", "1", "-t", "5", "-J", "notebook", "--", "sh", "-c",
        ])
        .arg("sleep 12; gpuctl run -- env GPUCTL_FAKE_GPU_BUSY=30 sleep 60")
        .env("GPUCTL_CONTROLLER", c.url())
        .env("PATH", &path)
        .current_dir(c.path(""))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The allocation is submitted once the spawned gpuctl gets that far.
    assert!(wait_for(T, || c.gpuctl(&["show", "1"]).status.success()));
    let held = c.wait_state(1, "RUNNING", T);
    assert_eq!(held["interactive"], true, "{held}");
    let b = borrower(&c);
    let jb = c.wait_state(b, "RUNNING", T);
    assert_eq!(jb["gpus"], c.job(1)["gpus"], "{jb}");
    // The step starts at 12 s: its use resumes, and the borrower yields.
    assert!(
        wait_for(T, || c.job(b)["state"] == "PENDING"),
        "{}",
        c.job(b)
    );
    let j = c.job(b);
    assert!(j["reason"].as_str().unwrap().contains("use resumed"), "{j}");
    let a = c.job(1);
    assert_eq!(a["state"], "RUNNING", "{a}");
    c.gpuctl_ok(&["cancel", "1", &b.to_string()]);
    let _ = alloc.kill();
    let _ = alloc.wait();
}

/// The part of a shared GPU nobody holds is lent without measuring its holder: a
/// guaranteed half-GPU share kept 70% busy (over `lend_below`, so never lent by
/// measure) leaves the other half to a borrower `free_after` after it started, with the
/// memory its limit leaves as the borrower's room.
#[test]
fn the_half_of_a_gpu_a_share_leaves_is_lent() {
    let c = cluster();
    let holder = c.submit(
        "holder.toml",
        "name = \"serve\"\n\
         script = \"GPUCTL_FAKE_GPU_BUSY=70 GPUCTL_FAKE_GPU_MEMORY_MIB=9000 sleep 300\"\n\
         [resources]\ngpus = 0.5\ngpu_memory = \"20GiB\"\n",
    );
    c.wait_state(holder, "RUNNING", T);
    let b = borrower(&c);
    let (jb, jh) = lent(&c, b, holder);
    assert_eq!(jb["gpus"], jh["gpus"], "the share's GPU: {jb}\n{jh}");
    // Its hard limit: 80 GiB less the share's 20 GiB limit (more than its 9,000 MiB
    // peak with the 25% margin).
    let slot = &jb["allocations"][0]["slots"][0];
    assert_eq!(slot["memory_mib"], 81_920 - 20_480, "{jb}");
    assert!(
        jb["reason"].as_str().unwrap().contains("(70% busy)"),
        "{jb}"
    );
    // The share keeps running as it was.
    let jh = c.job(holder);
    assert_eq!(
        (jh["state"].as_str(), jh["attempt"].as_u64()),
        (Some("RUNNING"), Some(1))
    );
    c.gpuctl_ok(&["cancel", &holder.to_string(), &b.to_string()]);
}
