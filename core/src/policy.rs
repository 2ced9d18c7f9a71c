//! QoS policy in the controller: the caps a pass checks (what each owner holds now
//! under each capped QoS), and preemption (`sched::preempt` plans, this applies).

use crate::record::{Job, JobSpec, JobState};
use crate::request;
use gpuctl_sched::limits::{Caps, QosCaps, norm_milli};
use gpuctl_sched::preempt::{PreemptConfig, RunningJob};
use gpuctl_sched::{self as sched, Blocked, PendingJob, Request};

use crate::jobs::owner;
use crate::state::{Cluster, Effects, array_of, live_allocs, pending_job, resources};

/// How long a job takes to give its GPUs back once asked (its signal's lead, else the
/// kill grace), in seconds.
pub fn lead_secs(spec: &JobSpec, cfg: &crate::Config) -> u64 {
    request::parse_signal_spec(&spec.signal)
        .ok()
        .flatten()
        .and_then(|(_, t)| t)
        .unwrap_or(cfg.kill_grace.as_secs())
}

/// Whether a job gives its GPUs back when asked, so that it may borrow a window's
/// floor: it is requeued when stopped, checkpoints on a signal, and its signal's lead
/// leaves the floor's owner time to start within `reclaim_within`.
pub fn reclaimable(spec: &JobSpec, cfg: &crate::Config) -> bool {
    let p = &cfg.preemption;
    let signal = request::parse_signal_spec(&spec.signal).ok().flatten();
    p.lend_floors
        && spec.requeue
        && signal.is_some()
        && (lead_secs(spec, cfg) * 1000).saturating_add(RECLAIM_SLACK_MS as u64)
            <= p.reclaim_within.as_millis() as u64
}

/// What the reclaim bound keeps besides a borrower's lead: the borrower's kill and
/// requeue report after its lead, and the pass that starts the owner's job (the
/// controller runs a pass at the moment the bound comes at risk: `next_wake_ms`).
pub const RECLAIM_SLACK_MS: i64 = 5_000;

/// GPUs (a config number) in milli.
fn milli(gpus: Option<f64>) -> Option<u64> {
    gpus.map(|g| (g * 1000.0).round() as u64)
}

impl Cluster {
    /// The QoS caps of the config, with what running jobs hold under each.
    pub fn caps(&self) -> Caps {
        let mut caps = Caps::default();
        for (name, q) in &self.config.qos {
            let c = QosCaps {
                per_user_milli: milli(q.max_gpus_per_user),
                per_account_milli: milli(q.max_gpus_per_account),
            };
            if c != QosCaps::default() {
                caps.qos.insert(name.clone(), c);
            }
        }
        for s in self.jobs.active() {
            let j = &s.job;
            let spec = &j.spec;
            // Throttled arrays are tracked from their first task on.
            let array = array_of(spec).filter(|(_, max)| *max > 0);
            if let Some((a, _)) = array {
                caps.arrays.entry(a).or_default();
            }
            if j.state != JobState::Running {
                continue;
            }
            caps.add_task(array);
            if !caps.qos.is_empty() {
                let m = norm_milli(&Request::from(&resources(j)));
                caps.add(&spec.qos, owner(j), &spec.account, m);
            }
        }
        caps
    }
}

impl Cluster {
    /// The preemption settings the pass uses (QoS `preempts`, `[preemption]`).
    fn preempt_config(&self, now: i64) -> PreemptConfig {
        let p = &self.config.preemption;
        if !self.preemption_allowed(now) {
            return PreemptConfig::default();
        }
        // An open window's floor takes its GPUs back from preemptible jobs.
        let exempt: Vec<String> = self.preemptible_qos().into_iter().collect();
        let open = self.open_windows(now);
        let by_account = open
            .iter()
            .flat_map(|(_, w)| w.floor.keys().cloned())
            .map(|a| (a, exempt.clone()))
            .collect();
        let by_partition = open
            .iter()
            .flat_map(|(_, w)| w.partition_floor.keys().cloned())
            .map(|p| (p, exempt.clone()))
            .collect();
        PreemptConfig {
            lenders: self.lenders(now),
            reclaim_within_ms: i64::try_from(p.reclaim_within.as_millis()).unwrap_or(i64::MAX),
            reclaim_slack_ms: RECLAIM_SLACK_MS,
            by_account,
            by_partition,
            preempts: self
                .config
                .qos
                .iter()
                .filter(|(_, q)| !q.preempts.is_empty())
                .map(|(n, q)| (n.clone(), q.preempts.clone()))
                .collect(),
            min_run_ms: i64::try_from(p.min_run.as_millis()).unwrap_or(i64::MAX),
            max_preemptors: p.max_per_pass,
        }
    }

    /// `preempt` for the waiting jobs `preempt_candidates` found in a plan.
    pub(crate) fn preempt_for(&mut self, candidates: &[u64], now: i64, effects: &mut Effects) {
        let pc = self.preempt_config(now);
        self.next_reclaim_ms = None;
        if pc.is_empty() {
            return;
        }
        // Few waiting jobs may preempt: find them before the fair-share table (the
        // table costs as much as the lookups of every waiting job). When only QoS
        // levels preempt (no open window's floor, no lender), the pending jobs of those
        // levels are looked up from their index, not every candidate (a pass's waiting
        // jobs at 100,000 pending: 27 ms under the lock, at 25,000 nodes).
        let mut by_qos: Option<std::collections::HashSet<u64>> = None;
        if pc.by_account.is_empty() && pc.by_partition.is_empty() && pc.lenders.is_empty() {
            let ids = (pc.preempts.keys()).flat_map(|q| self.jobs.pending_of_qos(q));
            let ids: std::collections::HashSet<u64> = ids.collect();
            if ids.is_empty() {
                return;
            }
            by_qos = Some(ids);
        }
        let may: Vec<&Job> = candidates
            .iter()
            .filter(|id| by_qos.as_ref().is_none_or(|ids| ids.contains(id)))
            .filter_map(|&id| self.jobs.job(id))
            .filter(|j| {
                let s = &j.spec;
                let partition = self.config.partition_name(&s.partition);
                j.state == JobState::Pending
                    && (pc.preempts.contains_key(&s.qos)
                        || pc.by_account.contains_key(&s.account)
                        || pc.by_partition.contains_key(partition)
                        || pc
                            .lenders
                            .iter()
                            .any(|l| l.owner.owns(&s.account, partition)))
            })
            .collect();
        if may.is_empty() {
            return;
        }
        let shares = self.fair_share_table();
        let waiting: Vec<PendingJob> = may
            .into_iter()
            .map(|j| pending_job(j, &shares, &self.config))
            .collect();
        if waiting.is_empty() {
            return;
        }
        let running: Vec<RunningJob> = self
            .jobs
            .active()
            .filter(|s| s.job.state == JobState::Running)
            .map(|s| {
                let j = &s.job;
                let spec = &j.spec;
                RunningJob {
                    id: j.id,
                    qos: spec.qos.clone(),
                    start_ms: j.start_time_ms,
                    gpu_milli: norm_milli(&Request::from(&resources(j))),
                    vacating: s.vacate_by_ms > 0 || s.cancel_requested,
                    account: spec.account.clone(),
                    partition: self.config.partition_name(&spec.partition).to_string(),
                    reclaimable: reclaimable(spec, &self.config),
                    lead_ms: i64::try_from(lead_secs(spec, &self.config))
                        .unwrap_or(i64::MAX / 2000)
                        .saturating_mul(1000),
                }
            })
            .collect();
        let view = self.view();
        let cfg = self.sched_config.clone();
        let done = sched::preempt::plan_preemptions(&view, &running, &waiting, &cfg, &pc, now);
        for p in &done {
            for &victim in &p.victims {
                self.preempt_one(victim, p.job, now, effects);
            }
            self.jobs.annotate_pending(p.job, |j| {
                j.reason = "Preempting".into();
            });
        }
        // A preemptor whose victims are still inside their minimum run starts when
        // that run ends, not when they would end by themselves.
        let pending: Vec<&PendingJob> = waiting
            .iter()
            .filter(|w| !done.iter().any(|p| p.job == w.id))
            .collect();
        self.next_reclaim_ms = next_reclaim(&pending, &running, &pc, now);
        // Jobs alike (request, QoS, owner's floor) get the same answer: each shape is
        // planned once, and only the first few shapes are (a burst of thousands of
        // waiting preemptors cost thousands of plans a pass).
        let mut known: std::collections::HashMap<(&Request, &str, &str, &str), Option<i64>> =
            std::collections::HashMap::new();
        for w in pending {
            let key = (
                &w.request,
                w.qos.as_str(),
                w.account.as_str(),
                w.partition.as_str(),
            );
            let t = match known.get(&key) {
                Some(t) => *t,
                None if known.len() < PREEMPT_SHAPES => {
                    let t = preemption_time(&view, &running, w, &cfg, &pc, now);
                    known.insert(key, t);
                    t
                }
                None => None,
            };
            if let Some(t) = t {
                self.jobs.annotate_pending(w.id, |j| {
                    if j.expected_start_ms == 0 || t < j.expected_start_ms {
                        j.expected_start_ms = t;
                    }
                });
            }
        }
    }

    fn preempt_one(&mut self, victim: u64, by: u64, now: i64, effects: &mut Effects) {
        let Some(j) = self.jobs.job(victim) else {
            return;
        };
        let spec = j.spec.clone();
        let signal = request::parse_signal_spec(&spec.signal).ok().flatten();
        let lead = lead_secs(&spec, &self.config);
        let reason = format!("Preempted by job {by}");
        tracing::info!(job = victim, by, requeue = spec.requeue, "preempting job");
        if spec.requeue {
            let sig = signal.map(|(n, _)| (n, lead));
            let e = self.request_requeue(victim, &reason, sig, now);
            effects.sends.extend(e.sends);
        } else {
            let attempt = j.attempt;
            let nodes: Vec<String> = live_allocs(j).map(|a| a.node.clone()).collect();
            for node in nodes {
                if !self.fleet.conns.contains_key(&node) {
                    continue;
                }
                let kill = crate::command::Command::Kill(crate::command::Kill {
                    as_state: gpuctl_sched::job::JobState::Preempted,
                    signal: signal.as_ref().map(|(n, _)| n.clone()).unwrap_or_default(),
                    kill_grace_secs: lead,
                    ..self.kill(victim, attempt, &reason)
                });
                effects.sends.push((node, kill));
            }
        }
        let lead_ms = i64::try_from(lead)
            .unwrap_or(i64::MAX / 2000)
            .saturating_mul(1000);
        self.jobs.edit(victim, |s| {
            s.preempted_by = by;
            s.vacate_by_ms = now.saturating_add(lead_ms).saturating_add(5_000);
        });
        effects.wake = true;
    }
}

/// Room for a job that needs a GPU after a pass (`gpu_room`): what a
/// submit of such a job may skip a pass for. Errs towards more room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuRoom {
    /// Anything may fit (or may be made to fit: a window's floor may preempt).
    Any,
    /// No node that takes jobs has any GPU compute free.
    None,
    /// The most CPU and host memory free on any node with GPU compute free (not
    /// necessarily the same node).
    Free { cpu_milli: u32, memory_bytes: u64 },
}

impl GpuRoom {
    /// Whether a job that needs GPU compute, and these CPUs and memory, may start in
    /// this room.
    pub fn admits(self, cpu_milli: u32, memory_bytes: u64) -> bool {
        match self {
            GpuRoom::Any => true,
            GpuRoom::None => false,
            GpuRoom::Free {
                cpu_milli: cpu,
                memory_bytes: memory,
            } => cpu_milli <= cpu && memory_bytes <= memory,
        }
    }
}

/// The room a pass leaves for a job that needs a GPU: `Any` when nothing waits after
/// it, else what its `plan` (none: its queue was empty) left on `view`.
pub fn room_after(view: &sched::ClusterView, plan: Option<&sched::Plan>, waiting: bool) -> GpuRoom {
    match (waiting, plan) {
        (false, _) => GpuRoom::Any,
        (true, Some(plan)) => gpu_room(view, plan),
        (true, None) => gpu_room(view, &sched::Plan::default()),
    }
}

/// The room a job that needs a GPU has after `plan`, made on `view`: per node that takes
/// jobs, whether any GPU slot has compute free (a slot held below a whole GPU counts,
/// even where no request could use the rest), and then its free CPU and memory. The
/// controller defers the pass of a submit that cannot start in it (a loop of submits
/// against a full cluster must not pay for a pass over the whole queue each). Pure and
/// outside the controller's lock: walking the state's jobs for it under the lock took
/// 46 ms at 10,000 nodes. Events since the view was taken each wake a pass of their own.
pub fn gpu_room(view: &sched::ClusterView, plan: &sched::Plan) -> GpuRoom {
    let index: std::collections::HashMap<&str, usize> = view
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    // Per node: compute held per slot, CPU and memory held.
    let mut held: Vec<(Vec<u32>, u64, u64)> = view
        .nodes
        .iter()
        .map(|n| (vec![0; n.slots.len()], 0, 0))
        .collect();
    let allocs = view.running.iter().map(|r| &r.alloc);
    for a in allocs.chain(plan.starts.iter().flat_map(|s| &s.allocs)) {
        let Some(&i) = index.get(a.node.as_str()) else {
            continue;
        };
        let h = &mut held[i];
        h.1 += u64::from(a.cpu_milli);
        h.2 += a.memory_bytes;
        for s in &a.slots {
            if let Some(k) = view.nodes[i].slots.iter().position(|x| x.uuid == s.uuid) {
                h.0[k] += s.compute_milli;
            }
        }
    }
    let mut room = GpuRoom::None;
    for (n, (slots, cpu, memory)) in view.nodes.iter().zip(&held) {
        if n.eligibility != sched::Eligibility::Up || slots.iter().all(|&c| c >= sched::GPU_MILLI) {
            continue;
        }
        let free_cpu = u32::try_from(u64::from(n.cpu_milli).saturating_sub(*cpu)).unwrap_or(0);
        let free_memory = n.memory_bytes.saturating_sub(*memory);
        room = match room {
            GpuRoom::Free {
                cpu_milli,
                memory_bytes,
            } => GpuRoom::Free {
                cpu_milli: cpu_milli.max(free_cpu),
                memory_bytes: memory_bytes.max(free_memory),
            },
            _ => GpuRoom::Free {
                cpu_milli: free_cpu,
                memory_bytes: free_memory,
            },
        };
    }
    room
}

impl Cluster {
    /// Whether an open window's floor may take GPUs back now (then any job may be made
    /// room for: `GpuRoom::Any`).
    pub fn floors_preempt(&self, now: i64) -> bool {
        let p = self.preempt_config(now);
        !(p.by_account.is_empty() && p.by_partition.is_empty() && p.lenders.is_empty())
    }

    /// The request of a new job whose pass may wait while its room is short: one that
    /// needs GPU compute (a share given only as memory gets its compute from the GPU it
    /// lands on: counted as not) and whose QoS preempts nobody. `None`: its pass runs.
    pub fn deferrable(&self, j: &Job) -> Option<Request> {
        let qos = j.spec.qos.as_str();
        let preempts = self
            .config
            .qos
            .get(qos)
            .is_some_and(|q| !q.preempts.is_empty());
        let req = Request::from(&resources(j));
        (req.gpu_milli_total() > 0 && !preempts).then_some(req)
    }
}

/// When the first of `waiting` whose floor could take borrowers back would put the
/// reclaim bound at risk with the slowest borrower running now (a pass must run then:
/// the borrowers' minimum run no longer protects them).
fn next_reclaim(
    waiting: &[&PendingJob],
    running: &[RunningJob],
    pc: &PreemptConfig,
    now: i64,
) -> Option<i64> {
    let lead = running
        .iter()
        .filter(|r| r.reclaimable && !r.vacating)
        .map(|r| r.lead_ms)
        .max()?;
    waiting
        .iter()
        .filter(|w| {
            pc.lenders
                .iter()
                .any(|l| l.owner.owns(&w.account, &w.partition))
        })
        .map(|w| {
            w.submit_ms
                .saturating_add(pc.reclaim_within_ms)
                .saturating_sub(lead)
                .saturating_sub(pc.reclaim_slack_ms)
        })
        .filter(|&t| t > now)
        .min()
}

impl Cluster {
    /// When a pass must run even if nothing happens: a job's begin time, the moment
    /// a floor's owner would miss the reclaim bound, or when a GPU kept by
    /// `min_layout_age` may take the MIG layout jobs wait for.
    pub fn next_wake_ms(&self) -> Option<i64> {
        [
            self.next_begin_ms(),
            self.next_reclaim_ms,
            self.mig.next_change_ms,
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

/// How many kinds of waiting preemptors a pass works out an expected start for.
const PREEMPT_SHAPES: usize = 16;

/// How many future moments a preemptor's expected start looks at (each a one-job
/// preemption plan).
const PREEMPT_LOOKAHEAD: usize = 8;

/// The first moment a running job's minimum run ends at which `job` could preempt its
/// way in (`None`: no such moment among the next few).
fn preemption_time(
    view: &sched::ClusterView,
    running: &[RunningJob],
    job: &PendingJob,
    cfg: &sched::SchedConfig,
    pc: &sched::preempt::PreemptConfig,
    now: i64,
) -> Option<i64> {
    let mut moments: Vec<i64> = running
        .iter()
        .filter(|r| !r.vacating)
        .map(|r| r.start_ms.saturating_add(pc.min_run_ms))
        .filter(|&t| t > now)
        .collect();
    moments.sort_unstable();
    moments.dedup();
    moments.truncate(PREEMPT_LOOKAHEAD);
    let one = std::slice::from_ref(job);
    moments
        .into_iter()
        .find(|&t| !sched::preempt::plan_preemptions(view, running, one, cfg, pc, t).is_empty())
}

/// The waiting jobs of a plan that may take running jobs' places: those that wait for
/// GPUs (resources, a higher job's reservation, or past the backfill depth), in the
/// plan's rank order.
pub fn preempt_candidates(plan: &sched::Plan) -> Vec<u64> {
    plan.waiting
        .iter()
        .filter(|w| {
            matches!(
                w.reason,
                Blocked::Resources | Blocked::Priority { .. } | Blocked::BeyondDepth
            )
        })
        .map(|w| w.job)
        .collect()
}
