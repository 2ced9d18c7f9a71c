//! `scancel -s USR1` on the state machine (`Cluster::signal_jobs`): a command to each
//! node of a running job that delivers the signal alone, nothing for a pending job,
//! another user's jobs refused whole, a signal no job may be sent refused; the state
//! does not change.

mod common;

use common::*;
use gpuctl_core::Actor;
use gpuctl_core::command::Command;
use gpuctl_core::error::Kind;
use gpuctl_core::record::JobState;

#[test]
fn a_signal_goes_to_a_running_jobs_nodes_and_changes_nothing() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let running = submit(&mut c, 1, false, T0);
    pass(&mut c, T0);
    report(&mut c, "n1", running, None, T0);
    let pending = submit(&mut c, 2, false, T0);
    pass(&mut c, T0);
    assert_eq!(state(&c, pending), JobState::Pending);
    let before = c.jobs().job(running).unwrap().clone();

    let (results, effects) = c
        .signal_jobs(&alice(), &[running, pending], &[], "usr1")
        .unwrap();
    let [Command::Kill(k)] = &effects
        .sends
        .iter()
        .map(|s| s.1.clone())
        .collect::<Vec<_>>()[..]
    else {
        panic!("one command: {:?}", effects.sends)
    };
    assert_eq!(effects.sends[0].0, "n1");
    assert!(
        k.signal_only && k.signal == "USR1" && k.job_id == running,
        "{k:?}"
    );
    assert_eq!(k.attempt, before.attempt);
    assert!(results[0].ok, "{:?}", results[0]);
    assert!(!results[1].ok && results[1].message.contains("nothing of it runs"));
    // Nothing in the state changed: no entry, the job as it was.
    assert_eq!(c.jobs().job(running).unwrap(), &before);

    let bob = Actor {
        user: "bob".into(),
        admin: false,
    };
    let e = c.signal_jobs(&bob, &[running], &[], "USR1").unwrap_err();
    assert_eq!(e.kind, Kind::PermissionDenied, "{}", e.message);
    let e = c
        .signal_jobs(&alice(), &[running], &[], "WINCH")
        .unwrap_err();
    assert_eq!(e.kind, Kind::InvalidArgument, "{}", e.message);
}
