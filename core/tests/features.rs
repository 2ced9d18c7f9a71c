//! Node features and a job's constraint (sbatch -C): a job runs only on nodes whose
//! agent offers what it asks for, waits with the reason when they are busy, is refused
//! when no node it may use has them, and an agent with malformed features is refused.

mod common;

use common::*;
use gpuctl_core::operations::Operations as _;
use gpuctl_core::record::{JobSpec, JobState};

fn attach_offering(c: &mut gpuctl_core::Cluster, node: &str, features: &[&str], now: i64) {
    attach_as(c, node, &[], features, now);
}

fn constrained(gpus: u32, constraint: &str) -> JobSpec {
    let mut s = spec(gpus, false);
    s.resources.constraint = constraint.into();
    s
}

#[test]
fn a_job_runs_only_where_its_constraint_is_met() {
    let mut c = cluster();
    attach_offering(&mut c, "a1", &["a100"], T0);
    attach_offering(&mut c, "a2", &["a100", "nvlink"], T0);
    attach_offering(&mut c, "h1", &["h100", "nvlink"], T0);
    let both = submit_spec(&mut c, constrained(2, "a100&nvlink"), T0);
    let e = pass(&mut c, T0);
    assert!(
        commands(&e).contains(&to("a2", &format!("start {both}"))),
        "{:?}",
        commands(&e)
    );
    // a2 is full: the next such job waits although a1 and h1 are idle, and says why.
    let next = submit_spec(&mut c, constrained(1, "nvlink&a100"), T0);
    assert!(commands(&pass(&mut c, T0)).is_empty());
    assert_eq!(state(&c, next), JobState::Pending);
    let why = explained_nodes(&c, next, T0 + 1);
    for n in ["a1", "h1"] {
        assert!(
            why.contains(&(
                n.to_string(),
                "lacks the features the job's constraint asks for".to_string()
            )),
            "{why:?}"
        );
    }
    // An OR: either kind will do; a1 (first in order) takes it.
    let either = submit_spec(&mut c, constrained(1, "h100|a100"), T0 + 2);
    let e = pass(&mut c, T0 + 2);
    assert!(
        commands(&e).contains(&to("a1", &format!("start {either}"))),
        "{:?}",
        commands(&e)
    );
}

#[test]
fn a_constraint_no_node_meets_is_refused_and_so_are_bad_features() {
    let mut c = cluster();
    attach_offering(&mut c, "a1", &["a100"], T0);
    let Err(e) = c.admit(&alice(), constrained(1, "h100"), "", T0) else {
        panic!("admitted a job no node can run")
    };
    assert!(
        e.message.contains("constraint \"h100\"") && e.message.contains("offer: a100"),
        "{}",
        e.message
    );
    let Err(e) = c.admit(&alice(), constrained(1, "[a100|h100]"), "", T0) else {
        panic!("admitted Slurm's matching OR")
    };
    assert!(e.message.contains("not supported"), "{}", e.message);
    // An agent offering a feature with a space or too many features is refused.
    let nonce = b"n-bad".to_vec();
    c.leader().challenge("b1", nonce.clone(), T0);
    let req = gpuctl_core::event::Register {
        node: "b1".into(),
        gpus: gpus("b1", 1),
        cpus: 4,
        nonce,
        agent_id: "agent-b1".into(),
        features: vec!["has space".into()],
        previous_session: Vec::new(),
        ..gpuctl_core::event::Register::default()
    };
    let Err(e) = c.attach(&req, None, T0) else {
        panic!("attached with a malformed feature")
    };
    assert!(e.message.contains("holds"), "{}", e.message);
    assert!(c.fleet().node("b1").is_none());
}
