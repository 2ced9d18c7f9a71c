//! What users do to the cluster state: cancel jobs, drain and resume nodes, list nodes.

use crate::error::{Actor, Refusal};
use crate::jobs::{PendingCancel, owner};
use crate::node::{NodeListing, NodeRow};
use crate::record::{JobState, state_name};
use crate::state::{Cluster, Effects};
use crate::view::{CancelResult, TaskRef};

impl Cluster {
    /// `ids`, where the id of an array (its first task) also stands for its other
    /// unfinished tasks, like `scancel ARRAY_ID`.
    /// The unfinished jobs `f` matches (a cancel by filter).
    pub fn active_matching(&self, f: &crate::filter::JobFilter) -> Vec<u64> {
        self.jobs
            .active()
            .map(|s| &s.job)
            .filter(|j| f.matches(j))
            .map(|j| j.id)
            .collect()
    }

    /// The job id of task `task_id` of array `array_job_id`, when it exists.
    pub fn array_task_job(&self, array_job_id: u64, task_id: u32) -> Option<u64> {
        self.jobs.all().map(|s| &s.job).find_map(|j| {
            let s = &j.spec;
            (s.array_job_id == array_job_id && s.array_task_id == Some(task_id)).then_some(j.id)
        })
    }

    fn with_array_tasks(&self, ids: &[u64]) -> Vec<u64> {
        let arrays: std::collections::BTreeSet<u64> = ids
            .iter()
            .filter(|&&id| {
                self.jobs
                    .job(id)
                    .map(|j| &j.spec)
                    .is_some_and(|s| s.array_job_id == id && s.array_task_id.is_some())
            })
            .copied()
            .collect();
        let mut out = ids.to_vec();
        if !arrays.is_empty() {
            // Membership in a set: `out.contains` made cancelling an array of n tasks
            // cost n^2/2 comparisons under the lock (10 ms at 10,000 tasks, seconds at
            // 100,000).
            let mut seen: std::collections::HashSet<u64> = ids.iter().copied().collect();
            for s in self.jobs.active() {
                let j = &s.job;
                let a = j.spec.array_job_id;
                if arrays.contains(&a) && seen.insert(j.id) {
                    out.push(j.id);
                }
            }
        }
        out
    }

    /// `cancel`, and tasks of arrays by their index (`scancel 12_3`): a task named so
    /// is that task alone, even when its job id is the array's.
    pub(crate) fn cancel_tasks(
        &mut self,
        actor: &Actor,
        ids: &[u64],
        tasks: &[TaskRef],
        now: i64,
    ) -> Result<(Vec<CancelResult>, Effects), Refusal> {
        let (ids, missing) = self.targets(ids, tasks);
        let (mut results, effects) = self.cancel_jobs(actor, &ids, now)?;
        results.extend(missing);
        Ok((results, effects))
    }

    /// The jobs `ids` and `tasks` name (an array's id: every task), and a refusal for
    /// each task that is not there.
    pub(crate) fn targets(&self, ids: &[u64], tasks: &[TaskRef]) -> (Vec<u64>, Vec<CancelResult>) {
        let mut ids = self.with_array_tasks(ids);
        let mut missing = Vec::new();
        if !tasks.is_empty() {
            let index: std::collections::HashMap<(u64, u32), u64> = self
                .jobs
                .all()
                .map(|s| &s.job)
                .filter_map(|j| {
                    let s = &j.spec;
                    Some(((s.array_job_id, s.array_task_id?), j.id))
                })
                .collect();
            let mut seen: std::collections::HashSet<u64> = ids.iter().copied().collect();
            for t in tasks {
                match index.get(&(t.array_job_id, t.task_id)) {
                    Some(&id) if seen.insert(id) => ids.push(id),
                    Some(_) => {}
                    None => missing.push(CancelResult {
                        job_id: t.array_job_id,
                        ok: false,
                        message: format!(
                            "array {} has no task {} (gpuctl queue -t all lists its tasks)",
                            t.array_job_id, t.task_id
                        ),
                    }),
                }
            }
        }
        (ids, missing)
    }

    fn cancel_jobs(
        &mut self,
        actor: &Actor,
        ids: &[u64],
        now: i64,
    ) -> Result<(Vec<CancelResult>, Effects), Refusal> {
        self.only_own(actor, ids, "cancel")?;
        let mut results = Vec::new();
        let mut effects = Effects::wake();
        // Its pending jobs end by one transition, the one `restore` applies again to
        // those this cancel alone changed (`Changes::cancels`, their `ids`).
        let mut pending = PendingCancel {
            at: now,
            reason: format!("cancelled while pending by {}", actor.user),
            ids: Vec::new(),
        };
        for &id in ids {
            let result = |ok: bool, msg: &str| CancelResult {
                job_id: id,
                ok,
                message: msg.to_string(),
            };
            let Some(j) = self.jobs.job(id) else {
                results.push(result(false, "no such job"));
                continue;
            };
            match j.state {
                JobState::Pending => {
                    if !self.jobs.changed(id) {
                        pending.ids.push(id);
                    }
                    self.jobs
                        .transition(id, pending.transition(), now)
                        .expect("pending jobs can be cancelled");
                    results.push(result(true, "removed from the queue"));
                }
                JobState::Running => {
                    let why = format!("cancelled by {}", actor.user);
                    let (sends, missing) =
                        self.kill_running(id, &why, gpuctl_sched::job::JobState::Cancelled);
                    effects.sends.extend(sends);
                    results.push(result(
                        true,
                        if missing == 0 {
                            "killing"
                        } else {
                            "killing; a node is not connected and kills it when its agent returns"
                        },
                    ));
                }
                s => results.push(result(
                    false,
                    &format!("already finished ({})", state_name(s)),
                )),
            }
        }
        self.jobs.cancelled_pending(pending);
        Ok((results, effects))
    }

    /// Drains a node (`Some(reason)`) or resumes it (`None`) for an admin. An admin's
    /// drain (or resume) is the admin's: health checks leave it alone.
    pub(crate) fn set_drain(
        &mut self,
        name: &str,
        drain: Option<String>,
    ) -> Result<(NodeRow, Effects), Refusal> {
        let n = self
            .fleet
            .nodes
            .get_mut(name)
            .ok_or_else(|| Refusal::not_found(format!("no node named {name:?}")))?;
        n.drain_reason = drain;
        n.drain_automatic = false;
        self.node_changed(name);
        let usage = self.usage();
        let node = self.node_row(&self.fleet.nodes[name], &usage);
        tracing::info!(node = name, state = ?node.state, reason = %node.reason, "drain state changed");
        Ok((node, Effects::wake()))
    }

    /// The nodes named (all of them when `names` is empty), with the cluster's
    /// fragmentation when all were asked for.
    pub fn list_nodes(&self, names: &[String]) -> NodeListing {
        let c = self;
        let usage = c.usage();
        if !names.is_empty() {
            let nodes = names
                .iter()
                .filter_map(|n| c.fleet.nodes.get(n))
                .map(|n| c.node_row(n, &usage))
                .collect();
            return NodeListing {
                nodes,
                ..NodeListing::default()
            };
        }
        let nodes: Vec<NodeRow> = c
            .fleet
            .nodes
            .values()
            .map(|n| c.node_row(n, &usage))
            .collect();
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
                (n.node.cpus.saturating_mul(1000)).saturating_sub(used.map_or(0, |u| u.cpu_milli));
            let mem_free = nv.memory_bytes.saturating_sub(used.map_or(0, |u| u.memory));
            frag += workload.node_frag(nv, &free, (cpu_free, mem_free));
        }
        NodeListing {
            nodes,
            fragmentation_gpus: frag / 1000.0,
            fragmentation_pct_of_idle: if idle == 0 {
                0.0
            } else {
                frag / idle as f64 * 100.0
            },
        }
    }
}

impl Cluster {
    /// Refuses unless every job of `ids` is `actor`'s (or `actor` is an admin).
    pub(crate) fn only_own(&self, actor: &Actor, ids: &[u64], what: &str) -> Result<(), Refusal> {
        if actor.admin {
            return Ok(());
        }
        let foreign: Vec<String> = ids
            .iter()
            .filter_map(|id| self.jobs.job(*id).map(|j| (id, owner(j))))
            .filter(|(_, o)| *o != actor.user)
            .map(|(id, o)| format!("job {id} belongs to {o}"))
            .collect();
        if foreign.is_empty() {
            return Ok(());
        }
        Err(actor.deny(&format!(
            "only a job's owner or an admin may {what} it ({})",
            foreign.join(", ")
        )))
    }

    /// `signal` (a name, as a job's checkpoint signal is named) sent to the running
    /// instances of the jobs `ids` and `tasks` name, which keep running (`scancel -s
    /// USR1`): the commands to their nodes, and a result per job. Nothing changes in
    /// the state, so there is no entry: only the controller the agents talk to sends
    /// them. Only a job's owner or an admin may; if any is someone else's, nothing is
    /// sent.
    pub fn signal_jobs(
        &self,
        actor: &Actor,
        ids: &[u64],
        tasks: &[TaskRef],
        signal: &str,
    ) -> Result<(Vec<CancelResult>, Effects), Refusal> {
        let name = crate::request::parse_signal(signal)
            .map_err(Refusal::invalid_argument)?
            .ok_or_else(|| {
                Refusal::invalid_argument("a signal to send is named (USR1, HUP, ...)")
            })?;
        let (ids, missing) = self.targets(ids, tasks);
        self.only_own(actor, &ids, "signal")?;
        let mut effects = Effects::default();
        let mut results = Vec::new();
        for id in ids {
            let result = |ok: bool, message: String| CancelResult {
                job_id: id,
                ok,
                message,
            };
            let Some(j) = self.jobs.job(id) else {
                results.push(result(false, "no such job".into()));
                continue;
            };
            if j.state != JobState::Running {
                let state = state_name(j.state);
                results.push(result(
                    false,
                    format!("{state}: nothing of it runs to signal"),
                ));
                continue;
            }
            let mut sent = 0;
            for a in crate::state::live_allocs(j) {
                if !self.fleet.conns.contains_key(&a.node) {
                    continue;
                }
                let kill = crate::command::Kill {
                    signal: name.clone(),
                    signal_only: true,
                    kill_grace_secs: 0,
                    ..self.kill(id, j.attempt, &format!("SIG{name} sent by {}", actor.user))
                };
                effects
                    .sends
                    .push((a.node.clone(), crate::command::Command::Kill(kill)));
                sent += 1;
            }
            results.push(match sent {
                0 => result(false, "its nodes are not connected now".into()),
                n => result(true, format!("SIG{name} sent to {n} node(s)")),
            });
        }
        results.extend(missing);
        Ok((results, effects))
    }
}
