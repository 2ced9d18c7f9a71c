//! The deferred pass's room, decided in core: which submits may leave their pass to
//! later, and what a pass's end does about them.

mod common;

use common::*;
use gpuctl_core::policy::GpuRoom;
use gpuctl_core::room::{Deferred, PassRoom};

#[test]
fn a_gpu_submit_against_a_full_cluster_defers_and_an_event_ends_that() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let running = submit(&mut c, 2, false, T0);
    pass(&mut c, T0);
    report(&mut c, "n1", running, None, T0);
    let waiting = submit(&mut c, 2, false, T0 + 1);

    let mut room = PassRoom::default();
    assert_eq!(
        room.room(),
        GpuRoom::Any,
        "before any pass anything may fit"
    );
    let j = c.jobs().job(waiting).unwrap().clone();
    assert!(!room.defers(&c, &j), "no pass has measured the room yet");
    // The pass left a job waiting and no GPU free.
    assert_eq!(room.settle(&c, true, GpuRoom::None, T0 + 2), Deferred::None);
    assert!(room.defers(&c, &j));
    // A CPU-only job never defers: it needs no GPU room.
    let cpu_only = submit(&mut c, 0, false, T0 + 3);
    assert!(!room.defers(&c, &c.jobs().job(cpu_only).unwrap().clone()));
    // The next pass's input took the deferred submit; another defers after it, and
    // that pass's end leaves it to the timer while nothing fits ...
    room.pass_started();
    assert_eq!(room.settle(&c, true, GpuRoom::None, T0 + 4), Deferred::None);
    assert!(room.defers(&c, &j));
    assert_eq!(
        room.settle(&c, true, GpuRoom::None, T0 + 5),
        Deferred::PassSoon
    );
    // ... and runs it now once there is room for it.
    let free = GpuRoom::Free {
        cpu_milli: 16_000,
        memory_bytes: 64 << 30,
    };
    assert_eq!(room.settle(&c, true, free, T0 + 6), Deferred::PassNow);
    // A job's end wakes the scheduler: until its pass, nothing defers.
    room.pass_started();
    room.woken();
    assert!(!room.defers(&c, &j));
    // A pass that leaves nothing waiting keeps no room.
    assert_eq!(
        room.settle(&c, false, GpuRoom::None, T0 + 7),
        Deferred::None
    );
    assert_eq!(room.room(), GpuRoom::Any);
}
