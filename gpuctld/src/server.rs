//! The gRPC services: `Controller` for users and `AgentLink` for agents. Each handler
//! decodes, calls the `Controller`, and encodes; no scheduling or state logic lives here.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use gpuctl_proto::{self as pb, agent_link_server, controller_server};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use crate::controller::Controller;

/// Largest request the controller decodes.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

pub struct UserApi(pub Arc<Controller>);
pub struct AgentApi(pub Arc<Controller>);

#[tonic::async_trait]
impl controller_server::Controller for UserApi {
    async fn submit(
        &self,
        req: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitResponse>, Status> {
        let job_id = self.0.submit(req.into_inner().spec).await?;
        Ok(Response::new(pb::SubmitResponse { job_id }))
    }

    async fn list_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let jobs = self.0.list_jobs(req.into_inner().all);
        Ok(Response::new(pb::ListJobsResponse { jobs }))
    }

    async fn get_job(&self, req: Request<pb::GetJobRequest>) -> Result<Response<pb::Job>, Status> {
        Ok(Response::new(self.0.get_job(req.into_inner().job_id)?))
    }

    async fn cancel(
        &self,
        req: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let results = self.0.cancel(&req.into_inner().job_ids).await?;
        Ok(Response::new(pb::CancelResponse { results }))
    }

    async fn list_nodes(
        &self,
        _req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        Ok(Response::new(self.0.list_nodes()))
    }

    async fn drain_node(
        &self,
        req: Request<pb::DrainNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let r = req.into_inner();
        if r.reason.trim().is_empty() {
            return Err(Status::invalid_argument("drain needs a reason"));
        }
        Ok(Response::new(
            self.0.set_drain(&r.name, Some(r.reason)).await?,
        ))
    }

    async fn explain(
        &self,
        req: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::Explanation>, Status> {
        Ok(Response::new(
            self.0.explain(req.into_inner().job_id).await?,
        ))
    }

    async fn priorities(
        &self,
        _req: Request<pb::PrioritiesRequest>,
    ) -> Result<Response<pb::PrioritiesResponse>, Status> {
        Ok(Response::new(pb::PrioritiesResponse {
            jobs: self.0.priorities(),
        }))
    }

    async fn resume_node(
        &self,
        req: Request<pb::ResumeNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        Ok(Response::new(
            self.0.set_drain(&req.into_inner().name, None).await?,
        ))
    }
}

/// The command stream handed to an agent. When tonic drops it (the agent went away),
/// the node is marked disconnected.
pub struct CommandStream {
    rx: mpsc::Receiver<Result<pb::AgentCommand, Status>>,
    ctl: Arc<Controller>,
    node: String,
    generation: u64,
}

impl Stream for CommandStream {
    type Item = Result<pb::AgentCommand, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for CommandStream {
    fn drop(&mut self) {
        self.ctl.disconnected(&self.node, self.generation);
        self.ctl.wake_scheduler();
    }
}

#[tonic::async_trait]
impl agent_link_server::AgentLink for AgentApi {
    type AttachStream = CommandStream;

    async fn attach(
        &self,
        req: Request<pb::RegisterRequest>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let req = req.into_inner();
        let node = req.node.clone();
        let (rx, generation) = self.0.connect(req).await?;
        Ok(Response::new(CommandStream {
            rx,
            ctl: self.0.clone(),
            node,
            generation,
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let known = self.0.heartbeat(&req.into_inner());
        Ok(Response::new(pb::HeartbeatResponse { known }))
    }

    async fn report_job(
        &self,
        req: Request<pb::JobReport>,
    ) -> Result<Response<pb::JobReportAck>, Status> {
        self.0.report(&req.into_inner()).await?;
        Ok(Response::new(pb::JobReportAck {}))
    }
}
