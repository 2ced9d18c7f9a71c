//! The read-only web page (`gpuctld --web-listen`), rendered by a real headless
//! Chromium: the page's script runs, fetches the state and fills in the heat map, the
//! charts and the tables; a job named like markup stays text. The screenshot (and
//! `gpuctl top --once`, the terminal view, as text) are kept under
//! `target/test-artefacts/`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use gpuctl_tests::{Cluster, free_port, wait_for};

const T: Duration = Duration::from_secs(20);

fn artefacts() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-artefacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Chromium's binary, or None where it is not installed (CI installs it and sets
/// GPUCTL_REQUIRE_CHROMIUM, so that there a missing browser fails instead of skipping).
fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok());
    if found.is_none() {
        gpuctl_tests::skipped(
            "GPUCTL_REQUIRE_CHROMIUM",
            "Chromium (apt-get install chromium)",
        );
    }
    found
}

fn headless(browser: &str, args: &[&str], url: &str) -> String {
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--virtual-time-budget=8000",
            "--window-size=1300,1000",
        ])
        .args(args)
        .arg(url)
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_web_page_renders_the_cluster_in_a_real_browser() {
    let Some(browser) = chromium() else { return };
    let port = free_port();
    let mut c = Cluster::controller_with_args(&["--web-listen", &format!("127.0.0.1:{port}")]);
    // Busy and idle GPUs, so that the heat map has colours to show.
    c.add_agent_gpus_file(
        "web1",
        "[[gpus]]\ncount = 2\nmodel = \"A100-80GB\"\n[gpus.metrics]\nutilization = [[0, 93]]\n\
         [[gpus]]\ncount = 2\nmodel = \"A100-80GB\"\n[gpus.metrics]\nutilization = [[0, 12]]\n",
        "1s",
    );
    c.add_agent("web2", "2xA100-80GB:mig=3g.40gb+3g.40gb", &[]);
    c.wait_nodes_up(2);
    let hostile = "<img src=x onerror=alert(1)>";
    let train = c.submit(
        "train.toml",
        &format!("name = \"{hostile}\"\nscript = \"sleep 60\"\n[resources]\ngpus = 2\n"),
    );
    let infer = c.submit(
        "infer.toml",
        "name = \"infer\"\nscript = \"sleep 60\"\n[resources]\ngpus = 0.25\n",
    );
    let waits = c.submit(
        "big.toml",
        "name = \"big-train\"\nscript = \"sleep 60\"\n[resources]\ngpus = 4\n",
    );
    c.wait_state(train, "RUNNING", T);
    c.wait_state(infer, "RUNNING", T);
    // The agent's samples have reached the controller.
    assert!(wait_for(T, || {
        c.nodes().to_string().contains("\"util_pct\":93")
    }));

    let url = format!("http://127.0.0.1:{port}/");
    let dom = headless(browser, &["--dump-dom"], &url);
    // The script ran and filled the page from /api/state.
    assert!(dom.contains("data-loaded=\"1\""), "{dom}");
    for text in ["web1", "web2", "big-train", "infer", "Resources", "RUNNING"] {
        assert!(dom.contains(text), "{text} not on the page:\n{dom}");
    }
    // Totals: 6 GPUs, 2.25 allocated (38%), one pending, two running.
    for card in [
        "<b>2</b><span class=\"muted\">nodes</span>",
        "<b>6</b><span class=\"muted\">GPUs</span>",
        "<b>38%</b><span class=\"muted\">allocated</span>",
        "<b>1</b><span class=\"muted\">pending jobs</span>",
        "<b>2</b><span class=\"muted\">running jobs</span>",
    ] {
        assert!(dom.contains(card), "{card} not on the page:\n{dom}");
    }
    // The users table: root runs 2 jobs holding 2.25 GPUs, 1 waits.
    assert!(
        dom.contains("<td>root</td><td class=\"num\">2</td><td class=\"num\">1</td><td class=\"num\">2.25</td>"),
        "{dom}"
    );
    // One heat-map cell per GPU, the busy ones at their utilisation; the charts drew.
    assert_eq!(dom.matches("class=\"gpu").count(), 6, "{dom}");
    assert_eq!(dom.matches(">93</div>").count(), 2, "{dom}");
    assert_eq!(dom.matches("<polyline").count(), 4, "{dom}");
    // The job named like markup is text, not an element.
    assert!(dom.contains("&lt;img src=x onerror=alert(1)&gt;"), "{dom}");
    assert!(!dom.contains("<img"), "{dom}");
    assert!(
        dom.contains(&format!("<td class=\"num\">{waits}</td>")),
        "{dom}"
    );

    let shot = artefacts().join("web.png");
    let _ = std::fs::remove_file(&shot);
    headless(
        browser,
        &[&format!("--screenshot={}", shot.display())],
        &url,
    );
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{}",
        png.len()
    );

    // The terminal view of the same cluster, as text.
    let top = c.gpuctl_ok(&["top", "--once", "--width", "110"]);
    assert!(top.contains("web1") && top.contains("big-train"), "{top}");
    std::fs::write(artefacts().join("top.txt"), &top).unwrap();
    for id in [train, infer, waits] {
        c.gpuctl_ok(&["cancel", &id.to_string()]);
    }
}
