//! Node features (`gpud --features`) and jobs' constraints (`sbatch -C`, `gpuctl submit
//! -C`, `resources.constraint`) on the real binaries: a constrained job runs on the node
//! that offers what it asks for, waits with the reason when that node is busy, and one
//! no node meets is refused at submit.

use std::path::PathBuf;
use std::time::Duration;

use gpuctl_tests::Cluster;

const T: Duration = Duration::from_secs(30);

#[test]
fn constrained_jobs_run_where_the_features_are() {
    let mut c = Cluster::controller_only();
    c.add_agent("plain", "1xA100-80GB", &["--features", "a100"]);
    c.add_agent("fast", "1xA100-80GB", &["--features", "a100,nvlink"]);
    c.wait_nodes_up(2);
    let nodes = c.nodes();
    let fast = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "fast")
        .unwrap();
    assert_eq!(fast["features"], serde_json::json!(["a100", "nvlink"]));
    let table = c.gpuctl_ok(&["nodes"]);
    assert!(
        table.lines().next().unwrap().contains("FEATURES"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.trim_start().starts_with("fast") && l.contains("a100,nvlink")),
        "{table}"
    );
    // The example script asks for both features: it runs on `fast`.
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/sbatch/constraint.sbatch");
    let id = c.json(&["submit", script.to_str().unwrap()])["job_id"]
        .as_u64()
        .unwrap();
    let done = c.wait_state(id, "COMPLETED", T);
    assert_eq!(done["node"], "fast", "{done:#}");
    assert_eq!(done["resources"]["constraint"], "a100&nvlink");
    // `fast` busy: the next such job waits although `plain` is idle, and says why.
    std::fs::write(
        c.path("long.toml"),
        "command = [\"sleep\", \"30\"]\n[resources]\ngpus = 1\nconstraint = \"nvlink\"\n",
    )
    .unwrap();
    let first = c.json(&["submit", "long.toml"])["job_id"].as_u64().unwrap();
    assert_eq!(c.wait_state(first, "RUNNING", T)["node"], "fast");
    let second = c.json(&["submit", "long.toml"])["job_id"].as_u64().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(c.job(second)["state"], "PENDING");
    let why = c.gpuctl_ok(&["explain", &second.to_string()]);
    assert!(
        why.contains("lacks the features the job's constraint asks for"),
        "{why}"
    );
    // The flag overrides the file: either kind will do, and `plain` is free.
    let either = c.json(&["submit", "long.toml", "-C", "h100|a100"])["job_id"]
        .as_u64()
        .unwrap();
    assert_eq!(c.wait_state(either, "RUNNING", T)["node"], "plain");
    // No node has it: refused at submit, naming what the nodes offer.
    let out = c.gpuctl(&["submit", "long.toml", "-C", "h100"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("offer: a100, nvlink"), "{err}");
}

/// A malformed feature stops gpud at start with the flag and the feature named (exit
/// 2), before it reaches the controller; a trailing comma is not a feature.
#[test]
fn gpud_refuses_a_malformed_feature_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(gpuctl_tests::bin("gpud"))
        .args(["--features", "a100,,bad one", "--fake-gpus", "1xA100-80GB"])
        .args(["--name", "x", "--key-file", "/nonexistent"])
        .arg("--state-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--features") && err.contains("bad one"),
        "{err}"
    );
}
