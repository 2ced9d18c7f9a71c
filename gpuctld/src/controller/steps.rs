//! Steps opened from outside a job (`gpuctl run --jobid`, `srun` in `gpuctl alloc`):
//! the controller is the only party both the client and the agent reach, so it relays.
//!
//! A client's `Interact` stream opens a step: the controller checks who may and where
//! it goes (`Cluster::step_target`: the job's nodes by rank), and sends each of
//! those nodes' agents a `StepSession` command with a fresh random number of its own.
//! Each agent starts its part and calls `StepIo`, signed like every agent request,
//! naming its number. The client's input is fanned out (standard input, window sizes:
//! the first node's; signals: every node's; its end: a hang-up for all), the nodes'
//! output fanned in, and the step's end is the last node's, with the worst exit code.
//! Nothing of a step is stored: it is the job's (its accounting is the job's step file,
//! read by the agent at the job's end).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use gpuctl_proto::{self as pb, step_input::Input, step_output::Output};
use parking_lot::Mutex;
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tonic::{Status, Streaming};

use super::{Controller, status};
use crate::auth::Caller;

/// How long an agent has to open a step it was sent.
const OPEN_TIMEOUT: Duration = Duration::from_secs(15);
/// Steps waiting for their agent, in all and of one user.
const MAX_PENDING: usize = 1024;
const MAX_PENDING_PER_USER: usize = 32;
/// Output messages queued for a client before the agents' sides wait.
const OUTPUT_QUEUE: usize = 64;
/// What a client hears when the controller stops under its step.
const SHUTTING_DOWN: &str = "the controller is shutting down: the step was ended";
/// Input messages queued for one node before the client's side waits.
const INPUT_QUEUE: usize = 64;

/// What the nodes of one step share: the client's output stream, and the step's end
/// as their parts end (the worst exit code; the first error).
struct Group {
    output: mpsc::Sender<Result<pb::StepOutput, Status>>,
    /// Parts not ended yet, and the worst code and the first error so far.
    end: Mutex<(usize, i32, Option<String>)>,
}

impl Group {
    /// One node's part ended; the last one ends the step for the client.
    async fn part_ended(&self, how: Result<i32, String>) {
        let done = {
            let mut e = self.end.lock();
            e.0 = e.0.saturating_sub(1);
            match how {
                Ok(c) => e.1 = e.1.max(c),
                Err(why) => {
                    e.2.get_or_insert(why);
                }
            }
            (e.0 == 0).then(|| e.2.clone().map_or(Output::ExitCode(e.1), Output::Error))
        };
        if let Some(o) = done {
            let _ = self
                .output
                .send(Ok(pb::StepOutput { output: Some(o) }))
                .await;
        }
    }
}

/// One node's part of a client's step, whose agent has not called yet.
struct Pending {
    node: String,
    user: String,
    /// What this node's agent receives: the client's input meant for it.
    input: mpsc::Receiver<pb::StepInput>,
    group: Arc<Group>,
}

/// The steps waiting for their agents, by number; and whether the controller is
/// shutting down (every relay then ends: a step's stream must not hold the server up).
pub struct Relay {
    pending: Mutex<HashMap<Vec<u8>, Pending>>,
    closing: tokio::sync::watch::Sender<bool>,
}

impl Default for Relay {
    fn default() -> Relay {
        Relay {
            pending: Mutex::default(),
            closing: tokio::sync::watch::channel(false).0,
        }
    }
}

impl Relay {
    /// Ends every relay (the controller is stopping): each node's part sees its
    /// client's input end (a hang-up), each client an error.
    pub fn close(&self) {
        self.closing.send_replace(true);
        self.pending.lock().clear();
    }
}

/// Resolves once `Relay::close` was called.
async fn closed(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|c| *c).await;
}

/// What a client receives.
pub type ClientStream = tokio_stream::wrappers::ReceiverStream<Result<pb::StepOutput, Status>>;

impl Controller {
    /// A client's `Interact`: checks the opening, sends the step's nodes their parts
    /// and answers the stream the step's output will come on.
    pub async fn interact(
        self: &Arc<Self>,
        caller: &Caller,
        mut input: Streaming<pb::StepInput>,
    ) -> Result<ClientStream, Status> {
        let first = input
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream ended before it opened a step"))?;
        let Some(Input::Open(open)) = first.input else {
            return Err(Status::invalid_argument(
                "a step's first message must open it (OpenStep)",
            ));
        };
        let asked = gpuctl_core::interactive::OpenStep {
            args: open.args.clone(),
            term: open.term.clone(),
            size: open.size.map(|w| (w.rows, w.cols)),
        };
        gpuctl_core::interactive::check_open(&asked).map_err(status)?;
        let job_id = open.job_id;
        let (target, links) = {
            let c = self.lock();
            let target = c
                .step_target(&caller.actor(), job_id, open.nodes)
                .map_err(status)?;
            let links: Option<Vec<_>> = target
                .nodes
                .iter()
                .map(|n| c.links.get(n).map(|l| l.tx.clone()))
                .collect();
            (target, links)
        };
        let links =
            links.ok_or_else(|| Status::unavailable("a node of the job is not attached now"))?;
        let (tx, rx) = mpsc::channel(OUTPUT_QUEUE);
        let group = Arc::new(Group {
            output: tx,
            end: Mutex::new((target.nodes.len(), 0, None)),
        });
        let mut numbers = Vec::new();
        let mut inputs = Vec::new();
        {
            let mut p = self.steps.pending.lock();
            let mine = p.values().filter(|s| s.user == caller.user).count();
            if p.len() + target.nodes.len() > MAX_PENDING
                || mine + target.nodes.len() > MAX_PENDING_PER_USER
            {
                return Err(Status::resource_exhausted(format!(
                    "too many steps wait for their nodes ({mine} of yours, {} in all); try again shortly",
                    p.len()
                )));
            }
            for node in &target.nodes {
                let number: [u8; 16] = rand::random();
                let (itx, irx) = mpsc::channel(INPUT_QUEUE);
                p.insert(
                    number.to_vec(),
                    Pending {
                        node: node.clone(),
                        user: caller.user.clone(),
                        input: irx,
                        group: group.clone(),
                    },
                );
                numbers.push(number.to_vec());
                inputs.push(itx);
            }
        }
        for (i, (link, number)) in links.iter().zip(&numbers).enumerate() {
            // The terminal is the first node's; the others' parts write to pipes.
            let part = pb::OpenStep {
                pty: open.pty && i == 0,
                ..open.clone()
            };
            let cmd = pb::AgentCommand {
                command: Some(pb::agent_command::Command::Step(pb::StepSession {
                    job_id,
                    attempt: target.attempt,
                    step: number.clone(),
                    open: Some(part),
                })),
                ..pb::AgentCommand::default()
            };
            if link.send(Ok(Box::new(cmd))).await.is_err() {
                let mut p = self.steps.pending.lock();
                for n in &numbers {
                    p.remove(n);
                }
                return Err(Status::unavailable(format!(
                    "node {} went away",
                    target.nodes[i]
                )));
            }
        }
        tracing::info!(job = job_id, nodes = ?target.nodes, user = %caller.user, "step opened from outside the job");
        tokio::spawn(fan_out(input, inputs, self.steps.closing.subscribe()));
        let ctl = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(OPEN_TIMEOUT).await;
            for n in numbers {
                let lost = ctl.steps.pending.lock().remove(&n);
                if let Some(p) = lost {
                    let why = format!(
                        "the agent on {} did not open the step within {} s",
                        p.node,
                        OPEN_TIMEOUT.as_secs()
                    );
                    p.group.part_ended(Err(why)).await;
                }
            }
        });
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
    }

    /// An agent's `StepIo`: its first message names the step (signed in the request's
    /// metadata); then its output goes to the client, and the client's input to it.
    pub async fn step_io(
        self: &Arc<Self>,
        via: &crate::pki::Via<'_>,
        meta: &tonic::metadata::MetadataMap,
        mut from_agent: Streaming<pb::StepOutput>,
    ) -> Result<impl Stream<Item = Result<pb::StepInput, Status>> + Send + 'static, Status> {
        let first = from_agent
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream ended before it named its step"))?;
        let Some(Output::Hello(hello)) = first.output else {
            return Err(Status::invalid_argument(
                "a StepIo stream's first message must name its step (StepHello)",
            ));
        };
        let signed =
            self.verify_agent(via, meta, "step_io", &hello.node, &hello.encode_to_vec())?;
        self.check_session(&hello.node, &signed)?;
        let p = {
            let mut pending = self.steps.pending.lock();
            match pending.get(&hello.step) {
                Some(p) if p.node == hello.node => pending.remove(&hello.step),
                Some(_) => {
                    return Err(Status::permission_denied(
                        "that step was sent to another node",
                    ));
                }
                None => None,
            }
        };
        let p = p.ok_or_else(|| Status::not_found("no step waits under that number"))?;
        let node = pb::StepOutput {
            output: Some(Output::Node(hello.node.clone())),
        };
        let _ = p.group.output.send(Ok(node)).await;
        let group = p.group;
        let closing = self.steps.closing.subscribe();
        tokio::spawn(async move {
            let mut ended = None;
            let stop = closed(closing);
            tokio::pin!(stop);
            loop {
                let m = tokio::select! {
                    m = from_agent.message() => m,
                    () = &mut stop => {
                        ended = Some(Err(SHUTTING_DOWN.to_string()));
                        break;
                    }
                };
                let Ok(Some(m)) = m else { break };
                match m.output {
                    Some(Output::ExitCode(c)) => {
                        ended = Some(Ok(c));
                        break;
                    }
                    Some(Output::Error(e)) => {
                        ended = Some(Err(e));
                        break;
                    }
                    Some(Output::Stdout(_) | Output::Stderr(_)) => {
                        if group.output.send(Ok(m)).await.is_err() {
                            break;
                        }
                    }
                    // Only the agent's opening names a node or a step.
                    Some(Output::Hello(_) | Output::Node(_)) | None => {}
                }
            }
            let how = ended.unwrap_or_else(|| {
                Err("the step's agent went away before the step ended".to_string())
            });
            group.part_ended(how).await;
        });
        // The client's input meant for this node; its end (the client gone) is the
        // stream's end, which the agent takes as a hang-up.
        Ok(tokio_stream::wrappers::ReceiverStream::new(p.input).map(Ok))
    }
}

/// The client's input to the step's nodes: standard input and window sizes to the
/// first, signals to all. When the client's stream ends, every node's ends.
async fn fan_out(
    mut input: Streaming<pb::StepInput>,
    nodes: Vec<mpsc::Sender<pb::StepInput>>,
    closing: tokio::sync::watch::Receiver<bool>,
) {
    let stop = closed(closing);
    tokio::pin!(stop);
    loop {
        let m = tokio::select! {
            m = input.message() => m,
            () = &mut stop => break,
        };
        let Ok(Some(m)) = m else { break };
        match &m.input {
            Some(Input::Signal(name)) => {
                if !gpuctl_core::interactive::STEP_SIGNALS.contains(&name.as_str()) {
                    continue;
                }
                for n in &nodes {
                    // A node whose agent has not called yet (or is gone) misses it.
                    let _ = n.try_send(m.clone());
                }
            }
            Some(Input::Stdin(_) | Input::StdinClosed(_) | Input::Resize(_)) => {
                // When the first node's part is over, its input has nowhere to go.
                if let Some(first) = nodes.first() {
                    let _ = first.send(m).await;
                }
            }
            Some(Input::Open(_)) | None => {}
        }
    }
}
