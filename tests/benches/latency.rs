//! The user-facing fast paths (not a test): one release `gpuctld` and one `gpud` with 8
//! fake GPUs on loopback, driven by the real CLI. Prints, each with its spread:
//! - submit -> dispatch -> launch on an idle node (the job's own `submit_time`,
//!   `start_time`, `launch_time`, and the program's own clock when it ran), and the
//!   CLI's round trip for that submit;
//! - a job that sleeps 1 s: its `end_time - launch_time` and `end_time - start_time`;
//! - sequential `gpuctl submit` from a loop (jobs that stay queued: the node is drained),
//!   with what a bare CLI start and a bare request cost, for the breakdown, and the same
//!   jobs as one `gpuctl submit` of that many files;
//! - `gpuctl queue --json` and `gpuctl nodes --json` at N queued jobs, and cancelling
//!   all of them until none is left.
//!
//!   cargo bench -p gpuctl-tests --bench latency [-- --jobs 10000 --samples 40 --favordynmods 1]
//!
//! `--favordynmods 1` starts gpud with `--cgroup-favordynmods` (it remounts the host's
//! cgroup2 mount; the setting stays). The bench prints which way the host was.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpuctl_tests::{bench_arg, bench_cli, release_bins, start_bench_agent, start_bench_controller};
use serde_json::Value;

struct Bench {
    bin: PathBuf,
    dir: PathBuf,
}

impl Bench {
    fn ok(&self, args: &[&str]) -> String {
        bench_cli(&self.bin, &self.dir, args)
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    fn submit(&self, file: &str) -> u64 {
        let out = self.ok(&["submit", file]);
        out.split_whitespace()
            .find_map(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("no job id in {out:?}"))
    }

    fn wait_ended(&self, id: u64) -> Value {
        let t = Instant::now();
        loop {
            let j = self.json(&["show", &id.to_string(), "--json"]);
            if j["end_time"].is_string() {
                return j;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "job {id}: {j}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Unix ms of an RFC 3339 UTC time as the CLI prints it (`2026-12-02T03:31:35.123Z`).
fn unix_ms(v: &Value) -> i64 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a time: {v}"));
    let n = |r: std::ops::Range<usize>| s[r].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let secs = n(11..13) * 3600 + n(14..16) * 60 + n(17..19);
    let frac = s[19..]
        .strip_prefix('.')
        .map_or(0, |f| f.trim_end_matches('Z')[..3].parse::<i64>().unwrap());
    (days * 86_400 + secs) * 1000 + frac
}

/// This host's wall clock in Unix microseconds.
fn unix_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// "p50 / p90 / max" of a sample.
fn spread(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!(
        "p50 {:.1} / p90 {:.1} / max {:.1}",
        at(0.5),
        at(0.9),
        at(1.0)
    )
}

fn start_cluster(bin: &Path, d: &Path, favor: bool) -> (std::process::Child, std::process::Child) {
    let (ctld, addr) = start_bench_controller(bin, d);
    let mut extra = vec!["--cgroup-parent", "gpuctl-bench/latency"];
    extra.extend(favor.then_some("--cgroup-favordynmods"));
    let gpud = start_bench_agent(bin, d, &addr, &extra);
    (ctld, gpud)
}

fn main() {
    let samples = bench_arg("--samples", 40) as usize;
    let queued = bench_arg("--jobs", 10_000) as usize;
    let bin = release_bins(&["gpuctld", "gpuctl", "gpud"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let favor = bench_arg("--favordynmods", 0) == 1;
    let daemons = Daemons(start_cluster(&bin, d, favor));
    let b = Bench {
        bin: bin.clone(),
        dir: d.to_path_buf(),
    };
    let t = Instant::now();
    while !b.ok(&["nodes"]).contains("IDLE") {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "agent did not attach"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(
        d.join("true.toml"),
        "command = [\"true\"]\nstdout = \"/dev/null\"\n[resources]\ngpus = 1\ncpus = 1\n",
    )
    .unwrap();
    std::fs::create_dir_all(d.join("out")).unwrap();
    std::fs::write(
        d.join("date.toml"),
        "command = [\"date\", \"+%s%6N\"]\nstdout = \"out/%j.txt\"\n[resources]\ngpus = 1\ncpus = 1\n",
    )
    .unwrap();
    std::fs::write(
        d.join("sleep.toml"),
        "command = [\"sleep\", \"1\"]\nstdout = \"/dev/null\"\n[resources]\ngpus = 1\ncpus = 1\n",
    )
    .unwrap();
    launch_phase(&b, samples);
    run_time_phase(&b, samples);
    let n = cli_phase(&b, samples);
    queued_phase(&b, queued, n);
    drop(daemons);
}

/// Submit -> launch on an idle node, one job at a time.
/// The job is `date +%s%6N`: its own clock when it ran, in microseconds, against the
/// bench's clock when it invoked `gpuctl submit` (both this host's wall clock).
fn launch_phase(b: &Bench, samples: usize) {
    let (mut dispatch, mut launch, mut total, mut cli) = (vec![], vec![], vec![], vec![]);
    let (mut ran_cli, mut ran_submit) = (vec![], vec![]);
    for i in 0..samples + 3 {
        let invoked_us = unix_us();
        let t = Instant::now();
        let id = b.submit("date.toml");
        let round_trip = t.elapsed().as_secs_f64() * 1000.0;
        let j = b.wait_ended(id);
        if i < 3 {
            continue; // warm-up
        }
        let (s, st, l) = (
            unix_ms(&j["submit_time"]),
            unix_ms(&j["start_time"]),
            unix_ms(&j["launch_time"]),
        );
        dispatch.push((st - s) as f64);
        launch.push((l - st) as f64);
        total.push((l - s) as f64);
        cli.push(round_trip);
        let out = std::fs::read_to_string(b.dir.join(format!("out/{id}.txt"))).unwrap();
        let ran_us: i64 = out.trim().parse().unwrap();
        ran_cli.push((ran_us - invoked_us) as f64 / 1000.0);
        ran_submit.push((ran_us - s * 1000) as f64 / 1000.0);
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let cgroup2 = mounts
        .lines()
        .filter(|l| l.contains(" cgroup2 "))
        .collect::<Vec<_>>();
    println!("cgroup2 mounts: {cgroup2:?}");
    println!("submit -> launch on an idle node, {samples} jobs one at a time (ms):");
    println!(
        "  submit_time -> start_time (queue, pass): {}",
        spread(dispatch)
    );
    println!(
        "  start_time -> launch_time (dispatch, spawn): {}",
        spread(launch)
    );
    println!("  submit_time -> launch_time: {}", spread(total));
    println!(
        "  submit_time -> the program's own clock when it ran: {}",
        spread(ran_submit)
    );
    println!(
        "  `gpuctl submit` invoked -> the program's own clock when it ran: {}",
        spread(ran_cli)
    );
    println!(
        "  `gpuctl submit` round trip (process start to exit): {}",
        spread(cli)
    );
}

/// A job that sleeps 1 s, 8 at a time.
fn run_time_phase(b: &Bench, samples: usize) {
    let (mut by_launch, mut by_start) = (vec![], vec![]);
    for _ in 0..samples.div_ceil(8) {
        let ids: Vec<u64> = (0..8).map(|_| b.submit("sleep.toml")).collect();
        for id in ids {
            let j = b.wait_ended(id);
            let end = unix_ms(&j["end_time"]);
            by_launch.push((end - unix_ms(&j["launch_time"]) - 1000) as f64);
            by_start.push((end - unix_ms(&j["start_time"]) - 1000) as f64);
        }
    }
    println!("`sleep 1`: observed run time beyond 1,000 ms (ms):");
    println!("  end_time - launch_time: {}", spread(by_launch));
    println!("  end_time - start_time: {}", spread(by_start));
}

/// The CLI's own cost, then sequential submits that stay queued (the node is drained
/// from here on), then as many again in one call. Answers how many were submitted.
fn cli_phase(b: &Bench, samples: usize) -> usize {
    b.ok(&["node", "drain", "bench", "--reason", "bench"]);
    let timed = |f: &dyn Fn()| {
        let t = Instant::now();
        for _ in 0..samples {
            f();
        }
        t.elapsed().as_secs_f64() * 1000.0 / samples as f64
    };
    let version = timed(&|| {
        Command::new(b.bin.join("gpuctl"))
            .arg("--version")
            .output()
            .unwrap();
    });
    let whoami = timed(&|| {
        b.ok(&["whoami"]);
    });
    let n = samples * 10;
    let t = Instant::now();
    for _ in 0..n {
        b.submit("true.toml");
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "sequential `gpuctl submit`, {n} jobs: {:.0}/s ({:.2} ms each); `gpuctl --version` {version:.2} ms, `gpuctl whoami` (connect + one request) {whoami:.2} ms",
        n as f64 / secs,
        secs * 1000.0 / n as f64
    );
    // The same jobs as one call with many files (one connection, one durable request a job).
    let files = vec!["true.toml"; n];
    let mut args = vec!["submit"];
    args.extend(files);
    let t = Instant::now();
    let out = b.ok(&args);
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(out.lines().count(), n, "{out}");
    println!(
        "one `gpuctl submit` of {n} files: {:.0}/s ({:.2} ms each)",
        n as f64 / secs,
        secs * 1000.0 / n as f64
    );
    2 * n
}

/// Many queued jobs (`queued` in all, `n` there already): arrays of up to 10,000 tasks
/// (the controller's default `limits.max_array_tasks`), then the lists and a cancel of
/// all of them in one `gpuctl cancel --me`.
fn queued_phase(b: &Bench, queued: usize, n: usize) {
    let mut left = queued - n;
    while left > 0 {
        let tasks = left.min(10_000);
        let spec = format!("0-{}", tasks - 1);
        b.ok(&["submit", "--array", &spec, "true.toml"]);
        left -= tasks;
    }
    let listed = b.json(&["queue", "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), queued, "jobs queued");
    let mut queue_ms = vec![];
    let mut nodes_ms = vec![];
    for _ in 0..5 {
        let t = Instant::now();
        let out = b.ok(&["queue", "--json"]);
        queue_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        assert!(out.len() > queued * 100);
        let t = Instant::now();
        b.ok(&["nodes", "--json"]);
        nodes_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "`gpuctl queue --json`, {queued} queued jobs (ms): {}",
        spread(queue_ms)
    );
    println!(
        "`gpuctl nodes --json` with {queued} queued jobs (ms): {}",
        spread(nodes_ms)
    );
    // One request by filter (scancel --me), as a user cancels everything: no ids to
    // list first, no 4,096-id cap.
    let t = Instant::now();
    b.ok(&["cancel", "--me"]);
    let command = t.elapsed();
    while b.ok(&["queue", "--json"]).trim() != "[]" {
        std::thread::sleep(Duration::from_millis(5));
    }
    println!(
        "`gpuctl cancel --me` of {queued} queued jobs, the command: {:.1} ms",
        command.as_secs_f64() * 1000.0
    );
    println!(
        "cancel {queued} queued jobs until none is left: {:.3} s",
        t.elapsed().as_secs_f64()
    );
}

/// The controller and the agent, killed when the bench ends (or panics).
struct Daemons((std::process::Child, std::process::Child));

impl Drop for Daemons {
    fn drop(&mut self) {
        let (ctld, gpud) = &mut self.0;
        let _ = gpud.kill();
        let _ = ctld.kill();
        let _ = gpud.wait();
        let _ = ctld.wait();
    }
}
