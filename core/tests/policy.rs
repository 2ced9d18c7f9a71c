//! Policy in the state machine: fair share charging, holds, requeues, QoS caps and
//! preemption, driven event by event with the agents played by the test.

mod common;

use common::*;
use gpuctl_core::command::{Command, Kill};
use gpuctl_core::operations::Operations as _;
use gpuctl_core::ops::Admission;
use gpuctl_core::record::{JobSpec, JobState};
use gpuctl_core::{Actor, Cluster, Config, Effects};

fn actor(user: &str, admin: bool) -> Actor {
    Actor {
        user: user.into(),
        admin,
    }
}

fn submit_as(c: &mut Cluster, who: &Actor, mut spec: JobSpec, now: i64) -> u64 {
    spec.user = who.user.clone();
    match c.admit(who, spec, "", now).expect("admitted") {
        Admission::New(stored) => {
            let id = stored.job.id;
            c.commit_submit(*stored);
            id
        }
        Admission::Array(_) | Admission::Repeat(_) => panic!("one job"),
    }
}

fn kills(effects: &Effects) -> Vec<Kill> {
    effects
        .sends
        .iter()
        .filter_map(|(_, c)| match c {
            Command::Kill(k) => Some(k.clone()),
            _ => None,
        })
        .collect()
}

/// The agent reports every start `effects` sent as running.
fn started(c: &mut Cluster, node: &str, effects: &Effects, now: i64) {
    for (n, cmd) in &effects.sends {
        if let Command::Start(s) = cmd {
            assert_eq!(n, node);
            report(c, node, s.job_id, None, now);
        }
    }
}

#[test]
fn usage_is_charged_and_the_lighter_user_goes_first() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let a = submit(&mut c, 2, false, T0);
    let e = pass(&mut c, T0);
    started(&mut c, "n1", &e, T0);
    // An hour later alice's job ends: 2 GPU-hours charged to alice.
    let hour = 3_600_000;
    report(&mut c, "n1", a, Some((JobState::Completed, 0)), T0 + hour);
    pass(&mut c, T0 + hour);
    let used = c.fair_usage().of_account("alice");
    assert!((used - 7200.0).abs() < 60.0, "{used}");
    // Alice and bob submit at the same time: bob, who used nothing, ranks first.
    let bob = actor("bob", false);
    let next_a = submit(&mut c, 2, false, T0 + hour + 1);
    let b = submit_as(&mut c, &bob, spec(2, false), T0 + hour + 1);
    let e = pass(&mut c, T0 + hour + 2);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {b}"))]);
    assert_eq!(state(&c, next_a), JobState::Pending);
    let t = c.fair_share_table();
    assert!(t.factor("alice", "alice") < t.factor("bob", "bob"));
    // The record the store keeps comes back whole.
    let records = gpuctl_core::restore::Records {
        usage: Some(c.usage_record()),
        ..Default::default()
    };
    let d = gpuctl_core::restore::restore(c.config().clone(), records, T0 + hour + 3).cluster;
    assert_eq!(d.fair_usage(), c.fair_usage());
}

#[test]
fn held_jobs_stay_out_of_passes_until_released() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let id = submit(&mut c, 1, false, T0);
    c.hold(&alice(), id).unwrap();
    assert!(commands(&pass(&mut c, T0 + 1)).is_empty());
    assert_eq!(c.jobs().job(id).unwrap().reason, "JobHeldUser");
    // Someone else may not release it; an admin's hold only an admin lifts.
    assert!(c.release(&actor("bob", false), id).is_err());
    c.hold(&actor("root", true), id).unwrap();
    assert_eq!(c.jobs().job(id).unwrap().reason, "JobHeldAdmin");
    assert!(c.release(&alice(), id).is_err());
    c.release(&actor("root", true), id).unwrap();
    let e = pass(&mut c, T0 + 2);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {id}"))]);
    // A running job is not held.
    assert!(c.hold(&alice(), id).is_err());
}

#[test]
fn a_requeued_job_waits_for_its_instance_then_runs_again_as_the_same_job() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let id = submit(&mut c, 2, false, T0);
    let e = pass(&mut c, T0);
    started(&mut c, "n1", &e, T0);
    let e = c.requeue(&alice(), id, T0 + 10).unwrap();
    assert_eq!(commands(&e), vec![to("n1", &format!("kill {id}"))]);
    // Still running (its GPUs held) until the agent says it ended.
    assert_eq!(state(&c, id), JobState::Running);
    assert!(commands(&pass(&mut c, T0 + 11)).is_empty());
    report(&mut c, "n1", id, Some((JobState::Cancelled, -15)), T0 + 20);
    let j = c.jobs().job(id).unwrap();
    assert_eq!(j.state, JobState::Pending);
    assert_eq!(j.reason, "requeued by alice");
    assert_eq!(j.submit_time_ms, T0);
    let e = pass(&mut c, T0 + 21);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {id}"))]);
    assert_eq!(c.jobs().job(id).unwrap().attempt, 2);
}

#[test]
fn a_qos_cap_holds_a_users_next_job_with_its_own_reason() {
    let mut cfg = Config::default();
    cfg.qos.get_mut("normal").unwrap().max_gpus_per_user = Some(2.0);
    let mut c = Cluster::new(cfg);
    attach(&mut c, "n1", T0);
    attach(&mut c, "n2", T0);
    let first = submit(&mut c, 2, false, T0);
    let second = submit(&mut c, 2, false, T0);
    let bob = submit_as(&mut c, &actor("bob", false), spec(1, false), T0);
    let e = pass(&mut c, T0);
    let starts = commands(&e);
    assert!(
        starts.iter().any(|(_, w)| *w == format!("start {first}")),
        "{starts:?} {}",
        c.jobs().job(first).unwrap().reason
    );
    assert!(starts.iter().any(|(_, w)| *w == format!("start {bob}")));
    assert_eq!(starts.len(), 2, "{starts:?}");
    let j = c.jobs().job(second).unwrap();
    assert_eq!(j.reason, "QOSMaxGpusPerUser");
    assert_eq!(j.expected_start_ms, 0);
}

/// A config where alice's `scavenger` jobs may be preempted by `urgent` ones.
fn preempting_config() -> Config {
    let mut cfg = Config::default();
    let low = gpuctl_core::config::QosConfig::open(0);
    cfg.qos.insert("scavenger".into(), low);
    let mut urgent = gpuctl_core::config::QosConfig::open(10_000);
    urgent.preempts = vec!["scavenger".into()];
    cfg.qos.insert("urgent".into(), urgent);
    cfg.preemption.min_run = std::time::Duration::from_secs(60);
    cfg.resolve_qos();
    cfg
}

#[test]
fn preemption_signals_the_victim_then_requeues_it_and_starts_the_preemptor() {
    let mut c = Cluster::new(preempting_config());
    attach(&mut c, "n1", T0);
    let mut victim_spec = spec(2, true);
    victim_spec.qos = "scavenger".into();
    victim_spec.signal = "USR1@30".into();
    let victim = submit_spec(&mut c, victim_spec, T0);
    let e = pass(&mut c, T0);
    started(&mut c, "n1", &e, T0);
    // A young victim is protected: nothing happens for 60 s.
    let mut urgent = spec(2, false);
    urgent.qos = "urgent".into();
    let u = submit_spec(&mut c, urgent, T0 + 10_000);
    assert!(kills(&pass(&mut c, T0 + 10_000)).is_empty());
    // It is expected to start when the victim's minimum run ends, not when the
    // victim's time limit would.
    let victim_start = c.jobs().job(victim).unwrap().start_time_ms;
    assert_eq!(
        c.jobs().job(u).unwrap().expected_start_ms,
        victim_start + 60_000
    );
    let e = pass(&mut c, T0 + 61_000);
    let k = kills(&e);
    assert_eq!(k.len(), 1);
    assert_eq!(
        (k[0].job_id, k[0].signal.as_str(), k[0].kill_grace_secs),
        (victim, "USR1", 30)
    );
    // The preemptor waits for the victim's GPUs; no second victim is taken.
    assert_eq!(state(&c, u), JobState::Pending);
    assert!(kills(&pass(&mut c, T0 + 62_000)).is_empty());
    report(
        &mut c,
        "n1",
        victim,
        Some((JobState::Cancelled, -10)),
        T0 + 80_000,
    );
    let v = c.jobs().job(victim).unwrap();
    assert_eq!(v.state, JobState::Pending);
    assert_eq!(v.reason, format!("Preempted by job {u}"));
    assert_eq!(v.submit_time_ms, T0);
    let e = pass(&mut c, T0 + 80_001);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {u}"))]);
}

#[test]
fn a_victim_that_is_not_requeueable_ends_preempted() {
    let mut c = Cluster::new(preempting_config());
    attach(&mut c, "n1", T0);
    let mut victim_spec = spec(2, false);
    victim_spec.qos = "scavenger".into();
    let victim = submit_spec(&mut c, victim_spec, T0);
    let e = pass(&mut c, T0);
    started(&mut c, "n1", &e, T0);
    let mut urgent = spec(1, false);
    urgent.qos = "urgent".into();
    submit_spec(&mut c, urgent, T0 + 120_000);
    let k = kills(&pass(&mut c, T0 + 120_000));
    assert_eq!(k.len(), 1);
    assert_eq!(k[0].as_state, gpuctl_sched::job::JobState::Preempted);
    report(
        &mut c,
        "n1",
        victim,
        Some((JobState::Preempted, -15)),
        T0 + 130_000,
    );
    assert_eq!(state(&c, victim), JobState::Preempted);
}

#[test]
fn an_array_makes_one_job_per_task_and_its_throttle_holds() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    attach(&mut c, "n2", T0);
    let mut s = spec(1, false);
    s.array = "0-5%2".into();
    let first = submit_spec(&mut c, s, T0);
    let tasks: Vec<u64> = (first..first + 6).collect();
    for (i, id) in tasks.iter().enumerate() {
        let sp = c.jobs().job(*id).unwrap().spec.clone();
        assert_eq!((sp.array_job_id, sp.array_task_id), (first, Some(i as u32)));
    }
    // Four GPUs free, two tasks at once.
    let e = pass(&mut c, T0);
    assert_eq!(commands(&e).len(), 2, "{:?}", commands(&e));
    for (node, cmd) in &e.sends {
        if let Command::Start(st) = cmd {
            report(&mut c, node, st.job_id, None, T0);
        }
    }
    assert_eq!(c.jobs().job(first + 2).unwrap().reason, "JobArrayTaskLimit");
    // One ends: one more starts.
    let node = c.jobs().job(first).unwrap().allocations[0].node.clone();
    report(
        &mut c,
        &node,
        first,
        Some((JobState::Completed, 0)),
        T0 + 10,
    );
    let e = pass(&mut c, T0 + 11);
    assert_eq!(commands(&e).len(), 1);
    // Cancelling the array's id cancels every task left.
    let (results, _) = c.cancel(&alice(), &[first], T0 + 12).unwrap();
    assert_eq!(results.len(), 6);
    assert_eq!(results.iter().filter(|r| r.ok).count(), 5, "{results:?}");
    // A submit may not pose as a task.
    let mut fake = spec(1, false);
    fake.array_job_id = 7;
    assert!(c.admit(&alice(), fake, "", T0).is_err());
}

#[test]
fn charges_follow_each_run_across_passes_and_a_requeue() {
    let mut cfg = Config::default();
    // No decay within the test: the charges add up exactly.
    cfg.fairshare.half_life = std::time::Duration::from_secs(1 << 40);
    let mut c = Cluster::new(cfg);
    attach(&mut c, "n1", T0);
    let id = submit(&mut c, 2, false, T0);
    let e = pass(&mut c, T0);
    // Its charge rate is computed as it starts (in the apply's parts), not by the next
    // charge (after a mass start, all at once in one hold).
    assert_eq!(c.charged_jobs(), 1);
    started(&mut c, "n1", &e, T0);
    let hour = 3_600_000;
    // Two passes an hour apart: the second charges from the first, not from the start.
    pass(&mut c, T0 + hour);
    pass(&mut c, T0 + 2 * hour);
    let used = c.fair_usage().of_account("alice");
    assert!((used - 2.0 * 7200.0).abs() < 1e-3, "{used}");
    // Requeued: the first run is charged to its end; the second from its own start.
    c.requeue(&alice(), id, T0 + 2 * hour + 10_000).unwrap();
    report(
        &mut c,
        "n1",
        id,
        Some((JobState::Cancelled, -15)),
        T0 + 2 * hour + 20_000,
    );
    let e = pass(&mut c, T0 + 2 * hour + 21_000);
    started(&mut c, "n1", &e, T0 + 2 * hour + 21_000);
    assert_eq!(state(&c, id), JobState::Running);
    pass(&mut c, T0 + 3 * hour);
    let used = c.fair_usage().of_account("alice");
    let want = 2.0 * (7_220.0 + 3_600.0 - 21.0);
    assert!((used - want).abs() < 1e-3, "{used} != {want}");
    // One run is kept between charges, and none once it has ended.
    assert_eq!(c.charged_jobs(), 1);
    report(
        &mut c,
        "n1",
        id,
        Some((JobState::Completed, 0)),
        T0 + 3 * hour + 1_000,
    );
    pass(&mut c, T0 + 3 * hour + 2_000);
    assert!(c.charged_jobs() == 0, "{} kept", c.charged_jobs());
    let used = c.fair_usage().of_account("alice");
    let want = want + 2.0 * 1.0;
    assert!((used - want).abs() < 1e-3, "{used} != {want}");
}

#[test]
fn a_job_cancelled_before_its_start_was_reported_is_stale_when_it_is() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let id = submit(&mut c, 1, false, T0);
    let e = pass(&mut c, T0);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {id}"))]);
    // Cancelled before the agent said it runs: the cancel's kill and the pass's start
    // go out from different tasks, so the kill may reach the agent first (ignored: no
    // such job yet). The start's report is then answered "stale": the agent kills it.
    let (_, e) = c.cancel(&alice(), &[id], T0 + 1).unwrap();
    assert_eq!(commands(&e), vec![to("n1", &format!("kill {id}"))]);
    let started = job_report(&c, "n1", id, None, T0 + 2);
    assert!(c.report(&started, T0 + 2).0);
    // A start reported as usual is not.
    let other = submit(&mut c, 1, false, T0 + 3);
    pass(&mut c, T0 + 3);
    let started = job_report(&c, "n1", other, None, T0 + 4);
    assert!(!c.report(&started, T0 + 4).0);
}

/// Training may hold half of 4 GPUs while inference's window is open; a job that
/// checkpoints and requeues borrows the rest and says so, and inference takes it back.
#[test]
fn a_checkpointing_job_borrows_the_floor_says_so_and_is_taken_back() {
    let mut cfg: Config = toml::from_str(
        r#"
[accounts.inference]
users = ["alice"]
[accounts.training]
users = ["bob"]
[preemption]
min_run = "5m"
[windows.always]
days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
start = "00:00"
end = "23:59"
floor = { inference = 0.5 }
preemption = true
"#,
    )
    .unwrap();
    cfg.resolve_qos();
    let mut c = Cluster::new(cfg);
    let now = 1_704_103_200_000; // Monday 10:00 UTC
    attach(&mut c, "n1", now);
    attach(&mut c, "n2", now);
    let bob = actor("bob", false);
    let mut ckpt = spec(1, true);
    ckpt.signal = "USR1@10".into();
    let run_all = |c: &mut Cluster, e: &Effects, now: i64| {
        for node in ["n1", "n2"] {
            let sends = e.sends.iter().filter(|(n, _)| n == node).cloned().collect();
            let mine = Effects {
                sends,
                ..Effects::default()
            };
            started(c, node, &mine, now);
        }
    };
    // Training may hold 2 of the 4 GPUs: a third job that cannot give back waits.
    let plain: Vec<u64> = (0..3)
        .map(|_| submit_as(&mut c, &bob, spec(1, false), now))
        .collect();
    let e = pass(&mut c, now);
    run_all(&mut c, &e, now);
    assert_eq!(c.jobs().job(plain[2]).unwrap().reason, "WindowFloor");
    // Two that checkpoint and requeue borrow the rest, and say so.
    let ids: Vec<u64> = (0..2)
        .map(|_| submit_as(&mut c, &bob, ckpt.clone(), now))
        .collect();
    let e = pass(&mut c, now);
    run_all(&mut c, &e, now);
    let borrowing = "Borrowing the inference floor (window always), may be reclaimed";
    for &id in &ids {
        let j = c.jobs().job(id).unwrap();
        assert_eq!(j.state, JobState::Running, "{j:?}");
        assert_eq!(j.reason, borrowing);
    }
    // Inference asks for a GPU: just submitted, the borrowers keep their minimum run,
    // and the controller is told when the bound comes at risk (120 s less the lead
    // and the slack); then one borrower gets its signal.
    let alice = actor("alice", false);
    let i = submit_as(&mut c, &alice, spec(1, false), now + 1000);
    let e = pass(&mut c, now + 1000);
    assert!(kills(&e).is_empty());
    assert_eq!(
        c.next_wake_ms(),
        Some(now + 1000 + 120_000 - 10_000 - 5_000)
    );
    let e = pass(&mut c, now + 106_000);
    let k = kills(&e);
    assert_eq!(k.len(), 1, "{k:?}");
    assert_eq!(k[0].signal, "USR1");
    assert_eq!(k[0].kill_grace_secs, 10);
    assert!(ids.contains(&k[0].job_id));
    assert_eq!(state(&c, i), JobState::Pending);
}

#[test]
fn a_hold_is_written_and_comes_back_after_a_restart() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let id = submit(&mut c, 1, false, T0);
    c.take_changes();
    c.hold(&alice(), id).unwrap();
    let changed = c.take_changes();
    assert!(
        changed.jobs.put.contains(&id),
        "a hold is a change to write"
    );
    let records = gpuctl_core::restore::Records {
        jobs: c.jobs().active().cloned().collect(),
        next_job_id: id + 1,
        ..Default::default()
    };
    let mut d = gpuctl_core::restore::restore(c.config().clone(), records, T0 + 5).cluster;
    attach(&mut d, "n1", T0 + 6);
    assert!(commands(&pass(&mut d, T0 + 7)).is_empty(), "still held");
    assert_eq!(d.jobs().job(id).unwrap().reason, "JobHeldUser");
}
