//! `max_restarts`: a job that fails is queued again, at most that many times; nothing
//! else (a completion, a time limit, a cancel) restarts it.

mod common;

use common::*;
use gpuctl_core::Cluster;
use gpuctl_core::operations::Operations as _;
use gpuctl_core::record::{JobSpec, JobState};

fn restarting(gpus: u32, max: u32) -> JobSpec {
    JobSpec {
        max_restarts: max,
        ..spec(gpus, false)
    }
}

/// Starts every pending job it can at `now`, each reported running.
fn start(c: &mut Cluster, now: i64) {
    let e = pass(c, now);
    for (node, what) in commands(&e) {
        if let Some(id) = what.strip_prefix("start ") {
            report(c, &node, id.parse().unwrap(), None, now);
        }
    }
}

#[test]
fn a_failed_job_is_queued_again_up_to_its_max_restarts_then_fails() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let id = submit_spec(&mut c, restarting(1, 2), T0);
    for n in 1..=2u32 {
        let now = T0 + i64::from(n) * 1000;
        start(&mut c, now);
        assert_eq!(state(&c, id), JobState::Running);
        report(&mut c, "n1", id, Some((JobState::Failed, 3)), now + 1);
        let j = c.jobs().job(id).unwrap();
        assert_eq!(j.state, JobState::Pending, "restart {n}");
        assert_eq!(j.restarts, n);
        assert_eq!(j.attempt, n, "attempt counts the starts so far");
        assert_eq!(
            j.reason,
            format!("requeued after a failure (exit 3): restart {n} of 2")
        );
    }
    start(&mut c, T0 + 5000);
    report(&mut c, "n1", id, Some((JobState::Failed, 3)), T0 + 5001);
    let j = c.jobs().job(id).unwrap();
    assert_eq!(j.state, JobState::Failed, "no restart left");
    assert_eq!((j.restarts, j.exit_code), (2, Some(3)));
}

#[test]
fn completions_time_limits_and_cancels_are_not_restarted() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let done = submit_spec(&mut c, restarting(1, 5), T0);
    let late = submit_spec(&mut c, restarting(1, 5), T0);
    start(&mut c, T0);
    report(&mut c, "n1", done, Some((JobState::Completed, 0)), T0 + 1);
    report(&mut c, "n1", late, Some((JobState::Timeout, 137)), T0 + 1);
    assert_eq!(state(&c, done), JobState::Completed);
    assert_eq!(state(&c, late), JobState::Timeout);

    let cancelled = submit_spec(&mut c, restarting(1, 5), T0 + 2);
    start(&mut c, T0 + 2);
    c.cancel(&alice(), &[cancelled], T0 + 3).unwrap();
    // Killed: even reported as a failure (its process ended by a signal), a cancelled
    // job is not restarted.
    report(
        &mut c,
        "n1",
        cancelled,
        Some((JobState::Failed, 143)),
        T0 + 4,
    );
    let j = c.jobs().job(cancelled).unwrap();
    assert!(j.state.is_final(), "{:?}", j.state);
    assert_eq!(j.restarts, 0);
}

#[test]
fn a_gang_restarts_once_its_other_ranks_are_killed() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    attach(&mut c, "n2", T0);
    let mut s = restarting(2, 1);
    s.resources.nodes = 2;
    let id = submit_spec(&mut c, s, T0);
    start(&mut c, T0);
    assert_eq!(state(&c, id), JobState::Running);
    // Rank 0 fails: rank 1 is killed, and the job waits for its end.
    let e = report(&mut c, "n1", id, Some((JobState::Failed, 1)), T0 + 1);
    assert!(
        commands(&e).contains(&to("n2", &format!("kill {id}"))),
        "{:?}",
        commands(&e)
    );
    assert_eq!(state(&c, id), JobState::Running);
    report(&mut c, "n2", id, Some((JobState::Failed, 143)), T0 + 2);
    let j = c.jobs().job(id).unwrap();
    assert_eq!(j.state, JobState::Pending);
    assert_eq!(j.restarts, 1, "one failure, one restart");
    // Its second start fails too: no restart left.
    start(&mut c, T0 + 3);
    report(&mut c, "n1", id, Some((JobState::Failed, 1)), T0 + 4);
    report(&mut c, "n2", id, Some((JobState::Failed, 143)), T0 + 5);
    assert_eq!(state(&c, id), JobState::Failed);
}

#[test]
fn absurd_restart_counts_are_refused_with_the_limit() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let Err(e) = c.admit(&alice(), restarting(1, 1_000_000), "", T0) else {
        panic!("a million restarts admitted")
    };
    assert_eq!(e.message, "max_restarts = 1000000: at most 100");
}
