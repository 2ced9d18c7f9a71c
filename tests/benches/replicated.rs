//! Replicated controllers (issue 40) against one controller, on release binaries (not a
//! test). Prints:
//! - cost, one controller and three on Raft in the same run: durable submits/s from
//!   `--writers` concurrent gRPC clients over the leader's Unix socket for `--seconds`
//!   (jobs stay queued: the node is drained), and submit -> launch of `--samples` jobs one
//!   at a time on an idle node (the job's own `submit_time` and `launch_time`);
//! - failover: three controllers, four agents of eight fake GPUs, `--running` long jobs
//!   (quarter GPUs) and three `gpuctl` clients submitting and cancelling; the leader
//!   `kill -9`ed `--kills` times (restarted as a follower each time, and caught up
//!   before the next kill): from the kill to
//!   `gpuctl admin controllers` naming a new leader, and to a submit it acknowledged;
//!   then the checks of the end-to-end test (every acknowledged submit once, no job
//!   launched twice, the long jobs running on where they started). `--fault partition`
//!   cuts the leader off instead (each controller in a network namespace; its link taken
//!   down, and up again once another leads); `--secure 1` runs the members in the
//!   default mode (TLS between everyone, agents joined with tokens) instead of
//!   `--insecure-shared-key` (in the cost phase too: Raft's traffic over TLS).
//!
//! ```text
//! cargo bench -p gpuctl-tests --bench replicated [-- --phases cost,failover
//!     --modes one,three --seconds 5 --writers 64 --samples 40 --kills 20 --running 100
//!     --fault kill|partition --secure 0|1]
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpuctl_proto as pb;
use gpuctl_tests::replicated::{Clients, Replicated};
use gpuctl_tests::{bench_arg, bench_text_arg, release_bins, unix_ms, wait_for};

/// Room for the storm's queued jobs.
const ROOMY: &str = "[limits]\nmax_pending_per_user = 1000000\n";

fn main() {
    let bins = release_bins(&["gpuctl", "gpuctld", "gpud"]);
    let phases = bench_text_arg("--phases").unwrap_or_else(|| "cost,failover".into());
    if phases.contains("cost") {
        let seconds = bench_arg("--seconds", 5);
        let writers = bench_arg("--writers", 64) as usize;
        let samples = bench_arg("--samples", 40) as usize;
        let modes = bench_text_arg("--modes").unwrap_or_else(|| "one,three".into());
        if modes.contains("one") {
            let r = Replicated::single_with(bins.clone(), ROOMY);
            cost("one controller", r, seconds, writers, samples);
        }
        if modes.contains("three") {
            let secure = bench_arg("--secure", 0) == 1;
            let r = Replicated::start_custom(3, bins.clone(), ROOMY, false, secure)
                .expect("controllers");
            let name = if secure {
                "three on Raft (TLS)"
            } else {
                "three on Raft"
            };
            cost(name, r, seconds, writers, samples);
        }
    }
    if phases.contains("failover") {
        let partition = bench_text_arg("--fault").is_some_and(|f| f == "partition");
        let r = Replicated::start_custom(3, bins, ROOMY, partition, bench_arg("--secure", 0) == 1)
            .expect("controllers (network namespaces need root and iproute2)");
        failover(
            r,
            bench_arg("--kills", 20) as usize,
            bench_arg("--running", 100) as usize,
            partition,
        );
    }
}

fn spread(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!(
        "p50 {:.2}  p90 {:.2}  max {:.2}  (n={})",
        at(0.5),
        at(0.9),
        at(1.0),
        v.len()
    )
}

fn ok(r: &Replicated, args: &[&str]) -> String {
    let out = r.gpuctl(args);
    assert!(
        out.status.success(),
        "gpuctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn cost(name: &str, mut r: Replicated, seconds: u64, writers: usize, samples: usize) {
    r.add_agent("a", "8xA100-80GB");
    assert!(
        r.wait_nodes_idle(1, Duration::from_secs(30)),
        "the agent did not attach"
    );
    std::fs::write(
        r.dir.path().join("date.toml"),
        "name = \"date\"\nscript = \"true\"\n[resources]\ngpus = 1\n",
    )
    .unwrap();
    // Submit -> launch, one job at a time.
    let mut launch = Vec::new();
    for i in 0..samples + 3 {
        let out = ok(&r, &["submit", "date.toml", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let id = v["job_id"].as_u64().unwrap().to_string();
        let mut job = serde_json::Value::Null;
        let ended = wait_for(Duration::from_secs(30), || {
            job = r.json(&["show", &id]).unwrap_or_default();
            job["end_time"].is_string()
        });
        assert!(ended, "job {id}: {job}");
        if i >= 3 {
            launch.push((unix_ms(&job["launch_time"]) - unix_ms(&job["submit_time"])) as f64);
        }
    }
    // Durable submits/s: the node drained, so that the jobs stay queued.
    ok(&r, &["node", "drain", "a", "--reason", "bench"]);
    let leader = r.wait_leader(Duration::from_secs(10)).unwrap_or(0).max(1);
    let socket = r.socket(leader);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (done, took) = rt.block_on(submit_storm(socket, writers, Duration::from_secs(seconds)));
    println!("{name}:");
    println!(
        "  durable submits/s, {writers} concurrent clients over {seconds} s: {:.0} ({done} in {:.1} s)",
        done as f64 / took.as_secs_f64(),
        took.as_secs_f64()
    );
    println!(
        "  submit_time -> launch_time, one job at a time (ms): {}",
        spread(launch)
    );
}

async fn submit_storm(
    socket: std::path::PathBuf,
    writers: usize,
    run: Duration,
) -> (u64, Duration) {
    let channel = tonic::transport::Endpoint::from_static("http://local")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .expect("the leader's socket");
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|_| {
            let mut client = pb::controller_client::ControllerClient::new(channel.clone());
            let done = done.clone();
            tokio::spawn(async move {
                while started.elapsed() < run {
                    let spec = pb::JobSpec {
                        script: "true".into(),
                        workdir: "/tmp".into(),
                        resources: Some(pb::Resources {
                            cpus: 1,
                            gpu: Some(pb::resources::Gpu::Gpus(1)),
                            ..Default::default()
                        }),
                        ..Default::default()
                    };
                    let req = pb::SubmitRequest {
                        spec: Some(spec),
                        ..Default::default()
                    };
                    client.submit(req).await.expect("a durable submit");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (done.load(Ordering::Relaxed), started.elapsed())
}

fn failover(mut r: Replicated, kills: usize, running: usize, partition: bool) {
    for name in ["a", "b", "c", "d"] {
        r.add_agent(name, "8xA100-80GB");
    }
    assert!(
        r.wait_nodes_idle(4, Duration::from_secs(30)),
        "agents did not attach"
    );
    std::fs::write(
        r.dir.path().join("long.toml"),
        "name = \"long\"\nscript = \"sleep 3600\"\n[resources]\ngpus = 0.25\n",
    )
    .unwrap();
    std::fs::write(
        r.dir.path().join("short.toml"),
        "name = \"short\"\nscript = \"sleep 0.3\"\n[resources]\ngpus = 0.25\n",
    )
    .unwrap();
    let out = ok(
        &r,
        &[
            "submit",
            "long.toml",
            "--array",
            &format!("0-{}", running - 1),
        ],
    );
    assert!(!out.is_empty());
    let mut long = BTreeMap::new();
    let all = wait_for(Duration::from_secs(60), || {
        long = (r.jobs().unwrap_or_default().into_iter())
            .filter(|j| j.1 == "RUNNING")
            .map(|(id, _, attempt, node)| (id, (attempt, node)))
            .collect();
        long.len() == running
    });
    assert!(all, "{} of {running} long jobs running", long.len());
    let r = Arc::new(r);
    let clients = Clients::start(&r, "short.toml");
    let (mut served, mut elected) = (Vec::new(), Vec::new());
    for _ in 0..kills {
        // Each kill with all three members up and caught up (the one restarted last
        // time replays its log first): a quorum of two then survives the kill.
        let synced = wait_for(Duration::from_secs(60), || {
            r.members().is_some_and(|ms| {
                let leader_at = ms
                    .iter()
                    .find(|m| m["leader"] == true)
                    .and_then(|m| m["commit_index"].as_u64());
                leader_at.is_some_and(|l| {
                    ms.iter()
                        .all(|m| m["commit_index"].as_u64().is_some_and(|c| c + 50 >= l))
                })
            })
        });
        assert!(synced, "members did not catch up: {:?}", r.members());
        std::thread::sleep(Duration::from_secs(1));
        let leader = r.wait_leader(Duration::from_secs(20)).expect("a leader");
        let killed = Instant::now();
        if partition {
            r.partition(leader);
        } else {
            r.kill9(leader);
        }
        // A new leader named (a cheap question to each controller)...
        let new = wait_for(Duration::from_secs(30), || {
            r.wait_leader(Duration::from_millis(1))
                .is_some_and(|l| l != leader)
        });
        assert!(new, "no new leader within 30 s of a kill");
        elected.push(killed.elapsed().as_secs_f64() * 1000.0);
        // ... and a write acknowledged by it.
        let wrote = wait_for(Duration::from_secs(30), || {
            r.gpuctl(&["submit", "short.toml"]).status.success()
        });
        assert!(wrote, "no submit acknowledged within 30 s of a kill");
        served.push(killed.elapsed().as_secs_f64() * 1000.0);
        if partition {
            r.heal(leader);
        } else {
            r.start_member(leader);
        }
    }
    let acked = clients.finish();
    let jobs = r.jobs().expect("a listing");
    let seen: BTreeMap<u64, (String, u64, String)> = (jobs.into_iter())
        .map(|(id, s, a, n)| (id, (s, a, n)))
        .collect();
    let lost = acked.iter().filter(|id| !seen.contains_key(id)).count();
    let twice = r.launches().values().filter(|n| **n > 1).count();
    let requeued = seen.values().filter(|(_, a, _)| *a > 1).count();
    let disturbed = (long.iter())
        .filter(|(id, (a, n))| {
            seen.get(id)
                .is_none_or(|(s, sa, sn)| s != "RUNNING" || sa != a || sn != n)
        })
        .count();
    let fault = if partition {
        "the leader cut off by a partition"
    } else {
        "kill -9 of the leader"
    };
    println!(
        "failover: 3 controllers, 4 agents, {running} long jobs running, 3 clients; {kills} x {fault}:"
    );
    println!(
        "  fault -> admin controllers names a new leader (ms): {}",
        spread(elected)
    );
    println!(
        "  fault -> a submit acknowledged by it (ms): {}",
        spread(served)
    );
    println!(
        "  acknowledged submits: {}; lost: {lost}; jobs launched more than once: {twice}; long jobs killed or moved: {disturbed}; jobs with a second attempt (a start that never reached its agent, requeued): {requeued}",
        acked.len()
    );
    assert_eq!((lost, twice, disturbed), (0, 0, 0));
}
