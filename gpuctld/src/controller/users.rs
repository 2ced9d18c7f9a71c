//! Reading and changing jobs and nodes for users: explain, priorities, cancel, tokens,
//! the node list and drains.

use gpuctl_core::record::{Job, JobState, SlotUse, state_name};
use gpuctl_proto as pb;
use gpuctl_proto::store::StoredToken;
use tonic::Status;

use gpuctl_core::jobs::{owner, presented};
use gpuctl_core::state::live_allocs;
use gpuctl_sched as sched;

use super::{Controller, now_ms, status, store_status};
use crate::auth::Caller;
use gpuctl_core::log::{Applied, Change};

impl Controller {
    /// The metrics' exposition text, from the state now.
    /// Exports a listener's connection counters with the metrics.
    pub fn watch_listener(&self, stats: std::sync::Arc<gpuctl_proto::guard::Stats>) {
        self.metrics.watch_listener(stats);
    }

    pub fn metrics_text(&self) -> String {
        self.raft_metrics();
        let snap = self.snapshot(&self.list_nodes(&[]));
        self.metrics.render(&snap, now_ms())
    }

    /// What the state says now, with `nodes` (a `list_nodes` of every node): the
    /// metrics' and the web page's figures.
    pub fn snapshot(&self, nodes: &pb::ListNodesResponse) -> crate::metrics::Snapshot {
        let mut snap = crate::metrics::Snapshot {
            fragmentation_gpus: nodes.fragmentation_gpus,
            ..Default::default()
        };
        let (mut util_sum, mut sampled) = (0.0, 0u32);
        for n in &nodes.nodes {
            *snap
                .nodes_by_state
                .entry(n.state().as_str_name().to_string())
                .or_default() += 1;
            if n.state() != pb::NodeState::Down {
                snap.gpus_total += n.gpus.len() as u64;
                for g in &n.gpus {
                    snap.mig_instances += g.mig.len() as u64;
                    snap.mig_instances_allocated +=
                        g.mig.iter().filter(|m| m.allocated_to != 0).count() as u64;
                    if let Some(m) = &g.metrics {
                        util_sum += f64::from(m.util_pct).min(100.0);
                        sampled += 1;
                    }
                }
            }
        }
        snap.gpu_util_mean = (sampled > 0).then(|| util_sum / f64::from(sampled));
        // MIG instances by UUID: their profile says their share of the GPU.
        let mig: std::collections::HashMap<&str, &str> = nodes
            .nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .flat_map(|g| &g.mig)
            .map(|m| (m.uuid.as_str(), m.profile.as_str()))
            .collect();
        let up: std::collections::HashSet<&str> = nodes
            .nodes
            .iter()
            .filter(|n| n.state() != pb::NodeState::Down)
            .map(|n| n.name.as_str())
            .collect();
        {
            let c = self.lock();
            snap.mig_reconfigurations = c.mig_state().reconfigurations;
            snap.mig_changing = c.mig_state().changing.len() as u64;
            let mut shared = std::collections::BTreeSet::new();
            for s in c.jobs().all() {
                let j = &s.job;
                let state = state_name(j.state).to_string();
                *snap.jobs_by_state.entry(state).or_default() += 1;
                match j.state {
                    JobState::Pending => {
                        let reason = if j.reason.is_empty() {
                            "None"
                        } else {
                            j.reason.as_str()
                        };
                        let reason = reason.split(':').next().unwrap_or(reason).to_string();
                        *snap.pending_by_reason.entry(reason).or_default() += 1;
                        snap.jobs_by_user.entry(owner(j).to_string()).or_default().1 += 1;
                    }
                    JobState::Running if j.spec.opportunistic => {
                        let borrowed: f64 = live_allocs(j)
                            .flat_map(|a| &a.slots)
                            .map(|s| slot_gpus(s, &mig))
                            .sum();
                        *snap
                            .borrowed_gpus_by_account
                            .entry(j.spec.account.clone())
                            .or_default() += borrowed;
                        snap.jobs_by_user.entry(owner(j).to_string()).or_default().0 += 1;
                    }
                    JobState::Running => {
                        let mut held = 0.0;
                        for a in live_allocs(j) {
                            let on_up = up.contains(a.node.as_str());
                            for s in &a.slots {
                                let g = slot_gpus(s, &mig);
                                held += g;
                                if on_up {
                                    snap.gpus_allocated += g;
                                }
                            }
                        }
                        for s in live_allocs(j).flat_map(|a| &a.slots) {
                            if s.compute_milli < 1000 && !s.uuid.starts_with("MIG-") {
                                snap.share_slots += 1;
                                shared.insert(s.uuid.as_str());
                            }
                        }
                        *snap
                            .running_gpus_by_user
                            .entry(owner(j).to_string())
                            .or_default() += held;
                        snap.jobs_by_user.entry(owner(j).to_string()).or_default().0 += 1;
                        let account = j.spec.account.as_str();
                        *snap
                            .running_gpus_by_account
                            .entry(account.to_string())
                            .or_default() += held;
                    }
                    _ => {}
                }
            }
            snap.shared_gpus = shared.len() as u64;
        }
        snap
    }

    /// Why a job waits, node by node, from a fresh (pure) pass (`gpuctl_core::explain`).
    pub async fn explain(&self, id: u64) -> Result<pb::Explanation, Status> {
        use gpuctl_core::explain::{Explain, PassInput, rendered};
        let now = now_ms();
        let step = self.lock().explain(id, now).map_err(status)?;
        let PassInput {
            base,
            view,
            queue,
            cfg,
        } = match step {
            Explain::Done(out) => return Ok(gpuctl_proto::wire::explanation_pb(out)),
            Explain::Pass(input) => *input,
        };
        let ex = tokio::task::spawn_blocking(move || sched::explain(&view, &queue, &cfg, now, id))
            .await
            .expect("explain panicked")
            .ok_or_else(|| Status::internal("the job was not in the pass"))?;
        Ok(gpuctl_proto::wire::explanation_pb(rendered(base, &ex, now)))
    }

    /// The pending jobs in priority order with their factors (`gpuctl priority`), at
    /// most 100,000.
    pub fn priorities(&self) -> Vec<pb::JobPriority> {
        let jobs = self.lock().priorities(now_ms(), 100_000);
        jobs.into_iter()
            .map(gpuctl_proto::wire::job_priority_pb)
            .collect()
    }

    /// Cancels jobs. Only their owners or an admin may; if any of `ids` is someone
    /// else's, nothing is cancelled.
    pub async fn cancel(
        self: &std::sync::Arc<Self>,
        caller: &Caller,
        ids: &[u64],
        tasks: &[pb::ArrayTask],
        filter: Option<&pb::ListJobsRequest>,
    ) -> Result<Vec<pb::CancelResult>, Status> {
        let filter = cancel_filter(caller, filter)?;
        let (results, out) = self
            .commit(
                |c, _| {
                    let (ids, tasks) = named(c, ids, tasks, filter.as_ref());
                    let actor = caller.actor();
                    Ok((Change::Cancel { actor, ids, tasks }, ()))
                },
                |_, (), answer| match answer.map_err(status)? {
                    Applied::Cancelled(results) => Ok(results),
                    other => unreachable!("a cancel answers its results, not {other:?}"),
                },
            )
            .await?;
        self.deliver(out, true).await.map_err(store_status)?;
        self.settle_cancels_soon();
        Ok(results
            .into_iter()
            .map(gpuctl_proto::wire::cancel_result_pb)
            .collect())
    }

    /// Sends `signal` to the running jobs named (ids, tasks, a filter's matches), which
    /// keep running (`scancel -s USR1`; `gpuctl_core::Cluster::signal_jobs`): nothing
    /// changes in the state, so nothing goes to the journal; the commands leave at once.
    pub async fn signal(
        &self,
        caller: &Caller,
        ids: &[u64],
        tasks: &[pb::ArrayTask],
        filter: Option<&pb::ListJobsRequest>,
        signal: &str,
    ) -> Result<Vec<pb::CancelResult>, Status> {
        let filter = cancel_filter(caller, filter)?;
        let (results, out) = {
            let mut c = self.lock();
            let (ids, tasks) = named(&c, ids, tasks, filter.as_ref());
            let (results, effects) = c
                .signal_jobs(&caller.actor(), &ids, &tasks, signal)
                .map_err(status)?;
            let (sends, wake) = c.route(effects);
            let out = super::Out {
                sends,
                wake,
                wrote: false,
            };
            (results, out)
        };
        self.deliver(out, false).await.map_err(store_status)?;
        Ok(results
            .into_iter()
            .map(gpuctl_proto::wire::cancel_result_pb)
            .collect())
    }

    /// The job a hold, release or requeue names: its id, or an array's task.
    pub fn action_target(&self, req: &pb::JobActionRequest) -> Result<u64, Status> {
        let Some(t) = &req.task else {
            return Ok(req.job_id);
        };
        self.lock()
            .array_task_job(t.array_job_id, t.task_id)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "array {} has no task {} (gpuctl queue -t all lists its tasks)",
                    t.array_job_id, t.task_id
                ))
            })
    }

    /// Holds, releases or requeues one job.
    pub async fn job_action(
        &self,
        caller: &Caller,
        id: u64,
        action: JobAction,
    ) -> Result<pb::Job, Status> {
        self.change_job(caller, id, |actor| Change::Job { actor, id, action })
            .await
    }

    /// Changes a job's time limit, partition, name, comment or nice
    /// (`scontrol update`); answers it as it is now.
    pub async fn update_job(
        &self,
        caller: &Caller,
        id: u64,
        update: gpuctl_core::update::JobUpdate,
    ) -> Result<pb::Job, Status> {
        self.change_job(caller, id, |actor| Change::Update { actor, id, update })
            .await
    }

    /// One change of job `id` by `caller` (`change` made with its actor), answered with
    /// the job as it is after it.
    async fn change_job(
        &self,
        caller: &Caller,
        id: u64,
        change: impl FnOnce(gpuctl_core::Actor) -> Change,
    ) -> Result<pb::Job, Status> {
        let (job, out) = self
            .commit(
                |_, _| Ok((change(caller.actor()), ())),
                |c, (), done| {
                    done.map_err(status)?;
                    Ok((c.jobs().job(id))
                        .map(super::listing::presented_pb)
                        .unwrap_or_default())
                },
            )
            .await?;
        self.deliver(out, true).await.map_err(store_status)?;
        Ok(job)
    }

    /// The partitions, their nodes and jobs (`gpuctl partitions`).
    pub fn partitions(&self) -> pb::PartitionsResponse {
        pb::PartitionsResponse {
            partitions: (self.lock().partition_rows().into_iter())
                .map(gpuctl_proto::wire::partition_row_pb)
                .collect(),
        }
    }

    /// Time-of-day windows now (`gpuctl windows`).
    pub fn windows(&self) -> pb::WindowsResponse {
        gpuctl_proto::wire::windows_pb(self.lock().windows_answer(now_ms()))
    }

    /// Fair share per account and user (`gpuctl share`).
    pub fn share(&self) -> pb::ShareResponse {
        gpuctl_proto::wire::share_pb(self.lock().share_answer())
    }

    // ------------------------------------------------------------ users and tokens

    /// Whether `user` is an admin: root and the users the config names.
    pub fn is_admin(&self, user: &str) -> bool {
        user == "root" || self.config().admins.iter().any(|a| a == user)
    }

    /// The user a token secret belongs to.
    pub fn token_user(&self, secret: &str) -> Option<String> {
        self.pki.token_user(secret)
    }

    pub async fn create_token(
        &self,
        caller: &Caller,
        user: &str,
        note: &str,
    ) -> Result<pb::CreateTokenResponse, Status> {
        caller.require_admin("create tokens")?;
        if !crate::auth::valid_user_name(user) {
            return Err(Status::invalid_argument(format!(
                "{user:?} is not a valid user name"
            )));
        }
        // A token for a user that exists nowhere would submit jobs no node can run.
        if !matches!(nix::unistd::User::from_name(user), Ok(Some(_))) {
            return Err(Status::invalid_argument(format!(
                "user {user:?} does not exist on the controller's host (create it, or check the spelling)"
            )));
        }
        let (id, secret) = crate::auth::new_token();
        let now = now_ms();
        let t = StoredToken {
            id: id.clone(),
            user: user.to_string(),
            hash: crate::auth::token_hash(&secret),
            created_ms: now,
            note: note.chars().take(200).collect(),
        };
        use gpuctl_proto::store::log_credential::Change as Credential;
        self.record(now, Credential::ApiToken(t)).await?;
        tracing::info!(by = %caller.user, user, id, "token created");
        Ok(pb::CreateTokenResponse {
            token: secret,
            id,
            user: user.to_string(),
        })
    }

    pub fn list_tokens(&self, caller: &Caller) -> Result<Vec<pb::TokenInfo>, Status> {
        caller.require_admin("list tokens")?;
        Ok((self.pki.with(|c| c.api.list()))
            .into_iter()
            .map(|t| pb::TokenInfo {
                id: t.id,
                user: t.user,
                created_ms: t.created_ms,
                note: t.note,
            })
            .collect())
    }

    pub async fn revoke_token(&self, caller: &Caller, id: &str) -> Result<(), Status> {
        caller.require_admin("revoke tokens")?;
        use gpuctl_proto::store::log_credential::Change as Credential;
        (self.record(now_ms(), Credential::ApiTokenRevoked(id.to_string()))).await?;
        tracing::info!(by = %caller.user, id, "token revoked");
        Ok(())
    }

    /// The nodes named (all of them when `names` is empty), with the cluster's
    /// fragmentation when all were asked for.
    pub fn list_nodes(&self, names: &[String]) -> pb::ListNodesResponse {
        let listing = self.lock().list_nodes(names);
        gpuctl_proto::wire::listing_pb(listing)
    }

    pub async fn set_drain(&self, name: &str, drain: Option<String>) -> Result<pb::Node, Status> {
        let (node, out) = self
            .commit(
                |_, _| {
                    let node = name.to_string();
                    Ok((
                        Change::Drain {
                            node,
                            reason: drain,
                        },
                        (),
                    ))
                },
                |_, (), row| match row.map_err(status)? {
                    Applied::Node(row) => Ok(*row),
                    other => unreachable!("a drain answers its node, not {other:?}"),
                },
            )
            .await?;
        self.deliver(out, true).await.map_err(store_status)?;
        Ok(gpuctl_proto::wire::node_pb(node))
    }
}

/// What `job_action` does.
pub use gpuctl_core::log::JobAction;

impl Controller {
    /// The jobs the web page shows, newest first: every running job, up to
    /// `max_pending` pending ones, and up to `max_done` that ended at or after
    /// `ended_since_ms`.
    pub fn web_jobs(&self, ended_since_ms: i64, max_pending: usize, max_done: usize) -> Vec<Job> {
        let c = self.lock();
        let mut live = Vec::new();
        let mut pending = 0;
        let mut done = Vec::new();
        for s in c.jobs().newest() {
            let j = &s.job;
            match j.state {
                JobState::Running => live.push(presented(j)),
                JobState::Pending if pending < max_pending => {
                    pending += 1;
                    live.push(presented(j));
                }
                JobState::Pending => {}
                _ if j.end_time_ms >= ended_since_ms && done.len() < max_done => {
                    done.push(presented(j));
                }
                _ => {}
            }
        }
        live.extend(done);
        live
    }
}

/// The GPUs a slot holds: the one definition behind `gpuctl_gpus_allocated`, the per
/// user and per account running GPUs and the web page. A whole GPU is 1, a share its
/// compute fraction, a MIG instance its compute slices of seven (3g.40gb: 3/7), as
/// fair share charges them.
fn slot_gpus(s: &SlotUse, mig: &std::collections::HashMap<&str, &str>) -> f64 {
    match mig.get(s.uuid.as_str()) {
        Some(profile) => gpuctl_sched::fairshare::mig_fraction(profile),
        None => f64::from(s.compute_milli.min(1000)) / 1000.0,
    }
}

/// A cancel's (or a signal's) filter, for `caller`: unfinished jobs, their own unless
/// they are an admin (`JobFilter::for_cancel`).
fn cancel_filter(
    caller: &Caller,
    filter: Option<&pb::ListJobsRequest>,
) -> Result<Option<gpuctl_core::filter::JobFilter>, Status> {
    filter
        .map(|f| {
            let f = gpuctl_proto::wire::job_filter(f)?;
            f.for_cancel(&caller.actor()).map_err(status)
        })
        .transpose()
}

/// The jobs a cancel or a signal names: its ids and the filter's matches, and its tasks.
fn named(
    c: &gpuctl_core::Cluster,
    ids: &[u64],
    tasks: &[pb::ArrayTask],
    filter: Option<&gpuctl_core::filter::JobFilter>,
) -> (Vec<u64>, Vec<gpuctl_core::view::TaskRef>) {
    let mut ids = ids.to_vec();
    if let Some(f) = filter {
        ids.extend(c.active_matching(f));
    }
    (
        ids,
        tasks.iter().map(gpuctl_proto::wire::task_ref).collect(),
    )
}
