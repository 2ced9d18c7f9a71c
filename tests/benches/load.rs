//! Load benchmark (not a test): sustained durable submits from several concurrent
//! clients against one release-built `gpuctld` on its Unix socket, with the queue grown
//! to 100,000 pending jobs first; then `gpuctl queue --json` and `gpuctl queue` at that
//! size. Prints acknowledged submits per second, p50/p99/max latency and the queue
//! latencies.
//!
//!   cargo bench -p gpuctl-tests --bench load [-- --queue 100000 --clients 16 --measure 20000]

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuctl_proto::{self as pb, controller_client::ControllerClient};
use gpuctl_tests::{bench_arg, release_bins};
use tokio::sync::Mutex;

fn spec(i: usize) -> pb::JobSpec {
    pb::JobSpec {
        name: format!("load-{i}"),
        command: vec!["python".into(), "train.py".into(), format!("--seed={i}")],
        workdir: "/tmp".into(),
        resources: Some(pb::Resources {
            gpu: Some(pb::resources::Gpu::Gpus(1)),
            cpus: 4,
            memory_bytes: 16 << 30,
            time_limit_secs: 3600,
            ..pb::Resources::default()
        }),
        ..pb::JobSpec::default()
    }
}

struct Phase {
    acked: usize,
    secs: f64,
    lat_ms: Vec<f64>,
}

async fn submit_many(socket: &Path, clients: usize, total: usize) -> Phase {
    let next = Arc::new(Mutex::new(0usize));
    let start = Instant::now();
    // Every submit carries a request id, as `gpuctl submit` does (unique per phase).
    let phase = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let url = format!("unix:{}", socket.display());
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let channel = tonic::transport::Endpoint::from_shared(url)
                .unwrap()
                .connect()
                .await
                .expect("connect to gpuctld");
            let mut client = ControllerClient::new(channel);
            let mut lat = Vec::new();
            loop {
                let i = {
                    let mut n = next.lock().await;
                    if *n >= total {
                        break;
                    }
                    *n += 1;
                    *n
                };
                let t = Instant::now();
                client
                    .submit(pb::SubmitRequest {
                        spec: Some(spec(i)),
                        request_id: format!("load-{phase}-{i}"),
                        hold: false,
                    })
                    .await
                    .expect("submit acknowledged");
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            lat
        }));
    }
    let mut lat_ms = Vec::new();
    for t in tasks {
        lat_ms.extend(t.await.unwrap());
    }
    let secs = start.elapsed().as_secs_f64();
    lat_ms.sort_by(f64::total_cmp);
    Phase {
        acked: lat_ms.len(),
        secs,
        lat_ms,
    }
}

fn pct(v: &[f64], p: f64) -> f64 {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn report(name: &str, p: &Phase) {
    println!(
        "{name}: {} acknowledged in {:.1} s = {:.0} submits/s; latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        p.acked,
        p.secs,
        p.acked as f64 / p.secs,
        pct(&p.lat_ms, 0.5),
        pct(&p.lat_ms, 0.99),
        p.lat_ms.last().unwrap()
    );
}

fn time_gpuctl(bin: &Path, socket: &Path, args: &[&str]) -> (f64, usize) {
    let t = Instant::now();
    let out = Command::new(bin.join("gpuctl"))
        .arg("--controller")
        .arg(format!("unix:{}", socket.display()))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success());
    (t.elapsed().as_secs_f64() * 1000.0, out.stdout.len())
}

fn main() {
    // `cargo bench` passes --bench; libtest-style filters are ignored.
    let queue = bench_arg("--queue", 100_000) as usize;
    let clients = bench_arg("--clients", 16) as usize;
    let measure = bench_arg("--measure", 20_000) as usize;
    let bin = release_bins(&["gpuctld", "gpuctl"]);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("gpuctld.sock");
    std::fs::write(
        dir.path().join("gpuctld.toml"),
        "sched_interval = \"10s\"\n[limits]\nmax_pending_per_user = 10000000\n",
    )
    .unwrap();
    let mut ctld = Command::new(bin.join("gpuctld"))
        .args(["--listen", "127.0.0.1:0", "--state-dir"])
        .arg(dir.path().join("state"))
        .arg("--socket")
        .arg(&socket)
        .arg("--config")
        .arg(dir.path().join("gpuctld.toml"))
        .args(["--insecure-shared-key", "--insecure"])
        .env("GPUCTL_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start gpuctld");
    let up = Instant::now();
    while !socket.exists() {
        assert!(
            up.elapsed() < Duration::from_secs(10),
            "gpuctld did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "gpuctld (release) on {}, state on {}; {clients} concurrent clients over the Unix socket",
        socket.display(),
        dir.path().display()
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fill = rt.block_on(submit_many(&socket, clients, queue));
    report(&format!("fill to {queue} pending"), &fill);
    let sustained = rt.block_on(submit_many(&socket, clients, measure));
    report(
        &format!("sustained at {queue}+ pending ({measure} submits)"),
        &sustained,
    );

    let rpc_ms = rt.block_on(async {
        let url = format!("unix:{}", socket.display());
        let channel = tonic::transport::Endpoint::from_shared(url)
            .unwrap()
            .initial_stream_window_size(16 << 20)
            .initial_connection_window_size(32 << 20)
            .max_frame_size(1 << 20)
            .connect()
            .await
            .unwrap();
        let mut client = ControllerClient::new(channel).max_decoding_message_size(1 << 30);
        let t = Instant::now();
        let n = client
            .list_jobs(pb::ListJobsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .jobs
            .len();
        assert_eq!(n, queue + measure);
        t.elapsed().as_secs_f64() * 1000.0
    });
    println!(
        "ListJobs RPC alone ({} jobs, decoded): {rpc_ms:.0} ms",
        queue + measure
    );
    let runs: Vec<(f64, usize)> = (0..3)
        .map(|_| time_gpuctl(&bin, &socket, &["queue", "--json"]))
        .collect();
    let mut ms: Vec<f64> = runs.iter().map(|r| r.0).collect();
    ms.sort_by(f64::total_cmp);
    println!(
        "gpuctl queue --json with {} jobs: median {:.0} ms of 3 (min {:.0}, max {:.0}); {:.1} MB of JSON",
        queue + measure,
        ms[1],
        ms[0],
        ms[2],
        runs[0].1 as f64 / 1e6
    );
    let runs: Vec<f64> = (0..3)
        .map(|_| time_gpuctl(&bin, &socket, &["queue"]).0)
        .collect();
    let mut ms = runs;
    ms.sort_by(f64::total_cmp);
    println!(
        "gpuctl queue (table) at that size: median {:.0} ms of 3",
        ms[1]
    );
    let rss = std::fs::read_to_string(format!("/proc/{}/status", ctld.id()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .unwrap_or(0);
    println!("gpuctld resident memory: {:.0} MiB", rss as f64 / 1024.0);
    let _ = ctld.kill();
    let _ = ctld.wait();
}
