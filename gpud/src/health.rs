//! The site's own node check (`gpud --health-program PATH`), like Slurm's
//! HealthCheckProgram: run every `--health-interval` as the agent's user (an admin's
//! program, named on the agent's command line, never by a user), with no input and a
//! time limit. Exit 0 is healthy; anything else is a complaint, worded by the
//! program's first line of output. Heartbeats carry the latest complaint; the
//! controller drains the node with it and lifts that drain once the program passes.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// The longest complaint kept (a line for `gpuctl nodes`).
const MAX_REASON: usize = 200;

pub struct HealthProgram {
    pub program: PathBuf,
    pub every: Duration,
    pub timeout: Duration,
}

/// The complaint from a finished run: empty when it passed.
pub fn verdict(success: bool, code: Option<i32>, stdout: &[u8], stderr: &[u8]) -> String {
    if success {
        return String::new();
    }
    let first_line = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_string)
    };
    let said = first_line(stdout).or_else(|| first_line(stderr));
    let why = match (said, code) {
        (Some(s), _) => s,
        (None, Some(c)) => format!("exit status {c}"),
        (None, None) => "killed by a signal".to_string(),
    };
    // One printable line of bounded length.
    let mut clean: String = why
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if let Some((cut, _)) = clean.char_indices().nth(MAX_REASON) {
        clean.truncate(cut);
        clean.push('…');
    }
    clean
}

/// One run of the program: its complaint, or "" when it passed.
pub async fn check_once(p: &HealthProgram) -> String {
    let child = tokio::process::Command::new(&p.program)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => return format!("cannot run {}: {e}", p.program.display()),
    };
    match tokio::time::timeout(p.timeout, child.wait_with_output()).await {
        Ok(Ok(out)) => verdict(
            out.status.success(),
            out.status.code(),
            &out.stdout,
            &out.stderr,
        ),
        Ok(Err(e)) => format!("{}: {e}", p.program.display()),
        // Dropping the child kills it.
        Err(_) => format!(
            "{} did not finish in {}",
            p.program.display(),
            humantime::format_duration(p.timeout)
        ),
    }
}

/// Runs the program every `p.every` and keeps the latest complaint in `latest`.
pub async fn run(p: HealthProgram, latest: std::sync::Arc<Mutex<String>>) {
    let mut tick = tokio::time::interval(p.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = String::new();
    loop {
        tick.tick().await;
        let now = check_once(&p).await;
        if now != last {
            if now.is_empty() {
                tracing::info!("health program passes again");
            } else {
                tracing::warn!("health program: {now}");
            }
            last.clone_from(&now);
        }
        *latest.lock().unwrap_or_else(|e| e.into_inner()) = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_take_the_first_line_and_stay_one_short_line() {
        assert_eq!(verdict(true, Some(0), b"all fine", b""), "");
        assert_eq!(
            verdict(false, Some(1), b"\n  GPU 3 missing  \nmore", b"x"),
            "GPU 3 missing"
        );
        assert_eq!(verdict(false, Some(2), b"", b"ib0 down\n"), "ib0 down");
        assert_eq!(verdict(false, Some(7), b"", b""), "exit status 7");
        assert_eq!(verdict(false, None, b"", b""), "killed by a signal");
        assert_eq!(verdict(false, Some(1), b"a\x1b[31mb\tc", b""), "a [31mb c");
        let long = "x".repeat(500);
        assert_eq!(
            verdict(false, Some(1), long.as_bytes(), b"")
                .chars()
                .count(),
            MAX_REASON + 1
        );
    }

    #[tokio::test]
    async fn a_program_that_hangs_is_killed_at_its_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("check.sh");
        std::fs::write(&script, "#!/bin/sh\nsleep 30\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let p = HealthProgram {
            program: script.clone(),
            every: Duration::from_secs(1),
            timeout: Duration::from_millis(300),
        };
        let t = std::time::Instant::now();
        let why = check_once(&p).await;
        assert!(why.contains("did not finish in 300ms"), "{why}");
        assert!(t.elapsed() < Duration::from_secs(5));
        let missing = HealthProgram {
            program: dir.path().join("nope"),
            ..p
        };
        assert!(check_once(&missing).await.starts_with("cannot run"));
    }
}
