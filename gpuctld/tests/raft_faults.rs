//! A randomized fault test of the replicated controllers (Jepsen-style, short form, below
//! the daemon): three controllers on openraft in one process; clients submit, cancel and
//! end jobs and run passes through whichever controller leads, while controllers are
//! cut off (partitions), stopped and restarted from their disks, at random. A checker
//! then heals everything and verifies: every acknowledged submit exists exactly once,
//! as acknowledged; no GPU was ever given past its capacity on any replica at any step;
//! every replica holds the same state and its invariants (`Cluster::check`).

mod raft_common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use gpuctl_core::command::Command;
use gpuctl_core::event::{Report, ReportKind};
use gpuctl_core::log::{Applied, Change, plan_entries};
use gpuctl_core::ops::Admission;
use gpuctl_core::record::{GpuPart, JobSpec, JobState, Resources};
use gpuctl_core::{Actor, Cluster};
use openraft::{BasicNode, ServerState};
use raft_common::*;

const ROUNDS: usize = 60;
const WITHIN: Duration = Duration::from_millis(1500);
const T0: i64 = 1_700_000_000_000;

/// A seeded generator (the seed is in the failure's message).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

fn ana() -> Actor {
    Actor {
        user: "ana".into(),
        admin: false,
    }
}

/// No GPU holds more than all of it: the running jobs' shares of each, summed.
fn gpus_within_capacity(c: &Cluster) -> Result<(), String> {
    let mut held: HashMap<(String, String), u32> = HashMap::new();
    for r in c.jobs().active() {
        let j = &r.job;
        if j.state != JobState::Running {
            continue;
        }
        for a in j.allocations.iter().filter(|a| !a.ended) {
            for s in &a.slots {
                *held.entry((a.node.clone(), s.uuid.clone())).or_default() += s.compute_milli;
            }
        }
    }
    match held.iter().find(|(_, m)| **m > 1000) {
        Some(((node, gpu), m)) => Err(format!("{gpu} on {node} given {m} milli")),
        None => Ok(()),
    }
}

/// The test's world: the controllers (`None`: stopped), what the clients were told.
struct World {
    router: Arc<Router>,
    t: Transport,
    dirs: Vec<tempfile::TempDir>,
    cs: Vec<Option<Controller>>,
    /// Acknowledged submits: their name, and the id they were acknowledged with.
    acked: BTreeMap<String, u64>,
    /// Ids handed out to admissions so far (acknowledged or not).
    next_id: u64,
    at: i64,
    rng: Rng,
    seed: u64,
}

impl World {
    /// The controller that leads and is not cut off, if there is one now (its place).
    fn leader(&self) -> Option<usize> {
        let cut = self.router.cut.lock().clone();
        self.cs.iter().position(|c| {
            c.as_ref().is_some_and(|c| {
                !cut.contains(&c.id) && c.raft.metrics().borrow().state == ServerState::Leader
            })
        })
    }

    fn check_every_replica(&self, when: &str) {
        for c in self.cs.iter().flatten() {
            let r = c.replica.lock();
            if let Err(e) = gpus_within_capacity(r.cluster()).and_then(|()| r.cluster().check()) {
                panic!("seed {}, {when}, controller {}: {e}", self.seed, c.id);
            }
        }
    }

    async fn submit(&mut self) {
        let Some(i) = self.leader() else { return };
        let l = self.cs[i].as_ref().unwrap();
        let name = format!("job-{}", self.next_id);
        let spec = JobSpec {
            user: "ana".into(),
            name: name.clone(),
            command: vec!["train".into()],
            workdir: "/home/ana".into(),
            resources: Resources {
                gpu: Some(GpuPart::Gpus(1 + self.rng.below(2) as u32)),
                cpus: 1,
                time_limit_secs: 3600,
                ..Resources::default()
            },
            ..JobSpec::default()
        };
        let admitted =
            (l.replica.lock().cluster()).admit_from(&ana(), spec, "", self.at, self.next_id);
        let Ok(Admission::New(record)) = admitted else {
            return;
        };
        let id = record.job.id;
        self.next_id = id + 1;
        let answer = try_propose(l, self.at, Change::Submit(vec![*record]), WITHIN).await;
        if let Some((Ok(_), _)) = answer {
            self.acked.insert(name, id);
        }
    }

    /// A pass through the leader, and its agents' reports that the starts ran.
    async fn pass(&mut self) {
        let Some(i) = self.leader() else { return };
        let l = self.cs[i].as_ref().unwrap();
        let Some((Ok(Applied::Prepared(waiting)), _)) =
            try_propose(l, self.at, Change::Prepare, WITHIN).await
        else {
            return;
        };
        let plan = {
            let r = l.replica.lock();
            let c = r.cluster();
            gpuctl_sched::schedule(
                &c.view(),
                &c.queue(&waiting),
                &c.pass_config(self.at),
                self.at,
            )
        };
        let mut reports = Vec::new();
        for e in plan_entries(&plan, 4, self.at) {
            let Some((_, effects)) = try_propose(l, self.at, e.change, WITHIN).await else {
                return;
            };
            for (node, cmd) in effects.sends {
                if let Command::Start(s) = cmd {
                    reports.push(Report::new(&node, s.job_id, s.attempt, ReportKind::Started));
                }
            }
        }
        try_propose(l, self.at, Change::Reports(reports), WITHIN).await;
    }

    /// A running job ends (its agent's report through the leader).
    async fn end(&mut self) {
        let Some(i) = self.leader() else { return };
        let l = self.cs[i].as_ref().unwrap();
        let running: Vec<(u64, u32, String)> = (l.replica.lock().cluster().jobs().active())
            .filter(|r| r.job.state == JobState::Running)
            .map(|r| (r.job.id, r.job.attempt, r.job.allocations[0].node.clone()))
            .collect();
        if running.is_empty() {
            return;
        }
        let (id, attempt, node) = running[self.rng.below(running.len() as u64) as usize].clone();
        let mut end = Report::new(&node, id, attempt, ReportKind::Ended);
        end.state = JobState::Completed;
        end.exit_code = Some(0);
        try_propose(l, self.at, Change::Reports(vec![end]), WITHIN).await;
    }

    async fn cancel(&mut self) {
        let Some(i) = self.leader() else { return };
        let l = self.cs[i].as_ref().unwrap();
        if self.acked.is_empty() {
            return;
        }
        let k = self.rng.below(self.acked.len() as u64) as usize;
        let id = *self.acked.values().nth(k).unwrap();
        let cancel = Change::Cancel {
            actor: ana(),
            ids: vec![id],
            tasks: Vec::new(),
        };
        try_propose(l, self.at, cancel, WITHIN).await;
    }

    /// Cuts off, heals, stops or restarts a controller at random.
    async fn fault(&mut self) {
        let i = self.rng.below(3) as usize;
        let id = i as u64 + 1;
        let cut = self.router.cut.lock().contains(&id);
        match (&self.cs[i], cut) {
            (_, true) => {
                self.router.cut.lock().remove(&id);
            }
            (None, false) => {
                self.cs[i] = Some(start(&self.t, id, self.dirs[i].path()).await);
            }
            (Some(c), false) => {
                if self.rng.below(2) == 0 {
                    self.router.cut.lock().insert(id);
                } else {
                    self.t.stop(id);
                    let _ = c.raft.shutdown().await;
                    self.cs[i] = None;
                }
            }
        }
    }

    /// Commits `change` through whichever controller leads, waiting out elections
    /// (everyone connected); the place of the controller it committed through.
    async fn commit(&mut self, change: Change) -> usize {
        for _ in 0..40 {
            if let Some(i) = self.leader() {
                let l = self.cs[i].as_ref().unwrap();
                if let Some((answer, _)) = try_propose(l, self.at, change.clone(), WITHIN).await {
                    answer.expect("accepted");
                    return i;
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("seed {}: nothing committed in 40 tries", self.seed);
    }

    /// Everyone back and connected, a leader elected; the leader's place.
    async fn heal(&mut self) -> usize {
        self.router.cut.lock().clear();
        for i in 0..3 {
            if self.cs[i].is_none() {
                self.cs[i] = Some(start(&self.t, i as u64 + 1, self.dirs[i].path()).await);
            }
        }
        let all: Vec<&Controller> = self.cs.iter().flatten().collect();
        let id = leader(&all).await;
        id as usize - 1
    }
}

async fn run(seed: u64) {
    let router = Arc::new(Router::default());
    let t = Transport::Local(router.clone());
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut cs = Vec::new();
    for id in 1..=3u64 {
        cs.push(Some(start(&t, id, dirs[id as usize - 1].path()).await));
    }
    let members: BTreeMap<u64, BasicNode> =
        (1..=3).map(|i| (i, BasicNode::new(t.address(i)))).collect();
    cs[0]
        .as_ref()
        .unwrap()
        .raft
        .initialize(members)
        .await
        .expect("initialized");
    let mut w = World {
        router,
        t,
        dirs,
        cs,
        acked: BTreeMap::new(),
        next_id: 1,
        at: T0,
        rng: Rng(seed),
        seed,
    };
    w.heal().await;
    for n in ["n1", "n2", "n3"] {
        let attach = Change::Attach {
            register: register(n),
            peer: None,
        };
        w.commit(attach).await;
    }
    let mut faults = 0;
    for round in 0..ROUNDS {
        w.at += 1000;
        match w.rng.below(10) {
            0..=3 => w.submit().await,
            4 | 5 => w.pass().await,
            6 => w.end().await,
            7 => w.cancel().await,
            _ => {
                w.fault().await;
                faults += 1;
            }
        }
        if w.leader().is_none() {
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        w.check_every_replica(&format!("round {round}"));
    }
    // The checker: everyone back, every replica alike and complete.
    w.heal().await;
    let l = w.commit(Change::Prepare).await;
    let l = w.cs[l].as_ref().unwrap();
    let all: Vec<&Controller> = w.cs.iter().flatten().collect();
    let states = settled(l, &all).await;
    for (c, s) in all.iter().zip(&states) {
        assert!(
            *s == states[0],
            "seed {seed}: controller {} differs:{}",
            c.id,
            difference(s, &states[0])
        );
    }
    w.check_every_replica("at the end");
    let jobs: Vec<(String, u64)> = (l.replica.lock().cluster().jobs().all())
        .map(|j| (j.job.spec.name.clone(), j.job.id))
        .collect();
    for (name, id) in &w.acked {
        let same: Vec<u64> = (jobs.iter())
            .filter(|j| j.0 == *name)
            .map(|j| j.1)
            .collect();
        assert_eq!(
            same,
            vec![*id],
            "seed {seed}: acknowledged {name} (job {id}) is there as {same:?}"
        );
    }
    assert!(
        faults >= 2 && w.acked.len() >= 2,
        "seed {seed}: {faults} faults, {} acknowledged: too quiet a run",
        w.acked.len()
    );
    eprintln!(
        "seed {seed}: {} acknowledged submits, {faults} faults, all replicas alike",
        w.acked.len()
    );
    for c in w.cs.iter().flatten() {
        let _ = c.raft.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_lose_no_acknowledged_job_and_never_overgive_a_gpu() {
    for seed in [1, 2, 3] {
        run(seed).await;
    }
}
