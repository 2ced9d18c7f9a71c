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
            assert!(
                std::env::var_os("GPUCTL_REQUIRE_PROMTOOL").is_none(),
                "promtool is required here: {e}"
            );
            eprintln!("skipped: no promtool ({e}); apt-get install prometheus");
            return;
        }
    };
    let text = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(
        check.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(text.contains("SUCCESS: 9 rules found"), "{text}");
    let test = run(&["test", "rules", "alerts_test.yml"]).unwrap();
    assert!(
        test.status.success(),
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
}
