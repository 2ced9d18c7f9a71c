//! A job's `nodelist` and `exclude` (sbatch -w / -x): it runs only where they allow,
//! waits with the reason when those nodes are busy, and is refused when no node
//! matches.

mod common;

use common::*;
use gpuctl_core::record::{JobSpec, JobState};

fn listed(gpus: u32, nodelist: &[&str], exclude: &[&str]) -> JobSpec {
    let mut s = spec(gpus, false);
    let r = &mut s.resources;
    r.nodelist = nodelist.iter().map(|x| x.to_string()).collect();
    r.exclude = exclude.iter().map(|x| x.to_string()).collect();
    s
}

#[test]
fn a_job_runs_only_where_its_lists_allow() {
    let mut c = cluster();
    for n in ["gpu01", "gpu02", "gpu03"] {
        attach(&mut c, n, T0);
    }
    let only3 = submit_spec(&mut c, listed(2, &["gpu03"], &[]), T0);
    let e = pass(&mut c, T0);
    assert!(
        commands(&e).contains(&to("gpu03", &format!("start {only3}"))),
        "{:?} {:?}",
        commands(&e),
        c.jobs().job(only3).unwrap().reason
    );
    // gpu03 is full: a job that excludes the others waits although they are idle.
    let not12 = submit_spec(&mut c, listed(1, &[], &["gpu[01-02]"]), T0);
    assert!(commands(&pass(&mut c, T0)).is_empty());
    assert_eq!(state(&c, not12), JobState::Pending);
    let why = explained_nodes(&c, not12, T0 + 1);
    assert!(
        why.contains(&(
            "gpu01".to_string(),
            "left out by the job's nodelist or exclude".to_string()
        )),
        "{why:?}"
    );
    // A hostlist with a range and a glob.
    let glob = submit_spec(&mut c, listed(1, &["gpu0[1-2]", "x*"], &["gpu01"]), T0 + 2);
    let e = pass(&mut c, T0 + 2);
    assert!(
        commands(&e).contains(&to("gpu02", &format!("start {glob}"))),
        "{:?}",
        commands(&e)
    );
}

#[test]
fn a_list_no_node_matches_is_refused_at_submit() {
    let mut c = cluster();
    attach(&mut c, "gpu01", T0);
    let Err(e) = c.admit(&alice(), listed(1, &["cpu[1-9]"], &[]), "", T0) else {
        panic!("admitted a job no node may run")
    };
    assert!(e.message.contains("matches its nodelist"), "{}", e.message);
    let Err(e) = c.admit(&alice(), listed(1, &[], &["gpu*"]), "", T0) else {
        panic!("admitted a job that excludes every node")
    };
    assert!(e.message.contains("exclude"), "{}", e.message);
    // A malformed pattern is refused with the pattern.
    let Err(e) = c.admit(&alice(), listed(1, &["gpu[9-1]"], &[]), "", T0) else {
        panic!("admitted a malformed pattern")
    };
    assert!(e.message.contains("runs backwards"), "{}", e.message);
}
