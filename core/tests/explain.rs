//! `gpuctl explain`'s answers, decided in core: without a pass where the state says it
//! all, else from a read-only pass put into words.

mod common;

use common::*;
use gpuctl_core::Cluster;
use gpuctl_core::explain::{Explain, PassInput, rendered};
use gpuctl_core::operations::Operations as _;
use gpuctl_core::record::{Dependency, DependencyKind};

/// The answer as the daemon gives it: the state's, or the pass's in words.
fn explain(c: &Cluster, id: u64, now: i64) -> gpuctl_core::view::Explanation {
    match c.explain(id, now).expect("a known job") {
        Explain::Done(out) => out,
        Explain::Pass(input) => {
            let PassInput {
                base,
                view,
                queue,
                cfg,
            } = *input;
            let ex = gpuctl_sched::explain(&view, &queue, &cfg, now, id).expect("in the pass");
            rendered(base, &ex, now)
        }
    }
}

#[test]
fn an_unknown_job_is_not_found() {
    let c = cluster();
    let Err(e) = c.explain(99, T0) else {
        panic!("explained a job that does not exist")
    };
    assert_eq!(e.kind, gpuctl_core::Kind::NotFound);
    assert_eq!(e.message, "no job 99");
}

#[test]
fn running_held_and_waiting_jobs_are_explained_in_words() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let first = submit(&mut c, 2, false, T0);
    // Before any pass: it fits now.
    let e = explain(&c, first, T0);
    assert_eq!(e.reason, "None");
    assert_eq!(e.summary, "fits now on n1; it starts at the next pass");
    assert_eq!(e.expected_start_ms, T0);
    pass(&mut c, T0);
    report(&mut c, "n1", first, None, T0);
    assert_eq!(explain(&c, first, T0 + 1).summary, "running on n1");

    // A second job of both GPUs waits for the first, and says where it will run.
    let second = submit(&mut c, 2, false, T0 + 2);
    let e = explain(&c, second, T0 + 3);
    assert_eq!(e.reason, "Resources");
    assert!(
        e.summary
            .starts_with("waits for resources held by running jobs; reserved on n1"),
        "{}",
        e.summary
    );
    assert_eq!(e.nodes.len(), 1);
    assert!(e.nodes[0].reason.contains("not enough free GPUs"), "{e:?}");
    assert!(e.expected_start_ms > T0, "a reservation's start: {e:?}");

    // Held by its owner: no pass is needed to say so.
    c.hold(&alice(), second).unwrap();
    let Ok(Explain::Done(e)) = c.explain(second, T0 + 4) else {
        panic!("a held job needs no pass")
    };
    assert!(e.summary.starts_with("held by its owner"), "{}", e.summary);
}

#[test]
fn a_job_behind_a_dependency_says_which() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let first = submit(&mut c, 1, false, T0);
    let mut s = spec(1, false);
    s.dependencies = vec![Dependency {
        kind: DependencyKind::AfterOk,
        job_id: first,
    }];
    let second = submit_spec(&mut c, s, T0 + 1);
    let Ok(Explain::Done(e)) = c.explain(second, T0 + 2) else {
        panic!("a job behind a dependency is not in the pass")
    };
    assert_eq!(e.reason, "Dependency");
    assert_eq!(
        e.summary,
        format!("waits for its dependencies (AfterOk {first})")
    );
}
