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
