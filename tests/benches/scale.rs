//! Scale harness (not a test): one release-built `gpuctld` with thousands of simulated
//! agents in this process, each speaking the real agent protocol over gRPC on loopback
//! (challenge, signed attach with its GPUs, the command stream, numbered and signed
//! heartbeats with eight GPUs' metrics at the real interval, STARTED and ENDED reports
//! for the jobs it is given, reconnecting when the controller goes away). Jobs "run" for
//! a few minutes of wall time. It reports, from the controller's side:
//!
//! - heartbeat handling: the controller's CPU time (from /proc) while only heartbeats
//!   arrive, as a share of one core, and heartbeat RPC latency at the agents;
//! - with the queue at `--pending` jobs and a steady submit/finish stream: CPU, the
//!   scheduling pass time (its histogram on the metrics endpoint), the latency of a
//!   user's queue (`ListJobs` by job name and by user) while passes run, and memory (RSS);
//! - recovery after `kill -9`: until the controller answers again with every job, and
//!   until every agent is attached again.
//!
//! ```text
//! cargo bench -p gpuctl-tests --bench scale [-- --nodes 10000 --pending 100000
//!     --heartbeat 10 --window 60 --job-secs 300 --per-channel 50 --unary-heartbeats 0
//!     --heartbeats-only 0 --tls 0]
//! ```
//!
//! `--tls 1` runs the controller as it runs by default (TLS, nodes joined with tokens):
//! every simulated node joins first and then dials with its own certificate, one
//! connection per node (`--per-channel` is then 1). `--tls 0` is the old mode
//! (`--insecure-shared-key`, nodes sign with the cluster key); with `--per-channel 1`
//! it isolates what TLS costs from what one connection per node costs.
//!
//! Heartbeats go on each session's Heartbeats stream, as gpud sends them;
//! `--unary-heartbeats 1` sends each as its own request (the path before the stream).
//!
//! Agents and controller share this machine's cores: on a small host the agents' own
//! work (signing, decoding) competes with the controller's, so the figures are upper
//! bounds of the controller's cost.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuctl_proto::agent_link_client::AgentLinkClient;
use gpuctl_proto::auth::{ClusterKey, Signed};
use gpuctl_proto::controller_client::ControllerClient;
use gpuctl_proto::{self as pb, JobState};
use gpuctl_tests::{bench_arg, free_port, release_bins};
#[path = "support/daemons.rs"]
mod daemons;
#[path = "support/join.rs"]
mod join;
use daemons::{Daemon, start_gpuctld, start_gpuctld_on, start_replicas};
use prost::Message;
use tonic::transport::Channel;

#[derive(Clone, Copy)]
struct Opts {
    nodes: usize,
    gpus: usize,
    pending: usize,
    heartbeat: Duration,
    window: Duration,
    job_secs: f64,
    /// Agents per HTTP/2 connection (each holds a command and a heartbeat stream open).
    per_channel: usize,
    unary: bool,
    /// The default mode (TLS, joined nodes) instead of `--insecure-shared-key`.
    tls: bool,
}

/// What the agents saw.
#[derive(Default)]
struct Stats {
    heartbeat_ms: Mutex<Vec<f64>>,
    heartbeat_errors: AtomicU64,
    starts: AtomicU64,
    ends: AtomicU64,
    attached: AtomicU64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A number in [0, 1) from `i`, the same every run (the jitter of timers and durations).
fn unit(i: u64) -> f64 {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) as f64 / (1u64 << 53) as f64
}

struct SimAgent {
    node: String,
    index: usize,
    gpus: usize,
    key: ClusterKey,
    client: AgentLinkClient<Channel>,
    session: Vec<u8>,
    seq: u64,
    handled: u64,
    /// Running instances and when each ends.
    running: HashMap<(u64, u32), tokio::time::Instant>,
    job_secs: f64,
    heartbeat: Duration,
    /// Heartbeats one request each (the old path) instead of on a stream, as gpud
    /// does with a controller that has no Heartbeats stream.
    unary: bool,
    /// This session's heartbeat stream (opened at its first heartbeat).
    hb_link: Option<(
        tokio::sync::mpsc::Sender<pb::SignedHeartbeat>,
        tonic::Streaming<pb::HeartbeatResponse>,
    )>,
}

impl SimAgent {
    fn req<T: Message>(&mut self, method: &str, msg: T, numbered: bool) -> tonic::Request<T> {
        let signed = if numbered {
            self.next_signed()
        } else {
            Signed {
                session: Vec::new(),
                seq: 0,
            }
        };
        self.key
            .signed_request(method, &self.node, now_ms(), &signed, msg)
            .unwrap()
    }

    /// The session's next number.
    fn next_signed(&mut self) -> Signed {
        self.seq += 1;
        Signed {
            session: self.session.clone(),
            seq: self.seq,
        }
    }

    fn gpu_uuid(&self, g: usize) -> String {
        format!("GPU-{}-{g}", self.node)
    }

    fn running_list(&self) -> Vec<pb::RunningJob> {
        self.running
            .keys()
            .map(|&(job_id, attempt)| pb::RunningJob {
                job_id,
                attempt,
                ..Default::default()
            })
            .collect()
    }

    async fn attach(&mut self) -> Result<tonic::Streaming<pb::SignedCommand>, tonic::Status> {
        let ch = pb::ChallengeRequest {
            node: self.node.clone(),
        };
        let req = self.req("challenge", ch, false);
        let nonce = self.client.challenge(req).await?.into_inner().nonce;
        let register = pb::RegisterRequest {
            node: self.node.clone(),
            gpus: (0..self.gpus)
                .map(|g| pb::Gpu {
                    uuid: self.gpu_uuid(g),
                    model: "H100-80GB".into(),
                    memory_mib: 81920,
                    index: g as u32,
                    ..Default::default()
                })
                .collect(),
            cpus: 128,
            memory_bytes: 2 << 40,
            gpu_backend: "fake".into(),
            running: self.running_list(),
            nonce: nonce.clone(),
            agent_id: format!("sim-{}", self.index),
            address: "127.0.0.1".into(),
            allow_root_jobs: true,
            ..Default::default()
        };
        let req = self.req("attach", register, false);
        let stream = self.client.attach(req).await?.into_inner();
        self.session = nonce;
        self.seq = 0;
        self.handled = 0;
        self.hb_link = None;
        Ok(stream)
    }

    async fn report(&mut self, job_id: u64, attempt: u32, end: Option<JobState>) {
        let r = pb::JobReport {
            node: self.node.clone(),
            job_id,
            kind: if end.is_some() {
                pb::job_report::Kind::Ended
            } else {
                pb::job_report::Kind::Started
            } as i32,
            state: end.map_or(0, |s| s as i32),
            exit_code: end.map(|_| 0),
            time_ms: now_ms(),
            attempt,
            ..Default::default()
        };
        let req = self.req("report", r, true);
        // A lost report is the controller's restart: its heartbeats carry the truth.
        let _ = self.client.report_job(req).await;
    }

    async fn heartbeat(&mut self, stats: &Stats) -> bool {
        let busy = !self.running.is_empty();
        let t = now_ms();
        let hb = pb::HeartbeatRequest {
            node: self.node.clone(),
            commands_handled: self.handled,
            running: self.running_list(),
            metrics: (0..self.gpus)
                .map(|g| pb::GpuMetrics {
                    uuid: self.gpu_uuid(g),
                    util_pct: if busy { 80 } else { 0 },
                    mem_used_mib: if busy { 40_000 } else { 0 },
                    temp_c: 55,
                    power_w: if busy { 500.0 } else { 90.0 },
                    power_limit_w: 700.0,
                    ecc_uncorrected: Some(0),
                    time_ms: t,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let sent = Instant::now();
        let answer = if self.unary {
            let req = self.req("heartbeat", hb, true);
            self.client.heartbeat(req).await.map(|r| r.into_inner())
        } else {
            self.streamed(hb).await
        };
        match answer {
            Ok(r) => {
                let ms = sent.elapsed().as_secs_f64() * 1000.0;
                stats.heartbeat_ms.lock().unwrap().push(ms);
                r.known
            }
            Err(_) => {
                stats.heartbeat_errors.fetch_add(1, Ordering::Relaxed);
                self.hb_link = None;
                false
            }
        }
    }

    /// One heartbeat on the session's Heartbeats stream, as gpud sends it.
    async fn streamed(
        &mut self,
        hb: pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse, tonic::Status> {
        if self.hb_link.is_none() {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            let answers = self
                .client
                .heartbeats(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await?
                .into_inner();
            self.hb_link = Some((tx, answers));
        }
        let signed = self.next_signed();
        let m = self.key.sign_heartbeat(&self.node, now_ms(), &signed, &hb);
        let (tx, answers) = self.hb_link.as_mut().expect("opened above");
        tx.send(m)
            .await
            .map_err(|_| tonic::Status::unavailable("stream closed"))?;
        answers
            .message()
            .await?
            .ok_or_else(|| tonic::Status::unavailable("stream ended"))
    }

    async fn command(&mut self, signed: &pb::SignedCommand, stats: &Stats) {
        let Ok(cmd) = self.key.verify_command(&self.node, signed) else {
            return;
        };
        self.handled = cmd.seq;
        match cmd.command {
            Some(pb::agent_command::Command::Start(s)) => {
                let jitter = 0.5 + unit(s.job_id ^ u64::from(s.rank));
                let ends =
                    tokio::time::Instant::now() + Duration::from_secs_f64(self.job_secs * jitter);
                self.running.insert((s.job_id, s.attempt), ends);
                stats.starts.fetch_add(1, Ordering::Relaxed);
                self.report(s.job_id, s.attempt, None).await;
            }
            Some(pb::agent_command::Command::Kill(k))
                if self.running.remove(&(k.job_id, k.attempt)).is_some() =>
            {
                let state = match k.as_state() {
                    JobState::Unspecified => JobState::Cancelled,
                    s => s,
                };
                self.report(k.job_id, k.attempt, Some(state)).await;
            }
            // The bench's simulated agents open no steps.
            Some(
                pb::agent_command::Command::Kill(_)
                | pb::agent_command::Command::Kills(_)
                | pb::agent_command::Command::Step(_)
                | pb::agent_command::Command::Limit(_)
                | pb::agent_command::Command::Mig(_),
            ) => {}
            None => {}
        }
    }

    /// Attached: commands, heartbeats and job ends until the stream ends.
    async fn session(&mut self, mut stream: tonic::Streaming<pb::SignedCommand>, stats: &Stats) {
        let first = self.heartbeat.mul_f64(unit(self.index as u64));
        let mut hb = tokio::time::interval_at(tokio::time::Instant::now() + first, self.heartbeat);
        loop {
            let next_end = self.running.values().min().copied();
            let end = async {
                match next_end {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                msg = stream.message() => match msg {
                    Ok(Some(signed)) => self.command(&signed, stats).await,
                    _ => return,
                },
                _ = hb.tick() => {
                    if !self.heartbeat(stats).await {
                        return;
                    }
                }
                () = end => {
                    let now = tokio::time::Instant::now();
                    let done: Vec<(u64, u32)> = self
                        .running
                        .iter()
                        .filter(|(_, t)| **t <= now)
                        .map(|(k, _)| *k)
                        .collect();
                    for (id, attempt) in done {
                        self.running.remove(&(id, attempt));
                        stats.ends.fetch_add(1, Ordering::Relaxed);
                        self.report(id, attempt, Some(JobState::Completed)).await;
                    }
                }
            }
        }
    }

    async fn run(mut self, stats: Arc<Stats>) {
        // As gpud: after a refused attach, wait with jittered exponential backoff
        // (0.1 s doubling to 5 s, times 0.5 to 1.5), so that 10,000 agents do not
        // retry in lockstep.
        let mut failures = 0u32;
        loop {
            match self.attach().await {
                Ok(stream) => {
                    failures = 0;
                    stats.attached.fetch_add(1, Ordering::Relaxed);
                    self.session(stream, &stats).await;
                    stats.attached.fetch_sub(1, Ordering::Relaxed);
                }
                Err(_) => {
                    failures += 1;
                    let base = (0.1 * 2f64.powi(failures.min(6) as i32 - 1)).min(5.0);
                    let jitter = 0.5 + unit(self.index as u64 * 31 + u64::from(failures));
                    tokio::time::sleep(Duration::from_secs_f64(base * jitter)).await;
                }
            }
        }
    }
}

/// The controller's CPU seconds so far (user + system) and resident memory (MiB now,
/// MiB at most).
fn proc_usage(pid: u32) -> (f64, f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |x| x.1)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // After the command: state is field 3, so utime (14) and stime (15) are at 11, 12.
    let cpu = (ticks(11) + ticks(12)) / 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (cpu, kib("VmRSS:"), kib("VmHWM:"))
}

async fn user_client(socket: &Path) -> ControllerClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("unix:{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .expect("connect to gpuctld");
    ControllerClient::new(channel)
        .max_decoding_message_size(1 << 30)
        .max_encoding_message_size(64 << 20)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn spec(i: usize, name: &str) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        // The probe's jobs are a user's own (submitted for them: the harness is root).
        user: if name == "probe" {
            "probe".into()
        } else {
            String::new()
        },
        command: vec!["python".into(), "train.py".into(), format!("--seed={i}")],
        workdir: "/tmp".into(),
        resources: Some(pb::Resources {
            gpu: Some(pb::resources::Gpu::Gpus([1, 2, 4, 8][i % 4])),
            cpus: 8,
            time_limit_secs: 3600,
            ..pb::Resources::default()
        }),
        ..pb::JobSpec::default()
    }
}

/// Submits `n` jobs from 16 concurrent clients; answers submits per second.
async fn submit(socket: &Path, n: usize, from: usize, name: &str) -> f64 {
    let next = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (next, socket, name) = (next.clone(), socket.to_path_buf(), name.to_string());
        tasks.push(tokio::spawn(async move {
            let mut c = user_client(&socket).await;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= n {
                    break;
                }
                let req = pb::SubmitRequest {
                    spec: Some(spec(from + i, &name)),
                    request_id: format!("scale-{name}-{}", from + i),
                    hold: false,
                };
                c.submit(req).await.expect("submit acknowledged");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    n as f64 / t.elapsed().as_secs_f64()
}

/// The pass histogram's (count, sum, bucket counts by upper bound).
fn pass_histogram(metrics_port: u16) -> (f64, f64, Vec<(f64, f64)>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", metrics_port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    let (mut count, mut sum, mut buckets) = (0.0, 0.0, Vec::new());
    for l in body.lines() {
        let value = |l: &str| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if l.starts_with("gpuctl_schedule_pass_seconds_count") {
            count = value(l).unwrap_or(0.0);
        } else if l.starts_with("gpuctl_schedule_pass_seconds_sum") {
            sum = value(l).unwrap_or(0.0);
        } else if let Some(rest) = l.strip_prefix("gpuctl_schedule_pass_seconds_bucket{le=\"") {
            let le = rest.split('"').next().unwrap_or("+Inf");
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            buckets.push((le, value(l).unwrap_or(0.0)));
        }
    }
    (count, sum, buckets)
}

/// The smallest bucket bound holding `p` of the passes between two scrapes.
fn bucket_quantile(before: &[(f64, f64)], after: &[(f64, f64)], p: f64) -> f64 {
    let total = after.last().map_or(0.0, |b| b.1) - before.last().map_or(0.0, |b| b.1);
    for (a, b) in after.iter().zip(before) {
        if a.1 - b.1 >= p * total {
            return a.0;
        }
    }
    f64::INFINITY
}

/// Each node's key and client: the cluster key and `per_channel` nodes to a connection,
/// or (TLS) each node joined, with its own key and connection.
fn credentials(
    rt: &tokio::runtime::Runtime,
    o: Opts,
    d: &Daemon,
    dir: &Path,
) -> Vec<(ClusterKey, AgentLinkClient<Channel>)> {
    if !o.tls {
        // Channels spawn their connection tasks on the runtime.
        let _in_runtime = rt.enter();
        let key = ClusterKey::load(&dir.join("state/cluster.key")).unwrap();
        let mut client = None;
        return (0..o.nodes)
            .map(|i| {
                if i % o.per_channel == 0 {
                    let url = format!("http://127.0.0.1:{}", d.port);
                    let ch = tonic::transport::Endpoint::from_shared(url)
                        .unwrap()
                        .connect_lazy();
                    client = Some(AgentLinkClient::new(ch));
                }
                (key.clone(), client.clone().unwrap())
            })
            .collect();
    }
    let ca = std::fs::read_to_string(dir.join("state/ca.pem")).unwrap();
    let url = format!("https://127.0.0.1:{}", d.port);
    let t = Instant::now();
    // Joins from 8 tasks at once (each join waits for its token's and identity's writes).
    let joined = rt.block_on(async {
        let next = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (next, ca, url, socket) = (next.clone(), ca.clone(), url.clone(), d.socket.clone());
            tasks.push(tokio::spawn(async move {
                let mut admin = user_client(&socket).await;
                let mut mine = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= o.nodes {
                        return mine;
                    }
                    let j = join::join(&mut admin, &ca, &url, &format!("sim{i:05}")).await;
                    mine.push((i, j.key, AgentLinkClient::new(j.channel)));
                }
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all.sort_by_key(|x| x.0);
        all
    });
    println!(
        "{} nodes joined (token, certificate, node key) in {:.1} s",
        o.nodes,
        t.elapsed().as_secs_f64()
    );
    joined.into_iter().map(|(_, k, c)| (k, c)).collect()
}

/// Starts every agent; waits until all are attached.
fn start_agents(
    rt: &tokio::runtime::Runtime,
    o: Opts,
    creds: Vec<(ClusterKey, AgentLinkClient<Channel>)>,
) -> Arc<Stats> {
    let stats = Arc::new(Stats::default());
    rt.block_on(async {
        for (i, (key, client)) in creds.into_iter().enumerate() {
            let agent = SimAgent {
                node: format!("sim{i:05}"),
                index: i,
                gpus: o.gpus,
                key,
                client,
                session: Vec::new(),
                seq: 0,
                handled: 0,
                running: HashMap::new(),
                job_secs: o.job_secs,
                heartbeat: o.heartbeat,
                unary: o.unary,
                hb_link: None,
            };
            tokio::spawn(agent.run(stats.clone()));
        }
    });
    let t = Instant::now();
    while (stats.attached.load(Ordering::Relaxed) as usize) < o.nodes {
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "agents did not attach"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "{} agents x {} GPUs attached in {:.1} s",
        o.nodes,
        o.gpus,
        t.elapsed().as_secs_f64()
    );
    stats
}

/// The controllers' CPU over `window` while only heartbeats arrive (`pids`: each
/// controller's, named).
fn heartbeat_phase(o: Opts, pids: &[(String, u32)], stats: &Stats) {
    // Let the attach burst settle, then measure.
    std::thread::sleep(o.heartbeat * 2);
    stats.heartbeat_ms.lock().unwrap().clear();
    let before: Vec<f64> = pids.iter().map(|(_, p)| proc_usage(*p).0).collect();
    let t = Instant::now();
    std::thread::sleep(o.window);
    let after: Vec<(f64, f64)> = (pids.iter())
        .map(|(_, p)| {
            let (cpu, rss, _) = proc_usage(*p);
            (cpu, rss)
        })
        .collect();
    let secs = t.elapsed().as_secs_f64();
    let mut lat = std::mem::take(&mut *stats.heartbeat_ms.lock().unwrap());
    let n = lat.len();
    let cpu: Vec<String> = (pids.iter().zip(before.iter().zip(&after)))
        .map(|((name, _), (c0, (c1, rss)))| {
            format!(
                "{name} {:.1}% of one core (RSS {rss:.0} MiB)",
                100.0 * (c1 - c0) / secs
            )
        })
        .collect();
    println!(
        "heartbeats only: {n} in {secs:.0} s ({:.0}/s); controller CPU: {}; \
         heartbeat RPC p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; errors {}",
        n as f64 / secs,
        cpu.join(", "),
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        pct(&mut lat, 1.0),
        stats.heartbeat_errors.load(Ordering::Relaxed),
    );
}

/// The queue filled to `pending`, then a window with a steady submit stream.
fn load_phase(rt: &tokio::runtime::Runtime, o: Opts, d: &Daemon, pid: u32, stats: &Stats) {
    let capacity = o.nodes * o.gpus * 4 / 15; // jobs of 1, 2, 4, 8 GPUs: 3.75 on average
    let fill = o.pending + capacity;
    let rate = rt.block_on(submit(&d.socket, fill, 0, "fill"));
    println!("submitted {fill} jobs at {rate:.0}/s (16 clients, each durable)");
    rt.block_on(submit(&d.socket, 10, 0, "probe"));
    // The first passes place the cluster full.
    let t = Instant::now();
    while (stats.starts.load(Ordering::Relaxed) as usize) < capacity * 9 / 10
        && t.elapsed() < Duration::from_secs(300)
    {
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "{} jobs started in {:.1} s after the fill",
        stats.starts.load(Ordering::Relaxed),
        t.elapsed().as_secs_f64()
    );
    let (n0, s0, b0) = pass_histogram(d.metrics);
    let (c0, _, _) = proc_usage(pid);
    let (starts0, ends0) = (
        stats.starts.load(Ordering::Relaxed),
        stats.ends.load(Ordering::Relaxed),
    );
    stats.heartbeat_ms.lock().unwrap().clear();
    let t = Instant::now();
    let (queue_ms, submitted) = rt.block_on(async {
        let socket = d.socket.clone();
        // A steady stream: as many submits as jobs end (one a job_secs/capacity).
        let per_sec = (capacity as f64 / o.job_secs).max(1.0);
        let submitter = tokio::spawn(async move {
            let mut c = user_client(&socket).await;
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_sec));
            let mut i = 0;
            let stop = tokio::time::Instant::now() + o.window;
            while tokio::time::Instant::now() < stop {
                tick.tick().await;
                let req = pb::SubmitRequest {
                    spec: Some(spec(i, "stream")),
                    request_id: format!("scale-stream-{i}"),
                    hold: false,
                };
                c.submit(req).await.expect("submit acknowledged");
                i += 1;
            }
            i
        });
        let mut c = user_client(&d.socket).await;
        // A user's queue two ways, in turn: by job name (`queue --name`: every active
        // job is looked at) and by user (`queue -u`/`--me`: the user's own jobs).
        let (mut by_name, mut by_user) = (Vec::new(), Vec::new());
        let stop = tokio::time::Instant::now() + o.window;
        while tokio::time::Instant::now() < stop {
            let named = by_name.len() <= by_user.len();
            let req = if named {
                pb::ListJobsRequest {
                    names: vec!["probe".into()],
                    ..Default::default()
                }
            } else {
                pb::ListJobsRequest {
                    users: vec!["probe".into()],
                    ..Default::default()
                }
            };
            let q = Instant::now();
            let jobs = c
                .list_jobs(req)
                .await
                .expect("queue answered")
                .into_inner()
                .jobs;
            let ms = q.elapsed().as_secs_f64() * 1000.0;
            // The probe's 10 jobs, less those that ran and ended (short jobs: the
            // probe, new to fair share, goes first).
            assert!(jobs.len() <= 10, "{} jobs", jobs.len());
            assert!(
                jobs.iter().all(|j| j
                    .spec
                    .as_ref()
                    .is_some_and(|s| s.name == "probe" && s.user == "probe")),
                "another user's job in the probe's queue"
            );
            if named {
                by_name.push(ms)
            } else {
                by_user.push(ms)
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let lat = (by_name, by_user);
        (lat, submitter.await.unwrap())
    });
    let secs = t.elapsed().as_secs_f64();
    let (c1, rss, hwm) = proc_usage(pid);
    let (n1, s1, b1) = pass_histogram(d.metrics);
    let (mut by_name, mut by_user) = queue_ms;
    let mut hb = std::mem::take(&mut *stats.heartbeat_ms.lock().unwrap());
    println!(
        "with the queue ({} pending at the start) over {secs:.0} s: {submitted} submitted, {} started, {} ended; \
         controller CPU {:.0}% of one core; {} passes, mean {:.0} ms, p50 <= {:.3} s, p99 <= {:.3} s; \
         a user's queue by name p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} calls), \
         by user p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} calls); \
         heartbeat RPC p99 {:.1} ms; RSS {rss:.0} MiB (peak {hwm:.0} MiB)",
        o.pending,
        stats.starts.load(Ordering::Relaxed) - starts0,
        stats.ends.load(Ordering::Relaxed) - ends0,
        100.0 * (c1 - c0) / secs,
        n1 - n0,
        1000.0 * (s1 - s0) / (n1 - n0).max(1.0),
        bucket_quantile(&b0, &b1, 0.5),
        bucket_quantile(&b0, &b1, 0.99),
        pct(&mut by_name, 0.5),
        pct(&mut by_name, 0.99),
        pct(&mut by_name, 1.0),
        by_name.len(),
        pct(&mut by_user, 0.5),
        pct(&mut by_user, 0.99),
        pct(&mut by_user, 1.0),
        by_user.len(),
        pct(&mut hb, 0.99),
    );
}

/// How many jobs the controller lists (pending and running), once it answers.
async fn active_jobs(socket: &Path) -> Vec<u64> {
    let mut c = user_client(socket).await;
    c.list_jobs(pb::ListJobsRequest::default())
        .await
        .expect("the queue answered")
        .into_inner()
        .jobs
        .iter()
        .map(|j| j.id)
        .collect()
}

/// Of `before` (active jobs' ids), those no longer active in `after`: each must be
/// known and final (it ended meanwhile), never missing. Answers how many ended.
async fn ended_not_lost(socket: &Path, before: &[u64], after: &[u64]) -> usize {
    let after: std::collections::HashSet<u64> = after.iter().copied().collect();
    let mut c = user_client(socket).await;
    let mut ended = 0;
    for &id in before.iter().filter(|id| !after.contains(id)) {
        let j = c
            .get_job(pb::GetJobRequest { job_id: id })
            .await
            .unwrap_or_else(|s| panic!("job {id} was active before the kill and is lost: {s}"))
            .into_inner();
        assert!(j.state().is_final(), "job {id} is neither active nor final");
        ended += 1;
    }
    ended
}

/// `kill -9`, start again: until it answers with every job, and until every agent is
/// attached again.
fn recovery_phase(
    rt: &tokio::runtime::Runtime,
    o: Opts,
    bin: &Path,
    dir: &Path,
    d: Daemon,
    stats: &Stats,
) -> Daemon {
    let before = rt.block_on(active_jobs(&d.socket));
    let mut child = d.child;
    child.kill().unwrap();
    child.wait().unwrap();
    let t = Instant::now();
    let nd = start_gpuctld_on(bin, dir, d.metrics, d.port, d.tls);
    let after = rt.block_on(active_jobs(&nd.socket));
    let up = t.elapsed().as_secs_f64();
    // Jobs keep ending (agents report them as they reattach): each job active before
    // the kill is active still or ended, none lost.
    let ended = rt.block_on(ended_not_lost(&nd.socket, &before, &after));
    while (stats.attached.load(Ordering::Relaxed) as usize) < o.nodes
        && t.elapsed() < Duration::from_secs(600)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "recovery after kill -9: answering with every job after {up:.2} s ({} active before \
         the kill: {} active, {ended} ended since, none lost); all {} agents attached again \
         after {:.1} s",
        before.len(),
        before.len() - ended,
        o.nodes,
        t.elapsed().as_secs_f64()
    );
    nd
}

fn main() {
    let o = Opts {
        nodes: bench_arg("--nodes", 10_000) as usize,
        gpus: bench_arg("--gpus", 8) as usize,
        pending: bench_arg("--pending", 100_000) as usize,
        heartbeat: Duration::from_secs(bench_arg("--heartbeat", 10)),
        window: Duration::from_secs(bench_arg("--window", 60)),
        job_secs: bench_arg("--job-secs", 300) as f64,
        // An agent holds two streams open (commands, heartbeats): 50 agents keep a
        // connection under HTTP/2's usual limit of 200 concurrent streams.
        per_channel: bench_arg("--per-channel", 50) as usize,
        unary: bench_arg("--unary-heartbeats", 0) == 1,
        tls: bench_arg("--tls", 0) == 1,
    };
    let o = Opts {
        per_channel: if o.tls { 1 } else { o.per_channel.max(1) },
        ..o
    };
    let bin = release_bins(&["gpuctld"]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("gpuctld.toml"),
        format!(
            "node_timeout = \"{}s\"\n[limits]\nmax_pending_per_user = 10000000\nmax_message_bytes = \"64MiB\"\nmax_connections = 100000\nmax_connections_per_address = 100000\n",
            o.heartbeat.as_secs() * 6
        ),
    )
    .unwrap();
    let replicas = bench_arg("--replicas", 1);
    let (mut members, leader) = if replicas > 1 {
        assert!(
            !o.tls && bench_arg("--heartbeats-only", 0) == 1,
            "--replicas runs with --tls 0 --heartbeats-only 1"
        );
        start_replicas(&bin, dir.path(), replicas)
    } else {
        (vec![start_gpuctld(&bin, dir.path(), free_port(), o.tls)], 0)
    };
    let d = &members[leader];
    println!(
        "gpuctld (release) pid {}{}, {}, {} simulated agents x {} GPUs ({} to a connection), heartbeats every {:?}, jobs of about {} s",
        d.child.id(),
        if replicas > 1 {
            format!(" (leader of {replicas} on Raft)")
        } else {
            String::new()
        },
        if o.tls {
            "TLS, nodes joined (the default)"
        } else {
            "--insecure-shared-key (plain TCP)"
        },
        o.nodes,
        o.gpus,
        o.per_channel,
        o.heartbeat,
        o.job_secs
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_, rss_before, _) = proc_usage(d.child.id());
    let creds = credentials(&rt, o, d, dir.path());
    let stats = start_agents(&rt, o, creds);
    let (_, rss_after, _) = proc_usage(d.child.id());
    println!(
        "controller RSS {rss_before:.0} MiB before the agents joined and attached, {rss_after:.0} MiB after: {:.1} KiB per agent",
        (rss_after - rss_before) * 1024.0 / o.nodes as f64
    );
    let pids: Vec<(String, u32)> = (members.iter().enumerate())
        .map(|(i, m)| {
            let name = match (replicas, i == leader) {
                (1, _) => "controller".to_string(),
                (_, true) => format!("leader ({})", i + 1),
                (_, false) => format!("follower ({})", i + 1),
            };
            (name, m.child.id())
        })
        .collect();
    heartbeat_phase(o, &pids, &stats);
    if bench_arg("--heartbeats-only", 0) == 1 {
        for m in &mut members {
            let _ = m.child.kill();
            let _ = m.child.wait();
        }
        return;
    }
    let d = members.remove(0);
    load_phase(&rt, o, &d, d.child.id(), &stats);
    let mut d = recovery_phase(&rt, o, &bin, dir.path(), d, &stats);
    let _ = d.child.kill();
    let _ = d.child.wait();
}
