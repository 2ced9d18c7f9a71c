//! The opportunistic class under random job streams, through the state machine:
//! guaranteed jobs (whole GPUs and shares) and opportunistic ones arrive in any order, holders' use and memory
//! change at every heartbeat, jobs end. Whatever happens:
//! - no GPU is given more memory than it has: the borrowers' limits and what their
//!   holders use fit it, or every borrower there has been told to yield at that beat;
//! - the class never touches a guaranteed job: no kill or requeue of one comes from
//!   lending, yielding or a lend pass.

mod common;

use gpuctl_core::operations::Operations as _;
use std::collections::HashMap;
use std::time::Duration;

use common::*;
use gpuctl_core::command::Command;
use gpuctl_core::log::{Change, Entry};
use gpuctl_core::record::{JobSpec, JobState};
use gpuctl_core::{Cluster, Effects};
use proptest::prelude::*;

const GPU_MIB: u64 = 81920;

#[derive(Debug, Clone)]
enum Op {
    Guaranteed(u32),
    /// A guaranteed share: half a GPU's compute and this much of its memory (MiB).
    GuaranteedShare(u64),
    Borrower,
    /// A heartbeat: per running job (in id order, cycling) its busy % and memory MiB.
    Beat(Vec<(u32, u64)>),
    Pass,
    /// The running job at this index (in id order) ends.
    End(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u32..=2).prop_map(Op::Guaranteed),
        (4_096u64..=40_960).prop_map(Op::GuaranteedShare),
        Just(Op::Borrower),
        prop::collection::vec((0u32..=100, 0u64..=60_000), 1..6).prop_map(Op::Beat),
        Just(Op::Pass),
        (0usize..8).prop_map(Op::End),
    ]
}

struct World {
    c: Cluster,
    t: i64,
}

impl World {
    fn running(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = (self.c.jobs().active())
            .filter(|s| s.job.state == JobState::Running)
            .map(|s| s.job.id)
            .collect();
        ids.sort_unstable();
        ids
    }

    fn opportunistic(&self, id: u64) -> bool {
        self.c.jobs().job(id).is_some_and(|j| j.spec.opportunistic)
    }

    /// Checks what the class sent, then plays the agent: a started job reports
    /// STARTED, a killed one ends CANCELLED.
    fn settle(&mut self, e: Effects, from_class: bool) {
        for (_, cmd) in &e.sends {
            match cmd {
                Command::Kill(k) => {
                    assert!(
                        !from_class || self.opportunistic(k.job_id),
                        "the class killed guaranteed job {}",
                        k.job_id
                    );
                    if self
                        .c
                        .jobs()
                        .job(k.job_id)
                        .is_some_and(|j| j.state == JobState::Running)
                    {
                        report(
                            &mut self.c,
                            "n1",
                            k.job_id,
                            Some((JobState::Cancelled, 143)),
                            self.t,
                        );
                    }
                }
                Command::Start(s) => {
                    report(&mut self.c, "n1", s.job_id, None, self.t);
                }
                Command::Limit(l) => unreachable!("no job is updated here: {l:?}"),
                Command::Mig(m) => unreachable!("no node is dynamic-MIG here: {m:?}"),
            }
        }
        for s in self.c.jobs().active().filter(|s| !s.job.spec.opportunistic) {
            assert!(
                s.requeue_requested.is_empty(),
                "guaranteed job {} asked to requeue: {}",
                s.job.id,
                s.requeue_requested
            );
        }
    }

    fn beat(&mut self, uses: &[(u32, u64)]) {
        let running = self.running();
        if running.is_empty() {
            return;
        }
        // Each job's figures, on each GPU it holds.
        let mut on: HashMap<String, Vec<(u64, u32, u64, u64)>> = HashMap::new();
        for (k, id) in running.iter().enumerate() {
            let (busy, mem) = uses[k % uses.len()];
            let j = self.c.jobs().job(*id).unwrap();
            for s in j.allocations.iter().flat_map(|a| a.slots.iter()) {
                // A borrower or a share uses at most its limit (the agent ends it past
                // that); a whole GPU's holder may use all of it.
                let mem = mem.min(s.memory_mib);
                on.entry(s.uuid.clone())
                    .or_default()
                    .push((*id, busy, mem, s.memory_mib));
            }
        }
        let metrics = (0..2)
            .map(|g| {
                let uuid = format!("GPU-n1-{g}");
                let jobs = on.get(&uuid).cloned().unwrap_or_default();
                gpuctl_core::node::GpuMetrics {
                    uuid,
                    util_pct: jobs.iter().map(|u| u.1).sum::<u32>().min(100),
                    mem_used_mib: jobs.iter().map(|u| u.2).sum(),
                    time_ms: self.t,
                    jobs: jobs
                        .iter()
                        .map(|u| gpuctl_core::node::JobGpuUse {
                            job_id: u.0,
                            mem_used_mib: u.2,
                            processes: 1,
                            util_pct: Some(u.1),
                        })
                        .collect(),
                    ..Default::default()
                }
            })
            .collect();
        let hb = gpuctl_core::event::Heartbeat {
            node: "n1".into(),
            running: running
                .iter()
                .map(|&id| {
                    gpuctl_core::event::Running::new(id, self.c.jobs().job(id).unwrap().attempt)
                })
                .collect(),
            metrics,
            ..Default::default()
        };
        let e = self.c.heartbeat(&hb, self.t).1;
        checked(&self.c);
        // Memory: the holders' use and the borrowers' limits fit each GPU, or every
        // borrower there is yielding now.
        for jobs in on.values() {
            let held: u64 = (jobs.iter())
                .filter(|u| !self.opportunistic(u.0))
                .map(|u| u.2)
                .sum();
            let lent: Vec<&(u64, u32, u64, u64)> =
                jobs.iter().filter(|u| self.opportunistic(u.0)).collect();
            let limits: u64 = lent.iter().map(|u| u.3).sum();
            if held > 0 && held + limits > GPU_MIB {
                for u in &lent {
                    let r = self.c.jobs().get(u.0).unwrap();
                    assert!(
                        !r.requeue_requested.is_empty(),
                        "borrower {} keeps {} MiB beside its holders' {held} MiB",
                        u.0,
                        u.3
                    );
                }
            }
        }
        self.settle(e, true);
    }
}

fn borrower() -> JobSpec {
    JobSpec {
        name: "sweep".into(),
        opportunistic: true,
        signal: "USR1@5".into(),
        ..spec(1, true)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn borrowers_fit_and_never_touch_guaranteed_jobs(ops in prop::collection::vec(op(), 1..80)) {
        let mut c = cluster();
        configure(&mut c, |cfg| {
            cfg.opportunistic.measure = Duration::from_secs(20);
            cfg.opportunistic.yield_window = Duration::from_secs(5);
            cfg.idle.lend_after = Some(Duration::from_secs(30));
        });
        attach(&mut c, "n1", T0);
        let mut w = World { c, t: T0 };
        for op in ops {
            w.t += 7_000;
            match op {
                Op::Guaranteed(n) => {
                    submit(&mut w.c, n, false, w.t);
                }
                Op::GuaranteedShare(mib) => {
                    let mut s = spec(1, false);
                    s.resources.gpu = Some(gpuctl_core::record::GpuPart::Share(
                        gpuctl_core::record::GpuShare {
                            compute_milli: 500,
                            memory_mib: Some(mib),
                        },
                    ));
                    submit_spec(&mut w.c, s, w.t);
                }
                Op::Borrower => {
                    submit_spec(&mut w.c, borrower(), w.t);
                }
                Op::Beat(uses) => w.beat(&uses),
                Op::Pass => {
                    let t = w.t;
                    let lent = w.c.apply(Entry::new(t, Change::Prepare)).1;
                    checked(&w.c);
                    w.settle(lent, true);
                    // The main pass may evict borrowers, never a guaranteed job.
                    let main = pass(&mut w.c, t);
                    w.settle(main, true);
                }
                Op::End(k) => {
                    let running = w.running();
                    if let Some(&id) = running.get(k % running.len().max(1)) {
                        let t = w.t;
                        report(&mut w.c, "n1", id, Some((JobState::Completed, 0)), t);
                    }
                }
            }
        }
    }
}

/// The harness above does lend: a stream that measures a holder and then raises its
/// memory sees a borrower run, then yield.
#[test]
fn a_fixed_stream_lends_and_yields() {
    let mut c = cluster();
    configure(&mut c, |cfg| {
        cfg.opportunistic.measure = Duration::from_secs(20);
    });
    attach(&mut c, "n1", T0);
    let mut w = World { c, t: T0 };
    let holder = submit(&mut w.c, 1, false, w.t);
    let e = pass(&mut w.c, w.t);
    w.settle(e, true);
    let b = submit_spec(&mut w.c, borrower(), w.t);
    for _ in 0..5 {
        w.t += 7_000;
        w.beat(&[(30, 10_000)]);
    }
    let t = w.t;
    let lent = w.c.apply(Entry::new(t, Change::Prepare)).1;
    w.settle(lent, true);
    assert_eq!(state(&w.c, b), JobState::Running);
    // The holder's memory grows past what the borrower's limit leaves: it yields.
    w.t += 7_000;
    w.beat(&[(30, 60_000), (20, 1_000)]);
    assert_eq!(state(&w.c, b), JobState::Pending);
    assert_eq!(state(&w.c, holder), JobState::Running);
}
