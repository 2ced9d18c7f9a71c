//! A job reaches only the GPUs it was given (issue "Hardening, second round", attack 1):
//! its cgroup refuses `open()` of another GPU's device node with EPERM, whatever it puts
//! in `CUDA_VISIBLE_DEVICES`, and the fake backend counts its GPU memory only on the GPUs
//! it may open. Device nodes are made with `mknod` (fake GPU i is 195:i, as NVML's minor
//! numbers are on real nodes); opening one with no driver behind it fails with ENXIO,
//! which says the cgroup let it through.

use std::time::Duration;

use gpuctl_tests::{Cluster, wait_for};

const T: Duration = Duration::from_secs(30);

/// Whether this host can confine devices: root, and a v1 devices controller or a
/// cgroup2 hierarchy (the agent's own check decides; its log says which).
fn confinable(c: &Cluster, node: &str) -> bool {
    let log = c.agent_log(node);
    if log.contains("GPU device isolation is unavailable") {
        gpuctl_tests::skipped(
            "GPUCTL_REQUIRE_CGROUPS",
            &format!("device confinement: {log}"),
        );
        return false;
    }
    assert!(
        log.contains("jobs are confined to their GPUs' device nodes"),
        "{log}"
    );
    true
}

fn mknod(path: &std::path::Path, minor: u64) {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    let _ = std::fs::remove_file(path);
    mknod(
        path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(195, minor),
    )
    .unwrap();
}

#[test]
fn a_job_opens_its_own_gpu_and_no_other() {
    let c = Cluster::start(&[("dev1", "4xA100-80GB")]);
    c.wait_nodes_up(1);
    if !confinable(&c, "dev1") {
        return;
    }
    let dir = c.path("dev");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..4 {
        mknod(&dir.join(format!("nvidia{i}")), i);
    }
    mknod(&dir.join("nvidiactl"), 255);
    // The job names every GPU in CUDA_VISIBLE_DEVICES and tries each node.
    let gpus: Vec<String> = c.nodes()[0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_string())
        .collect();
    let script = format!(
        "export CUDA_VISIBLE_DEVICES={all}\nfor n in nvidia0 nvidia1 nvidia2 nvidia3 nvidiactl; do \
         printf '%s ' $n; dd if={dir}/$n of=/dev/null count=1 2>&1 | grep -o 'Operation not permitted\\|No such device or address' | head -n 1; done",
        all = gpus.join(","),
        dir = dir.display()
    );
    let toml =
        format!("script = '''\n{script}\n'''\nstdout = \"devs-%j.out\"\n[resources]\ngpus = 1\n");
    let id = c.submit("devs.toml", &toml);
    let j = c.wait_state(id, "COMPLETED", T);
    let mine = j["gpus"][0].as_str().unwrap();
    let index = gpus.iter().position(|g| g == mine).unwrap();
    let out = std::fs::read_to_string(c.path(&format!("devs-{id}.out"))).unwrap();
    for i in 0..4 {
        let want = if i == index {
            "No such device or address"
        } else {
            "Operation not permitted"
        };
        assert!(
            out.contains(&format!("nvidia{i} {want}")),
            "GPU {i}:\n{out}"
        );
    }
    assert!(
        out.contains("nvidiactl No such device or address"),
        "the control node stays open:\n{out}"
    );
    // A job without GPUs opens none.
    let none = c.submit(
        "none.toml",
        &toml
            .replace("gpus = 1", "gpus = 0")
            .replace("devs-%j", "none-%j"),
    );
    c.wait_state(none, "COMPLETED", T);
    let out = std::fs::read_to_string(c.path(&format!("none-{none}.out"))).unwrap();
    assert_eq!(out.matches("Operation not permitted").count(), 4, "{out}");
}

#[test]
fn fake_gpu_memory_follows_the_devices_a_job_may_open() {
    let c = Cluster::start(&[("dev2", "2xA100-80GB")]);
    c.wait_nodes_up(1);
    if !confinable(&c, "dev2") {
        return;
    }
    let victim = c.submit(
        "victim.toml",
        "script = \"sleep 60\"\n[resources]\ngpus = 1\n",
    );
    let v = c.wait_state(victim, "RUNNING", T);
    let theirs = v["gpus"][0].as_str().unwrap().to_string();
    // The job lists the victim's GPU first: CUDA could open only its own.
    let thief = c.submit(
        "thief.toml",
        &format!(
            "script = '''\nexport CUDA_VISIBLE_DEVICES={theirs},$CUDA_VISIBLE_DEVICES\nexport GPUCTL_FAKE_GPU_MEMORY_MIB=5000\nsleep 60\n'''\n[resources]\ngpus = 1\n"
        ),
    );
    let t = c.wait_state(thief, "RUNNING", T);
    let own = t["gpus"][0].as_str().unwrap().to_string();
    let used = |uuid: &str| {
        c.nodes()[0]["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["uuid"] == uuid)
            .map(|g| g["metrics"]["mem_used_mib"].as_u64().unwrap_or(0))
            .unwrap()
    };
    assert!(
        wait_for(T, || used(&own) == 5000),
        "own GPU: {}",
        used(&own)
    );
    assert_eq!(used(&theirs), 0, "the victim's GPU holds none of it");
    c.gpuctl_ok(&["cancel", &victim.to_string(), &thief.to_string()]);
}
