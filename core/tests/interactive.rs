//! Interactive allocations (`gpuctl alloc`) and steps opened from outside a job: who may
//! open one and where it runs, and how an allocation ends when released.

mod common;

use common::*;
use gpuctl_core::Actor;
use gpuctl_core::operations::Operations as _;
use gpuctl_core::record::{JobSpec, JobState};

fn allocation(gpus: u32) -> JobSpec {
    JobSpec {
        command: Vec::new(),
        interactive: true,
        name: "interactive".into(),
        ..spec(gpus, false)
    }
}

fn bob() -> Actor {
    Actor {
        user: "bob".into(),
        admin: false,
    }
}

#[test]
fn an_allocation_runs_nothing_of_its_own_and_is_checked_as_such() {
    let c = cluster();
    let with_command = JobSpec {
        interactive: true,
        ..spec(1, false)
    };
    let e = c.admit(&alice(), with_command, "", T0).unwrap_err();
    assert!(
        e.message.contains("interactive allocation"),
        "{}",
        e.message
    );
    let array = JobSpec {
        array: "0-3".into(),
        ..allocation(1)
    };
    assert!(c.admit(&alice(), array, "", T0).is_err());
    let no_command = JobSpec {
        command: Vec::new(),
        ..spec(1, false)
    };
    assert!(c.admit(&alice(), no_command, "", T0).is_err());
}

#[test]
fn steps_go_to_a_started_allocation_of_their_owner_on_its_node() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let id = submit_spec(&mut c, allocation(2), T0);
    // Pending: no step yet.
    assert!(c.step_target(&alice(), id, 0).is_err());
    let e = pass(&mut c, T0 + 10);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {id}"))]);
    // Running at the controller, but its node has not said so: not yet.
    let e = c.step_target(&alice(), id, 0).unwrap_err();
    assert!(e.message.contains("starting"), "{}", e.message);
    report(&mut c, "n1", id, None, T0 + 20);
    let t = c.step_target(&alice(), id, 0).unwrap();
    assert_eq!((t.nodes, t.attempt), (vec!["n1".to_string()], 1));
    let e = c.step_target(&alice(), id, 2).unwrap_err();
    assert!(e.message.contains("runs on 1 node"), "{}", e.message);
    // Someone else's job: refused, naming whose it is.
    let e = c.step_target(&bob(), id, 0).unwrap_err();
    assert!(e.message.contains("alice"), "{}", e.message);
    let admin = Actor {
        user: "root".into(),
        admin: true,
    };
    assert!(c.step_target(&admin, id, 1).is_ok());
    // A job being ended (cancelled, or an allocation released) takes no new steps.
    c.cancel(&alice(), &[id], T0 + 30).unwrap();
    let e = c.step_target(&alice(), id, 0).unwrap_err();
    assert!(e.message.contains("ending"), "{}", e.message);
}

#[test]
fn a_released_allocation_ends_completed_and_only_allocations_are_released() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let alloc = submit_spec(&mut c, allocation(1), T0);
    let batch = submit(&mut c, 1, false, T0);
    pass(&mut c, T0 + 10);
    report(&mut c, "n1", alloc, None, T0 + 20);
    report(&mut c, "n1", batch, None, T0 + 20);
    let e = c.release_allocation(&alice(), batch, None).unwrap_err();
    assert!(
        e.message.contains("not an interactive allocation"),
        "{}",
        e.message
    );
    assert!(c.release_allocation(&bob(), alloc, None).is_err());
    let e = c.release_allocation(&alice(), alloc, Some(4)).unwrap();
    let kill = e
        .sends
        .iter()
        .find_map(|(_, cmd)| match cmd {
            gpuctl_core::command::Command::Kill(k) => Some(k.clone()),
            _ => None,
        })
        .expect("its holder is stopped");
    assert_eq!(kill.as_state, gpuctl_sched::job::JobState::Completed);
    assert!(kill.reason.contains("exited 4"), "{}", kill.reason);
    checked(&c);
    report(&mut c, "n1", alloc, Some((JobState::Completed, 0)), T0 + 30);
    assert_eq!(state(&c, alloc), JobState::Completed);
    // Released once: a second release says it ended.
    let e = c.release_allocation(&alice(), alloc, None).unwrap_err();
    assert!(e.message.contains("already ended"), "{}", e.message);
    assert_eq!(state(&c, batch), JobState::Running);
}
