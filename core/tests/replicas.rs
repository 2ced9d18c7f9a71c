//! The same events applied to two fresh clusters give the same effects, in the same
//! order, and the same state: nothing in the state machine may depend on what differs
//! between two processes (hash seeds, addresses, the clock). What replicated
//! controllers would rely on (issue 40), and what makes the simulator's replays
//! repeatable.

mod common;

use common::*;
use gpuctl_core::command::Command;
use gpuctl_core::event::{Heartbeat, Report, ReportKind, Running};
use gpuctl_core::node::{GpuMetrics, JobGpuUse};
use gpuctl_core::ops::Admission;
use gpuctl_core::record::{GpuPart, GpuShare};
use gpuctl_core::{Actor, Cluster, Config, Effects};
use gpuctl_sched::job::JobState as State;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    Submit {
        user: u8,
        gpus: u32,
        share: bool,
        minutes: u64,
    },
    Pass,
    Advance(i64),
    End(usize, bool),
    Cancel(usize),
    Heartbeat(u8, u32),
    Drain(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u8..3, 1u32..=2, any::<bool>(), 1u64..120).prop_map(|(user, gpus, share, minutes)| {
            Step::Submit {
                user,
                gpus,
                share,
                minutes,
            }
        }),
        Just(Step::Pass),
        (1i64..90).prop_map(Step::Advance),
        (0usize..8, any::<bool>()).prop_map(|(k, ok)| Step::End(k, ok)),
        (0usize..8).prop_map(Step::Cancel),
        (0u8..3, 0u32..=100).prop_map(|(n, util)| Step::Heartbeat(n, util)),
        (0u8..3).prop_map(Step::Drain),
    ]
}

const NODES: [&str; 3] = ["n1", "n2", "n3"];
const USERS: [&str; 3] = ["alice", "bob", "carol"];

/// Everything the state holds that a user or the store could see, in a fixed order.
fn digest(c: &Cluster) -> String {
    let mut jobs: Vec<String> = c.jobs().all().map(|s| format!("{s:?}")).collect();
    jobs.sort();
    let nodes: Vec<String> = c
        .fleet()
        .nodes()
        .values()
        .map(|n| format!("{n:?}"))
        .collect();
    let listing = c.list_nodes(&[]);
    format!(
        "next {}\njobs {jobs:?}\nnodes {nodes:?}\nlisting {listing:?}\nusage {:?}",
        c.next_job_id(),
        c.fair_usage()
    )
}

/// The running instances, by job id: (job, attempt, node).
fn running(c: &Cluster) -> Vec<(u64, u32, String)> {
    let mut out: Vec<(u64, u32, String)> = c
        .jobs()
        .active()
        .map(|s| &s.job)
        .filter(|j| j.state == State::Running)
        .flat_map(|j| {
            j.allocations
                .iter()
                .filter(|a| !a.ended)
                .map(|a| (j.id, j.attempt, a.node.clone()))
        })
        .collect();
    out.sort();
    out
}

/// One step on one cluster; answers its effects (what the shell would send).
fn apply(c: &mut Cluster, s: &Step, now: &mut i64) -> Vec<Effects> {
    let mut out = Vec::new();
    match *s {
        Step::Submit {
            user,
            gpus,
            share,
            minutes,
        } => {
            let name = USERS[user as usize];
            let actor = Actor {
                user: name.into(),
                admin: false,
            };
            let mut sp = spec(gpus, user == 1);
            sp.user = name.into();
            let r = &mut sp.resources;
            r.time_limit_secs = minutes * 60;
            if share {
                r.gpu = Some(GpuPart::Share(GpuShare {
                    compute_milli: 333 * gpus,
                    memory_mib: None,
                }));
            }
            if let Ok(Admission::New(j)) = c.admit(&actor, sp, "", *now) {
                c.commit_submit(*j);
            }
        }
        Step::Pass => {
            let e = pass(c, *now);
            // The agents say the starts ran.
            for (node, cmd) in &e.sends {
                if let Command::Start(st) = cmd {
                    let r = Report {
                        time_ms: *now,
                        ..Report::new(node, st.job_id, st.attempt, ReportKind::Started)
                    };
                    out.push(c.report(&r, *now).1);
                }
            }
            out.insert(0, e);
        }
        Step::Advance(secs) => {
            *now += secs * 1000;
            out.push(c.check_nodes(*now));
        }
        Step::End(k, ok) => {
            let r = running(c);
            if let Some((id, attempt, node)) = r.get(k % r.len().max(1)).cloned() {
                let end = Report {
                    state: if ok { State::Completed } else { State::Failed },
                    exit_code: Some(if ok { 0 } else { 1 }),
                    time_ms: *now,
                    ..Report::new(&node, id, attempt, ReportKind::Ended)
                };
                out.push(c.report(&end, *now).1);
            }
        }
        Step::Cancel(k) => {
            let r = running(c);
            if let Some((id, ..)) = r.get(k % r.len().max(1)) {
                let owner = c.jobs().job(*id).unwrap().spec.user.clone();
                let actor = Actor {
                    user: owner,
                    admin: false,
                };
                if let Ok((_, e)) = c.cancel(&actor, &[*id], *now) {
                    out.push(e);
                }
            }
        }
        Step::Heartbeat(n, util) => {
            let node = NODES[n as usize];
            let mine: Vec<(u64, u32)> = running(c)
                .into_iter()
                .filter(|r| r.2 == node)
                .map(|r| (r.0, r.1))
                .collect();
            let metrics = (0..2)
                .map(|i| GpuMetrics {
                    uuid: format!("GPU-{node}-{i}"),
                    util_pct: util,
                    temp_c: 50,
                    time_ms: *now,
                    jobs: mine
                        .iter()
                        .map(|&(job_id, _)| JobGpuUse {
                            job_id,
                            mem_used_mib: 1024,
                            processes: 1,
                        })
                        .collect(),
                    ..GpuMetrics::default()
                })
                .collect();
            let hb = Heartbeat {
                node: node.into(),
                running: mine.iter().map(|&(j, a)| Running::new(j, a)).collect(),
                metrics,
                ..Heartbeat::default()
            };
            out.push(c.heartbeat(&hb, *now).1);
        }
        Step::Drain(n) => {
            let node = NODES[n as usize];
            let drained = c
                .fleet()
                .node(node)
                .is_some_and(|x| x.drain_reason.is_some());
            let why = (!drained).then(|| "maintenance".to_string());
            if let Ok((_, e)) = c.set_drain(node, why) {
                out.push(e);
            }
        }
    }
    checked(c);
    out
}

fn cluster_of(now: i64) -> Cluster {
    let mut c = Cluster::new(Config::default());
    for n in NODES {
        attach(&mut c, n, now);
    }
    c.take_changes();
    c
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn the_same_events_give_two_clusters_the_same_effects_and_state(
        steps in prop::collection::vec(step(), 1..100)
    ) {
        let (mut now_a, mut now_b) = (T0, T0);
        let (mut a, mut b) = (cluster_of(T0), cluster_of(T0));
        for s in &steps {
            let ea = apply(&mut a, s, &mut now_a);
            let eb = apply(&mut b, s, &mut now_b);
            prop_assert_eq!(format!("{ea:?}"), format!("{eb:?}"), "effects of {:?}", s);
            let (ca, cb) = (a.take_changes(), b.take_changes());
            prop_assert_eq!(format!("{ca:?}"), format!("{cb:?}"), "changes of {:?}", s);
            prop_assert_eq!(digest(&a), digest(&b), "state after {:?}", s);
        }
    }
}

#[test]
fn a_fixed_history_starts_ends_and_cancels_jobs_alike_on_both() {
    use Step::*;
    let steps = [
        Submit {
            user: 0,
            gpus: 2,
            share: false,
            minutes: 30,
        },
        Submit {
            user: 1,
            gpus: 1,
            share: true,
            minutes: 10,
        },
        Submit {
            user: 2,
            gpus: 2,
            share: false,
            minutes: 60,
        },
        Submit {
            user: 0,
            gpus: 1,
            share: false,
            minutes: 5,
        },
        Pass,
        Heartbeat(0, 80),
        Heartbeat(1, 5),
        Heartbeat(2, 50),
        Advance(30),
        End(0, true),
        Cancel(0),
        Drain(2),
        Pass,
        Heartbeat(0, 90),
        Heartbeat(1, 90),
        Heartbeat(2, 90),
        Advance(30),
        End(0, false),
        Pass,
        // Silent past the node timeout: the nodes fail, their jobs with them.
        Advance(600),
    ];
    let (mut now_a, mut now_b) = (T0, T0);
    let (mut a, mut b) = (cluster_of(T0), cluster_of(T0));
    let mut sends = 0;
    for s in &steps {
        let ea = apply(&mut a, s, &mut now_a);
        let eb = apply(&mut b, s, &mut now_b);
        assert_eq!(format!("{ea:?}"), format!("{eb:?}"), "effects of {s:?}");
        sends += ea.iter().map(|e| e.sends.len()).sum::<usize>();
        assert_eq!(digest(&a), digest(&b), "state after {s:?}");
    }
    let ended = a.jobs().all().filter(|s| s.job.state.is_final()).count();
    assert!(
        sends >= 5,
        "only {sends} commands: the history did not run jobs"
    );
    assert!(ended >= 2, "only {ended} jobs ended");
}
