//! Reading and changing jobs and nodes for users: explain, priorities, cancel, tokens,
//! the node list and drains.

use std::time::{Duration, UNIX_EPOCH};

use gpuctl_proto::store::StoredToken;
use gpuctl_proto::{self as pb, JobState};
use tonic::Status;

use super::*;
use crate::auth::Caller;

impl Controller {
    /// The metrics' exposition text, from the state now.
    pub fn metrics_text(&self) -> String {
        let nodes = self.list_nodes(&[]);
        let mut snap = crate::metrics::Snapshot {
            fragmentation_gpus: nodes.fragmentation_gpus,
            ..Default::default()
        };
        for n in &nodes.nodes {
            *snap
                .nodes_by_state
                .entry(n.state().as_str_name().to_string())
                .or_default() += 1;
            if n.state() != pb::NodeState::Down {
                snap.gpus_total += n.gpus.len() as u64;
                snap.gpus_allocated += n
                    .gpus
                    .iter()
                    .map(|g| g.compute_allocated_milli.min(1000) as f64 / 1000.0)
                    .sum::<f64>();
            }
        }
        {
            let c = self.lock();
            for s in c.jobs.all() {
                let j = job_of(s);
                let state = j.state().as_str_name().to_string();
                *snap.jobs_by_state.entry(state).or_default() += 1;
                match j.state() {
                    JobState::Pending => {
                        let reason = if j.reason.is_empty() {
                            "None"
                        } else {
                            j.reason.as_str()
                        };
                        let reason = reason.split(':').next().unwrap_or(reason).to_string();
                        *snap.pending_by_reason.entry(reason).or_default() += 1;
                    }
                    JobState::Running => {
                        let held: f64 = live_allocs(j)
                            .flat_map(|a| &a.slots)
                            .map(|s| f64::from(s.compute_milli.min(1000)) / 1000.0)
                            .sum();
                        *snap
                            .running_gpus_by_user
                            .entry(owner(j).to_string())
                            .or_default() += held;
                    }
                    _ => {}
                }
            }
        }
        self.metrics.render(&snap, now_ms())
    }

    /// Why a job waits, node by node, from a fresh (pure) pass.
    pub async fn explain(&self, id: u64) -> Result<pb::Explanation, Status> {
        let job = self.get_job(id)?;
        let mut out = pb::Explanation {
            job_id: id,
            state: job.state,
            reason: job.reason.clone(),
            ..pb::Explanation::default()
        };
        if job.state() != JobState::Pending {
            out.summary = match job.state() {
                JobState::Running => format!("running on {}", job.node),
                s => format!("finished: {}", s.as_str_name()),
            };
            return Ok(out);
        }
        let (view, queue, cfg, _) = self.snapshot().map_err(store_status)?;
        if !queue.iter().any(|p| p.id == id) {
            // Left out of passes: it waits for other jobs.
            let deps = job
                .spec
                .as_ref()
                .map(|s| {
                    s.dependencies
                        .iter()
                        .map(|d| format!("{:?} {}", d.kind(), d.job_id))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            out.reason = "Dependency".into();
            out.summary = format!("waits for its dependencies ({deps})");
            return Ok(out);
        }
        let now = now_ms();
        let ex = tokio::task::spawn_blocking(move || sched::explain(&view, &queue, &cfg, now, id))
            .await
            .expect("explain panicked")
            .ok_or_else(|| Status::internal("the job was not in the pass"))?;
        out.rank = ex.rank as u32;
        out.priority = ex.priority;
        out.nodes = ex
            .nodes
            .iter()
            .map(|(n, m)| pb::NodeExplain {
                node: n.clone(),
                reason: m.as_ref().map(describe_miss).unwrap_or_default(),
            })
            .collect();
        match &ex.outcome {
            Ok(start) => {
                out.reason = "None".into();
                out.summary = format!(
                    "fits now on {}; it starts at the next pass",
                    start
                        .allocs
                        .iter()
                        .map(|a| a.node.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                );
                out.expected_start_ms = now;
            }
            Err(w) => {
                out.reason = w.reason.to_string();
                out.expected_start_ms = w.reservation.as_ref().map_or(0, |r| r.start);
                out.summary = match &w.reason {
                    sched::Blocked::Resources => "waits for resources held by running jobs".into(),
                    sched::Blocked::Priority { behind } => {
                        format!(
                            "would fit now, but the slots are reserved for higher-priority job {behind}"
                        )
                    }
                    sched::Blocked::NodesUnavailable => {
                        "only nodes that are down or drained could run it".into()
                    }
                    sched::Blocked::Infeasible => "no node could ever run it".into(),
                    sched::Blocked::BeyondDepth => {
                        "past the reservation depth: starts only when it fits now".into()
                    }
                };
                if let Some(r) = &w.reservation {
                    out.summary.push_str(&format!(
                        "; reserved on {}",
                        r.allocs
                            .iter()
                            .map(|a| a.node.as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    ));
                }
            }
        }
        Ok(out)
    }

    pub fn priorities(&self) -> Vec<pb::JobPriority> {
        let Ok((view, queue, cfg, _)) = self.snapshot() else {
            return Vec::new();
        };
        let c = self.lock();
        let now = now_ms();
        let norm = sched::size_norm(&view);
        let mut out: Vec<pb::JobPriority> = sched::priority::rank(&queue, &cfg.weights, now, norm)
            .into_iter()
            .map(|(j, _)| {
                let b = sched::priority::breakdown(j, &cfg.weights, now, norm);
                pb::JobPriority {
                    job_id: j.id,
                    user: c
                        .jobs
                        .job(j.id)
                        .and_then(|j| j.spec.as_ref())
                        .map(|s| s.user.clone())
                        .unwrap_or_default(),
                    total: b.total,
                    factors: b
                        .factors
                        .iter()
                        .map(|(f, v)| (f.name().to_string(), *v))
                        .collect(),
                }
            })
            .collect();
        out.truncate(100_000);
        out
    }

    /// Cancels jobs. Only their owners or an admin may; if any of `ids` is someone
    /// else's, nothing is cancelled.
    pub async fn cancel(
        &self,
        caller: &Caller,
        ids: &[u64],
    ) -> Result<Vec<pb::CancelResult>, Status> {
        let mut results = Vec::new();
        let mut kills = Vec::new();
        {
            let mut c = self.lock();
            if !caller.admin {
                let foreign: Vec<String> = ids
                    .iter()
                    .filter_map(|id| c.jobs.job(*id).map(|j| (id, owner(j))))
                    .filter(|(_, o)| *o != caller.user)
                    .map(|(id, o)| format!("job {id} belongs to {o}"))
                    .collect();
                if !foreign.is_empty() {
                    return Err(caller.deny(&format!(
                        "only a job's owner or an admin may cancel it ({})",
                        foreign.join(", ")
                    )));
                }
            }
            for &id in ids {
                let result = |ok: bool, msg: &str| pb::CancelResult {
                    job_id: id,
                    ok,
                    message: msg.to_string(),
                };
                let Some(j) = c.jobs.job(id) else {
                    results.push(result(false, "no such job"));
                    continue;
                };
                match j.state() {
                    JobState::Pending => {
                        let cancel = Transition::Finish {
                            state: JobState::Cancelled,
                            exit_code: None,
                            reason: format!("cancelled while pending by {}", caller.user),
                        };
                        c.jobs
                            .transition(id, cancel, now_ms())
                            .expect("pending jobs can be cancelled");
                        results.push(result(true, "removed from the queue"));
                    }
                    JobState::Running => {
                        let nodes: Vec<String> = live_allocs(j).map(|a| a.node.clone()).collect();
                        let attempt = j.attempt;
                        c.jobs.edit(id, |s| s.cancel_requested = true);
                        let mut all_connected = true;
                        for node in nodes {
                            match c.conns.get(&node) {
                                Some(conn) => kills.push((
                                    conn.tx.clone(),
                                    self.kill_cmd(
                                        id,
                                        attempt,
                                        &format!("cancelled by {}", caller.user),
                                    ),
                                )),
                                None => all_connected = false,
                            }
                        }
                        results.push(result(
                            true,
                            if all_connected {
                                "killing"
                            } else {
                                "killing; a node is not connected and kills it when its agent returns"
                            },
                        ));
                    }
                    s => results.push(result(
                        false,
                        &format!("already finished ({})", s.as_str_name()),
                    )),
                }
            }
            self.persist(&mut c).map_err(store_status)?;
        }
        self.store.flush().await.map_err(store_status)?;
        for (tx, cmd) in kills {
            let _ = tx.send(Ok(cmd)).await;
        }
        self.wake_scheduler();
        Ok(results)
    }

    // ------------------------------------------------------------ users and tokens

    /// Whether `user` is an admin: root and the users the config names.
    pub fn is_admin(&self, user: &str) -> bool {
        user == "root" || self.config.admins.iter().any(|a| a == user)
    }

    /// The user a token secret belongs to.
    pub fn token_user(&self, secret: &str) -> Option<String> {
        self.lock().tokens.user_of(secret).map(str::to_string)
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
        let t = StoredToken {
            id: id.clone(),
            user: user.to_string(),
            hash: crate::auth::token_hash(&secret),
            created_ms: now_ms(),
            note: note.chars().take(200).collect(),
        };
        self.store.put_token(&t).map_err(store_status)?;
        self.lock().tokens.insert(t);
        self.store.flush().await.map_err(store_status)?;
        tracing::info!(by = %caller.user, user, id, "token created");
        Ok(pb::CreateTokenResponse {
            token: secret,
            id,
            user: user.to_string(),
        })
    }

    pub fn list_tokens(&self, caller: &Caller) -> Result<Vec<pb::TokenInfo>, Status> {
        caller.require_admin("list tokens")?;
        Ok(self
            .lock()
            .tokens
            .list()
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
        let removed = self.lock().tokens.remove(id);
        if removed.is_none() {
            return Err(Status::not_found(format!("no token with id {id:?}")));
        }
        self.store.delete_token(id).map_err(store_status)?;
        self.store.flush().await.map_err(store_status)?;
        tracing::info!(by = %caller.user, id, "token revoked");
        Ok(())
    }

    /// The nodes named (all of them when `names` is empty), with the cluster's
    /// fragmentation when all were asked for.
    pub fn list_nodes(&self, names: &[String]) -> pb::ListNodesResponse {
        let c = self.lock();
        let usage = c.usage();
        if !names.is_empty() {
            let nodes = names
                .iter()
                .filter_map(|n| c.nodes.get(n))
                .map(|n| c.node_pb(n, &usage))
                .collect();
            return pb::ListNodesResponse {
                nodes,
                ..pb::ListNodesResponse::default()
            };
        }
        let nodes: Vec<pb::Node> = c.nodes.values().map(|n| c.node_pb(n, &usage)).collect();
        // Fragmentation over up nodes, against the current workload mix.
        let workload = c.workload();
        let view = c.view();
        let (mut frag, mut idle) = (0.0, 0u64);
        for (nv, n) in view.nodes.iter().zip(&nodes) {
            if !nv.eligible() {
                continue;
            }
            let free: Vec<(usize, u32)> = nv
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.is_mig())
                .map(|(i, s)| {
                    let used = usage
                        .get(nv.name.as_str())
                        .and_then(|u| u.slots.get(&s.uuid))
                        .map_or(0, |x| x.0);
                    (i, 1000u32.saturating_sub(used))
                })
                .collect();
            idle += free.iter().map(|x| u64::from(x.1)).sum::<u64>();
            let used = usage.get(nv.name.as_str());
            let cpu_free =
                (n.cpus.saturating_mul(1000)).saturating_sub(used.map_or(0, |u| u.cpu_milli));
            let mem_free = nv.memory_bytes.saturating_sub(used.map_or(0, |u| u.memory));
            frag += workload.node_frag(nv, &free, (cpu_free, mem_free));
        }
        pb::ListNodesResponse {
            nodes,
            fragmentation_gpus: frag / 1000.0,
            fragmentation_pct_of_idle: if idle == 0 {
                0.0
            } else {
                frag / idle as f64 * 100.0
            },
        }
    }

    pub async fn set_drain(&self, name: &str, drain: Option<String>) -> Result<pb::Node, Status> {
        let node = {
            let mut c = self.lock();
            let n = c
                .nodes
                .get_mut(name)
                .ok_or_else(|| Status::not_found(format!("no node named {name:?}")))?;
            n.drain_reason = drain;
            // An admin's drain (or resume) is the admin's: health checks leave it alone.
            n.drain_automatic = false;
            self.store.put_node(n).map_err(store_status)?;
            let n = n.clone();
            let usage = c.usage();
            c.node_pb(&n, &usage)
        };
        self.store.flush().await.map_err(store_status)?;
        tracing::info!(node = name, state = ?node.state(), reason = %node.reason, "drain state changed");
        self.wake_scheduler();
        Ok(node)
    }
}

/// One line on why a job does not fit a node.
fn describe_miss(m: &sched::Miss) -> String {
    use sched::Miss;
    let gib = |b: u64| bytesize::ByteSize(b).to_string();
    match m {
        Miss::Drained => "node drained".into(),
        Miss::Down => "node down".into(),
        Miss::GpuModel { want } if want.is_empty() => "no GPU of a usable kind".into(),
        Miss::GpuModel { want } => format!("GPU model is not {}", want.join(" or ")),
        Miss::TooSmall { what } => format!("not enough {what} even when empty"),
        Miss::NoMigProfile { profile } => format!("no MIG instance of profile {profile}"),
        Miss::Gpus { need, free } => format!("not enough free GPUs (need {need}, free {free})"),
        Miss::Mig {
            profile,
            need,
            free,
        } => {
            format!("not enough free {profile} MIG instances (need {need}, free {free})")
        }
        Miss::GpuShare {
            need_milli,
            need_mib,
            best_free_milli,
            best_free_mib,
        } => format!(
            "no GPU with a free share of {:.0}% and {need_mib} MiB (best: {:.0}% and {best_free_mib} MiB)",
            f64::from(*need_milli) / 10.0,
            f64::from(*best_free_milli) / 10.0
        ),
        Miss::Cpus { need, free } => format!(
            "not enough free CPUs (need {}, free {})",
            f64::from(*need) / 1000.0,
            f64::from(*free) / 1000.0
        ),
        Miss::Memory { need, free } => format!(
            "not enough free memory (need {}, free {})",
            gib(*need),
            gib(*free)
        ),
        Miss::Reserved { job, from } => format!(
            "reserved for job {job} from {}",
            humantime::format_rfc3339_seconds(
                UNIX_EPOCH + Duration::from_millis((*from).max(0) as u64)
            )
        ),
    }
}
