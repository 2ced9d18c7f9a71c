//! What operators install besides the binaries: shell completions and the manual.

use std::process::Command;

#[test]
fn completions_for_every_shell_name_the_commands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(gpuctl_tests::bin("gpuctl"))
            .args(["completions", shell])
            .env("GPUCTL_CONTROLLER", "http://127.0.0.1:1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8(out.stdout).unwrap();
        for word in ["submit", "queue", "cancel", "--wrap", "--export"] {
            assert!(text.contains(word), "{shell} completions lack {word}");
        }
        if shell == "bash" {
            let dir = tempfile::tempdir().unwrap();
            let f = dir.path().join("gpuctl.bash");
            std::fs::write(&f, &text).unwrap();
            let check = Command::new("bash").arg("-n").arg(&f).status().unwrap();
            assert!(check.success(), "bash completions do not parse");
        }
    }
}

#[test]
fn the_manual_renders_as_roff() {
    let out = Command::new(gpuctl_tests::bin("gpuctl"))
        .arg("man")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(".ie \\n(.g .ds Aq") || text.contains(".TH gpuctl"),
        "{text}"
    );
    assert!(text.contains("submit") && text.contains("completions"));
}

/// The alert rules in `deploy/prometheus/` load in a real Prometheus's `promtool`, and
/// fire on the series they are about (its unit tests). CI installs Prometheus and sets
/// GPUCTL_REQUIRE_PROMTOOL, so that a missing promtool fails there instead of skipping.
#[test]
fn alert_rules_load_and_fire_in_promtool() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus");
    let run = |args: &[&str]| {
        Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
    };
    let check = match run(&["check", "rules", "alerts.yml"]) {
        Ok(o) => o,
        Err(e) => {
            gpuctl_tests::skipped(
                "GPUCTL_REQUIRE_PROMTOOL",
                &format!("promtool ({e}; apt-get install prometheus)"),
            );
            return;
        }
    };
    let text = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(
        check.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(text.contains("SUCCESS: 11 rules found"), "{text}");
    let test = run(&["test", "rules", "alerts_test.yml"]).unwrap();
    assert!(
        test.status.success(),
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
}

fn repo(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

/// The systemd units pass `systemd-analyze verify` (run on copies pointing at the built
/// programs): every key known, every value parsed, the programs there.
#[test]
fn the_systemd_units_verify() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        gpuctl_tests::skipped("GPUCTL_REQUIRE_SYSTEMD", "systemd-analyze");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = gpuctl_tests::bin_dir();
    let mut units = Vec::new();
    for unit in ["gpuctld.service", "gpud.service"] {
        let text = std::fs::read_to_string(repo(&format!("deploy/systemd/{unit}"))).unwrap();
        assert!(text.contains("ExecStart=/usr/bin/"), "{unit}");
        let copy = dir.path().join(unit);
        std::fs::write(
            &copy,
            text.replace("/usr/bin/", &format!("{}/", bin.display())),
        )
        .unwrap();
        units.push(copy);
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&units)
        .output()
        .unwrap();
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && errors.trim().is_empty(), "{errors}");
    // The agent's jobs outlive it: stopping gpud must not kill them.
    let gpud = std::fs::read_to_string(repo("deploy/systemd/gpud.service")).unwrap();
    assert!(gpud.contains("\nKillMode=process\n") && gpud.contains("\nDelegate=yes\n"));
}

/// Every flag of both daemons is in the configuration reference.
#[test]
fn the_config_reference_names_every_daemon_flag() {
    let page = std::fs::read_to_string(repo("docs/config.md")).unwrap();
    for program in ["gpuctld", "gpud"] {
        let out = Command::new(gpuctl_tests::bin(program))
            .arg("--help")
            .output()
            .unwrap();
        let help = String::from_utf8(out.stdout).unwrap();
        let flags: Vec<&str> = help
            .split_whitespace()
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(|w| w.trim_end_matches([',', '.', ')', ';', ':']))
            .filter(|w| !["--help", "--version"].contains(w))
            .collect();
        assert!(flags.len() > 5, "{help}");
        for f in flags {
            assert!(
                page.contains(&format!("`{f}")),
                "{program} {f} not in docs/config.md"
            );
        }
    }
}

/// `gpuctld config` prints the effective configuration, which loads again as the same;
/// a bad file fails with its line and column.
#[test]
fn gpuctld_config_prints_a_config_that_loads_back() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(gpuctl_tests::bin("gpuctld"))
            .arg("config")
            .args(args)
            .output()
            .unwrap()
    };
    let mine = dir.path().join("mine.toml");
    std::fs::write(
        &mine,
        "kill_grace = \"30s\"\n[health]\nmax_gpu_power_w = 450\n",
    )
    .unwrap();
    let first = run(&["--config", mine.to_str().unwrap()]);
    assert!(first.status.success());
    let text = String::from_utf8(first.stdout).unwrap();
    assert!(text.contains("kill_grace = \"30s\"") && text.contains("max_gpu_power_w = 450"));
    let effective = dir.path().join("effective.toml");
    std::fs::write(&effective, &text).unwrap();
    let again = run(&["--config", effective.to_str().unwrap()]);
    assert_eq!(String::from_utf8(again.stdout).unwrap(), text);
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "kill_grace = \"30s\"\n[health]\nmax_gpu_temp = 80\n").unwrap();
    let out = run(&["--config", bad.to_str().unwrap()]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success());
    assert!(
        err.contains("bad.toml") && err.contains("line 3") && err.contains("max_gpu_temp"),
        "{err}"
    );
}

/// The Debian packages' metadata names files that exist (those built by
/// scripts/build-debs.sh aside) and a unit for each daemon.
#[test]
fn the_deb_metadata_names_files_that_exist() {
    for (package, unit) in [("gpuctld", true), ("gpud", true), ("gpuctl", false)] {
        let manifest: toml::Value = toml::from_str(
            &std::fs::read_to_string(repo(&format!("{package}/Cargo.toml"))).unwrap(),
        )
        .unwrap();
        let deb = &manifest["package"]["metadata"]["deb"];
        let assets = deb["assets"].as_array().unwrap();
        assert!(
            assets
                .iter()
                .any(|a| a[0].as_str() == Some(&format!("target/release/{package}"))),
            "{package} ships its program"
        );
        for a in assets {
            let src = a[0].as_str().unwrap();
            if !src.starts_with("target/") {
                assert!(repo(package).join(src).exists(), "{package}: {src} missing");
            }
        }
        if unit {
            let dir = deb["systemd-units"]["unit-scripts"].as_str().unwrap();
            assert!(
                repo(package)
                    .join(dir)
                    .join(format!("{package}.service"))
                    .exists()
            );
        }
    }
}

/// `gpuctld simulate` runs the simulator's own binary (the daemon links no simulator):
/// a replay of three jobs on two 8-GPU nodes gives the schedule worked out by hand (the
/// 16-GPU gang waits for both nodes: the 8-GPU job ends at 100 s, so it waits 80 s and
/// ends at 130 s), and its usage lines name `gpuctld simulate`.
#[test]
fn gpuctld_simulate_runs_the_simulator_binary() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs.csv");
    std::fs::write(
        &jobs,
        "submit_time,duration,num_gpus\n0,100,8\n10,50,4\n20,30,16\n",
    )
    .unwrap();
    let out = Command::new(gpuctl_tests::bin("gpuctld"))
        .args(["simulate", "replay", "--cluster", "2x8xA100-80GB", "--jobs"])
        .arg(&jobs)
        .args(["--policy", "fifo,backfill", "--out"])
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = std::fs::read(dir.path().join("out/summary.json")).unwrap();
    let rows: serde_json::Value = serde_json::from_slice(&summary).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert_eq!(row["jobs"], 3, "{row}");
        assert_eq!(row["makespan_s"], 130.0, "{row}");
        assert_eq!(row["wait_p99_s"], 80.0, "{row}");
    }
    assert!(dir.path().join("out/summary.md").exists());
    let help = Command::new(gpuctl_tests::bin("gpuctld"))
        .args(["simulate", "replay", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8(help.stdout).unwrap();
    assert!(text.contains("Usage: gpuctld simulate replay"), "{text}");
}
