//! A cancel of pending jobs kept as one record (`jobs::Changes::cancels`): applied again
//! by `restore` to the records written before it, it gives the records the cancel left.

mod common;

use common::*;
use gpuctl_core::log::{Change, Entry, JobAction};
use gpuctl_core::record::JobState;
use gpuctl_core::restore::{Records, restore};

#[test]
fn a_cancel_applied_again_to_the_records_before_it_gives_the_records_after_it() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    // One runs (the node's GPUs), the rest wait.
    let ids: Vec<u64> = (0..6).map(|i| submit(&mut c, 2, false, T0 + i)).collect();
    pass(&mut c, T0 + 10);
    let running: Vec<u64> = (ids.iter().copied())
        .filter(|&id| state(&c, id) == JobState::Running)
        .collect();
    assert!(!running.is_empty() && running.len() < ids.len());
    c.take_changes();
    // What a store holds before the cancel; then one pending job held in the same window
    // as the cancel (its record says more than the cancel: not the cancel's to restore).
    let before = c.records();
    let held = *ids.iter().rev().find(|id| !running.contains(id)).unwrap();
    let hold = Change::Job {
        actor: alice(),
        id: held,
        action: JobAction::Hold,
    };
    c.apply(Entry::new(T0 + 20, hold)).0.expect("held");
    let cancel = Change::Cancel {
        actor: alice(),
        ids: ids.clone(),
        tasks: Vec::new(),
    };
    c.apply(Entry::new(T0 + 30, cancel)).0.expect("cancelled");
    checked(&c);
    let changes = c.take_changes().jobs;
    let [cancel] = &changes.cancels[..] else {
        panic!("one cancel: {:?}", changes.cancels);
    };
    let pending: Vec<u64> = (ids.iter().copied())
        .filter(|id| !running.contains(id) && *id != held)
        .collect();
    assert_eq!(
        cancel.ids, pending,
        "the pending jobs the cancel alone changed"
    );
    assert_eq!(changes.deferrable(cancel), pending);
    assert!(
        changes.put.contains(&held),
        "the held job is written as it is"
    );

    let records = Records {
        cancels: changes.cancels.clone(),
        ..before
    };
    let restored = restore(c.config().clone(), records, T0 + 40);
    for id in &pending {
        assert_eq!(
            restored.cluster.jobs().get(*id),
            c.jobs().get(*id),
            "job {id} restored as the cancel left it"
        );
        assert_eq!(state(&restored.cluster, *id), JobState::Cancelled);
    }
    let rewritten: Vec<u64> = restored.rewrite.iter().map(|s| s.job.id).collect();
    assert_eq!(rewritten, pending);
    // The running jobs' kills and the held job are not the cancel record's: their
    // records as written before it come back as they were.
    for id in running.iter().chain([&held]) {
        assert_ne!(state(&restored.cluster, *id), JobState::Cancelled);
    }
    restored.cluster.check().unwrap();
}
