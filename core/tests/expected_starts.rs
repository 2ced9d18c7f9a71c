//! Passes between those that plan every waiting job (`expected_starts_every`): they stop
//! once nothing else can start, the jobs they did not plan wait for resources, and
//! keep the expected start the last full pass gave them (none, if none has yet).

mod common;

use common::*;
use gpuctl_core::operations::Operations as _;

/// A pass at `now`, planning every waiting job or not.
fn pass_planning(c: &mut gpuctl_core::Cluster, now: i64, every: bool) -> gpuctl_sched::Plan {
    let (view, queue, mut cfg) = c.pass_input(now);
    cfg.expected_starts = every;
    let plan = gpuctl_sched::schedule(&view, &queue, &cfg, now);
    c.apply_plan(&plan, now);
    checked(c);
    plan
}

fn shown(c: &gpuctl_core::Cluster, id: u64) -> (String, i64) {
    let j = c.jobs().job(id).unwrap();
    (j.reason.clone(), j.expected_start_ms)
}

#[test]
fn unplanned_jobs_keep_their_expected_starts() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let running = submit(&mut c, 2, false, T0);
    pass(&mut c, T0);
    report(&mut c, "n1", running, None, T0);
    let big = submit(&mut c, 2, false, T0 + 1000);
    let plan = pass_planning(&mut c, T0 + 2000, true);
    assert_eq!(plan.unplanned, 0);
    let (reason, start) = shown(&c, big);
    assert_eq!(reason, "Resources");
    // The running job's limit is an hour; the big job is expected then.
    assert_eq!(start, T0 + 3_600_000);

    // A pass that stops at once (no GPU is free): both wait; the big job keeps its
    // expected start, the new one has none yet.
    let next = submit(&mut c, 2, false, T0 + 3000);
    let plan = pass_planning(&mut c, T0 + 4000, false);
    assert!(plan.starts.is_empty());
    assert_eq!(plan.unplanned, 2);
    assert_eq!(shown(&c, big), ("Resources".into(), T0 + 3_600_000));
    assert_eq!(shown(&c, next), ("Resources".into(), 0));

    // The next full pass gives the new one its own.
    pass_planning(&mut c, T0 + 5000, true);
    assert_eq!(shown(&c, next).1, T0 + 2 * 3_600_000);
}
