//! The agent's own cost (not a test): a release `gpud` with 8 fake GPUs, sampling every
//! second, heartbeating every second, with 16 running jobs (two half-GPU shares per GPU),
//! observed for a while: CPU time it used (as % of one core) and its resident memory.
//! Targets: under 1% of one core, under 30 MB.
//!
//!   cargo bench -p gpuctl-tests --bench agent_cost [-- --seconds 60]

use std::time::{Duration, Instant};

use gpuctl_tests::{bench_arg, bench_cli, release_bins, start_bench_agent, start_bench_controller};

/// (utime + stime in clock ticks, resident KiB) of a process.
fn usage(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (ticks, rss)
}

fn main() {
    let seconds = bench_arg("--seconds", 60);
    let bin = release_bins(&["gpuctld", "gpuctl", "gpud"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut ctld, addr) = start_bench_controller(&bin, d);
    let mut gpud = start_bench_agent(
        &bin,
        d,
        &addr,
        &[
            "--sample-interval",
            "1s",
            "--heartbeat-interval",
            "1s",
            "--cgroup-parent",
            "gpuctl-bench/agent-cost",
        ],
    );
    let gpuctl = |args: &[&str]| bench_cli(&bin, d, args);
    std::fs::write(
        d.join("job.toml"),
        "script = \"sleep 3600\"\n[resources]\ngpus = 0.5\ncpus = 1\n",
    )
    .unwrap();
    let t = Instant::now();
    while !gpuctl(&["nodes"]).contains("IDLE") {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "agent did not register"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..16 {
        gpuctl(&["submit", "job.toml"]);
    }
    let t = Instant::now();
    loop {
        let q = gpuctl(&["queue"]);
        if q.matches("RUNNING").count() == 16 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "jobs did not start:\n{q}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Let start-up settle, then measure.
    std::thread::sleep(Duration::from_secs(3));
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap_or(100) as f64;
    let (c0, _) = usage(gpud.id());
    let t0 = Instant::now();
    let mut peak_rss = 0;
    while t0.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_secs(1));
        peak_rss = peak_rss.max(usage(gpud.id()).1);
    }
    let (c1, rss) = usage(gpud.id());
    let wall = t0.elapsed().as_secs_f64();
    let cpu_pct = (c1 - c0) as f64 / tick / wall * 100.0;
    println!(
        "gpud, 8 fake GPUs, 16 running jobs, 1 s sampling and heartbeats, {wall:.0} s: CPU {cpu_pct:.2}% of one core ({:.2} s), resident memory {:.1} MB now, {:.1} MB peak",
        (c1 - c0) as f64 / tick,
        rss as f64 / 1024.0,
        peak_rss as f64 / 1024.0
    );
    let ids: Vec<String> = gpuctl(&["queue", "--json"])
        .lines()
        .filter_map(|l| l.trim().strip_prefix("\"id\": "))
        .map(|v| v.trim_end_matches(',').to_string())
        .collect();
    let mut args = vec!["cancel"];
    args.extend(ids.iter().map(String::as_str));
    gpuctl(&args);
    std::thread::sleep(Duration::from_secs(2));
    let _ = gpud.kill();
    let _ = ctld.kill();
    let _ = gpud.wait();
    let _ = ctld.wait();
}
