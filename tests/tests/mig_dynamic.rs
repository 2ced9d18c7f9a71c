//! Dynamic MIG on the real binaries (issue 58): a fake A100 of a `gpud --mig dynamic`
//! node with no layout set beforehand runs seven `mig = "1g.10gb"` jobs at once, then
//! a whole-GPU job once they have ended; the node list shows the layout, the metrics
//! count the changes, and a static node refuses none of its own (it is never asked).

use std::time::Duration;

use gpuctl_tests::{Cluster, free_port, scrape, wait_for};

const T: Duration = Duration::from_secs(60);

fn submit(c: &Cluster, file: &str, text: &str) -> u64 {
    std::fs::write(c.path(file), text).unwrap();
    let j = c.json(&["submit", c.path(file).to_str().unwrap()]);
    j["job_id"].as_u64().unwrap_or_else(|| panic!("{j}"))
}

/// GPU 0 of `node` as `gpuctl nodes --json` lists it.
fn gpu0(c: &Cluster, node: &str) -> serde_json::Value {
    let nodes = c.json(&["nodes"]);
    (nodes.as_array().into_iter().flatten())
        .find(|n| n["name"] == node)
        .map(|n| n["gpus"][0].clone())
        .unwrap_or_default()
}

#[test]
fn seven_small_jobs_share_a_gpu_laid_out_for_them_then_a_whole_job_runs_on_it() {
    let mut c = Cluster::controller_with_config("[mig]\nmin_layout_age = \"1s\"\n");
    let port = free_port();
    c.kill9_controller();
    c.ctld_args = vec!["--metrics-listen".into(), format!("127.0.0.1:{port}")];
    c.start_controller();
    c.add_agent("d1", "1xA100-80GB", &["--mig", "dynamic"]);
    c.wait_nodes_up(1);
    assert_eq!(
        gpu0(&c, "d1")["mig"],
        serde_json::json!([]),
        "no layout beforehand"
    );
    let small = "script = \"sleep 4\"\n[resources]\nmig = \"1g.10gb\"\n";
    let ids: Vec<u64> = (0..7)
        .map(|i| submit(&c, &format!("s{i}.toml"), small))
        .collect();
    // All seven run at once, each on an instance of its own.
    assert!(
        wait_for(T, || ids.iter().all(|&id| c.job(id)["state"] == "RUNNING")),
        "{:?}\n{}",
        ids.iter()
            .map(|&id| c.job(id)["reason"].clone())
            .collect::<Vec<_>>(),
        c.agent_log("d1")
    );
    let g = gpu0(&c, "d1");
    let mig = g["mig"].as_array().unwrap();
    assert_eq!(mig.len(), 7, "{g}");
    assert!(
        mig.iter()
            .all(|m| m["profile"] == "1g.10gb" && !m["job_id"].is_null()),
        "{g}"
    );
    let mut held: Vec<String> = ids
        .iter()
        .map(|&id| c.job(id)["gpus"][0].as_str().unwrap().to_string())
        .collect();
    held.sort();
    held.dedup();
    assert_eq!(held.len(), 7, "seven instances, one each");
    // A whole-GPU job: it runs on the same GPU, whole again, once they have ended.
    let whole = submit(&c, "w.toml", "script = \"true\"\n[resources]\ngpus = 1\n");
    for &id in &ids {
        c.wait_state(id, "COMPLETED", T);
    }
    c.wait_state(whole, "COMPLETED", T);
    let g = gpu0(&c, "d1");
    assert_eq!(g["mig"], serde_json::json!([]), "whole again: {g}");
    assert_eq!(c.job(whole)["gpus"][0], g["uuid"]);
    let log = c.agent_log("d1");
    assert!(log.contains("MIG layout changed"), "{log}");
    let m = scrape(port);
    assert!(m.contains("gpuctl_mig_reconfigurations_total 2"), "{m}");
}
