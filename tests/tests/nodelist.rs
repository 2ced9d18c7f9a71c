//! `-w`/`-x` (nodelist, exclude) on the real binaries: a job kept off a node runs on
//! the other, one kept to a node waits for it, and a list no node matches is refused.

use std::time::Duration;

use gpuctl_tests::Cluster;

const T: Duration = Duration::from_secs(30);

#[test]
fn jobs_run_only_where_their_node_lists_allow() {
    let c = Cluster::start(&[("gpu01", "1xA100-80GB"), ("gpu02", "1xA100-80GB")]);
    let job = "command = [\"sleep\", \"30\"]\n[resources]\ngpus = 1\n";
    std::fs::write(c.path("j.toml"), job).unwrap();
    let off1 = c.json(&["submit", "j.toml", "-x", "gpu01"])["job_id"]
        .as_u64()
        .unwrap();
    let running = c.wait_state(off1, "RUNNING", T);
    assert_eq!(running["node"], "gpu02", "{running:#}");
    assert_eq!(
        running["resources"]["exclude"],
        serde_json::json!(["gpu01"])
    );
    // Kept to gpu02, which is full: it waits, although gpu01 is free.
    let on2 = c.json(&["submit", "j.toml", "-w", "gpu0[2]"])["job_id"]
        .as_u64()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let waiting = c.job(on2);
    assert_eq!(waiting["state"], "PENDING", "{waiting:#}");
    let why = c.gpuctl_ok(&["explain", &on2.to_string()]);
    assert!(
        why.contains("left out by the job's nodelist or exclude"),
        "{why}"
    );
    // No node matches: refused at submit, with the reason.
    let out = c.gpuctl(&["submit", "j.toml", "-w", "cpu[1-4]"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("matches its nodelist"), "{err}");
}
