//! Steps opened from outside a job (`gpuctl run --jobid`, `srun` in `gpuctl alloc`):
//! the controller is the only party both the client and the agent reach, so it relays.
//!
//! A client's `Interact` stream opens a step: the controller checks who may
//! (`Cluster::step_target`), keeps the client's streams under a fresh random number,
//! and sends the job's node a `StepSession` command with that number. The agent starts
//! the step and calls `StepIo`, signed like every agent request, naming the number; from
//! then on the client's input goes to the agent and the agent's output to the client.
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
/// Output messages queued for a client before the agent's side waits.
const OUTPUT_QUEUE: usize = 64;

/// A client's step whose agent has not called yet.
struct Pending {
    node: String,
    user: String,
    input: Streaming<pb::StepInput>,
    output: mpsc::Sender<Result<pb::StepOutput, Status>>,
}

/// The steps waiting for their agents, by number.
#[derive(Default)]
pub struct Relay {
    pending: Mutex<HashMap<Vec<u8>, Pending>>,
}

fn error(message: String) -> pb::StepOutput {
    pb::StepOutput {
        output: Some(Output::Error(message)),
    }
}

/// What a client receives.
pub type ClientStream = tokio_stream::wrappers::ReceiverStream<Result<pb::StepOutput, Status>>;

impl Controller {
    /// A client's `Interact`: checks the opening, sends the job's node the step and
    /// answers the stream the step's output will come on.
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
        gpuctl_core::interactive::check_open(&open).map_err(status)?;
        let job_id = open.job_id;
        let (target, link) = {
            let c = self.lock();
            let target = c.step_target(&caller.actor(), job_id).map_err(status)?;
            let link = c.links.get(&target.node).map(|l| l.tx.clone());
            (target, link)
        };
        let link = link.ok_or_else(|| {
            Status::unavailable(format!("node {} is not attached now", target.node))
        })?;
        let step: [u8; 16] = rand::random();
        let (tx, rx) = mpsc::channel(OUTPUT_QUEUE);
        {
            let mut p = self.steps.pending.lock();
            let mine = p.values().filter(|s| s.user == caller.user).count();
            if p.len() >= MAX_PENDING || mine >= MAX_PENDING_PER_USER {
                return Err(Status::resource_exhausted(format!(
                    "too many steps wait for their nodes ({mine} of yours, {} in all); try again shortly",
                    p.len()
                )));
            }
            p.insert(
                step.to_vec(),
                Pending {
                    node: target.node.clone(),
                    user: caller.user.clone(),
                    input,
                    output: tx,
                },
            );
        }
        let cmd = pb::AgentCommand {
            command: Some(pb::agent_command::Command::Step(pb::StepSession {
                job_id,
                attempt: target.attempt,
                step: step.to_vec(),
                open: Some(open),
            })),
            ..pb::AgentCommand::default()
        };
        if link.send(Ok(Box::new(cmd))).await.is_err() {
            self.steps.pending.lock().remove(&step[..]);
            return Err(Status::unavailable(format!(
                "node {} went away",
                target.node
            )));
        }
        tracing::info!(job = job_id, node = %target.node, user = %caller.user, "step opened from outside the job");
        let ctl = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(OPEN_TIMEOUT).await;
            let lost = ctl.steps.pending.lock().remove(&step[..]);
            if let Some(p) = lost {
                let why = format!(
                    "the agent on {} did not open the step within {} s",
                    p.node,
                    OPEN_TIMEOUT.as_secs()
                );
                let _ = p.output.send(Ok(error(why))).await;
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
        let _ = p.output.send(Ok(node)).await;
        let out = p.output;
        tokio::spawn(async move {
            let mut ended = false;
            while let Ok(Some(m)) = from_agent.message().await {
                match &m.output {
                    Some(Output::ExitCode(_) | Output::Error(_)) => ended = true,
                    Some(Output::Stdout(_) | Output::Stderr(_)) => {}
                    // Only the agent's opening names a node or a step.
                    Some(Output::Hello(_) | Output::Node(_)) | None => continue,
                }
                if out.send(Ok(m)).await.is_err() || ended {
                    break;
                }
            }
            if !ended {
                let why = "the step's agent went away before the step ended".to_string();
                let _ = out.send(Ok(error(why))).await;
            }
        });
        // The client's input, but for its opening; its end (the client gone) is the
        // stream's end, which the agent takes as a hang-up.
        Ok(p.input.filter_map(|m| match m {
            Ok(pb::StepInput {
                input: Some(Input::Open(_)) | None,
            })
            | Err(_) => None,
            Ok(m) => Some(Ok(m)),
        }))
    }
}
