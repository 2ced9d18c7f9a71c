//! Admissions decided before earlier ones applied (a leader's submits still in the
//! log): ids handed out past the ones in flight (`admit_from`) do not collide; those
//! that do, or a request id queued meanwhile, are refused as they apply, alike on every
//! replica, and change nothing.

mod common;

use common::*;
use gpuctl_core::log::{Applied, Change, Entry};
use gpuctl_core::ops::Admission;
use gpuctl_core::record::Record;
use gpuctl_core::{Cluster, Kind};

fn admitted(a: Result<Admission, gpuctl_core::Refusal>) -> Record {
    match a {
        Ok(Admission::New(r)) => *r,
        other => panic!("{:?}", other.map(|_| ())),
    }
}

fn submit(c: &mut Cluster, r: Record) -> Result<Applied, gpuctl_core::Refusal> {
    let out = c.apply(Entry::new(T0, Change::Submit(vec![r]))).0;
    checked(c);
    out
}

#[test]
fn ids_handed_out_past_admissions_in_flight_do_not_collide() {
    let mut c = cluster();
    let a = admitted(c.admit(&alice(), spec(1, false), "", T0));
    let b = admitted(c.admit_from(&alice(), spec(1, false), "", T0, a.job.id + 1));
    assert_eq!((a.job.id, b.job.id), (1, 2));
    submit(&mut c, a).expect("queued");
    submit(&mut c, b).expect("queued");
    assert_eq!(c.jobs().len(), 2);
    assert_eq!(c.next_job_id(), 3);
}

#[test]
fn a_colliding_admission_is_refused_as_it_applies_and_changes_nothing() {
    let mut c = cluster();
    let a = admitted(c.admit(&alice(), spec(1, false), "", T0));
    let mut b = admitted(c.admit(&alice(), spec(2, false), "", T0));
    assert_eq!(a.job.id, b.job.id, "both decided on the same state");
    submit(&mut c, a).expect("queued");
    let refused = submit(&mut c, b.clone()).expect_err("the id is taken");
    assert_eq!(refused.kind, Kind::AlreadyExists);
    assert!(
        refused.message.contains("taken meanwhile"),
        "{}",
        refused.message
    );
    assert_eq!(c.jobs().len(), 1);
    assert_eq!(
        c.jobs().job(1).unwrap().spec.resources.gpu,
        spec(1, false).resources.gpu
    );
    // Admitted again on the state as it is now, it is queued.
    b = admitted(c.admit(&alice(), spec(2, false), "", T0));
    assert_eq!(b.job.id, 2);
    submit(&mut c, b).expect("queued");
}

#[test]
fn a_request_id_queued_meanwhile_refuses_its_repeat() {
    let mut c = cluster();
    let a = admitted(c.admit(&alice(), spec(1, false), "req-7", T0));
    let b = admitted(c.admit_from(&alice(), spec(1, false), "req-7", T0, 2));
    submit(&mut c, a).expect("queued");
    let refused = submit(&mut c, b).expect_err("a repeat");
    assert!(refused.message.contains("as job 1"), "{}", refused.message);
    assert_eq!(c.jobs().len(), 1);
    // Once applied, admission itself answers the repeat with its job.
    assert!(matches!(
        c.admit(&alice(), spec(1, false), "req-7", T0),
        Ok(Admission::Repeat(1))
    ));
}
