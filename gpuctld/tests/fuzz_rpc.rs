//! Bounded fuzzing of the RPC handlers: request bytes from `fuzz/corpus/rpc` and
//! mutations of them are decoded as each request type and, when they decode, handed to
//! the real handlers of a controller on a temp sled store (users by API token, agents
//! signed with the cluster key, so the checks are passed and the handler bodies run),
//! followed by a scheduling pass over whatever nodes and jobs that made. Nothing may
//! panic; every refusal is a gRPC status. PROPTEST_CASES runs it longer.
//!
//! `GPUCTL_WRITE_CORPUS=1 cargo test -p gpuctld --test fuzz_rpc write_corpus` rewrites
//! the seed files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpuctl_proto::agent_link_server::AgentLink as _;
use gpuctl_proto::auth::{
    ClusterKey, MAC_HEADER, NODE_HEADER, SEQ_HEADER, SESSION_HEADER, Signed, TIME_HEADER,
};
use gpuctl_proto::controller_server::Controller as _;
use gpuctl_proto::{self as pb};
use gpuctld::auth::Caller;
use gpuctld::config::Config;
use gpuctld::controller::{Controller, now_ms};
use gpuctld::server::{AgentApi, UserApi};
use gpuctld::store::Store;
use proptest::prelude::*;
use prost::Message;

const KINDS: &[&str] = &[
    "submit",
    "cancel",
    "getjob",
    "listjobs",
    "drain",
    "resume",
    "token",
    "revoke",
    "attach",
    "heartbeat",
    "report",
];

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/rpc")
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(corpus_dir())
        .expect("fuzz/corpus/rpc")
        .map(|e| e.unwrap().path())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

fn spec(gpus: u32) -> pb::JobSpec {
    pb::JobSpec {
        name: "seed".into(),
        command: vec!["true".into()],
        workdir: "/tmp".into(),
        user: "root".into(),
        resources: Some(pb::Resources {
            gpu: (gpus > 0).then_some(pb::resources::Gpu::Gpus(gpus)),
            cpus: 1,
            ..pb::Resources::default()
        }),
        ..pb::JobSpec::default()
    }
}

fn gpu(i: u32, mig: bool) -> pb::Gpu {
    pb::Gpu {
        uuid: format!("GPU-{i}"),
        model: "A100-80GB".into(),
        memory_mib: 81920,
        index: i,
        mig: if mig {
            vec![pb::MigInstance {
                uuid: format!("MIG-{i}"),
                profile: "3g.40gb".into(),
                memory_mib: 40960,
                allocated_to: 0,
            }]
        } else {
            Vec::new()
        },
        ..pb::Gpu::default()
    }
}

#[test]
fn write_corpus() {
    if std::env::var_os("GPUCTL_WRITE_CORPUS").is_none() {
        return;
    }
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let w = |name: &str, b: Vec<u8>| std::fs::write(dir.join(name), b).unwrap();
    w(
        "submit-1.bin",
        pb::SubmitRequest {
            spec: Some(spec(1)),
            request_id: "req-1".into(),
            hold: false,
        }
        .encode_to_vec(),
    );
    let mut share = spec(0);
    share.resources.as_mut().unwrap().gpu = Some(pb::resources::Gpu::Share(pb::GpuShare {
        compute_milli: 250,
        memory_mib: Some(10240),
    }));
    share.env.insert("A".into(), "b".into());
    share.stdout = "out/%j.log".into();
    w(
        "submit-2.bin",
        pb::SubmitRequest {
            spec: Some(share),
            request_id: String::new(),
            hold: false,
        }
        .encode_to_vec(),
    );
    let mut mig = spec(0);
    mig.resources.as_mut().unwrap().gpu = Some(pb::resources::Gpu::Mig(pb::MigInstances {
        profile: "3g.40gb".into(),
        count: 1,
    }));
    w(
        "submit-3.bin",
        pb::SubmitRequest {
            spec: Some(mig),
            request_id: String::new(),
            hold: false,
        }
        .encode_to_vec(),
    );
    let mut gang = spec(2);
    gang.resources.as_mut().unwrap().nodes = 2;
    gang.script = "echo".into();
    gang.command.clear();
    w(
        "submit-4.bin",
        pb::SubmitRequest {
            spec: Some(gang),
            request_id: String::new(),
            hold: false,
        }
        .encode_to_vec(),
    );
    w(
        "cancel-1.bin",
        pb::CancelRequest {
            job_ids: vec![1, 2, 99],
            tasks: vec![pb::ArrayTask {
                array_job_id: 1,
                task_id: 3,
            }],
            filter: None,
            signal: String::new(),
        }
        .encode_to_vec(),
    );
    w(
        "getjob-1.bin",
        pb::GetJobRequest { job_id: 1 }.encode_to_vec(),
    );
    w(
        "listjobs-1.bin",
        pb::ListJobsRequest {
            all: true,
            users: vec!["alice".into()],
            states: vec![1, 3],
            ..pb::ListJobsRequest::default()
        }
        .encode_to_vec(),
    );
    w(
        "drain-1.bin",
        pb::DrainNodeRequest {
            name: "n1".into(),
            reason: "fuzz".into(),
        }
        .encode_to_vec(),
    );
    w(
        "resume-1.bin",
        pb::ResumeNodeRequest { name: "n1".into() }.encode_to_vec(),
    );
    w(
        "token-1.bin",
        pb::CreateTokenRequest {
            user: "alice".into(),
            note: "x".into(),
        }
        .encode_to_vec(),
    );
    w(
        "revoke-1.bin",
        pb::RevokeTokenRequest {
            id: "0011aabbccdd".into(),
        }
        .encode_to_vec(),
    );
    write_agent_corpus(&w);
}

/// The agent side's seed inputs: an attach, a heartbeat, a start and an end report.
fn write_agent_corpus(w: &impl Fn(&str, Vec<u8>)) {
    w(
        "attach-1.bin",
        pb::RegisterRequest {
            node: "n1".into(),
            gpus: vec![gpu(0, false), gpu(1, false), gpu(2, true)],
            cpus: 16,
            memory_bytes: 64 << 30,
            gpu_backend: "fake".into(),
            running: vec![pb::RunningJob {
                job_id: 1,
                attempt: 1,
                ..Default::default()
            }],
            unacked_reports: vec![pb::JobReport {
                node: "n1".into(),
                job_id: 2,
                kind: 2,
                state: 3,
                attempt: 1,
                ..pb::JobReport::default()
            }],
            agent_id: "agent-1".into(),
            address: "10.0.0.1".into(),
            allow_root_jobs: true,
            ..pb::RegisterRequest::default()
        }
        .encode_to_vec(),
    );
    w(
        "heartbeat-1.bin",
        pb::HeartbeatRequest {
            node: "n1".into(),
            running: vec![pb::RunningJob {
                job_id: 1,
                attempt: 1,
                ..Default::default()
            }],
            metrics: vec![pb::GpuMetrics {
                uuid: "GPU-0".into(),
                util_pct: 90,
                mem_used_mib: 1000,
                temp_c: 70,
                power_w: 300.0,
                jobs: vec![pb::JobGpuUse {
                    job_id: 1,
                    mem_used_mib: 1000,
                    processes: 2,
                    util_pct: None,
                }],
                ..pb::GpuMetrics::default()
            }],
            commands_handled: 1,
            reporting: Vec::new(),
            health_error: String::new(),
        }
        .encode_to_vec(),
    );
    w(
        "report-1.bin",
        pb::JobReport {
            node: "n1".into(),
            job_id: 1,
            kind: 1,
            attempt: 1,
            time_ms: 1,
            ..pb::JobReport::default()
        }
        .encode_to_vec(),
    );
    w(
        "report-2.bin",
        pb::JobReport {
            node: "n1".into(),
            job_id: 1,
            kind: 2,
            state: 4,
            exit_code: Some(3),
            reason: "exit code 3".into(),
            attempt: 1,
            time_ms: 2,
            ..Default::default()
        }
        .encode_to_vec(),
    );
}

struct Harness {
    _dir: tempfile::TempDir,
    ctl: Arc<Controller>,
    key: ClusterKey,
    admin_token: String,
    user_token: String,
    /// Each node's live session (its nonce) and the last request number used in it.
    sessions: std::sync::Mutex<std::collections::HashMap<String, (Vec<u8>, u64)>>,
    /// Attach streams kept open, so that later heartbeats and reports find the session.
    streams: std::sync::Mutex<Vec<gpuctld::server::CommandStream>>,
}

fn harness(rt: &tokio::runtime::Runtime) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let key = ClusterKey::generate();
    let pki = gpuctld::controller::PkiSetup::shared_key(key.clone(), dir.path());
    let ctl = Controller::open(store, Config::default(), None, pki).unwrap();
    let root = Caller {
        user: "root".into(),
        uid: Some(0),
        gid: Some(0),
        admin: true,
        via: "unix-socket",
    };
    let (admin_token, user_token) = rt.block_on(async {
        let a = ctl.create_token(&root, "root", "").await.unwrap().token;
        let u = ctl.create_token(&root, "nobody", "").await.unwrap().token;
        (a, u)
    });
    Harness {
        _dir: dir,
        ctl,
        key,
        admin_token,
        user_token,
        sessions: Default::default(),
        streams: Default::default(),
    }
}

fn user_req<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

fn agent_req<T: Message>(h: &Harness, method: &str, node: &str, msg: T) -> tonic::Request<T> {
    let now = now_ms();
    let signed = match method {
        "attach" | "challenge" => Signed {
            session: Vec::new(),
            seq: 0,
        },
        _ => {
            let mut s = h.sessions.lock().unwrap();
            let e = s.entry(node.to_string()).or_default();
            e.1 += 1;
            Signed {
                session: e.0.clone(),
                seq: e.1,
            }
        }
    };
    let mac = h
        .key
        .sign_request(method, node, now, &signed, &msg.encode_to_vec());
    let mut r = tonic::Request::new(msg);
    // A fuzzed node name may not be a valid header value; then the request goes unsigned.
    if let Ok(v) = node.parse() {
        r.metadata_mut().insert(NODE_HEADER, v);
        r.metadata_mut().insert(TIME_HEADER, now.into());
        r.metadata_mut().insert(
            SESSION_HEADER,
            hex::encode(&signed.session).parse().unwrap(),
        );
        r.metadata_mut().insert(SEQ_HEADER, signed.seq.into());
        r.metadata_mut().insert(MAC_HEADER, mac.parse().unwrap());
    }
    r
}

/// Decodes `bytes` as request `kind` and runs its handler. Returns whether it decoded.
async fn call(h: &Harness, kind: &str, bytes: &[u8], admin: bool) -> bool {
    let user = UserApi(h.ctl.clone());
    let agent = AgentApi(h.ctl.clone());
    let token = if admin { &h.admin_token } else { &h.user_token };
    macro_rules! user_call {
        ($ty:ty, $method:ident) => {{
            let Ok(m) = <$ty>::decode(bytes) else {
                return false;
            };
            let _ = user.$method(user_req(m, token)).await;
        }};
    }
    match kind {
        "submit" => user_call!(pb::SubmitRequest, submit),
        "cancel" => user_call!(pb::CancelRequest, cancel),
        "getjob" => {
            let Ok(m) = pb::GetJobRequest::decode(bytes) else {
                return false;
            };
            let _ = user.get_job(user_req(m, token)).await;
            let _ = user.explain(user_req(m, token)).await;
            let a = pb::JobActionRequest {
                job_id: m.job_id,
                ..Default::default()
            };
            let _ = user.hold(user_req(a, token)).await;
            let _ = user.release(user_req(a, token)).await;
            let _ = user.requeue(user_req(a, token)).await;
        }
        "listjobs" => {
            user_call!(pb::ListJobsRequest, list_jobs);
            let _ = user
                .list_nodes(user_req(pb::ListNodesRequest::default(), token))
                .await;
            let _ = user
                .priorities(user_req(pb::PrioritiesRequest {}, token))
                .await;
            let _ = user.share(user_req(pb::ShareRequest {}, token)).await;
            let _ = user.windows(user_req(pb::WindowsRequest {}, token)).await;
        }
        "drain" => user_call!(pb::DrainNodeRequest, drain_node),
        "resume" => user_call!(pb::ResumeNodeRequest, resume_node),
        "token" => user_call!(pb::CreateTokenRequest, create_token),
        "revoke" => {
            let Ok(m) = pb::RevokeTokenRequest::decode(bytes) else {
                return false;
            };
            // Never the harness's own tokens: later cases need them.
            if !h.admin_token.contains(&m.id) && !h.user_token.contains(&m.id) {
                let _ = user.revoke_token(user_req(m, token)).await;
            }
        }
        "attach" => {
            let Ok(mut m) = pb::RegisterRequest::decode(bytes) else {
                return false;
            };
            let node = m.node.clone();
            let ch = pb::ChallengeRequest { node: node.clone() };
            if let Ok(ch) = agent.challenge(agent_req(h, "challenge", &node, ch)).await {
                m.nonce = ch.into_inner().nonce;
            }
            let nonce = m.nonce.clone();
            if let Ok(stream) = agent.attach(agent_req(h, "attach", &node, m)).await {
                h.sessions.lock().unwrap().insert(node, (nonce, 0));
                let mut streams = h.streams.lock().unwrap();
                // A few stay open; older ones are dropped (their nodes disconnect).
                if streams.len() > 4 {
                    streams.remove(0);
                }
                streams.push(stream.into_inner());
            }
        }
        "heartbeat" => {
            let Ok(m) = pb::HeartbeatRequest::decode(bytes) else {
                return false;
            };
            let node = m.node.clone();
            let _ = agent.heartbeat(agent_req(h, "heartbeat", &node, m)).await;
        }
        "report" => {
            let Ok(m) = pb::JobReport::decode(bytes) else {
                return false;
            };
            let node = m.node.clone();
            let _ = agent.report_job(agent_req(h, "report", &node, m)).await;
        }
        other => unreachable!("kind {other}"),
    }
    true
}

#[test]
fn corpus_seeds_decode_and_run() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let h = harness(&rt);
    let seeds = seeds();
    assert!(seeds.len() >= 14, "corpus went missing");
    rt.block_on(async {
        for (name, bytes) in &seeds {
            let kind = name.split('-').next().unwrap();
            assert!(
                call(&h, kind, bytes, true).await,
                "seed {name} does not decode"
            );
        }
        // The seeds make jobs and a node; the scheduler runs over them.
        h.ctl.schedule_pass().await.unwrap();
    });
    let all = gpuctl_core::filter::JobFilter {
        all: true,
        ..Default::default()
    };
    assert!(h.ctl.list_jobs(&all).len() >= 3);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn mutated_requests_never_panic_a_handler(
        seed in any::<usize>(),
        kind in 0..KINDS.len(),
        admin in any::<bool>(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 0..10),
    ) {
        thread_local! {
            static STATE: (tokio::runtime::Runtime, std::cell::OnceCell<Harness>) =
                (tokio::runtime::Runtime::new().unwrap(), std::cell::OnceCell::new());
        }
        let seeds = seeds();
        let mut b = seeds[seed % seeds.len()].1.clone();
        for (i, x, op) in flips {
            match op {
                0 if !b.is_empty() => { let n = b.len(); b[i % n] ^= x; }
                1 => b.insert(i % (b.len() + 1), x),
                _ if !b.is_empty() => { let n = b.len(); b.truncate(i % n); }
                _ => {}
            }
        }
        STATE.with(|(rt, h)| {
            let h = h.get_or_init(|| harness(rt));
            rt.block_on(async {
                call(h, KINDS[kind], &b, admin).await;
                h.ctl.schedule_pass().await.unwrap();
            });
        });
    }
}
