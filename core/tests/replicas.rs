//! A leader's log applied to fresh clusters gives them the leader's effects, in the
//! same order, and its state: the leader decides (admission, an agent's identity, a
//! pass's plan) and applies each entry as it logs it; a replica only applies. Nothing
//! in the state machine may depend on what differs between two processes (hash seeds,
//! addresses, the clock), nor on what only the leader holds (challenges, sessions'
//! replay windows). What replicated controllers rely on (issue 40), and what makes the
//! simulator's replays repeatable.

mod common;

use common::*;
use gpuctl_core::command::Command;
use gpuctl_core::event::{Heartbeat, Register, Report, ReportKind, Running};
use gpuctl_core::log::{Applied, Change, Entry, plan_entries};
use gpuctl_core::node::{GpuMetrics, JobGpuUse};
use gpuctl_core::ops::Admission;
use gpuctl_core::record::{GpuPart, GpuShare};
use gpuctl_core::replay::Signed;
use gpuctl_core::{Actor, Cluster, Config, Effects, Refusal};
use gpuctl_sched::job::JobState as State;
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
enum Step {
    Submit {
        user: u8,
        gpus: u32,
        share: bool,
        minutes: u64,
    },
    Pass,
    /// A small pass as the replicated daemon runs it: one entry, planned by every
    /// replica (`Change::Pass`).
    WholePass,
    Advance(i64),
    End(usize, bool),
    Cancel(usize),
    Heartbeat(u8, u32),
    /// A signed request of the node's agent that changes nothing durable (a step's
    /// output, say): only the leader hears it.
    Ping(u8),
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
        Just(Step::WholePass),
        (1i64..90).prop_map(Step::Advance),
        (0usize..8, any::<bool>()).prop_map(|(k, ok)| Step::End(k, ok)),
        (0usize..8).prop_map(Step::Cancel),
        (0u8..3, 0u32..=100).prop_map(|(n, util)| Step::Heartbeat(n, util)),
        (0u8..3).prop_map(Step::Ping),
        (0u8..3).prop_map(Step::Drain),
    ]
}

const NODES: [&str; 3] = ["n1", "n2", "n3"];
const USERS: [&str; 3] = ["alice", "bob", "carol"];

/// Everything the state holds that a user or the store could see, in a fixed order.
/// `held` claims with those of the `touched` jobs replaced by `now` (theirs now).
fn carried(
    held: Vec<gpuctl_sched::Running>,
    touched: &[u64],
    now: Vec<gpuctl_sched::Running>,
) -> Vec<gpuctl_sched::Running> {
    let mut out: Vec<_> = (held.into_iter())
        .filter(|r| touched.binary_search(&r.job).is_err())
        .chain(now)
        .collect();
    out.sort_by_key(|r| r.job);
    out
}

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

/// Where two digests first differ, with some context.
fn difference(a: &str, b: &str) -> String {
    let at = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    let from = a[..at].rfind("Record {").unwrap_or(at.saturating_sub(200));
    let show = |s: &str| s[from..(at + 120).min(s.len())].to_string();
    format!("\n  one:   {}\n  other: {}", show(a), show(b))
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

/// A controller that leads: it decides each step as the daemon does (admission, the
/// agent's identity and a pass's plan on its own state), applies each entry it decides
/// at once, and keeps them: its log.
struct Leader {
    c: Cluster,
    now: i64,
    log: Vec<Entry>,
    /// Per node: its session (the attach's nonce and generation), the number of the
    /// last request its agent signed and of the last command sent to it.
    sessions: BTreeMap<String, Session>,
}

#[derive(Default)]
struct Session {
    nonce: Vec<u8>,
    generation: u64,
    requests: u64,
    commands: u64,
}

impl Leader {
    /// A cluster of `NODES`, each attached through the log.
    fn new(now: i64) -> Leader {
        let mut l = Leader {
            c: Cluster::new(Config::default()),
            now,
            log: Vec::new(),
            sessions: BTreeMap::new(),
        };
        for n in NODES {
            let register = register(n, now);
            let nonce = register.nonce.clone();
            l.c.leader().challenge(n, nonce.clone(), now);
            l.c.leader()
                .check_attach(&register, now)
                .expect("identity checked");
            let (attached, _) = l.apply(Change::Attach {
                register,
                peer: None,
            });
            let Ok(Applied::Attached(generation)) = attached else {
                panic!("{attached:?}");
            };
            let session = Session {
                nonce,
                generation,
                ..Session::default()
            };
            l.sessions.insert(n.to_string(), session);
        }
        l.c.take_changes();
        l
    }

    /// Applies a change the leader decided now, and logs it.
    fn apply(&mut self, change: Change) -> (Result<Applied, Refusal>, Effects) {
        let entry = Entry::new(self.now, change);
        self.log.push(entry.clone());
        let out = self.c.apply(entry);
        checked(&self.c);
        out
    }

    /// One step; answers its effects (what the shell would send).
    fn step(&mut self, s: &Step) -> Vec<Effects> {
        let mut out = Vec::new();
        match *s {
            Step::Submit {
                user,
                gpus,
                share,
                minutes,
            } => out.extend(self.submit(user, gpus, share, minutes)),
            Step::Pass | Step::WholePass => {
                let e = if matches!(s, Step::WholePass) {
                    vec![self.apply(Change::Pass).1]
                } else {
                    self.pass()
                };
                // The starts go out on their sessions; the agents say most of them ran
                // (one job in three never does: its agent handles the start without
                // running it, which a later heartbeat shows).
                let mut reports = Vec::new();
                for (node, cmd) in e.iter().flat_map(|e| &e.sends) {
                    let Command::Start(st) = cmd else { continue };
                    let s = self.sessions.get_mut(node).expect("a node's session");
                    s.commands += 1;
                    let start = Some((st.job_id, st.attempt));
                    self.c
                        .leader()
                        .command_sent(node, s.generation, s.commands, start);
                    if st.job_id % 3 != 0 {
                        let r = Report::new(node, st.job_id, st.attempt, ReportKind::Started);
                        reports.push(Report {
                            time_ms: self.now,
                            ..r
                        });
                    }
                }
                out.extend(e);
                out.push(self.apply(Change::Reports(reports)).1);
            }
            Step::Advance(secs) => {
                self.now += secs * 1000;
                let silent = self.c.silent_nodes(self.now);
                out.push(self.apply(Change::CheckNodes { silent }).1);
            }
            Step::End(k, ok) => {
                let r = running(&self.c);
                if let Some((id, attempt, node)) = r.get(k % r.len().max(1)).cloned() {
                    let end = Report {
                        state: if ok { State::Completed } else { State::Failed },
                        exit_code: Some(if ok { 0 } else { 1 }),
                        time_ms: self.now,
                        ..Report::new(&node, id, attempt, ReportKind::Ended)
                    };
                    out.push(self.apply(Change::Reports(vec![end])).1);
                }
            }
            Step::Cancel(k) => {
                let r = running(&self.c);
                if let Some((id, ..)) = r.get(k % r.len().max(1)) {
                    let owner = self.c.jobs().job(*id).unwrap().spec.user.clone();
                    let actor = Actor {
                        user: owner,
                        admin: false,
                    };
                    let ids = vec![*id];
                    let tasks = Vec::new();
                    out.push(self.apply(Change::Cancel { actor, ids, tasks }).1);
                }
            }
            Step::Heartbeat(n, util) => {
                let node = NODES[n as usize];
                if self.signed(node) {
                    let mut hb = heartbeat(&self.c, node, util, self.now);
                    hb.commands_handled = self.sessions[node].commands;
                    let not_run = self.c.leader().starts_not_run(&hb);
                    let heartbeat = hb;
                    out.push(self.apply(Change::Heartbeat { heartbeat, not_run }).1);
                }
            }
            Step::Ping(n) => {
                self.signed(NODES[n as usize]);
            }
            Step::Drain(n) => {
                let node = NODES[n as usize].to_string();
                let drained =
                    (self.c.fleet().node(&node)).is_some_and(|x| x.drain_reason.is_some());
                let reason = (!drained).then(|| "maintenance".to_string());
                out.push(self.apply(Change::Drain { node, reason }).1);
            }
        }
        out
    }

    /// A signed request of `node`'s agent as the shell checks it (`check_session`: the
    /// leader's alone). Answers whether it belongs to a live session.
    fn signed(&mut self, node: &str) -> bool {
        let s = self.sessions.get_mut(node).expect("a node's session");
        s.requests += 1;
        let signed = Signed {
            session: s.nonce.clone(),
            seq: s.requests,
        };
        self.c
            .leader()
            .check_session(node, &signed, self.now)
            .is_ok()
    }

    fn submit(&mut self, user: u8, gpus: u32, share: bool, minutes: u64) -> Option<Effects> {
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
        match self.c.admit(&actor, sp, "", self.now) {
            Ok(Admission::New(j)) => Some(self.apply(Change::Submit(vec![*j])).1),
            _ => None,
        }
    }

    /// A pass as the daemon runs it: its changing start, a plan on the state then, and
    /// the plan's entries (in parts of two, as the daemon's parts of thousands).
    fn pass(&mut self) -> Vec<Effects> {
        let Ok(Applied::Prepared(waiting)) = self.apply(Change::Prepare).0 else {
            panic!("a pass's start answers the jobs it leaves out");
        };
        let (c, now) = (&self.c, self.now);
        let plan = gpuctl_sched::schedule(&c.view(), &c.queue(&waiting), &c.pass_config(now), now);
        let mut out = Vec::new();
        for entry in plan_entries(&plan, 2, now) {
            out.push(self.apply(entry.change).1);
        }
        out
    }
}

/// The agent of `node` attaching with two GPUs and nothing running.
fn register(node: &str, now: i64) -> Register {
    Register {
        node: node.into(),
        gpus: gpus(node, 2),
        cpus: 16,
        memory_bytes: 64 << 30,
        gpu_backend: "fake".into(),
        nonce: format!("nonce-{node}-{now}").into_bytes(),
        agent_id: format!("agent-{node}"),
        ..Register::default()
    }
}

/// `node`'s heartbeat: the instances it runs by the state (those whose start it ran:
/// confirmed), at `util` percent.
fn heartbeat(c: &Cluster, node: &str, util: u32, now: i64) -> Heartbeat {
    let mine: Vec<(u64, u32)> = running(c)
        .into_iter()
        .filter(|r| r.2 == node)
        .filter(|r| c.jobs().get(r.0).is_some_and(|s| s.start_confirmed))
        .map(|r| (r.0, r.1))
        .collect();
    let metrics = (0..2)
        .map(|i| GpuMetrics {
            uuid: format!("GPU-{node}-{i}"),
            util_pct: util,
            temp_c: 50,
            time_ms: now,
            jobs: mine
                .iter()
                .map(|&(job_id, _)| JobGpuUse {
                    job_id,
                    mem_used_mib: 1024,
                    processes: 1,
                    util_pct: None,
                })
                .collect(),
            ..GpuMetrics::default()
        })
        .collect();
    Heartbeat {
        node: node.into(),
        running: mine.iter().map(|&(j, a)| Running::new(j, a)).collect(),
        metrics,
        ..Heartbeat::default()
    }
}

/// A replica: a fresh cluster that applies a leader's log.
fn replica(log: &[Entry]) -> (Cluster, Vec<Effects>) {
    let mut c = Cluster::new(Config::default());
    let effects = log.iter().map(|e| c.apply(e.clone()).1).collect();
    checked(&c);
    (c, effects)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn the_same_log_gives_replicas_the_leaders_effects_and_state(
        steps in prop::collection::vec(step(), 1..100)
    ) {
        let mut leader = Leader::new(T0);
        let mut follower = Cluster::new(Config::default());
        for e in &leader.log {
            prop_assert!(follower.apply(e.clone()).0.is_ok());
        }
        let mut applied = leader.log.len();
        follower.take_changes();
        // What a pass that carries its view reads: the claims of the jobs touched since.
        let mut cursor = leader.c.jobs().cursor();
        let mut held = leader.c.running_views();
        for s in &steps {
            let ea = leader.step(s);
            let touched = leader.c.jobs().touched_since(cursor).expect("the log reaches back");
            held = carried(held, &touched, leader.c.running_of(&touched));
            cursor = leader.c.jobs().cursor();
            prop_assert_eq!(&held, &leader.c.running_views(), "claims carried over {:?}", s);
            let new = &leader.log[applied..];
            let eb: Vec<Effects> = new.iter().map(|e| follower.apply(e.clone()).1).collect();
            applied = leader.log.len();
            checked(&follower);
            let ea: Vec<&Effects> = ea.iter().filter(|e| **e != Effects::default()).collect();
            let eb: Vec<&Effects> = eb.iter().filter(|e| **e != Effects::default()).collect();
            prop_assert_eq!(format!("{ea:?}"), format!("{eb:?}"), "effects of {:?}", s);
            let (ca, cb) = (leader.c.take_changes(), follower.take_changes());
            prop_assert_eq!(format!("{ca:?}"), format!("{cb:?}"), "changes of {:?}", s);
            prop_assert_eq!(digest(&leader.c), digest(&follower), "state after {:?}", s);
        }
        // Two fresh replicas of the whole log: alike, and like the leader.
        let (b, eb) = replica(&leader.log);
        let (c, ec) = replica(&leader.log);
        prop_assert_eq!(format!("{eb:?}"), format!("{ec:?}"));
        prop_assert_eq!(digest(&b), digest(&c));
        prop_assert_eq!(digest(&b), digest(&leader.c));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// A replica that joins late installs a snapshot (`Cluster::records`, restored as a
    /// store's records are) taken at any point of the log, then applies the rest: it
    /// ends like the leader.
    #[test]
    fn a_replica_from_a_snapshot_ends_like_the_leader(
        steps in prop::collection::vec(step(), 1..100),
        cut in 0.0f64..1.0,
    ) {
        let mut leader = Leader::new(T0);
        for s in &steps {
            leader.step(s);
        }
        let k = ((leader.log.len() as f64) * cut) as usize;
        let (early, _) = replica(&leader.log[..k]);
        let at = leader.log[..k].last().map_or(T0, |e| e.at);
        let mut late = gpuctl_core::restore::restore(Config::default(), early.records(), at).cluster;
        for e in &leader.log[k..] {
            let _ = late.apply(e.clone());
        }
        checked(&late);
        let (mine, theirs) = (digest(&late), digest(&leader.c));
        prop_assert!(mine == theirs, "after a snapshot at entry {}: {}", k, difference(&mine, &theirs));
    }
}

#[test]
fn a_fixed_history_starts_ends_and_cancels_jobs_alike_on_the_leader_and_a_replica() {
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
    let mut leader = Leader::new(T0);
    let mut sends = 0;
    for s in &steps {
        let e = leader.step(s);
        sends += e.iter().map(|e| e.sends.len()).sum::<usize>();
        let (b, _) = replica(&leader.log);
        assert_eq!(digest(&leader.c), digest(&b), "state after {s:?}");
    }
    let a = &leader.c;
    let ended = a.jobs().all().filter(|s| s.job.state.is_final()).count();
    assert!(
        sends >= 5,
        "only {sends} commands: the history did not run jobs"
    );
    assert!(ended >= 2, "only {ended} jobs ended");
    // A start its agent handled without running it ended the job, on the leader's
    // knowledge of what it sent (carried by the heartbeat's entry).
    let not_run = a
        .jobs()
        .all()
        .filter(|s| s.job.reason.contains("did not run the start"))
        .count();
    assert!(not_run >= 1, "no start went unrun");
}
