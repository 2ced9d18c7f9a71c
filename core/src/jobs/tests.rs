use proptest::prelude::*;

use super::*;
use crate::record::*;

fn pending(id: u64, user: &str, deps: bool, request: &str) -> Record {
    let dependencies = if deps {
        vec![Dependency {
            kind: DependencyKind::AfterOk,
            job_id: 1,
        }]
    } else {
        Vec::new()
    };
    Record {
        job: Job {
            id,
            state: JobState::Pending,
            submit_time_ms: 1,
            spec: JobSpec {
                user: user.into(),
                // Two names, so that the by-name index has more than one entry.
                name: format!("train-{}", id % 2),
                env: [("SECRET".to_string(), "x".to_string())].into(),
                dependencies,
                ..JobSpec::default()
            },
            ..Job::default()
        },
        request_id: request.into(),
        ..Record::default()
    }
}

fn on(node: &str, gpu: &str) -> Allocation {
    Allocation {
        node: node.into(),
        slots: vec![SlotUse {
            uuid: gpu.into(),
            compute_milli: 1000,
            memory_mib: 0,
        }],
        ..Allocation::default()
    }
}

fn start(t: &mut Jobs, id: u64, node: &str, now: i64) {
    let allocations = vec![on(node, "GPU-1")];
    t.transition(id, Transition::Start { allocations }, now)
        .unwrap();
}

#[test]
fn submit_start_end_keeps_every_index() {
    let mut t = Jobs::default();
    t.insert(pending(1, "alice", false, "r1"));
    t.insert(pending(2, "alice", true, ""));
    t.check().unwrap();
    assert_eq!(t.pending_of("alice"), 2);
    assert_eq!(t.by_request("alice", "r1"), Some(1));
    assert_eq!(t.with_deps().count(), 1);
    assert!(
        t.take_changes().is_empty(),
        "inserts are written by the caller"
    );

    let named =
        |t: &Jobs, name: &str| -> Vec<u64> { t.active_named(name).map(|s| s.job.id).collect() };
    assert_eq!(named(&t, "train-1"), [1]);
    assert_eq!(named(&t, "train-0"), [2]);
    start(&mut t, 1, "n1", 100);
    t.check().unwrap();
    assert_eq!(named(&t, "train-1"), [1], "a running job is still active");
    let j = presented(t.job(1).unwrap());
    assert_eq!(
        (j.state, j.attempt, j.start_time_ms),
        (JobState::Running, 1, 100)
    );
    assert_eq!(
        (j.node.as_str(), j.gpus.as_slice()),
        ("n1", &["GPU-1".to_string()][..])
    );
    assert_eq!(t.pending_of("alice"), 1);

    let finish = Transition::Finish {
        state: JobState::Completed,
        exit_code: Some(0),
        reason: String::new(),
    };
    t.transition(1, finish, 200).unwrap();
    t.check().unwrap();
    let j = t.job(1).unwrap();
    assert_eq!((j.state, j.end_time_ms), (JobState::Completed, 200));
    assert!(
        j.allocations
            .iter()
            .all(|a| a.ended && a.state == Some(JobState::Completed))
    );
    assert!(j.spec.env.is_empty(), "compacted at its end");
    assert_eq!(t.active_ids(), vec![2]);
    assert!(named(&t, "train-1").is_empty(), "an ended job is not");
    let changes = t.take_changes();
    assert_eq!(changes.put, [1].into());
    assert!(t.take_changes().is_empty());
}

#[test]
fn illegal_transitions_are_refused_and_change_nothing() {
    let mut t = Jobs::default();
    t.insert(pending(1, "bob", false, ""));
    let requeue = Transition::Requeue {
        reason: "x".into(),
        keep_for_readopt: false,
    };
    assert!(matches!(
        t.transition(1, requeue.clone(), 5),
        Err(Refused::Illegal {
            from: JobState::Pending,
            ..
        })
    ));
    let cancel = Transition::Finish {
        state: JobState::Cancelled,
        exit_code: None,
        reason: "by bob".into(),
    };
    t.transition(1, cancel.clone(), 5).unwrap();
    assert!(matches!(
        t.transition(1, cancel, 6),
        Err(Refused::Illegal { .. })
    ));
    let allocations = vec![on("n1", "GPU-1")];
    assert!(
        t.transition(1, Transition::Start { allocations }, 7)
            .is_err()
    );
    assert_eq!(t.transition(9, requeue, 7), Err(Refused::Unknown(9)));
    let not_final = Transition::Finish {
        state: JobState::Running,
        exit_code: None,
        reason: String::new(),
    };
    t.insert(pending(2, "bob", false, ""));
    assert!(t.transition(2, not_final, 8).is_err());
    t.check().unwrap();
    assert_eq!(t.job(1).unwrap().end_time_ms, 5);
}

#[test]
fn requeue_then_readopt_restores_the_running_record() {
    let mut t = Jobs::default();
    t.insert(pending(1, "carol", false, ""));
    start(&mut t, 1, "n1", 10);
    let requeue = Transition::Requeue {
        reason: "requeued: node n1 failed".into(),
        keep_for_readopt: true,
    };
    t.transition(1, requeue, 20).unwrap();
    t.check().unwrap();
    let j = t.job(1).unwrap();
    assert_eq!((j.state, j.attempt), (JobState::Pending, 1));
    assert!(j.allocations.is_empty() && j.node.is_empty());
    assert_eq!(t.pending_of("carol"), 1);
    // Another node, or another attempt, cannot take it back.
    let wrong = Transition::Readopt {
        node: "n2".into(),
        attempt: 1,
    };
    assert!(t.transition(1, wrong, 30).is_err());
    let old = Transition::Readopt {
        node: "n1".into(),
        attempt: 0,
    };
    assert!(t.transition(1, old, 30).is_err());
    let back = Transition::Readopt {
        node: "n1".into(),
        attempt: 1,
    };
    t.transition(1, back, 30).unwrap();
    t.check().unwrap();
    let j = presented(t.job(1).unwrap());
    assert_eq!(
        (j.state, j.start_time_ms, j.node.as_str()),
        (JobState::Running, 10, "n1")
    );
    assert!(t.get(1).unwrap().start_confirmed);
    assert_eq!(t.pending_of("carol"), 0);
}

#[test]
fn edit_may_not_change_the_state() {
    let mut t = Jobs::default();
    t.insert(pending(1, "dan", false, ""));
    t.edit(1, |s| s.cancel_requested = true).unwrap();
    assert_eq!(t.take_changes().put, [1].into());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        t.edit(1, |s| s.job.state = JobState::Running)
    }));
    assert!(r.is_err());
}

#[test]
fn all_and_newest_walk_live_and_finished_jobs_in_id_order() {
    let mut t = Jobs::default();
    for id in 1..=7 {
        t.insert(pending(id, "erin", false, &format!("r{id}")));
    }
    // Finished: 1, 2, 5 and 7; live: 3, 4 (running), 6.
    for id in [1, 2, 5, 7] {
        let done = Transition::Finish {
            state: JobState::Completed,
            exit_code: Some(0),
            reason: String::new(),
        };
        t.transition(id, done, 100).unwrap();
    }
    start(&mut t, 4, "n1", 50);
    t.check().unwrap();
    let ids =
        |it: &mut dyn Iterator<Item = &Record>| -> Vec<u64> { it.map(|s| s.job.id).collect() };
    assert_eq!(ids(&mut t.all()), vec![1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(ids(&mut t.newest()), vec![7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(ids(&mut t.active()), vec![3, 4, 6]);
    assert_eq!(t.on_node("n1"), vec![4]);
}

#[test]
fn retention_removes_the_oldest_finished_and_their_request_ids() {
    let mut t = Jobs::default();
    for id in 1..=5 {
        t.insert(pending(id, "erin", false, &format!("r{id}")));
        let done = Transition::Finish {
            state: JobState::Completed,
            exit_code: Some(0),
            reason: String::new(),
        };
        t.transition(id, done, id as i64 * 100).unwrap();
    }
    t.insert(pending(6, "erin", false, "r6"));
    t.take_changes();
    // Ended before 250: jobs 1 and 2; then at most 2 finished: job 3 too.
    assert_eq!(t.retire(250, 2), 3);
    t.check().unwrap();
    assert_eq!(t.ids().collect::<Vec<_>>(), vec![4, 5, 6]);
    assert_eq!(t.by_request("erin", "r1"), None);
    assert_eq!(t.by_request("erin", "r6"), Some(6));
    assert_eq!(t.take_changes().delete, [1, 2, 3].into());
}

#[derive(Debug, Clone)]
enum Step {
    Submit { user: u8, deps: bool },
    Start(u8),
    Requeue(u8, bool),
    Readopt(u8),
    Finish(u8, u8),
    Retire(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u8..3, any::<bool>()).prop_map(|(user, deps)| Step::Submit { user, deps }),
        (0u8..16).prop_map(Step::Start),
        (0u8..16, any::<bool>()).prop_map(|(j, k)| Step::Requeue(j, k)),
        (0u8..16).prop_map(Step::Readopt),
        (0u8..16, 0u8..6).prop_map(|(j, s)| Step::Finish(j, s)),
        (0u8..4).prop_map(Step::Retire),
    ]
}

proptest! {
    /// Whatever sequence of transitions is tried, legal or not, every index stays equal
    /// to one recomputed from the jobs, and a refused transition changes nothing.
    #[test]
    fn indexes_stay_true(steps in proptest::collection::vec(step(), 1..60)) {
        let mut t = Jobs::default();
        let mut next = 1u64;
        for (now, s) in steps.into_iter().enumerate() {
            let now = now as i64;
            let before: Vec<Record> = t.all().cloned().collect();
            let r = match s {
                Step::Submit { user, deps } => {
                    t.insert(pending(next, &format!("u{user}"), deps, &format!("q{next}")));
                    next += 1;
                    Ok(())
                }
                Step::Start(j) => t.transition(
                    u64::from(j),
                    Transition::Start { allocations: vec![on("n1", "GPU-1")] },
                    now,
                ),
                Step::Requeue(j, keep) => t.transition(
                    u64::from(j),
                    Transition::Requeue { reason: "r".into(), keep_for_readopt: keep },
                    now,
                ),
                Step::Readopt(j) => t.transition(
                    u64::from(j),
                    Transition::Readopt { node: "n1".into(), attempt: 1 },
                    now,
                ),
                Step::Finish(j, s) => {
                    let state = [JobState::Completed, JobState::Failed, JobState::Cancelled,
                        JobState::Timeout, JobState::NodeFail, JobState::Preempted][s as usize];
                    t.transition(
                        u64::from(j),
                        Transition::Finish { state, exit_code: None, reason: String::new() },
                        now,
                    )
                }
                Step::Retire(k) => {
                    t.retire(now - 5, usize::from(k));
                    Ok(())
                }
            };
            t.check().unwrap();
            if r.is_err() {
                let after: Vec<Record> = t.all().cloned().collect();
                prop_assert_eq!(before, after);
            }
            for s in t.all() {
                let j = &s.job;
                prop_assert_eq!(j.state == JobState::Running, !j.allocations.is_empty()
                    && j.allocations.iter().any(|a| !a.ended));
            }
        }
    }
}
