//! What TLS costs (not a test): the same release cluster (one `gpuctld`, one `gpud` with
//! 8 fake GPUs) in its default mode (TLS on TCP, the node joined with a token and
//! dialling with its own certificate, the CLI over `https://` with the CA pinned and an
//! API token) and in the old mode (`--insecure-shared-key --insecure`: plain TCP, the
//! cluster key, the token in clear), rounds alternating, a fresh cluster each time.
//! Users on TCP are what TLS touches, so the CLI talks TCP here, not the Unix socket.
//! Prints, per round and mode:
//!
//! - submit -> the job's program running on an idle node (the program's own clock
//!   against the job's `submit_time`), and `submit_time -> launch_time`, p50;
//! - sequential `gpuctl submit` from a loop over TCP (jobs that stay queued: the node is
//!   drained), submits a second, and as many jobs in one `gpuctl submit` of that many
//!   files (one connection, one handshake);
//! - the controller's resident memory at the end.
//!
//! ```text
//! cargo bench -p gpuctl-tests --bench wire [-- --rounds 3 --samples 30 --submits 200
//!     --cgroup-base DIR]
//! ```
//!
//! `--cgroup-base DIR` hands the agent another cgroup root (a cgroup2 mount of one's
//! own: a pure v2 host, where a launch does not wait for the kernel to move the job
//! into v1 hierarchies, so launch times show what the wire adds).
//!
//! Heartbeat CPU and memory per agent at 10,000 agents are the scale bench's
//! (`--tls 1` against `--tls 0 --per-channel 1`).

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use gpuctl_tests::{
    bench_arg, bench_cli, bench_text_arg, release_bins, start_bench_controller_in,
    start_bench_node, start_bench_node_joined, unix_ms, write_bench_jobs,
};
use serde_json::Value;

/// A cluster in one mode, and a CLI that reaches it over TCP.
struct Wire {
    tls: bool,
    bin: std::path::PathBuf,
    dir: tempfile::TempDir,
    addr: String,
    token: String,
    daemons: Vec<Child>,
}

impl Drop for Wire {
    fn drop(&mut self) {
        // The agent first: it would otherwise log the controller's end as lost.
        for c in self.daemons.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Wire {
    fn start(bin: &Path, tls: bool) -> Wire {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (ctld, addr) = start_bench_controller_in(bin, d, tls);
        let mut extra = vec![
            "--cgroup-parent".to_string(),
            format!("gpuctl-bench/wire-{}", std::process::id()),
        ];
        if let Some(root) = bench_text_arg("--cgroup-base") {
            extra.extend(["--cgroup-base".to_string(), root]);
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let gpud = if tls {
            start_bench_node_joined(bin, d, &addr, "bench", &extra)
        } else {
            start_bench_node(bin, d, &addr, "bench", &extra)
        };
        let t = Instant::now();
        while !bench_cli(bin, d, &["nodes"]).contains("IDLE") {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "agent did not attach"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let created: Value = serde_json::from_str(&bench_cli(
            bin,
            d,
            &["admin", "token", "create", "--user", "root", "--json"],
        ))
        .unwrap();
        write_bench_jobs(d);
        Wire {
            tls,
            bin: bin.to_path_buf(),
            addr,
            token: created["token"].as_str().unwrap().to_string(),
            daemons: vec![ctld, gpud],
            dir,
        }
    }

    /// `gpuctl ARGS` over TCP: https with the CA pinned, or http with `--insecure`.
    fn tcp(&self, args: &[&str]) -> String {
        let d = self.dir.path();
        let mut cmd = Command::new(self.bin.join("gpuctl"));
        if self.tls {
            cmd.args(["--controller", &format!("https://{}", self.addr)])
                .env("GPUCTL_CA", d.join("ctld/ca.pem"));
        } else {
            cmd.args([
                "--controller",
                &format!("http://{}", self.addr),
                "--insecure",
            ]);
        }
        let out = cmd
            .args(args)
            .env("GPUCTL_TOKEN", &self.token)
            .env("HOME", d)
            .current_dir(d)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "gpuctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn submit(&self, file: &str) -> u64 {
        let out = self.tcp(&["submit", file]);
        out.split_whitespace()
            .find_map(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("no job id in {out:?}"))
    }

    fn socket(&self, args: &[&str]) -> String {
        bench_cli(&self.bin, self.dir.path(), args)
    }

    /// Submit -> the program running, and submit_time -> launch_time (ms, each sample).
    fn launches(&self, samples: usize) -> (Vec<f64>, Vec<f64>) {
        let (mut ran, mut launched) = (Vec::new(), Vec::new());
        for i in 0..samples + 3 {
            let id = self.submit("date.toml");
            let t = Instant::now();
            let j = loop {
                let j: Value =
                    serde_json::from_str(&self.socket(&["show", &id.to_string(), "--json"]))
                        .unwrap();
                if j["end_time"].is_string() {
                    break j;
                }
                assert!(t.elapsed() < Duration::from_secs(60), "job {id}: {j}");
                std::thread::sleep(Duration::from_millis(20));
            };
            if i < 3 {
                continue; // warm-up
            }
            let s = unix_ms(&j["submit_time"]);
            launched.push((unix_ms(&j["launch_time"]) - s) as f64);
            let out =
                std::fs::read_to_string(self.dir.path().join(format!("out/{id}.txt"))).unwrap();
            let ran_us: i64 = out.trim().parse().unwrap();
            ran.push((ran_us - s * 1000) as f64 / 1000.0);
        }
        (ran, launched)
    }

    /// Sequential submits over TCP that stay queued (the node drained), then as many
    /// in one `gpuctl submit` of that many files (one connection): each per second.
    fn submit_loop(&self, n: usize) -> (f64, f64) {
        self.socket(&["node", "drain", "bench", "--reason", "bench"]);
        let t = Instant::now();
        for _ in 0..n {
            self.submit("hold.toml");
        }
        let one_by_one = n as f64 / t.elapsed().as_secs_f64();
        let mut args = vec!["submit"];
        args.extend(vec!["hold.toml"; n]);
        let t = Instant::now();
        let out = self.tcp(&args);
        let in_one = n as f64 / t.elapsed().as_secs_f64();
        assert_eq!(out.lines().count(), n, "{out}");
        self.socket(&["cancel", "--me"]);
        (one_by_one, in_one)
    }

    fn rss_mib(&self) -> f64 {
        let pid = self.daemons[0].id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

fn main() {
    let rounds = bench_arg("--rounds", 3) as usize;
    let samples = bench_arg("--samples", 30) as usize;
    let submits = bench_arg("--submits", 200) as usize;
    let bin = match std::env::var_os("GPUCTL_BENCH_BINS") {
        Some(dir) => std::fs::canonicalize(dir).expect("GPUCTL_BENCH_BINS"),
        None => release_bins(&["gpuctld", "gpuctl", "gpud"]),
    };
    println!("binaries: {}", bin.display());
    println!(
        "mode   round  submit->running p50 ms  submit->launch p50 ms  TCP submits/s, one a call  in one call  controller RSS MiB"
    );
    let mut all: [Vec<[f64; 4]>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        // Alternate which mode goes first, so neither always runs on a warmer host.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for tls in order {
            let w = Wire::start(&bin, tls);
            let (ran, launched) = w.launches(samples);
            let (rate, batch) = w.submit_loop(submits);
            let (r, l) = (median(ran), median(launched));
            println!(
                "{:<6} {round:>5}  {r:>22.2}  {l:>21.1}  {rate:>25.0}  {batch:>11.0}  {:>18.1}",
                if tls { "tls" } else { "plain" },
                w.rss_mib()
            );
            all[usize::from(tls)].push([r, l, rate, batch]);
        }
    }
    for (i, name) in ["plain", "tls"].iter().enumerate() {
        let v = &all[i];
        println!(
            "{name}: medians over rounds: submit->running {:.2} ms, submit->launch {:.1} ms, {:.0} submits/s one a call, {:.0}/s in one call",
            median(v.iter().map(|x| x[0]).collect()),
            median(v.iter().map(|x| x[1]).collect()),
            median(v.iter().map(|x| x[2]).collect()),
            median(v.iter().map(|x| x[3]).collect()),
        );
    }
}
