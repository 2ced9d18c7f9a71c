//! Property tests of policy in the state machine: whatever users submit, whatever
//! preempts what and whenever jobs end, no GPU is ever held past its capacity (a
//! preemption's victim holds its GPUs until its instance has ended), and an open
//! window's floor holds.

mod common;

use gpuctl_core::operations::Operations as _;
use std::collections::HashMap;

use common::*;
use gpuctl_core::command::Command;
use gpuctl_core::config::QosConfig;
use gpuctl_core::event::{Report, ReportKind};
use gpuctl_core::ops::Admission;
use gpuctl_core::record::{GpuPart, Job, JobState};
use gpuctl_core::windows::Window;
use gpuctl_core::{Actor, Cluster, Config, Effects};
use gpuctl_sched::job::JobState as State;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    Submit {
        bob: bool,
        gpus: u32,
        qos: u8,
        requeue: bool,
        minutes: u64,
    },
    Pass,
    Advance(i64),
    End(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (any::<bool>(), 1u32..=2, 0u8..3, any::<bool>(), 1u64..120).prop_map(
            |(bob, gpus, qos, requeue, minutes)| Step::Submit {
                bob,
                gpus,
                qos,
                requeue,
                minutes
            }
        ),
        Just(Step::Pass),
        (1i64..900).prop_map(Step::Advance),
        (0usize..8).prop_map(Step::End),
    ]
}

/// Low jobs are preempted by urgent ones; a window open all week keeps half the GPUs
/// for alice's account.
fn config() -> Config {
    let mut cfg = Config::default();
    cfg.qos.insert("scavenger".into(), QosConfig::open(0));
    let mut urgent = QosConfig::open(10_000);
    urgent.preempts = vec!["scavenger".into()];
    cfg.qos.insert("urgent".into(), urgent);
    cfg.preemption.min_run = std::time::Duration::ZERO;
    cfg.windows.insert(
        "always".into(),
        Window {
            days: ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
                .map(String::from)
                .to_vec(),
            start: "00:00".into(),
            end: "23:59".into(),
            floor: [("alice".to_string(), 0.5)].into(),
            partition_floor: std::collections::BTreeMap::new(),
            qos_priority: Default::default(),
            preemption: Some(true),
            gpu_power_limit: None,
            gpu_power_limit_nodes: Default::default(),
        },
    );
    cfg.resolve_qos();
    cfg
}

/// The simulated agents: instances running, and ends due (time, job, attempt, node, state).
#[derive(Default)]
struct Agents {
    due: Vec<(i64, u64, u32, String, State)>,
}

impl Agents {
    fn run(&mut self, c: &mut Cluster, e: Effects, now: i64) {
        for (node, cmd) in e.sends {
            match cmd {
                Command::Start(s) => {
                    let r = Report {
                        time_ms: now,
                        ..Report::new(&node, s.job_id, s.attempt, ReportKind::Started)
                    };
                    c.report(&r, now);
                    checked(c);
                }
                Command::Kill(k) => {
                    let t = now + i64::try_from(k.kill_grace_secs).unwrap() * 1000;
                    self.due.push((t, k.job_id, k.attempt, node, k.as_state));
                }
                Command::Limit(l) => unreachable!("no job is updated here: {l:?}"),
                Command::Mig(m) => unreachable!("no node is dynamic-MIG here: {m:?}"),
            }
        }
    }

    fn end(c: &mut Cluster, id: u64, attempt: u32, node: &str, state: State, now: i64) {
        let r = Report {
            state,
            exit_code: Some(0),
            time_ms: now,
            ..Report::new(node, id, attempt, ReportKind::Ended)
        };
        c.report(&r, now);
        checked(c);
    }

    fn advance(&mut self, c: &mut Cluster, now: i64) {
        self.due.sort_by_key(|d| d.0);
        let (ready, rest): (Vec<_>, Vec<_>) = self.due.drain(..).partition(|d| d.0 <= now);
        self.due = rest;
        for (t, id, attempt, node, state) in ready {
            Agents::end(c, id, attempt, &node, state, t);
        }
    }
}

/// No GPU over its capacity; the floor: others hold at most half the GPUs.
fn check(c: &Cluster) {
    let mut per_gpu: HashMap<String, u32> = HashMap::new();
    let mut others = 0u32;
    for s in c.jobs().active() {
        let j = &s.job;
        if j.state != JobState::Running {
            continue;
        }
        let spec = &j.spec;
        for a in j.allocations.iter().filter(|a| !a.ended) {
            for sl in &a.slots {
                *per_gpu.entry(sl.uuid.clone()).or_default() += sl.compute_milli;
                if spec.account != "alice" && spec.qos != "scavenger" {
                    others += sl.compute_milli;
                }
            }
        }
    }
    for (gpu, m) in per_gpu {
        assert!(m <= 1000, "{gpu} holds {m} milli");
    }
    assert!(
        others <= 2000,
        "other accounts hold {others} milli of 4000 (floor: half)"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn no_gpu_is_over_allocated_and_the_floor_holds(steps in prop::collection::vec(step(), 1..80)) {
        let mut c = Cluster::new(config());
        // 2024-01-01 is a Monday; the window is open all day but the last minute.
        let mut now = 1_704_103_200_000; // 10:00 UTC
        attach(&mut c, "n1", now);
        attach(&mut c, "n2", now);
        let mut agents = Agents::default();
        for s in steps {
            match s {
                Step::Submit { bob, gpus, qos, requeue, minutes } => {
                    let user = if bob { "bob" } else { "alice" };
                    let actor = Actor { user: user.into(), admin: false };
                    let mut sp = spec(gpus, requeue);
                    sp.user = user.into();
                    sp.qos = ["scavenger", "normal", "urgent"][qos as usize].into();
                    sp.resources.time_limit_secs = minutes * 60;
                    if let Ok(Admission::New(j)) = c.admit(&actor, sp, "", now) {
                        c.commit_submit(*j);
                    }
                }
                Step::Pass => {
                    let e = pass(&mut c, now);
                    agents.run(&mut c, e, now);
                }
                Step::Advance(secs) => {
                    now += secs * 1000;
                    agents.advance(&mut c, now);
                }
                Step::End(k) => {
                    let running: Vec<(u64, u32, String)> = c
                        .jobs()
                        .active()
                        .map(|s| &s.job)
                        .filter(|j| j.state == JobState::Running)
                        .flat_map(|j| j.allocations.iter().filter(|a| !a.ended).map(|a| (j.id, j.attempt, a.node.clone())))
                        .collect();
                    if let Some((id, attempt, node)) = running.get(k % running.len().max(1)).cloned() {
                        Agents::end(&mut c, id, attempt, &node, State::Completed, now);
                    }
                }
            }
            check(&c);
        }
    }
}

/// Alice's account owns half the GPUs all week; the floor lends to jobs that
/// checkpoint. Borrowers are protected for 5 minutes, longer than the 120 s bound.
fn lending_config() -> Config {
    let mut cfg = config();
    cfg.qos.clear();
    cfg.preemption.min_run = std::time::Duration::from_secs(300);
    cfg.resolve_qos();
    cfg
}

/// An owner's job waited past the bound although a node had room for it once the
/// borrowers on it were gone, and its owner held less than the floor with it.
fn owner_waits_past_the_bound(c: &Cluster, now: i64) -> Option<String> {
    let (mut alice_held, mut free): (u32, HashMap<String, u32>) = (0, HashMap::new());
    for node in ["n1", "n2"] {
        free.insert(node.into(), 2000);
    }
    let borrower = |j: &Job| {
        let s = &j.spec;
        s.account != "alice" && s.requeue && !s.signal.is_empty()
    };
    for j in c.jobs().active().map(|s| &s.job) {
        if j.state != JobState::Running {
            continue;
        }
        for a in j.allocations.iter().filter(|a| !a.ended) {
            let m: u32 = a.slots.iter().map(|s| s.compute_milli).sum();
            if j.spec.account == "alice" {
                alice_held += m;
            }
            // What a borrower holds is the owner's to take back.
            if !borrower(j) {
                *free.get_mut(&a.node).unwrap() -= m;
            }
        }
    }
    for j in c.jobs().active().map(|s| &s.job) {
        let spec = &j.spec;
        if j.state != JobState::Pending || spec.account != "alice" {
            continue;
        }
        let need = match spec.resources.gpu {
            Some(GpuPart::Gpus(n)) => n * 1000,
            _ => 0,
        };
        let waited = now - j.submit_time_ms;
        if waited > 120_000 && alice_held + need <= 2000 && free.values().any(|&f| f >= need) {
            return Some(format!("job {} waited {waited} ms ({spec:?})", j.id));
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn a_floors_owner_never_waits_past_the_reclaim_bound_while_borrowers_hold_its_gpus(
        steps in prop::collection::vec((any::<bool>(), 1u32..=2, any::<bool>(), 1u64..120, 1i64..6), 1..120)
    ) {
        let mut c = Cluster::new(lending_config());
        let mut now = 1_704_103_200_000; // Monday 10:00 UTC
        attach(&mut c, "n1", now);
        attach(&mut c, "n2", now);
        let mut agents = Agents::default();
        for (bob, gpus, ckpt, minutes, secs) in steps {
            // A submit runs a pass; jobs end at their time limit.
            let user = if bob { "bob" } else { "alice" };
            let actor = Actor { user: user.into(), admin: false };
            let mut sp = spec(gpus, bob && ckpt);
            sp.user = user.into();
            if bob && ckpt {
                sp.signal = "USR1@10".into();
            }
            sp.resources.time_limit_secs = minutes * 60;
            if let Ok(Admission::New(j)) = c.admit(&actor, sp, "", now) {
                c.commit_submit(*j);
                checked(&c);
            }
            let e = pass(&mut c, now);
            agents.run(&mut c, e, now);
            // Until the next step: every instance's end and every wake the controller
            // asks for runs a pass at its moment, as the daemon's do.
            let target = now + secs * 1000;
            loop {
                let due = agents.due.iter().map(|d| d.0).min();
                let wake = c.next_wake_ms().filter(|&t| t > now);
                let Some(t) = [due, wake].into_iter().flatten().filter(|&t| t <= target).min() else {
                    break;
                };
                now = now.max(t);
                agents.advance(&mut c, now);
                let e = pass(&mut c, now);
                agents.run(&mut c, e, now);
                if let Some(why) = owner_waits_past_the_bound(&c, now) {
                    prop_assert!(false, "{why}");
                }
            }
            now = target;
            let over: Vec<(u64, u32, String)> = c
                .jobs()
                .active()
                .map(|s| &s.job)
                .filter(|j| j.state == JobState::Running)
                .filter(|j| now - j.start_time_ms >= j.time_limit_secs as i64 * 1000)
                .flat_map(|j| j.allocations.iter().filter(|a| !a.ended).map(|a| (j.id, j.attempt, a.node.clone())))
                .collect();
            for (id, attempt, node) in over {
                Agents::end(&mut c, id, attempt, &node, State::Completed, now);
            }
            let e = pass(&mut c, now);
            agents.run(&mut c, e, now);
            if let Some(why) = owner_waits_past_the_bound(&c, now) {
                prop_assert!(false, "{why}");
            }
        }
    }
}
