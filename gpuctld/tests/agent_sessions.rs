//! The agent side of the controller, driven in process through the real handlers
//! (`AgentApi`) with requests signed by the cluster key: sessions, replays, and starts
//! an agent handled without running them.

use std::sync::Arc;

use futures::StreamExt;
use gpuctl_proto::agent_link_server::AgentLink as _;
use gpuctl_proto::auth::{ClusterKey, Signed};
use gpuctl_proto::{self as pb};
use gpuctld::auth::Caller;
use gpuctld::config::Config;
use gpuctld::controller::{Controller, now_ms};
use gpuctld::server::{AgentApi, CommandStream};
use gpuctld::store::Store;
use prost::Message;

struct Agent {
    key: ClusterKey,
    api: AgentApi,
    session: Vec<u8>,
    seq: u64,
}

impl Agent {
    fn req<T: Message>(&mut self, method: &str, msg: T, numbered: bool) -> tonic::Request<T> {
        let now = now_ms();
        let signed = if numbered {
            self.seq += 1;
            Signed {
                session: self.session.clone(),
                seq: self.seq,
            }
        } else {
            Signed {
                session: Vec::new(),
                seq: 0,
            }
        };
        self.key
            .signed_request(method, "n1", now, &signed, msg)
            .unwrap()
    }

    fn register(nonce: Vec<u8>) -> pb::RegisterRequest {
        pb::RegisterRequest {
            node: "n1".into(),
            gpus: vec![pb::Gpu {
                uuid: "GPU-0".into(),
                model: "A100-80GB".into(),
                memory_mib: 81920,
                ..pb::Gpu::default()
            }],
            cpus: 8,
            memory_bytes: 64 << 30,
            gpu_backend: "fake".into(),
            nonce,
            agent_id: "agent-a".into(),
            allow_root_jobs: true,
            ..pb::RegisterRequest::default()
        }
    }

    async fn attach(&mut self) -> Result<CommandStream, tonic::Status> {
        let ch = pb::ChallengeRequest { node: "n1".into() };
        let req = self.req("challenge", ch, false);
        let nonce = self.api.challenge(req).await?.into_inner().nonce;
        let req = self.req("attach", Agent::register(nonce.clone()), false);
        let stream = self.api.attach(req).await?.into_inner();
        self.session = nonce;
        self.seq = 0;
        Ok(stream)
    }

    async fn heartbeat(&mut self, handled: u64) -> Result<pb::HeartbeatResponse, tonic::Status> {
        let hb = pb::HeartbeatRequest {
            node: "n1".into(),
            commands_handled: handled,
            ..pb::HeartbeatRequest::default()
        };
        let req = self.req("heartbeat", hb, true);
        Ok(self.api.heartbeat(req).await?.into_inner())
    }
}

fn setup() -> (tempfile::TempDir, Arc<Controller>, Agent) {
    let dir = tempfile::tempdir().unwrap();
    let key = ClusterKey::generate();
    let ctl = Controller::open(
        Store::open(dir.path()).unwrap(),
        Config::default(),
        None,
        gpuctld::controller::PkiSetup::shared_key(key.clone(), dir.path()),
    )
    .unwrap();
    let agent = Agent {
        key,
        api: AgentApi(ctl.clone()),
        session: Vec::new(),
        seq: 0,
    };
    (dir, ctl, agent)
}

fn root() -> Caller {
    Caller {
        user: "root".into(),
        uid: Some(0),
        gid: Some(0),
        admin: true,
        via: "unix-socket",
    }
}

fn job_spec() -> pb::JobSpec {
    pb::JobSpec {
        script: "true".into(),
        workdir: "/tmp".into(),
        resources: Some(pb::Resources {
            gpu: Some(pb::resources::Gpu::Gpus(1)),
            cpus: 1,
            ..pb::Resources::default()
        }),
        ..pb::JobSpec::default()
    }
}

#[tokio::test]
async fn a_start_the_agent_handled_but_did_not_run_ends_the_job() {
    let (_dir, ctl, mut agent) = setup();
    let mut stream = agent.attach().await.unwrap();
    let id = ctl
        .submit(&root(), Some(job_spec()), "", false)
        .await
        .unwrap();
    ctl.schedule_pass().await.unwrap();
    assert_eq!(ctl.get_job(id).unwrap().state(), pb::JobState::Running);
    let signed = stream.next().await.unwrap().unwrap();
    let cmd = agent.key.verify_command("n1", &signed).unwrap();
    assert_eq!(cmd.session, agent.session);
    assert_eq!(cmd.seq, 1);
    // A heartbeat from before the start was handled changes nothing.
    agent.heartbeat(0).await.unwrap();
    assert_eq!(ctl.get_job(id).unwrap().state(), pb::JobState::Running);
    // The agent handled command 1 and runs nothing: the start was refused.
    agent.heartbeat(1).await.unwrap();
    let j = ctl.get_job(id).unwrap();
    assert_eq!(j.state(), pb::JobState::Failed);
    assert!(j.reason.contains("did not run the start"), "{}", j.reason);
}

#[tokio::test]
async fn a_cancelled_start_that_never_ran_ends_cancelled() {
    let (_dir, ctl, mut agent) = setup();
    let mut stream = agent.attach().await.unwrap();
    let id = ctl
        .submit(&root(), Some(job_spec()), "", false)
        .await
        .unwrap();
    ctl.schedule_pass().await.unwrap();
    let _start = stream.next().await.unwrap().unwrap();
    ctl.cancel(&root(), &[id], &[], None).await.unwrap();
    assert_eq!(ctl.get_job(id).unwrap().state(), pb::JobState::Running);
    let _kill = stream.next().await.unwrap().unwrap();
    agent.heartbeat(2).await.unwrap();
    assert_eq!(ctl.get_job(id).unwrap().state(), pb::JobState::Cancelled);
}

/// A client that goes away drops its request's future (tonic does): a cancel dropped
/// while its change waits for the disk still sends its kill.
#[tokio::test]
async fn a_cancel_whose_client_went_away_still_sends_its_kill() {
    let (_dir, ctl, mut agent) = setup();
    let mut stream = agent.attach().await.unwrap();
    let id = ctl
        .submit(&root(), Some(job_spec()), "", false)
        .await
        .unwrap();
    ctl.schedule_pass().await.unwrap();
    let _start = stream.next().await.unwrap().unwrap();
    let (caller, ids) = (root(), [id]);
    {
        let cancel = ctl.cancel(&caller, &ids, &[], None);
        tokio::pin!(cancel);
        // Its first poll changes the state and waits for the flush; then it is dropped.
        assert!(futures::poll!(cancel.as_mut()).is_pending());
    }
    let signed = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
        .await
        .expect("the kill reached the agent")
        .unwrap()
        .unwrap();
    let cmd = agent.key.verify_command("n1", &signed).unwrap();
    assert!(
        matches!(cmd.command, Some(pb::agent_command::Command::Kill(_))),
        "{cmd:?}"
    );
}

#[tokio::test]
async fn replayed_attach_and_requests_are_refused() {
    let (_dir, _ctl, mut agent) = setup();
    let ch = pb::ChallengeRequest { node: "n1".into() };
    let req = agent.req("challenge", ch, false);
    let nonce = agent.api.challenge(req).await.unwrap().into_inner().nonce;
    let attach = Agent::register(nonce.clone());
    let req = agent.req("attach", attach.clone(), false);
    let _stream = agent.api.attach(req).await.unwrap();
    agent.session = nonce;
    // The same attach again (same nonce): refused.
    let req = agent.req("attach", attach, false);
    let e = agent.api.attach(req).await.err().unwrap();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    // An attach with a nonce nobody handed out: refused.
    let req = agent.req("attach", Agent::register(vec![7; 16]), false);
    assert!(agent.api.attach(req).await.is_err());
    // A heartbeat, then the very same one again.
    agent.heartbeat(0).await.unwrap();
    agent.seq -= 1;
    let e = agent.heartbeat(0).await.unwrap_err();
    assert!(e.message().contains("already seen"), "{}", e.message());
    // A request of another session.
    agent.session = vec![1; 16];
    let e = agent.heartbeat(0).await.unwrap_err();
    assert!(e.message().contains("old or unknown"), "{}", e.message());
}

#[tokio::test]
async fn a_second_identity_cannot_take_a_live_name() {
    let (_dir, _ctl, mut agent) = setup();
    let _stream = agent.attach().await.unwrap();
    let ch = pb::ChallengeRequest { node: "n1".into() };
    let req = agent.req("challenge", ch, false);
    let nonce = agent.api.challenge(req).await.unwrap().into_inner().nonce;
    let mut other = Agent::register(nonce);
    other.agent_id = "agent-b".into();
    let req = agent.req("attach", other, false);
    let e = agent.api.attach(req).await.err().unwrap();
    assert_eq!(e.code(), tonic::Code::AlreadyExists);
    assert!(e.message().contains("agent-a"), "{}", e.message());
    // The same identity while its stream is live and heard from: a copy of this
    // agent; it waits (a retryable code, not AlreadyExists, which stops an agent).
    let e = agent.attach().await.err().unwrap();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("copy of this agent"),
        "{}",
        e.message()
    );
    // Once that stream has closed (an agent restart), the same identity is welcome.
    drop(_stream);
    let mut ok = false;
    for _ in 0..100 {
        if agent.attach().await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(ok, "the restarted agent attaches");
}

/// The same agent coming back while the controller still holds its connection (a
/// failover, a dropped connection not yet seen closed) names the session it had, and
/// takes its own connection over at once; a copy of its state dir, which cannot name
/// that session, still waits.
#[tokio::test]
async fn the_same_agent_naming_its_session_takes_its_connection_back() {
    let (_dir, _ctl, mut agent) = setup();
    let _stream = agent.attach().await.unwrap();
    let had = agent.session.clone();
    let challenge = |agent: &mut Agent| {
        let ch = pb::ChallengeRequest { node: "n1".into() };
        agent.req("challenge", ch, false)
    };
    // A copy: the right identity, a session it never had.
    let req = challenge(&mut agent);
    let nonce = agent.api.challenge(req).await.unwrap().into_inner().nonce;
    let mut copy = Agent::register(nonce);
    copy.previous_session = vec![7; 16];
    let req = agent.req("attach", copy, false);
    let e = agent.api.attach(req).await.err().unwrap();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    // The agent itself, naming the session it had.
    let req = challenge(&mut agent);
    let nonce = agent.api.challenge(req).await.unwrap().into_inner().nonce;
    let mut back = Agent::register(nonce);
    back.previous_session = had;
    let req = agent.req("attach", back, false);
    assert!(
        agent.api.attach(req).await.is_ok(),
        "its own connection is taken over"
    );
}
