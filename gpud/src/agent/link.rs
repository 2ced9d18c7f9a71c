//! The agent's link to the controllers: attaching (the challenge, the attach with what
//! runs here, and the command stream), following the leader among several controllers,
//! heartbeats on the session's stream, and the reports, resent until acknowledged.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuctl_proto::{self as pb, agent_link_client::AgentLinkClient};
use tonic::transport::Channel;

use super::{Agent, Options, Session, handle};
use crate::gpu::GpuInfo;

/// How long a controller has to answer a challenge or an attach.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a controller has to acknowledge reports before they are sent again (to
/// the controller attached to by then).
const REPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most reports sent in one request.
const REPORT_BATCH: usize = 512;

/// Sends queued reports in order, as many as are queued in one request (the ends of a
/// cancel's jobs travel together), retrying until the controller acknowledges them.
pub(super) async fn reporter(agent: Arc<Agent>) {
    loop {
        let mut pending = agent.reports.snapshot();
        if pending.is_empty() {
            agent.report_ready.notified().await;
            continue;
        }
        pending.truncate(REPORT_BATCH);
        loop {
            let Some(session) = agent.current_session() else {
                // Not attached: reports wait for the session (Attach carries them too).
                agent.session_ready.notified().await;
                continue;
            };
            let batch = pb::JobReports {
                node: agent.name.clone(),
                reports: pending.clone(),
            };
            let req = agent.signed("reports", Some(&session), batch);
            // The controller attached to now (after a leader's change, the new one).
            let mut client = AgentLinkClient::new(agent.channel());
            let sent = tokio::time::timeout(REPORT_TIMEOUT, client.report_jobs(req)).await;
            match sent
                .unwrap_or_else(|_| Err(tonic::Status::unavailable("no answer to the reports")))
            {
                Ok(acks) => {
                    if agent.reports.ack(&pending) {
                        drop(agent.persist_reports());
                    }
                    for (r, ack) in pending.iter().zip(&acks.get_ref().acks) {
                        if ack.stale {
                            agent.kill_stale(
                                r.job_id,
                                r.attempt,
                                "the controller no longer holds this start (node declared down or job cancelled)",
                            );
                        }
                    }
                    break;
                }
                Err(e) => {
                    tracing::debug!(
                        reports = pending.len(),
                        "reports not delivered yet: {}",
                        e.message()
                    );
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
    }
}

/// The local address of the route to the controller: where other nodes reach this one.
fn local_address(controller: &str) -> Option<String> {
    let uri: tonic::transport::Uri = controller.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    let sock = std::net::UdpSocket::bind(if host.contains(':') {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    })
    .ok()?;
    sock.connect((host, port)).ok()?;
    Some(sock.local_addr().ok()?.ip().to_string())
}

/// Whether an attach error means this agent must stop (not retry).
fn fatal_attach(e: &tonic::Status) -> bool {
    matches!(
        e.code(),
        tonic::Code::InvalidArgument | tonic::Code::Unauthenticated | tonic::Code::AlreadyExists
    )
}

/// Attach refusals, logged one line per condition and period: a failover or a restart
/// refuses many attempts for the same reason (the old leader's connection still held,
/// followers naming the leader), and each line saying it again is noise.
#[derive(Default)]
struct Refusals {
    /// The condition last logged (controller and code), when, and how many since.
    last: Option<(String, std::time::Instant)>,
    since: u32,
    total: u32,
}

/// How long one condition stays quiet after it was logged.
const REFUSAL_PERIOD: Duration = Duration::from_secs(30);

impl Refusals {
    /// `had_session`: this process was attached before (a refusal naming its identity
    /// is then its own old connection; else a copy of its state dir runs elsewhere).
    fn note(&mut self, url: &str, e: &tonic::Status, had_session: bool) {
        self.total += 1;
        // This agent's own previous connection, still held by the controller after a
        // failover or a reconnect: expected, and it passes once that one is dropped.
        let own_connection = had_session
            && e.code() == tonic::Code::FailedPrecondition
            && e.message().contains("under this agent identity");
        let key = format!("{url} {:?}", e.code());
        let quiet = self
            .last
            .as_ref()
            .is_some_and(|(k, at)| *k == key && at.elapsed() < REFUSAL_PERIOD);
        if quiet {
            self.since += 1;
            tracing::debug!(
                "cannot attach to the controller at {url}: {}; retrying",
                e.message()
            );
            return;
        }
        let again = std::mem::take(&mut self.since);
        let again = if again > 0 {
            format!(" ({again} more refusal(s) like the last one since)")
        } else {
            String::new()
        };
        if own_connection {
            tracing::info!(
                "the controller at {url} still holds this agent's previous connection; attaching once it lets it go{again}"
            );
        } else {
            tracing::warn!(
                "cannot attach to the controller at {url}: {}; retrying{again}",
                e.message()
            );
        }
        self.last = Some((key, std::time::Instant::now()));
    }

    fn attached(&mut self) {
        if self.total > 1 {
            tracing::info!("attached after {} refused attempt(s)", self.total);
        }
        *self = Refusals::default();
    }
}

pub(super) async fn attach_loop(agent: Arc<Agent>, opts: Options) -> anyhow::Result<()> {
    let mut backoff = Duration::from_millis(100);
    let id = agent.id.clone();
    let address = opts
        .address
        .clone()
        .or_else(|| local_address(opts.controller.split(',').next().unwrap_or_default()))
        .unwrap_or_default();
    tracing::info!(agent_id = %id, %address, "agent identity");
    let mut refusals = Refusals::default();
    // The session this process was attached under last: named at the next attach, so
    // that the controller hands this agent its own connection back at once.
    let mut previous_session = Vec::new();
    loop {
        if let Some(s) = agent
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            previous_session = s.id.clone();
        }
        let mut client = AgentLinkClient::new(agent.channel());
        let challenge = pb::ChallengeRequest {
            node: agent.name.clone(),
        };
        // A controller that accepts connections but does not answer (frozen) is left
        // for the next one of the list, not waited for.
        let asked = client.challenge(agent.signed("challenge", None, challenge));
        let answered = tokio::time::timeout(ATTACH_TIMEOUT, asked)
            .await
            .unwrap_or_else(|_| Err(tonic::Status::unavailable("no answer to the challenge")))
            .and_then(|ch| agent.check_term(ch.into_inner()));
        let attached = match answered {
            Ok(ch) => {
                let unacked = agent.reports.snapshot();
                let req = pb::RegisterRequest {
                    node: agent.name.clone(),
                    gpus: agent
                        .gpus
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter()
                        .map(GpuInfo::to_pb)
                        .collect(),
                    cpus: opts.cpus,
                    memory_bytes: opts.memory_bytes,
                    gpu_backend: opts.backend.kind().to_string(),
                    running: agent.running(),
                    unacked_reports: unacked.clone(),
                    nonce: ch.nonce.clone(),
                    agent_id: id.clone(),
                    address: address.clone(),
                    allow_root_jobs: agent.allow_root_jobs,
                    features: opts.features.clone(),
                    previous_session: previous_session.clone(),
                    mig_dynamic: opts.mig_dynamic,
                    takes_kill_batches: true,
                };
                let attach = client.attach(agent.signed("attach", None, req));
                tokio::time::timeout(ATTACH_TIMEOUT, attach)
                    .await
                    .unwrap_or_else(|_| Err(tonic::Status::unavailable("no answer to the attach")))
                    .map(|r| (r.into_inner(), ch, unacked))
            }
            Err(e) => Err(e),
        };
        let (mut stream, ch, unacked) = match attached {
            Ok(x) => x,
            Err(e) => {
                if fatal_attach(&e) {
                    anyhow::bail!("controller refused registration: {}", e.message());
                }
                let (at, n) = agent.controller_index();
                let url = opts.controller.split(',').nth(at).unwrap_or_default();
                refusals.note(url, &e, !previous_session.is_empty());
                if n > 1 {
                    // Replicated controllers: the next one (a follower names the leader
                    // in its refusal; trying each in turn finds it within one round).
                    agent.next_controller();
                    if at + 1 < n {
                        continue;
                    }
                }
                // Jittered: after a controller restart, thousands of agents must not
                // come back in lockstep (the scale harness, docs/benchmarks.md).
                let jitter = rand::random_range(0.5..1.5);
                tokio::time::sleep(backoff.mul_f64(jitter)).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        refusals.attached();
        if agent.reports.ack(&unacked) {
            drop(agent.persist_reports());
        }
        let session = Arc::new(Session {
            id: ch.nonce,
            seq: Default::default(),
            last_cmd: Default::default(),
            handled: Default::default(),
            confirmed: Mutex::new(std::time::Instant::now()),
            node_timeout: Duration::from_millis(ch.node_timeout_ms.max(1000)),
        });
        *agent.session.lock().unwrap_or_else(|p| p.into_inner()) = Some(session.clone());
        // One waiter (the reporter); a permit is kept if it is not waiting yet.
        agent.session_ready.notify_one();
        backoff = Duration::from_millis(100);
        tracing::info!(
            term = agent.term.load(std::sync::atomic::Ordering::SeqCst),
            "registered with controller {}",
            opts.controller
                .split(',')
                .nth(agent.controller_index().0)
                .unwrap_or_default()
        );

        let hb = tokio::spawn(heartbeats(
            agent.clone(),
            client.clone(),
            opts.heartbeat,
            session.clone(),
        ));
        // With several controllers, one that stops answering heartbeats (frozen, cut
        // off, deposed) is left for the next: the leader may be elsewhere now.
        let several = agent.controller_index().1 > 1;
        let lost_after = (opts.heartbeat * 3).max(Duration::from_secs(3));
        let mut check = tokio::time::interval(Duration::from_secs(1));
        loop {
            let msg = tokio::select! {
                m = stream.message() => m,
                _ = agent.gpus_changed.notified() => break,
                _ = check.tick(), if several => {
                    let quiet = session.confirmed.lock().unwrap_or_else(|p| p.into_inner()).elapsed();
                    if quiet > lost_after {
                        tracing::warn!(?quiet, "the controller answers no heartbeat; trying the next");
                        agent.next_controller();
                        break;
                    }
                    continue;
                }
            };
            match msg {
                Ok(Some(cmd)) => handle(&agent, &session, cmd),
                Ok(None) => {
                    tracing::warn!("controller closed the stream; reconnecting");
                    break;
                }
                Err(e) => {
                    tracing::warn!("lost the controller: {}; reconnecting", e.message());
                    break;
                }
            }
        }
        hb.abort();
        tokio::time::sleep(backoff).await;
    }
}

async fn heartbeats(
    agent: Arc<Agent>,
    mut client: AgentLinkClient<Channel>,
    every: Duration,
    session: Arc<Session>,
) {
    let mut tick = tokio::time::interval(every);
    // The session's heartbeat stream: opened at the first heartbeat and again after it
    // breaks; `None` with `unary` set once the controller does not offer it (then each
    // heartbeat is its own request, as before the stream existed).
    let mut link: Option<HeartbeatLink> = None;
    let mut unary = false;
    loop {
        tick.tick().await;
        let req = heartbeat_request(&agent, &session).await;
        let sent = std::time::Instant::now();
        if !unary && link.is_none() {
            match HeartbeatLink::open(&mut client).await {
                Ok(l) => link = Some(l),
                Err(e) if e.code() == tonic::Code::Unimplemented => {
                    tracing::info!(
                        "the controller has no heartbeat stream; heartbeats go one request each"
                    );
                    unary = true;
                }
                Err(e) => {
                    tracing::debug!("cannot open the heartbeat stream: {}", e.message());
                    continue;
                }
            }
        }
        let answer = match link.as_mut() {
            Some(l) if !unary => {
                let r = l
                    .exchange(agent.signed_heartbeat(&session, req), every)
                    .await;
                if r.is_err() {
                    link = None;
                }
                r
            }
            _ => client
                .heartbeat(agent.signed("heartbeat", Some(&session), req))
                .await
                .map(tonic::Response::into_inner),
        };
        match answer {
            Ok(r) => {
                if !r.known {
                    tracing::warn!("controller does not know this agent's stream");
                }
                *session.confirmed.lock().unwrap_or_else(|p| p.into_inner()) = sent;
                if r.known {
                    agent.apply_power(r.power_caps);
                }
                for s in r.stale {
                    agent.kill_stale(
                        s.job_id,
                        s.attempt,
                        "the controller holds this instance as ended",
                    );
                }
            }
            Err(e) => tracing::debug!("heartbeat failed: {}", e.message()),
        }
    }
}

/// What a heartbeat tells the controller now.
async fn heartbeat_request(agent: &Arc<Agent>, session: &Session) -> pb::HeartbeatRequest {
    // Read before the running list: a start counted here is in one of the lists.
    let commands_handled = session.handled.load(std::sync::atomic::Ordering::SeqCst);
    let health_error = {
        let health = agent
            .health
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let fault = agent
            .launch_fault
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match fault {
            Some(f) if health.is_empty() => f,
            Some(f) => format!("{health}; {f}"),
            None => health,
        }
    };
    pb::HeartbeatRequest {
        node: agent.name.clone(),
        commands_handled,
        health_error,
        running: {
            let a = agent.clone();
            tokio::task::spawn_blocking(move || a.running_with_usage())
                .await
                .unwrap_or_else(|_| agent.running())
        },
        reporting: agent
            .reports
            .snapshot()
            .iter()
            .map(|r| pb::RunningJob {
                job_id: r.job_id,
                attempt: r.attempt,
                ..Default::default()
            })
            .collect(),
        metrics: agent
            .latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
    }
}

/// One session's Heartbeats stream: heartbeats go in, their answers come back in order.
struct HeartbeatLink {
    tx: tokio::sync::mpsc::Sender<pb::SignedHeartbeat>,
    answers: tonic::Streaming<pb::HeartbeatResponse>,
}

impl HeartbeatLink {
    async fn open(client: &mut AgentLinkClient<Channel>) -> Result<HeartbeatLink, tonic::Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let answers = client
            .heartbeats(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(HeartbeatLink { tx, answers })
    }

    /// Sends one heartbeat and waits (at most `wait`) for its answer; an error means
    /// the stream is no good any more.
    async fn exchange(
        &mut self,
        hb: pb::SignedHeartbeat,
        wait: Duration,
    ) -> Result<pb::HeartbeatResponse, tonic::Status> {
        if self.tx.send(hb).await.is_err() {
            return Err(tonic::Status::unavailable("the heartbeat stream closed"));
        }
        match tokio::time::timeout(wait.max(Duration::from_secs(1)), self.answers.message()).await {
            Ok(Ok(Some(r))) => Ok(r),
            Ok(Ok(None)) => Err(tonic::Status::unavailable(
                "the controller ended the heartbeat stream",
            )),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(tonic::Status::deadline_exceeded("no answer to a heartbeat")),
        }
    }
}
