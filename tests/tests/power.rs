//! GPU power caps by time window on the real binaries (issue 58): a window that caps
//! opens on the controller's clock (`--fake-time`), each agent sets its fake A100s'
//! limits (a node pattern's own cap over the window's), `gpuctl nodes --json` shows
//! them, and they go back to the GPUs' default when the window closes.

use std::time::Duration;

use gpuctl_tests::{Cluster, wait_for};

/// Every GPU's power limit on `node`, as `gpuctl nodes --json` shows its last sample.
fn limits(c: &Cluster, node: &str) -> Vec<f64> {
    let nodes = c.json(&["nodes"]);
    let Some(n) = (nodes.as_array().into_iter().flatten()).find(|n| n["name"] == node) else {
        return Vec::new();
    };
    (n["gpus"].as_array().into_iter().flatten())
        .filter_map(|g| g["metrics"]["power_limit_w"].as_f64())
        .collect()
}

fn all_at(c: &Cluster, node: &str, watts: f64) -> bool {
    let l = limits(c, node);
    !l.is_empty() && l.iter().all(|w| (w - watts).abs() < 0.5)
}

#[test]
fn a_window_caps_gpu_power_while_open_and_the_default_comes_back_when_it_closes() {
    // The window runs 21:59 to 22:00 on the controller's clock, which starts at
    // 21:59:25: open at once, closed 35 s later.
    let config = "timezone = \"UTC\"\n\
         [windows.peak]\n\
         days = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
         start = \"21:59\"\nend = \"22:00\"\n\
         gpu_power_limit = \"50%\"\n\
         gpu_power_limit_nodes = { \"keep[1-9]\" = \"300W\" }\n";
    let mut c = Cluster::controller_with_config(config);
    c.kill9_controller();
    c.ctld_args = vec!["--fake-time".into(), "2024-01-01T21:59:25Z".into()];
    c.start_controller();
    c.add_agent("n1", "2xA100-80GB", &["--sample-interval", "1s"]);
    c.add_agent("keep1", "1xA100-80GB", &["--sample-interval", "1s"]);
    c.wait_nodes_up(2);
    let w = c.json(&["windows"]);
    assert_eq!(w["windows"][0]["open"], true, "{w}");
    // Half of an A100's 400 W; the pattern's node its own 300 W.
    assert!(
        wait_for(Duration::from_secs(20), || all_at(&c, "n1", 200.0)),
        "capped: {:?}",
        limits(&c, "n1")
    );
    assert!(
        wait_for(Duration::from_secs(10), || all_at(&c, "keep1", 300.0)),
        "{:?}",
        limits(&c, "keep1")
    );
    // The window closes at 22:00: the default again, on every GPU.
    assert!(
        wait_for(Duration::from_secs(60), || all_at(&c, "n1", 400.0)
            && all_at(&c, "keep1", 400.0)),
        "lifted: {:?} {:?}",
        limits(&c, "n1"),
        limits(&c, "keep1")
    );
    let w = c.json(&["windows"]);
    assert_eq!(w["windows"][0]["open"], false, "{w}");
    // The agent's log says what it set.
    let log = c.agent_log("n1");
    assert!(
        log.contains("GPU power limit set") && log.contains("watts=200"),
        "{log}"
    );
}
