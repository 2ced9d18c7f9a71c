//! The gRPC services: `Controller` for users and `AgentLink` for agents. Each handler
//! authenticates the caller, calls the `Controller`, and encodes; no scheduling or state
//! logic lives here.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use gpuctl_proto::guard::TcpPeer;
use gpuctl_proto::{self as pb, agent_link_server, controller_server};
use prost::Message as _;
use tokio::sync::mpsc;
use tonic::transport::server::UdsConnectInfo;

use crate::pki::Via;
use tonic::{Request, Response, Status};

use crate::auth::{Caller, redact};
use crate::controller::Controller;
use crate::controller::users::JobAction;

pub struct UserApi(pub Arc<Controller>);
pub struct AgentApi(pub Arc<Controller>);

impl UserApi {
    /// A listing's filter, checked: bounded lists and known states.
    fn filter(&self, r: &pb::ListJobsRequest) -> Result<gpuctl_core::filter::JobFilter, Status> {
        let max = self.0.config().limits.max_list_len;
        let n =
            r.users.len() + r.states.len() + r.names.len() + r.accounts.len() + r.partitions.len();
        if n > max {
            return Err(Status::invalid_argument(format!(
                "{n} filter values, over the limit of {max} (limits.max_list_len)"
            )));
        }
        if let Some(bad) = r
            .states
            .iter()
            .find(|&&s| pb::JobState::try_from(s).is_err() || s == 0)
        {
            return Err(Status::invalid_argument(format!(
                "unknown job state {bad} in the filter"
            )));
        }
        gpuctl_proto::wire::job_filter(r)
    }

    /// Who sent `req`, at the leader: a follower of replicated controllers answers
    /// UNAVAILABLE with where the leader is (clients go there).
    async fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        self.0.require_leader()?;
        self.identify(req).await
    }

    /// A hold, release, requeue or the end of an allocation (`action` of the request)
    /// of the job `req` names, by its caller: the job as it is after.
    async fn act(
        &self,
        req: Request<pb::JobActionRequest>,
        action: impl FnOnce(&pb::JobActionRequest) -> JobAction,
    ) -> Result<Response<pb::Job>, Status> {
        let caller = self.caller(&req).await?;
        let req = req.into_inner();
        let id = self.0.action_target(&req)?;
        let job = self.0.job_action(&caller, id, action(&req)).await?;
        Ok(Response::new(job))
    }

    /// Who sent `req`: the peer's uid on the Unix socket, else the API token's user.
    async fn identify<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        if let Some(info) = req.extensions().get::<UdsConnectInfo>() {
            let cred = info.peer_cred.ok_or_else(|| {
                Status::unauthenticated("cannot read the caller's credentials from the socket")
            })?;
            let uid = cred.uid();
            let user = crate::auth::user_name(uid).await.ok_or_else(|| {
                Status::permission_denied(format!(
                    "uid {uid} has no user name on the controller's host"
                ))
            })?;
            return Ok(Caller {
                admin: uid == 0 || self.0.is_admin(&user),
                user,
                uid: Some(uid),
                gid: Some(cred.gid()),
                via: "unix-socket",
            });
        }
        let header = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                Status::unauthenticated(
                    "no credentials: over TCP, pass an API token (GPUCTL_TOKEN or --token-file; an admin creates one with `gpuctl admin token create --user NAME`), or use the controller's Unix socket (--controller unix:PATH)",
                )
            })?;
        if req.extensions().get::<TcpPeer>().is_some_and(|p| !p.tls) && !self.0.pki().clear_tokens()
        {
            return Err(Status::unauthenticated(
                "API tokens are accepted over TLS only: this controller serves plain TCP (--insecure-shared-key); use the Unix socket, or start gpuctld without --insecure-shared-key (or, knowingly, with --insecure)",
            ));
        }
        let secret = header.strip_prefix("Bearer ").unwrap_or(header).trim();
        let user = self.0.token_user(secret).ok_or_else(|| {
            BAD_TOKEN.note(|n, secs| {
                tracing::warn!(
                    "request with an unknown or revoked token refused ({n} in the last {secs} s, this one included)"
                );
            });
            Status::unauthenticated("unknown or revoked API token")
        })?;
        // The connection proved who it is: out of the unauthenticated caps and deadline.
        if let Some(peer) = req.extensions().get::<TcpPeer>() {
            peer.auth.authenticated();
        }
        Ok(Caller {
            admin: self.0.is_admin(&user),
            user,
            uid: None,
            gid: None,
            via: "token",
        })
    }
}

/// Jobs per `ListJobsPaged` page.
const PAGE: usize = 250;

#[tonic::async_trait]
impl controller_server::Controller for UserApi {
    type ListJobsPagedStream =
        tokio_stream::wrappers::ReceiverStream<Result<pb::ListJobsResponse, Status>>;

    async fn list_jobs_paged(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<Self::ListJobsPagedStream>, Status> {
        let caller = self.caller(&req).await?;
        let filter = self.filter(req.get_ref())?;
        let all = filter.all;
        let ctl = self.0.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            // The ids now; each page is copied under the lock on its own, so the lock is
            // never held for the whole queue.
            let ids = ctl.job_ids(&filter);
            for chunk in ids.chunks(PAGE) {
                let page = ctl.page_by_id(chunk, all, &caller);
                if tx.send(Ok(page)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn submit(
        &self,
        req: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        // What admission changed (right-sizing, co-location), as the state noted it.
        let (job_id, notes) = self
            .0
            .submit_noted(&caller, r.spec, &r.request_id, r.hold)
            .await?;
        Ok(Response::new(pb::SubmitResponse { job_id, notes }))
    }

    async fn list_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let caller = self.caller(&req).await?;
        let filter = self.filter(req.get_ref())?;
        let mut jobs = self.0.list_jobs(&filter);
        jobs.iter_mut().for_each(|j| redact(&caller, j));
        Ok(Response::new(pb::ListJobsResponse {
            jobs,
            ..Default::default()
        }))
    }

    async fn get_job(&self, req: Request<pb::GetJobRequest>) -> Result<Response<pb::Job>, Status> {
        let caller = self.caller(&req).await?;
        let mut job = self.0.get_job(req.into_inner().job_id)?;
        redact(&caller, &mut job);
        Ok(Response::new(job))
    }

    async fn cancel(
        &self,
        req: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let caller = self.caller(&req).await?;
        let req = req.into_inner();
        let max = self.0.config().limits.max_list_len;
        if req.job_ids.len() + req.tasks.len() > max {
            return Err(Status::invalid_argument(format!(
                "{} jobs and tasks in one cancel, over the most allowed ({max}, limits.max_list_len)",
                req.job_ids.len() + req.tasks.len()
            )));
        }
        let filter = req.filter.as_ref();
        let results = if req.signal.is_empty() {
            (self.0.cancel(&caller, &req.job_ids, &req.tasks, filter)).await?
        } else {
            (self
                .0
                .signal(&caller, &req.job_ids, &req.tasks, filter, &req.signal))
            .await?
        };
        Ok(Response::new(pb::CancelResponse { results }))
    }

    async fn list_nodes(
        &self,
        req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        self.caller(&req).await?;
        let names = &req.get_ref().names;
        let max = self.0.config().limits.max_list_len;
        if names.len() > max {
            return Err(Status::invalid_argument(format!(
                "{} node names asked for, over the limit of {max} (limits.max_list_len)",
                names.len()
            )));
        }
        Ok(Response::new(self.0.list_nodes(names)))
    }

    async fn drain_node(
        &self,
        req: Request<pb::DrainNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        self.caller(&req).await?.require_admin("drain nodes")?;
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
        self.caller(&req).await?;
        Ok(Response::new(
            self.0.explain(req.into_inner().job_id).await?,
        ))
    }

    async fn priorities(
        &self,
        req: Request<pb::PrioritiesRequest>,
    ) -> Result<Response<pb::PrioritiesResponse>, Status> {
        self.caller(&req).await?;
        Ok(Response::new(pb::PrioritiesResponse {
            jobs: self.0.priorities(),
        }))
    }

    async fn share(
        &self,
        req: Request<pb::ShareRequest>,
    ) -> Result<Response<pb::ShareResponse>, Status> {
        self.caller(&req).await?;
        Ok(Response::new(self.0.share()))
    }

    async fn windows(
        &self,
        req: Request<pb::WindowsRequest>,
    ) -> Result<Response<pb::WindowsResponse>, Status> {
        self.caller(&req).await?;
        Ok(Response::new(self.0.windows()))
    }

    type InteractStream = crate::controller::ClientStream;

    async fn interact(
        &self,
        req: Request<tonic::Streaming<pb::StepInput>>,
    ) -> Result<Response<Self::InteractStream>, Status> {
        let caller = self.caller(&req).await?;
        Ok(Response::new(
            self.0.interact(&caller, req.into_inner()).await?,
        ))
    }

    async fn release_allocation(
        &self,
        req: Request<pb::JobActionRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        self.act(req, |r| JobAction::ReleaseAllocation(r.exit_code))
            .await
    }

    async fn partitions(
        &self,
        req: Request<pb::PartitionsRequest>,
    ) -> Result<Response<pb::PartitionsResponse>, Status> {
        self.caller(&req).await?;
        Ok(Response::new(self.0.partitions()))
    }

    async fn hold(&self, req: Request<pb::JobActionRequest>) -> Result<Response<pb::Job>, Status> {
        self.act(req, |_| JobAction::Hold).await
    }

    async fn release(
        &self,
        req: Request<pb::JobActionRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        self.act(req, |_| JobAction::Release).await
    }

    async fn requeue(
        &self,
        req: Request<pb::JobActionRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        self.act(req, |_| JobAction::Requeue).await
    }

    async fn update_job(
        &self,
        req: Request<pb::UpdateJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        let update = gpuctl_core::update::JobUpdate {
            time_limit_secs: r.time_limit_secs,
            partition: r.partition,
            name: r.name,
            comment: r.comment,
            priority: r.priority,
        };
        Ok(Response::new(
            self.0.update_job(&caller, r.job_id, update).await?,
        ))
    }

    async fn resume_node(
        &self,
        req: Request<pb::ResumeNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        self.caller(&req).await?.require_admin("resume nodes")?;
        Ok(Response::new(
            self.0.set_drain(&req.into_inner().name, None).await?,
        ))
    }

    async fn controllers(
        &self,
        req: Request<pb::ControllersRequest>,
    ) -> Result<Response<pb::ControllersResponse>, Status> {
        self.identify(&req).await?;
        Ok(Response::new(self.0.controllers()))
    }

    async fn change_controllers(
        &self,
        req: Request<pb::ChangeControllersRequest>,
    ) -> Result<Response<pb::ControllersResponse>, Status> {
        let caller = self.caller(&req).await?;
        caller.require_admin("change the controllers")?;
        Ok(Response::new(
            self.0.change_controllers(req.into_inner()).await?,
        ))
    }

    async fn who_am_i(
        &self,
        req: Request<pb::WhoAmIRequest>,
    ) -> Result<Response<pb::WhoAmIResponse>, Status> {
        let c = self.identify(&req).await?;
        Ok(Response::new(pb::WhoAmIResponse {
            user: c.user,
            admin: c.admin,
            via: c.via.into(),
        }))
    }

    async fn reconfigure(
        &self,
        req: Request<pb::ReconfigureRequest>,
    ) -> Result<Response<pb::ReconfigureResponse>, Status> {
        let caller = self.caller(&req).await?;
        caller.require_admin("reconfigure the controller")?;
        let ctl = self.0.clone();
        let (path, done) = tokio::task::spawn_blocking(move || ctl.reconfigure())
            .await
            .map_err(|e| Status::internal(format!("reconfigure failed: {e}")))?
            .map_err(|why| {
                Status::failed_precondition(format!("the configuration was not changed: {why}"))
            })?;
        Ok(Response::new(pb::ReconfigureResponse {
            path,
            applied: done.applied,
            needs_restart: done.needs_restart,
        }))
    }

    async fn create_token(
        &self,
        req: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        Ok(Response::new(
            self.0.create_token(&caller, &r.user, &r.note).await?,
        ))
    }

    async fn list_tokens(
        &self,
        req: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        let caller = self.caller(&req).await?;
        Ok(Response::new(pb::ListTokensResponse {
            tokens: self.0.list_tokens(&caller)?,
        }))
    }

    async fn revoke_token(
        &self,
        req: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, Status> {
        let caller = self.caller(&req).await?;
        self.0.revoke_token(&caller, &req.into_inner().id).await?;
        Ok(Response::new(pb::RevokeTokenResponse {}))
    }

    async fn create_join_token(
        &self,
        req: Request<pb::CreateJoinTokenRequest>,
    ) -> Result<Response<pb::CreateJoinTokenResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        Ok(Response::new(self.0.create_join_token(&caller, &r).await?))
    }

    async fn revoke_node(
        &self,
        req: Request<pb::RevokeNodeRequest>,
    ) -> Result<Response<pb::RevokeNodeResponse>, Status> {
        let caller = self.caller(&req).await?;
        let r = req.into_inner();
        Ok(Response::new(self.0.revoke_node(&caller, &r).await?))
    }
}

/// The command stream handed to an agent. When tonic drops it (the agent went away),
/// the node is marked disconnected.
pub struct CommandStream {
    rx: mpsc::Receiver<Result<Box<pb::AgentCommand>, Status>>,
    ctl: Arc<Controller>,
    node: String,
    generation: u64,
    /// Number of the last command sent in this session.
    seq: u64,
}

impl Stream for CommandStream {
    type Item = Result<pb::SignedCommand, Status>;

    /// Each command is numbered and signed as it leaves; once the session is no longer
    /// the node's live one, the stream ends and nothing queued for it is sent.
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match this.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(Some(Ok(cmd))) => {
                this.seq += 1;
                match this
                    .ctl
                    .sign_command(&this.node, this.generation, this.seq, *cmd)
                {
                    Some(signed) => Poll::Ready(Some(Ok(signed))),
                    None => {
                        tracing::info!(node = %this.node, "session ended; its queued commands are dropped");
                        Poll::Ready(None)
                    }
                }
            }
        }
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
    type HeartbeatsStream =
        Pin<Box<dyn Stream<Item = Result<pb::HeartbeatResponse, Status>> + Send + 'static>>;

    async fn challenge(
        &self,
        req: Request<pb::ChallengeRequest>,
    ) -> Result<Response<pb::ChallengeResponse>, Status> {
        self.0.require_leader()?;
        let (meta, ext, req) = req.into_parts();
        self.0.verify_agent(
            &Via::of(&ext),
            &meta,
            "challenge",
            &req.node,
            &req.encode_to_vec(),
        )?;
        Ok(Response::new(self.0.challenge(&req.node)))
    }

    type StepIoStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<pb::StepInput, Status>> + Send + 'static>,
    >;

    async fn step_io(
        &self,
        req: Request<tonic::Streaming<pb::StepOutput>>,
    ) -> Result<Response<Self::StepIoStream>, Status> {
        self.0.require_leader()?;
        let (meta, ext, inbound) = req.into_parts();
        let stream = self.0.step_io(&Via::of(&ext), &meta, inbound).await?;
        Ok(Response::new(Box::pin(stream)))
    }

    async fn attach(
        &self,
        req: Request<pb::RegisterRequest>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        self.0.require_leader()?;
        let (meta, ext, req) = req.into_parts();
        let peer = ext.get::<TcpPeer>().and_then(|p| p.addr);
        // The nonce in the (signed) body is the session; Attach itself names none.
        self.0.verify_agent(
            &Via::of(&ext),
            &meta,
            "attach",
            &req.node,
            &req.encode_to_vec(),
        )?;
        let node = req.node.clone();
        let (rx, generation) = self.0.connect(req, peer).await?;
        Ok(Response::new(CommandStream {
            rx,
            ctl: self.0.clone(),
            node,
            generation,
            seq: 0,
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        self.0.require_leader()?;
        let (meta, ext, req) = req.into_parts();
        let signed = self.0.verify_agent(
            &Via::of(&ext),
            &meta,
            "heartbeat",
            &req.node,
            &req.encode_to_vec(),
        )?;
        Ok(Response::new(self.0.signed_heartbeat(req, &signed).await?))
    }

    /// Each heartbeat is answered as the stream is polled (no task per agent); the first
    /// that fails its checks ends the stream with that status.
    async fn heartbeats(
        &self,
        req: Request<tonic::Streaming<pb::SignedHeartbeat>>,
    ) -> Result<Response<Self::HeartbeatsStream>, Status> {
        self.0.require_leader()?;
        let (_, ext, inbound) = req.into_parts();
        let state = (inbound, self.0.clone(), false);
        let out = futures::stream::unfold(state, move |(mut inbound, ctl, failed)| {
            let ext = ext.clone();
            async move {
                if failed {
                    return None;
                }
                // An error here is the agent going away: the stream just ends.
                let m = inbound.message().await.ok()??;
                let answer = ctl.streamed_heartbeat(&Via::of(&ext), &m).await;
                let failed = answer.is_err();
                Some((answer, (inbound, ctl, failed)))
            }
        });
        Ok(Response::new(Box::pin(out)))
    }

    async fn report_job(
        &self,
        req: Request<pb::JobReport>,
    ) -> Result<Response<pb::JobReportAck>, Status> {
        self.0.require_leader()?;
        let (meta, ext, req) = req.into_parts();
        let signed = self.0.verify_agent(
            &Via::of(&ext),
            &meta,
            "report",
            &req.node,
            &req.encode_to_vec(),
        )?;
        self.0.check_session(&req.node, &signed)?;
        Ok(Response::new(self.0.report(req).await?))
    }

    async fn report_jobs(
        &self,
        req: Request<pb::JobReports>,
    ) -> Result<Response<pb::JobReportAcks>, Status> {
        self.0.require_leader()?;
        let (meta, ext, req) = req.into_parts();
        let signed = self.0.verify_agent(
            &Via::of(&ext),
            &meta,
            "reports",
            &req.node,
            &req.encode_to_vec(),
        )?;
        self.0.check_session(&req.node, &signed)?;
        if req.reports.len() > MAX_REPORTS {
            return Err(Status::invalid_argument(format!(
                "{} reports in one request, over the limit of {MAX_REPORTS}",
                req.reports.len()
            )));
        }
        if let Some(r) = req.reports.iter().find(|r| r.node != req.node) {
            return Err(Status::invalid_argument(format!(
                "a report of node {:?} in node {:?}'s request",
                r.node, req.node
            )));
        }
        let acks = self.0.reports(req.reports).await?;
        Ok(Response::new(pb::JobReportAcks { acks }))
    }

    async fn join(
        &self,
        req: Request<pb::JoinRequest>,
    ) -> Result<Response<pb::JoinResponse>, Status> {
        Ok(Response::new(self.join_impl(req).await?))
    }

    async fn renew(
        &self,
        req: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::JoinResponse>, Status> {
        let (meta, ext, req) = req.into_parts();
        Ok(Response::new(
            self.0.renew(&Via::of(&ext), &meta, &req).await?,
        ))
    }
}

impl AgentApi {
    async fn join_impl(&self, req: Request<pb::JoinRequest>) -> Result<pb::JoinResponse, Status> {
        let (_, ext, req) = req.into_parts();
        self.0.join(&Via::of(&ext), &req).await
    }
}

/// The most reports one `ReportJobs` request may carry (an agent sends at most
/// `gpud`'s batch; a node runs far fewer jobs).
const MAX_REPORTS: usize = 4096;

/// Requests with a bad token: anyone can send them, so they are logged a line a period.
static BAD_TOKEN: gpuctl_proto::ratelog::RateLog =
    gpuctl_proto::ratelog::RateLog::new(std::time::Duration::from_secs(10));
