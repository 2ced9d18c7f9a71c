//! Makespan of many short jobs (not a test): one release `gpuctld` and four `gpud`s with
//! 8 fake GPUs each (32 GPUs) on loopback, real processes in real cgroups. N jobs of
//! `sleep D` (D from 1.0 to 5.4 s, mean 3.2 s, the same sequence every run) are
//! submitted and held, then released in one request; the bench waits until all ended
//! and prints, from the jobs' own records:
//! - the makespan (release -> last end) against the zero-overhead FIFO bound (each job
//!   on the first GPU free, in submit order, from the release, no gaps);
//! - GPU occupancy while jobs waited: GPU time with a job's process running (launch to
//!   end) over 32 x the time from the release to the last job's dispatch;
//! - per job: dispatch -> launch, and end - launch beyond its sleep.
//!
//!   cargo bench -p gpuctl-tests --bench makespan [-- --jobs 500 --nodes 4 --favordynmods 1 --seed 0]
//!
//! `--seed N` draws another mix of durations (0, the default, is the one the figures in
//! docs/benchmarks.md used first; `scripts/hq-makespan.sh` takes the same seeds).
//! `--favordynmods 1` starts the agents with `--cgroup-favordynmods` (see the latency
//! bench).

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpuctl_tests::{bench_arg, bench_cli, release_bins, start_bench_controller, start_bench_node};
use serde_json::Value;

/// The durations in ms: a linear congruential sequence over [1,000, 5,400), fixed by
/// `seed` (0: the sequence every figure in docs/benchmarks.md used before seeds).
fn durations(n: usize, seed: u64) -> Vec<i64> {
    let mut x: u64 =
        0x2545_f491_4f6c_dd1d_u64.wrapping_add(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            1_000 + ((x >> 33) % 4_400) as i64
        })
        .collect()
}

/// The FIFO schedule without overhead: each job, in order, on the GPU that frees first.
fn fifo_bound(durations: &[i64], gpus: usize) -> i64 {
    let mut free = vec![0i64; gpus];
    for &d in durations {
        let first = free.iter_mut().min().unwrap();
        *first += d;
    }
    free.into_iter().max().unwrap_or(0)
}

fn unix_ms_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Unix ms of an RFC 3339 UTC time with milliseconds, as the CLI prints it.
fn unix_ms(v: &Value) -> i64 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a time: {v}"));
    let t = humantime::parse_rfc3339(s).unwrap_or_else(|e| panic!("{s}: {e}"));
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn percentiles(mut v: Vec<i64>) -> String {
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!("p50 {} / p90 {} / max {}", at(0.5), at(0.9), at(1.0))
}

struct Daemons(Vec<Child>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for c in self.0.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn main() {
    let jobs = bench_arg("--jobs", 500) as usize;
    let nodes = bench_arg("--nodes", 4) as usize;
    let favor = bench_arg("--favordynmods", 0) == 1;
    let seed = bench_arg("--seed", 0);
    let bin = release_bins(&["gpuctld", "gpuctl", "gpud"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ctld, addr) = start_bench_controller(&bin, d);
    let mut daemons = Daemons(vec![ctld]);
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
    for name in &names {
        let parent = format!("gpuctl-bench/makespan-{name}");
        let mut extra = vec!["--cgroup-parent", &parent];
        extra.extend(favor.then_some("--cgroup-favordynmods"));
        daemons
            .0
            .push(start_bench_node(&bin, d, &addr, name, &extra));
    }
    let gpuctl = |args: &[&str]| bench_cli(&bin, d, args);
    wait_idle(&gpuctl, nodes);
    let ds = durations(jobs, seed);
    let ids = submit_held(&gpuctl, d, &names, &ds);
    let mut release = vec!["release"];
    release.extend(ids.iter().map(String::as_str));
    let released = unix_ms_now();
    gpuctl(&release);
    let t = Instant::now();
    let records = loop {
        let all: Value = serde_json::from_str(&gpuctl(&["queue", "--all", "--json"])).unwrap();
        let all = all.as_array().unwrap().clone();
        let ended = all.iter().filter(|j| j["end_time"].is_string()).count();
        if ended == jobs {
            break all;
        }
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "{ended} of {jobs} ended"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    drop(daemons);
    let ids: Vec<u64> = ids.iter().map(|i| i.parse().unwrap()).collect();
    report(&records, &ids, &ds, released, nodes * 8);
}

/// Waits until every node is attached and idle.
fn wait_idle(gpuctl: &dyn Fn(&[&str]) -> String, nodes: usize) {
    let t = Instant::now();
    loop {
        // `nodes --json` is an array of nodes.
        let v: Value = serde_json::from_str(&gpuctl(&["nodes", "--json"])).unwrap();
        let idle = v
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["state"] == "IDLE")
            .count();
        if idle == nodes {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "agents did not attach: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Submits one job per duration (with the nodes drained, so none starts), holds them
/// all in one request, and resumes the nodes. Answers the ids in submit order.
fn submit_held(
    gpuctl: &dyn Fn(&[&str]) -> String,
    d: &Path,
    names: &[String],
    ds: &[i64],
) -> Vec<String> {
    for n in names {
        gpuctl(&["node", "drain", n, "--reason", "bench"]);
    }
    let mut ids = Vec::new();
    for (i, ms) in ds.iter().enumerate() {
        let file = d.join(format!("job-{i}.toml"));
        std::fs::write(
            &file,
            format!(
                "command = [\"sleep\", \"{}.{:03}\"]\nstdout = \"/dev/null\"\n[resources]\ngpus = 1\ncpus = 1\n",
                ms / 1000,
                ms % 1000
            ),
        )
        .unwrap();
        let out = gpuctl(&["submit", file.to_str().unwrap()]);
        let id = out.split_whitespace().find(|w| w.parse::<u64>().is_ok());
        ids.push(id.expect("a job id").to_string());
    }
    let mut hold = vec!["hold"];
    hold.extend(ids.iter().map(String::as_str));
    gpuctl(&hold);
    for n in names {
        gpuctl(&["node", "resume", n]);
    }
    ids
}

fn report(records: &[Value], ids: &[u64], ds: &[i64], released: i64, gpus: usize) {
    let time = |j: &Value, f: &str| unix_ms(&j[f]);
    let last_end = records.iter().map(|j| time(j, "end_time")).max().unwrap();
    let last_dispatch = records.iter().map(|j| time(j, "start_time")).max().unwrap();
    let bound = fifo_bound(ds, gpus);
    let makespan = last_end - released;
    // GPU time with a process running, inside [release, last dispatch].
    let busy: i64 = records
        .iter()
        .map(|j| {
            let (a, b) = (time(j, "launch_time"), time(j, "end_time"));
            (b.min(last_dispatch) - a.max(released)).max(0)
        })
        .sum();
    let window = (last_dispatch - released).max(1);
    let occupancy = busy as f64 / (gpus as i64 * window) as f64;
    let by_id: std::collections::HashMap<u64, i64> =
        ids.iter().copied().zip(ds.iter().copied()).collect();
    let launch: Vec<i64> = records
        .iter()
        .map(|j| time(j, "launch_time") - time(j, "start_time"))
        .collect();
    let beyond: Vec<i64> = records
        .iter()
        .map(|j| time(j, "end_time") - time(j, "launch_time") - by_id[&j["id"].as_u64().unwrap()])
        .collect();
    // Per GPU, in order: a job's end -> the next job's dispatch there.
    let mut by_gpu: std::collections::HashMap<String, Vec<(i64, i64)>> = Default::default();
    for j in records {
        let gpu = format!("{}/{}", j["node"], j["gpus"]);
        by_gpu
            .entry(gpu)
            .or_default()
            .push((time(j, "start_time"), time(j, "end_time")));
    }
    let refill: Vec<i64> = by_gpu
        .values_mut()
        .flat_map(|runs| {
            runs.sort_unstable();
            runs.windows(2).map(|w| w[1].0 - w[0].1).collect::<Vec<_>>()
        })
        .collect();
    let mean = ds.iter().sum::<i64>() as f64 / ds.len() as f64;
    println!(
        "{} jobs of `sleep` (mean {:.2} s) on {gpus} GPUs:",
        ds.len(),
        mean / 1000.0
    );
    println!(
        "  makespan {:.2} s; zero-overhead FIFO bound {:.2} s; overhead {:.2} s ({:.2}%)",
        makespan as f64 / 1000.0,
        bound as f64 / 1000.0,
        (makespan - bound) as f64 / 1000.0,
        (makespan - bound) as f64 * 100.0 / bound as f64
    );
    println!(
        "  GPU occupancy while jobs waited (release -> last dispatch, {:.1} s): {:.2}%",
        window as f64 / 1000.0,
        occupancy * 100.0
    );
    println!("  dispatch -> launch (ms): {}", percentiles(launch));
    println!(
        "  end - launch beyond the sleep (ms): {}",
        percentiles(beyond)
    );
    println!(
        "  a job's end -> the next dispatch on its GPU (ms): {}",
        percentiles(refill)
    );
}
