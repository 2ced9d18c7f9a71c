//! The replay's simulated agents: they run what the controller sends. A start reports
//! STARTED at once; a kill (a cancel, a requeue, a preemption) ends the instance after
//! its grace (the checkpoint signal's lead), in the state the kill names. Every
//! instance that stops is recorded as a run, with the GPU slots it held. A job that
//! checkpoints (its trace row has a signal and `requeue`) saves its work when
//! signalled: requeued, it runs only what was left (the signal's lead is what it
//! loses); any other job starts over.
//!
//! Work, not wall time: a job's profile (`Usage`) is a list of phases, each some work
//! (ms at full speed) at a demand (its busy share of what it is charged). The jobs on
//! each GPU advance at the rates of the interference model (`crate::interference`), so
//! a slowed job runs longer; a job without a profile runs its duration at full speed.
//! With `Usage::heartbeat_ms` the agents also send heartbeats with each GPU's and each
//! job's use (as gpud does from NVML), which is what the controller lends GPUs by.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

use super::logged::Logged;
use crate::interference::{OnGpu, rates};
use gpuctl_core::Effects;
use gpuctl_core::command::{Command, MigLayout};
use gpuctl_core::event::{Heartbeat, Register, Report, ReportKind, Running};
use gpuctl_core::log::Change;
use gpuctl_core::node::{GpuMetrics, JobGpuUse, MigInstance};
use gpuctl_core::record::JobState;
use gpuctl_sched::Millis;
use gpuctl_sched::job::JobState as State;

use super::TraceJob;

/// What a job does on its GPUs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    /// (work in ms at full speed, busy share of its charge), in order.
    pub phases: Vec<(Millis, f64)>,
    /// GPU memory it uses on each of its GPUs, MiB.
    pub memory_mib: u64,
}

/// The jobs' profiles (by trace id), how the agents run them, and how the replay plans.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub profiles: HashMap<u64, Profile>,
    /// Opportunistic jobs run at a compute priority below the guaranteed ones.
    pub priority: bool,
    /// Heartbeats with GPU use every this many ms (none: no heartbeats).
    pub heartbeat_ms: Option<Millis>,
    /// The agents let the controller change their GPUs' MIG layouts (`gpud --mig
    /// dynamic`): they carry out its changes and attach again.
    pub mig_dynamic: bool,
    /// Each pass plans from a fresh build of the calendars (`replay --full-pass`).
    pub full_pass: bool,
}

/// One instance that ran: whose, when, how much, and whether it finished its work.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// The controller's job id, and the trace's.
    pub job: u64,
    pub trace_id: u64,
    pub account: String,
    pub start: Millis,
    pub end: Millis,
    pub gpu_milli: u64,
    pub completed: bool,
    /// Work it saved before it stopped (a checkpoint at its signal), ms.
    pub saved_ms: Millis,
    /// The GPU slots it held (every rank): (slot uuid, compute milli, memory MiB).
    pub slots: Vec<(String, u32, u64)>,
    /// Work it did (ms at full speed), and its busy share of its charge over the run
    /// as it ran (None: the run had no profile).
    pub work_ms: Millis,
    pub busy: Option<f64>,
    pub opportunistic: bool,
    /// What its GPUs drew for it (kWh): each GPU's idle draw in proportion to what it
    /// held (a borrower: none) and its busy draw over idle (`crate::power`).
    pub energy_kwh: f64,
}

/// A due kill's end: (time, job, attempt, node, state).
type Due = Reverse<(Millis, u64, u32, String, State)>;
/// A due phase end: (time, job, attempt, generation).
type PhaseDue = Reverse<(Millis, u64, u32, u32)>;
type Key = (u64, u32);

/// A running instance (every rank of it).
struct Inst {
    trace: u64,
    account: String,
    opportunistic: bool,
    nodes: Vec<String>,
    /// (node, uuid, compute milli, memory MiB) of every rank.
    slots: Vec<(String, String, u32, u64)>,
    /// Phases left: (work ms left, demand); the first is under way.
    phases: Vec<(f64, f64)>,
    profiled: bool,
    memory_mib: u64,
    rate: f64,
    last: Millis,
    start: Millis,
    gpu_milli: u64,
    work: f64,
    busy: f64,
    epoch: u32,
    /// Work done when it was signalled to stop.
    saved_at_signal: Option<f64>,
    /// The power cap of its most capped node: (time ratio, energy ratio) of fully busy
    /// work there (`crate::power::cap_effect`; (1, 1): none).
    cap: (f64, f64),
    /// What its GPUs drew for it so far (J).
    energy_j: f64,
}

impl Inst {
    /// Advances its work to `t` at its rate.
    fn settle(&mut self, t: Millis) {
        let dt = (t - self.last).max(0) as f64;
        self.last = t;
        let held: f64 = (self.slots.iter())
            .map(|s| f64::from(s.2.min(1000)) / 1000.0)
            .sum();
        let idle = if self.opportunistic {
            0.0
        } else {
            crate::power::IDLE_W
        };
        let draw = idle + crate::power::active_w(self.demand(), self.cap);
        self.energy_j += dt / 1000.0 * held * draw;
        if let Some(p) = self.phases.first_mut() {
            let w = (dt * self.rate).min(p.0);
            p.0 -= w;
            self.work += w;
            self.busy += w * p.1;
        }
    }

    fn demand(&self) -> f64 {
        self.phases.first().map_or(0.0, |p| p.1)
    }
}

#[derive(Default)]
pub struct SimAgents {
    usage: Usage,
    kills: BinaryHeap<Due>,
    due: BinaryHeap<PhaseDue>,
    insts: HashMap<Key, Inst>,
    /// GPU uuid -> (node, instances on it).
    gpus: BTreeMap<String, (String, Vec<Key>)>,
    /// GPU milli held by running guaranteed instances.
    pub allocated_milli: u64,
    pub runs: Vec<RunRecord>,
    /// Jobs that went back to the queue (requeued, preempted) since the last call.
    pub requeued: usize,
    /// Work each checkpointing job has saved, ms.
    saved: HashMap<u64, f64>,
    next_heartbeat: Option<Millis>,
    /// Jobs wait and more arrive: heartbeats go on while nothing runs (a GPU nobody
    /// holds is lent by them).
    pub waiting: bool,
    /// Node -> the power cap its GPUs are held to now, as (time ratio, energy ratio)
    /// of fully busy work (`crate::power`); absent: none. Read from the controller's
    /// heartbeat answers (`Cluster::power_caps`), as gpud applies them.
    caps: HashMap<String, (f64, f64)>,
    /// MIG layout changes under way: (when done, node, the change).
    pending_mig: Vec<(Millis, String, MigLayout)>,
    /// Layout changes carried out, ever (names their instances).
    reconfigured: u64,
    /// A node attached again with a new layout since the last call: a pass may place
    /// the jobs the layout is for.
    pub reattached: bool,
}

impl SimAgents {
    pub fn new(usage: Usage) -> SimAgents {
        SimAgents {
            usage,
            ..SimAgents::default()
        }
    }

    /// When the next end (or phase change, or heartbeat) is due.
    pub fn next_end(&self) -> Option<Millis> {
        let kill = self.kills.peek().map(|Reverse((t, ..))| *t);
        let phase = self.due.peek().map(|Reverse((t, ..))| *t);
        let beat = self
            .next_heartbeat
            .filter(|_| !self.insts.is_empty() || self.waiting);
        let mig = self.pending_mig.iter().map(|m| m.0).min();
        [kill, phase, beat, mig].into_iter().flatten().min()
    }

    /// Reports every end due by `now`. Returns the last end time.
    pub fn report_due(
        &mut self,
        c: &mut Logged,
        by_id: &BTreeMap<u64, &TraceJob>,
        now: Millis,
    ) -> Option<Millis> {
        let mut last = None;
        self.reconfigure_due(c, now);
        loop {
            let kill = self.kills.peek().map(|Reverse((t, ..))| *t);
            let phase = self.due.peek().map(|Reverse((t, ..))| *t);
            match (kill, phase) {
                (Some(k), p) if k <= now && p.is_none_or(|p| k <= p) => {
                    let Some(Reverse((t, id, attempt, node, state))) = self.kills.pop() else {
                        break;
                    };
                    if self.end_report(c, by_id, t, (id, attempt), &node, state) {
                        last = Some(t);
                    }
                }
                (_, Some(p)) if p <= now => {
                    let Some(Reverse((t, id, attempt, epoch))) = self.due.pop() else {
                        break;
                    };
                    if self.phase_end(c, by_id, t, (id, attempt), epoch) {
                        last = Some(t);
                    }
                }
                _ => break,
            }
        }
        last
    }

    /// A phase of `key` ends at `t` (if `epoch` is still its schedule): the next starts,
    /// or the instance completes. Whether it completed.
    fn phase_end(
        &mut self,
        c: &mut Logged,
        by_id: &BTreeMap<u64, &TraceJob>,
        t: Millis,
        key: Key,
        epoch: u32,
    ) -> bool {
        let Some(inst) = self.insts.get_mut(&key).filter(|i| i.epoch == epoch) else {
            return false;
        };
        inst.settle(t);
        if let Some(p) = inst.phases.first() {
            inst.work += p.0;
            inst.busy += p.0 * p.1;
        }
        if !inst.phases.is_empty() {
            inst.phases.remove(0);
        }
        if inst.phases.is_empty() {
            let nodes = inst.nodes.clone();
            for node in nodes {
                self.end_report(c, by_id, t, key, &node, State::Completed);
            }
            return true;
        }
        let uuids: BTreeSet<String> = inst.slots.iter().map(|s| s.1.clone()).collect();
        self.recompute(&uuids, t);
        false
    }

    /// Reports the end of `key` on `node`; records the run when the job is done with
    /// that instance. Whether a report was sent.
    fn end_report(
        &mut self,
        c: &mut Logged,
        by_id: &BTreeMap<u64, &TraceJob>,
        t: Millis,
        (id, attempt): Key,
        node: &str,
        state: State,
    ) -> bool {
        if !self.insts.contains_key(&(id, attempt)) {
            return false; // that instance is already gone
        }
        let completed = state == State::Completed;
        let end = Report {
            state,
            exit_code: Some(if completed { 0 } else { -15 }),
            time_ms: t,
            ..Report::new(node, id, attempt, ReportKind::Ended)
        };
        c.apply_sure(t, Change::Reports(vec![end]));
        let Some(j) = c.jobs().job(id) else {
            return true;
        };
        if j.state == JobState::Running && j.attempt == attempt {
            return true;
        }
        let pending = j.state == JobState::Pending;
        let completed = j.state == JobState::Completed;
        let Some(mut inst) = self.insts.remove(&(id, attempt)) else {
            return true;
        };
        inst.settle(t);
        if !inst.opportunistic {
            self.allocated_milli -= inst.gpu_milli;
        }
        if pending {
            self.requeued += 1;
        }
        let mut saved_ms = 0.0;
        if let Some(at) = inst.saved_at_signal
            && !completed
            && checkpoints(by_id[&id])
        {
            saved_ms = at;
            *self.saved.entry(id).or_default() += at;
        }
        let uuids: BTreeSet<String> = inst.slots.iter().map(|s| s.1.clone()).collect();
        for u in &uuids {
            if let Some((_, on)) = self.gpus.get_mut(u) {
                on.retain(|k| *k != (id, attempt));
                if on.is_empty() {
                    self.gpus.remove(u);
                }
            }
        }
        let wall = (t - inst.start).max(1) as f64;
        self.runs.push(RunRecord {
            job: id,
            trace_id: inst.trace,
            account: inst.account,
            start: inst.start,
            end: t,
            gpu_milli: inst.gpu_milli,
            completed,
            saved_ms: saved_ms.round() as Millis,
            slots: (inst.slots.into_iter())
                .map(|(_, u, m, mib)| (u, m, mib))
                .collect(),
            work_ms: inst.work.round() as Millis,
            busy: inst.profiled.then(|| inst.busy / wall),
            opportunistic: inst.opportunistic,
            energy_kwh: inst.energy_j / 3.6e6,
        });
        self.recompute(&uuids, t);
        true
    }

    /// Settles the instances on `uuids` at `t`, gives each its rate under the
    /// interference model, and schedules its current phase's end.
    fn recompute(&mut self, uuids: &BTreeSet<String>, t: Millis) {
        let keys: BTreeSet<Key> = uuids
            .iter()
            .filter_map(|u| self.gpus.get(u))
            .flat_map(|(_, on)| on.iter().copied())
            .collect();
        for k in &keys {
            if let Some(i) = self.insts.get_mut(k) {
                i.settle(t);
            }
        }
        for k in keys {
            let Some(i) = self.insts.get(&k) else {
                continue;
            };
            let mut rate = 1.0f64;
            for (_, u, _, _) in &i.slots {
                rate = rate.min(self.rate_on(u, k));
            }
            // A power cap stretches its busy part (its most capped node's).
            let cap = (i.nodes.iter()).filter_map(|n| self.caps.get(n)).fold(
                (1.0, 1.0),
                |a: (f64, f64), b| if b.0 > a.0 { *b } else { a },
            );
            let rate = rate * crate::power::rate(i.demand(), cap.0);
            let i = self.insts.get_mut(&k).expect("just read");
            i.cap = cap;
            i.rate = rate;
            i.epoch += 1;
            if let Some(p) = i.phases.first()
                && rate > 0.0
            {
                let at = t + (p.0 / rate).ceil() as Millis;
                self.due.push(Reverse((at, k.0, k.1, i.epoch)));
            }
        }
    }

    /// The rate of `key` on GPU `uuid`, given everything on it now.
    fn rate_on(&self, uuid: &str, key: Key) -> f64 {
        let Some((_, on)) = self.gpus.get(uuid) else {
            return 1.0;
        };
        let jobs: Vec<OnGpu> = on.iter().map(|k| self.on_gpu(uuid, *k)).collect();
        let r = rates(&jobs, self.usage.priority);
        on.iter().position(|k| *k == key).map_or(1.0, |p| r[p])
    }

    fn on_gpu(&self, uuid: &str, k: Key) -> OnGpu {
        let i = &self.insts[&k];
        let milli: u32 = i.slots.iter().filter(|s| s.1 == uuid).map(|s| s.2).sum();
        OnGpu {
            demand: i.demand() * f64::from(milli.min(1000)) / 1000.0,
            opportunistic: i.opportunistic,
        }
    }

    /// Runs the commands a pass sent. Returns the jobs started (rank 0 of each).
    pub fn deliver<'a>(
        &mut self,
        c: &mut Logged,
        sends: Vec<(String, Command)>,
        by_id: &BTreeMap<u64, &'a TraceJob>,
        now: Millis,
    ) -> Vec<&'a TraceJob> {
        let mut started = Vec::new();
        let mut touched = BTreeSet::new();
        for (node, cmd) in sends {
            match cmd {
                Command::Start(s) => {
                    let j = by_id[&s.job_id];
                    let report = Report {
                        time_ms: now,
                        ..Report::new(&node, s.job_id, s.attempt, ReportKind::Started)
                    };
                    c.apply_sure(now, Change::Reports(vec![report]));
                    let key = (s.job_id, s.attempt);
                    if !self.insts.contains_key(&key) {
                        let inst = self.instance(j, s.job_id, now);
                        if !inst.opportunistic {
                            self.allocated_milli += inst.gpu_milli;
                        }
                        self.insts.insert(key, inst);
                    }
                    let inst = self.insts.get_mut(&key).expect("just made");
                    inst.nodes.push(node.clone());
                    for x in &s.slots {
                        inst.slots.push((
                            node.clone(),
                            x.uuid.clone(),
                            x.compute_milli,
                            x.memory_mib,
                        ));
                        let on = self
                            .gpus
                            .entry(x.uuid.clone())
                            .or_insert_with(|| (node.clone(), Vec::new()));
                        if !on.1.contains(&key) {
                            on.1.push(key);
                        }
                        touched.insert(x.uuid.clone());
                    }
                    if s.slots.is_empty() {
                        // No GPU: it runs alone at full speed.
                        let i = &self.insts[&key];
                        if i.epoch == 0
                            && let Some(p) = i.phases.first()
                        {
                            let at = now + p.0.ceil() as Millis;
                            self.due.push(Reverse((at, key.0, key.1, 0)));
                        }
                    }
                    if s.rank == 0 {
                        started.push(j);
                    }
                }
                Command::Kill(k) => {
                    let attempt = if k.attempt > 0 {
                        k.attempt
                    } else {
                        c.jobs().job(k.job_id).map_or(0, |j| j.attempt)
                    };
                    let grace = i64::try_from(k.kill_grace_secs).unwrap_or(0) * 1000;
                    if let Some(i) = self.insts.get_mut(&(k.job_id, attempt)) {
                        i.settle(now);
                        if i.saved_at_signal.is_none() {
                            i.saved_at_signal = Some(i.work);
                        }
                    }
                    self.kills
                        .push(Reverse((now + grace, k.job_id, attempt, node, k.as_state)));
                }
                // A replay's instances run their traced durations: no limit is enforced
                // here, so a new one changes nothing they do (and no trace asks one).
                Command::Limit(_) => {}
                // A replay's nodes attach with static MIG layouts: none is asked.
                Command::Mig(m) => {
                    assert!(
                        self.usage.mig_dynamic,
                        "a replay node is not dynamic-MIG: {m:?}"
                    );
                    // As the fake backend takes: 200 ms and 100 ms an instance.
                    let at = now + 200 + 100 * m.layout.len() as Millis;
                    self.pending_mig.push((at, node, m));
                }
            }
        }
        self.recompute(&touched, now);
        started
    }

    /// A new instance of trace job `j` (controller id `id`): its profile less the work
    /// it saved before.
    fn instance(&self, j: &TraceJob, id: u64, now: Millis) -> Inst {
        let (mut phases, memory_mib, profiled) = match self.usage.profiles.get(&j.id) {
            Some(p) => (
                p.phases.iter().map(|&(w, d)| (w as f64, d)).collect(),
                p.memory_mib,
                true,
            ),
            None => (vec![(j.duration as f64, 0.0)], 0, false),
        };
        let mut skip = self.saved.get(&id).copied().unwrap_or(0.0);
        while skip > 0.0 && phases.len() > 1 && phases[0].0 <= skip {
            skip -= phases[0].0;
            phases.remove(0);
        }
        if let Some(p) = phases.first_mut() {
            p.0 = (p.0 - skip).max(1000.0);
        }
        Inst {
            trace: j.id,
            account: j.account.clone(),
            opportunistic: j.opportunistic,
            nodes: Vec::new(),
            slots: Vec::new(),
            phases,
            profiled,
            memory_mib,
            rate: 1.0,
            last: now,
            start: now,
            gpu_milli: j.gpu_milli,
            work: 0.0,
            busy: 0.0,
            epoch: 0,
            saved_at_signal: None,
            cap: (1.0, 1.0),
            energy_j: 0.0,
        }
    }

    /// Sends each node's heartbeat if one is due at `now`: per GPU, its jobs' use (as
    /// gpud reads it from NVML). The effects to act on (yields, a pass to run).
    pub fn heartbeat(&mut self, c: &mut Logged, now: Millis) -> Effects {
        let mut effects = Effects::default();
        let Some(every) = self.usage.heartbeat_ms else {
            return effects;
        };
        let due = *self.next_heartbeat.get_or_insert(now);
        if now < due {
            return effects;
        }
        // On a fixed beat, whatever happened in between.
        self.next_heartbeat = Some(due + ((now - due) / every + 1) * every);
        let mut by_node: BTreeMap<String, (Vec<Running>, Vec<GpuMetrics>)> = BTreeMap::new();
        for (k, i) in &self.insts {
            for n in &i.nodes {
                by_node
                    .entry(n.clone())
                    .or_default()
                    .0
                    .push(Running::new(k.0, k.1));
            }
        }
        // Every GPU of every node, as gpud samples them (nobody's use where none runs).
        let empty = Vec::new();
        let all: Vec<(String, String)> = c
            .fleet()
            .nodes()
            .values()
            .flat_map(|n| n.gpus.iter().map(|g| (n.name.clone(), g.uuid.clone())))
            .collect();
        for (node, uuid) in &all {
            let on = self.gpus.get(uuid).map_or(&empty, |(_, on)| on);
            let jobs: Vec<JobGpuUse> = on
                .iter()
                .map(|k| {
                    let i = &self.insts[k];
                    // Busy longer under a cap: its rate less the cap's stretch.
                    let used = (self.on_gpu(uuid, *k).demand * i.rate * i.cap.0).min(1.0);
                    JobGpuUse {
                        job_id: k.0,
                        mem_used_mib: i.memory_mib,
                        processes: 1,
                        util_pct: Some((used * 100.0).round() as u32),
                    }
                })
                .collect();
            let util: u32 = jobs.iter().filter_map(|u| u.util_pct).sum();
            by_node.entry(node.clone()).or_default().1.push(GpuMetrics {
                uuid: uuid.clone(),
                util_pct: util.min(100),
                mem_used_mib: jobs.iter().map(|u| u.mem_used_mib).sum(),
                jobs,
                time_ms: now,
                ..GpuMetrics::default()
            });
        }
        self.follow_caps(c, now);
        for (node, (running, metrics)) in by_node {
            let heartbeat = Heartbeat {
                node,
                running,
                metrics,
                ..Heartbeat::default()
            };
            let change = Change::Heartbeat {
                heartbeat,
                not_run: Vec::new(),
            };
            effects.merge(c.apply_sure(now, change));
        }
        effects
    }
}

impl SimAgents {
    /// Carries out the MIG layout changes due by `now`: the node attaches again with
    /// the GPU laid out anew (new instance UUIDs) and the instances it runs.
    fn reconfigure_due(&mut self, c: &mut Logged, now: Millis) {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending_mig)
            .into_iter()
            .partition(|m| m.0 <= now);
        self.pending_mig = later;
        for (_, node, change) in due {
            let Some(mut n) = c.fleet().node(&node).cloned() else {
                continue;
            };
            self.reconfigured += 1;
            let mut gpus = std::mem::take(&mut n.gpus);
            if let Some(g) = gpus.iter_mut().find(|g| g.uuid == change.gpu) {
                g.mig = (change.layout.iter().enumerate())
                    .map(|(k, p)| MigInstance {
                        uuid: format!("{}-mig{}-{k}", g.uuid, self.reconfigured),
                        profile: p.clone(),
                        memory_mib: gpuctl_sched::mig::profile_memory_mib(p).unwrap_or(0),
                    })
                    .collect();
            }
            let mut running: Vec<Running> = (self.insts.iter())
                .filter(|(_, i)| i.nodes.contains(&node))
                .map(|(k, _)| Running::new(k.0, k.1))
                .collect();
            running.sort_by_key(|r| (r.job_id, r.attempt));
            let register = Register {
                node: node.clone(),
                gpus,
                cpus: n.cpus,
                memory_bytes: n.memory_bytes,
                gpu_backend: "simulated".into(),
                running,
                nonce: self.reconfigured.to_le_bytes().to_vec(),
                agent_id: n.agent_id.clone(),
                mig_dynamic: true,
                ..Register::default()
            };
            let change = Change::Attach {
                register,
                peer: None,
            };
            let (attached, _) = c.apply(now, change);
            attached.expect("a simulated agent attaches again");
            self.reattached = true;
        }
    }

    /// Each node's GPUs held to the caps the controller's open windows name now (the
    /// lowest, as gpud applies them, in shares of the A100's maximum limit); the work
    /// on a node whose cap changed is re-rated from now.
    fn follow_caps(&mut self, c: &Logged, now: Millis) {
        let mut changed = BTreeSet::new();
        for name in c.fleet().nodes().keys() {
            let share = (c.power_caps(name, now).into_iter())
                .map(|cap| cap.watts(crate::power::BUSY_W) / crate::power::BUSY_W)
                .fold(f64::INFINITY, f64::min);
            let effect = (share < 1.0).then(|| crate::power::cap_effect(share));
            if self.caps.get(name).copied() != effect {
                match effect {
                    Some(e) => self.caps.insert(name.clone(), e),
                    None => self.caps.remove(name),
                };
                changed.insert(name.clone());
            }
        }
        if changed.is_empty() {
            return;
        }
        let uuids: BTreeSet<String> = (self.gpus.iter())
            .filter(|(_, (node, _))| changed.contains(node))
            .map(|(u, _)| u.clone())
            .collect();
        self.recompute(&uuids, now);
    }
}

/// Whether a trace job saves its work when signalled (a checkpoint signal and requeue).
fn checkpoints(j: &TraceJob) -> bool {
    j.requeue && !j.signal.is_empty()
}
