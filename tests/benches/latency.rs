//! The user-facing fast paths (not a test): one release `gpuctld` and one `gpud` with 8
//! fake GPUs on loopback, driven by the real CLI. Prints, each with its spread:
//! - submit -> dispatch -> launch on an idle node (the job's own `submit_time`,
//!   `start_time`, `launch_time`, and the program's own clock when it ran), and the
//!   CLI's round trip for that submit;
//! - a job that sleeps 1 s: its `end_time - launch_time` and `end_time - start_time`;
//! - sequential `gpuctl submit` from a loop (jobs that stay queued: the node is drained),
//!   with what a bare CLI start and a bare request cost, for the breakdown, and the same
//!   jobs as one `gpuctl submit` of that many files;
//! - steps: `srun date` inside a running batch job, one at a time: srun invoked -> the
//!   task's clock, and -> srun returned;
//! - alloc: `gpuctl run date` in a `gpuctl alloc` shell (a step from outside its job,
//!   through the controller to the node and back), one at a time, the same two figures;
//! - with 4 agents x 8 fake GPUs, 32 jobs running and N queued behind them: `gpuctl queue
//!   --json` and `gpuctl nodes` (text and `--json`), and cancelling everything in one
//!   `gpuctl cancel --me` until nothing waits or runs.
//!
//! ```text
//! cargo bench -p gpuctl-tests --bench latency [-- --jobs 10000 --samples 40 --favordynmods 1
//!     --cgroup-base DIR --phases launch,run,steps,alloc,cli,queued]
//! ```
//!
//! `GPUCTL_BENCH_BINS=DIR` runs the binaries in DIR instead of building this tree's (an
//! earlier build, for before-and-after runs side by side). `--cgroup-base DIR` hands the
//! agents another cgroup root (a cgroup2 mount of one's own: a pure v2 host).
//!
//! `--favordynmods 1` starts gpud with `--cgroup-favordynmods` (it remounts the host's
//! cgroup2 mount; the setting stays). The bench prints which way the host was.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use gpuctl_tests::{
    bench_arg, bench_cli, bench_text_arg, release_bins, start_bench_agent, start_bench_controller,
    start_bench_node, unix_ms, write_bench_jobs,
};
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

/// The agents' flags: their cgroup parent, and the bench's cgroup choices.
fn agent_flags(favor: bool) -> Vec<String> {
    let mut extra = vec![
        "--cgroup-parent".to_string(),
        format!("gpuctl-bench/latency-{}", std::process::id()),
    ];
    if favor {
        extra.push("--cgroup-favordynmods".into());
    }
    if let Some(root) = bench_text_arg("--cgroup-base") {
        extra.extend(["--cgroup-base".to_string(), root]);
    }
    extra
}

fn start_cluster(bin: &Path, d: &Path, favor: bool) -> (Child, String, Vec<Child>) {
    let (ctld, addr) = start_bench_controller(bin, d);
    let extra = agent_flags(favor);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let gpud = start_bench_agent(bin, d, &addr, &extra);
    (ctld, addr, vec![gpud])
}

fn main() {
    let samples = bench_arg("--samples", 40) as usize;
    let queued = bench_arg("--jobs", 10_000) as usize;
    let bin = match std::env::var_os("GPUCTL_BENCH_BINS") {
        Some(dir) => std::fs::canonicalize(dir).expect("GPUCTL_BENCH_BINS"),
        None => release_bins(&["gpuctld", "gpuctl", "gpud"]),
    };
    println!("binaries: {}", bin.display());
    let phases =
        bench_text_arg("--phases").unwrap_or_else(|| "launch,run,steps,alloc,cli,queued".into());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let favor = bench_arg("--favordynmods", 0) == 1;
    let (ctld, addr, agents) = start_cluster(&bin, d, favor);
    let mut daemons = Daemons(ctld, agents);
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
    write_bench_jobs(d);
    let on = |p: &str| phases.split(',').any(|x| x == p);
    if on("launch") {
        launch_phase(&b, samples);
    }
    if on("run") {
        run_time_phase(&b, samples);
    }
    if on("steps") {
        steps_phase(&b, samples);
    }
    if on("alloc") {
        alloc_phase(&b, samples);
    }
    if on("cli") {
        cli_phase(&b, samples);
    }
    if on("queued") {
        // Three more agents: 4 x 8 GPUs, as in the comparison with HyperQueue.
        let extra = agent_flags(favor);
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        for name in ["bench2", "bench3", "bench4"] {
            daemons
                .1
                .push(start_bench_node(&bin, d, &addr, name, &extra));
        }
        queued_phase(&b, queued);
    }
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

/// From a step loop's output (`i CLOCK` before each step, the step's own clock after
/// it, `i CLOCK` at the end; microseconds), past 3 warm-up steps: invoked -> the task's
/// clock, and invoked -> the next line (returned), in ms.
fn step_clocks(lines: &[&str], n: usize) -> (Vec<f64>, Vec<f64>) {
    let at = |l: &str| l.trim_start_matches("i ").parse::<i64>().unwrap();
    (3..n)
        .map(|k| {
            let (invoked, task, next) =
                (at(lines[2 * k]), at(lines[2 * k + 1]), at(lines[2 * k + 2]));
            (
                (task - invoked) as f64 / 1000.0,
                (next - invoked) as f64 / 1000.0,
            )
        })
        .unzip()
}

/// Steps inside a running job: a batch script (bash) that runs `srun date +%s%6N`
/// `samples` times, one task each, writing bash's own clock (`$EPOCHREALTIME`, no
/// process) just before each `srun`: srun invoked -> the task's program's own clock,
/// and srun invoked -> srun returned (the next line's clock).
fn steps_phase(b: &Bench, samples: usize) {
    let n = samples + 3;
    let script = format!(
        "#!/bin/bash\n#SBATCH -o steps.out --gpus=1\nfor i in $(seq {n}); do echo \"i ${{EPOCHREALTIME/./}}\"; srun date +%s%6N; done; echo \"i ${{EPOCHREALTIME/./}}\"\n"
    );
    std::fs::write(b.dir.join("steps.sbatch"), script).unwrap();
    let id = b.submit("steps.sbatch");
    let j = b.wait_ended(id);
    assert_eq!(j["state"], "COMPLETED", "{j}");
    let out = std::fs::read_to_string(b.dir.join("steps.out")).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    let (ran, round) = step_clocks(&lines, n);
    let steps = j["steps"].as_array().map_or(0, Vec::len);
    assert_eq!(steps, n, "every srun a step");
    println!("steps inside a running job, {samples} one at a time (ms):");
    println!("  srun invoked -> the task's own clock: {}", spread(ran));
    println!("  srun invoked -> srun returned: {}", spread(round));
}

/// Steps from outside a job: `gpuctl alloc` runs bash here, which runs `gpuctl run date
/// +%s%6N` `samples` times (a fresh CLI each: connect, Interact, the node's StepIo and
/// srun, the output back), with bash's own clock before each.
fn alloc_phase(b: &Bench, samples: usize) {
    let n = samples + 3;
    let script = format!(
        "for i in $(seq {n}); do echo \"i ${{EPOCHREALTIME/./}}\"; gpuctl run date +%s%6N; done > alloc.out; echo \"i ${{EPOCHREALTIME/./}}\" >> alloc.out"
    );
    let path = format!(
        "{}:{}",
        b.bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(b.bin.join("gpuctl"))
        .arg("--controller")
        .arg(format!("unix:{}", b.dir.join("gpuctld.sock").display()))
        .args(["alloc", "-G", "1", "--", "bash", "-c", &script])
        .env("PATH", path)
        .current_dir(&b.dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpuctl alloc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(b.dir.join("alloc.out")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        2 * n + 1,
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ran, round) = step_clocks(&lines, n);
    println!(
        "steps from outside a job (gpuctl run in gpuctl alloc), {samples} one at a time (ms):"
    );
    println!(
        "  gpuctl run invoked -> the task's own clock: {}",
        spread(ran)
    );
    println!(
        "  gpuctl run invoked -> gpuctl run returned: {}",
        spread(round)
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
/// from here on), then as many again in one call; cancels them all at the end and
/// resumes the node.
fn cli_phase(b: &Bench, samples: usize) {
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
    b.ok(&["cancel", "--me"]);
    while b.ok(&["queue", "--json"]).trim() != "[]" {
        std::thread::sleep(Duration::from_millis(20));
    }
    b.ok(&["node", "resume", "bench"]);
}

/// 32 jobs running (one a GPU of the four nodes) and `queued` waiting behind them
/// (arrays of up to 10,000 tasks, the controller's default `limits.max_array_tasks`):
/// the lists at that depth, then everything cancelled in one `gpuctl cancel --me`, until
/// nothing waits or runs.
fn queued_phase(b: &Bench, queued: usize) {
    let t = Instant::now();
    while b.json(&["nodes", "--json"]).as_array().unwrap().len() < 4
        || b.ok(&["nodes"]).matches("IDLE").count() < 4
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "agents did not attach"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let files = vec!["hold.toml"; 32];
    let mut args = vec!["submit"];
    args.extend(files);
    b.ok(&args);
    let running = |b: &Bench| {
        b.json(&["queue", "--json"])
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["state"] == "RUNNING" && j["launch_time"].is_string())
            .count()
    };
    let t = Instant::now();
    while running(b) < 32 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "32 jobs did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut left = queued;
    while left > 0 {
        let tasks = left.min(10_000);
        let spec = format!("0-{}", tasks - 1);
        b.ok(&["submit", "--array", &spec, "true.toml"]);
        left -= tasks;
    }
    let listed = b.json(&["queue", "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), queued + 32, "jobs listed");
    let (mut queue_ms, mut nodes_ms, mut nodes_json_ms) = (vec![], vec![], vec![]);
    let timed = |args: &[&str], into: &mut Vec<f64>| -> String {
        let t = Instant::now();
        let out = b.ok(args);
        into.push(t.elapsed().as_secs_f64() * 1000.0);
        out
    };
    for _ in 0..10 {
        let out = timed(&["queue", "--json"], &mut queue_ms);
        assert!(out.len() > queued * 100);
        let out = timed(&["nodes"], &mut nodes_ms);
        assert!(
            ["bench ", "bench2", "bench3", "bench4"]
                .iter()
                .all(|n| out.contains(n)),
            "{out}"
        );
        timed(&["nodes", "--json"], &mut nodes_json_ms);
    }
    println!(
        "`gpuctl queue --json`, {queued} queued + 32 running jobs, to a pipe (ms): {}",
        spread(queue_ms)
    );
    println!(
        "`gpuctl nodes`, 4 nodes, {queued} queued jobs (ms): {}",
        spread(nodes_ms)
    );
    println!(
        "`gpuctl nodes --json`, 4 nodes, {queued} queued jobs (ms): {}",
        spread(nodes_json_ms)
    );
    pass_phase(b, queued);
    // One request by filter (scancel --me), as a user cancels everything: no ids to
    // list first, no 4,096-id cap.
    let t = Instant::now();
    b.ok(&["cancel", "--me"]);
    let command = t.elapsed();
    while b.ok(&["queue", "--json"]).trim() != "[]" {
        std::thread::sleep(Duration::from_millis(2));
    }
    let all = t.elapsed();
    println!(
        "`gpuctl cancel --me` of {queued} queued + 32 running jobs, the command: {:.1} ms",
        command.as_secs_f64() * 1000.0
    );
    println!(
        "cancel {queued} queued + 32 running jobs until nothing waits or runs: {:.3} s",
        all.as_secs_f64()
    );
}

/// Scheduling passes over `queued` pending jobs (and 32 running): a hold and a release
/// of one of them, each waking a pass, 20 times; the controller's own pass times
/// (`gpuctl_schedule_pass_seconds`: the plan) over that while.
fn pass_phase(b: &Bench, queued: usize) {
    let read = || {
        let m = |n| gpuctl_tests::bench_metric(&b.dir, n).unwrap_or(f64::NAN);
        (
            m("gpuctl_schedule_pass_seconds_sum"),
            m("gpuctl_schedule_pass_seconds_count"),
        )
    };
    let listed = b.json(&["queue", "--json"]);
    let id = listed
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|j| j["state"] == "PENDING");
    let id = id.expect("a pending job")["id"].to_string();
    std::thread::sleep(Duration::from_millis(1500));
    let (sum0, count0) = read();
    for _ in 0..20 {
        b.ok(&["hold", &id]);
        b.ok(&["release", &id]);
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let (sum1, count1) = read();
    let passes = count1 - count0;
    println!(
        "scheduling passes over {queued} pending + 32 running jobs: {passes} passes, mean plan {:.1} ms (gpuctl_schedule_pass_seconds)",
        (sum1 - sum0) / passes * 1000.0
    );
}

/// The controller and the agents, killed when the bench ends (or panics).
struct Daemons(Child, Vec<Child>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for gpud in &mut self.1 {
            let _ = gpud.kill();
            let _ = gpud.wait();
        }
        let ctld = &mut self.0;
        let _ = ctld.kill();
        let _ = ctld.wait();
    }
}
