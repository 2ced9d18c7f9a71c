//! The cluster state machine driven event by event, with the agent side recorded: every
//! command the state wants sent comes back in its `Effects`, and these tests play the
//! agents by answering with reports, heartbeats and attaches. No store, no clock, no
//! sockets: `now` is a number the test moves.

mod common;

use gpuctl_core::operations::Operations as _;
use std::collections::BTreeMap;

use common::*;
use gpuctl_core::node::Node;
use gpuctl_core::policy::{GpuRoom, gpu_room};
use gpuctl_core::record::{Dependency, DependencyKind, GpuPart, GpuShare, Job, JobState, Record};
use gpuctl_core::{Actor, Cluster, Config};

#[test]
fn submit_start_and_end() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let id = submit(&mut c, 1, false, T0);
    assert_eq!(state(&c, id), JobState::Pending);
    let changes = c.take_changes();
    assert!(changes.nodes.contains("n1"), "the attached node is written");

    let e = pass(&mut c, T0 + 10);
    assert_eq!(commands(&e), vec![to("n1", "start 1")]);
    let gpuctl_core::command::Command::Start(start) = e.sends[0].1.clone() else {
        unreachable!()
    };
    assert_eq!(
        (start.attempt, start.slots.len(), start.time_limit_secs),
        (1, 1, 3600)
    );
    assert_eq!(state(&c, id), JobState::Running);
    assert_eq!(
        c.take_changes().jobs.put,
        [id].into(),
        "the placement is written"
    );

    assert_eq!(
        c.jobs().job(id).unwrap().launch_time_ms,
        0,
        "not launched yet"
    );
    report(&mut c, "n1", id, None, T0 + 20);
    assert!(c.jobs().get(id).unwrap().start_confirmed);
    let j = c.jobs().job(id).unwrap();
    assert_eq!(
        (j.start_time_ms, j.launch_time_ms),
        (T0 + 10, T0 + 20),
        "dispatched at the pass, launched at the agent's report"
    );
    let e = report(&mut c, "n1", id, Some((JobState::Completed, 0)), T0 + 5000);
    assert!(e.sends.is_empty() && e.wake);
    let j = c.jobs().job(id).unwrap();
    assert_eq!(
        (j.state, j.exit_code, j.end_time_ms),
        (JobState::Completed, Some(0), T0 + 5000)
    );
    assert!(j.spec.env.is_empty(), "finished jobs keep no env");
    // A pass with nothing left to run sends nothing.
    assert!(pass(&mut c, T0 + 6000).sends.is_empty());
}

#[test]
fn cancel_pending_at_once_and_running_through_its_agent() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let running = submit(&mut c, 2, false, T0);
    let pending = submit(&mut c, 2, false, T0);
    pass(&mut c, T0);
    assert_eq!(
        (state(&c, running), state(&c, pending)),
        (JobState::Running, JobState::Pending)
    );
    let bob = Actor {
        user: "bob".into(),
        admin: false,
    };
    let refused = c.cancel(&bob, &[pending], T0 + 1).unwrap_err();
    assert!(refused.message.contains("belongs to alice"), "{refused}");
    assert_eq!(state(&c, pending), JobState::Pending);

    let (results, e) = c.cancel(&alice(), &[pending, running, 99], T0 + 2).unwrap();
    let oks: Vec<bool> = results.iter().map(|r| r.ok).collect();
    assert_eq!(oks, vec![true, true, false]);
    assert_eq!(state(&c, pending), JobState::Cancelled);
    assert_eq!(commands(&e), vec![to("n1", "kill 1")]);
    assert_eq!(
        state(&c, running),
        JobState::Running,
        "it ends when its agent says so"
    );
    report(
        &mut c,
        "n1",
        running,
        Some((JobState::Cancelled, -15)),
        T0 + 3,
    );
    assert_eq!(state(&c, running), JobState::Cancelled);
}

#[test]
fn a_time_limit_reached_ends_the_job_timeout() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let id = submit(&mut c, 1, false, T0);
    pass(&mut c, T0);
    report(&mut c, "n1", id, None, T0);
    // The agent enforces the limit it was sent and reports the end.
    report(
        &mut c,
        "n1",
        id,
        Some((JobState::Timeout, -15)),
        T0 + 3_600_000,
    );
    let j = c.jobs().job(id).unwrap();
    assert_eq!(j.state, JobState::Timeout);
    assert_eq!(j.end_time_ms - j.start_time_ms, 3_600_000);
}

#[test]
fn node_loss_fails_its_jobs_or_requeues_those_that_ask() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let plain = submit(&mut c, 1, false, T0);
    let requeue = submit(&mut c, 1, true, T0);
    pass(&mut c, T0);
    report(&mut c, "n1", plain, None, T0);
    report(&mut c, "n1", requeue, None, T0);
    // Heard from at T0; silent past the 60 s node timeout.
    assert!(c.check_nodes(T0 + 59_000).closed.is_empty());
    let e = c.check_nodes(T0 + 61_000);
    assert_eq!(e.closed, vec!["n1".to_string()]);
    assert!(e.wake);
    assert_eq!(state(&c, plain), JobState::NodeFail);
    let j = c.jobs().job(requeue).unwrap();
    assert_eq!(j.state, JobState::Pending);
    assert_eq!(j.reason, "requeued: node n1 failed");
    assert!(j.allocations.is_empty());
    // Nothing runs there while it is down.
    assert!(pass(&mut c, T0 + 62_000).sends.is_empty());
}

#[test]
fn a_returning_agent_still_running_a_requeued_job_takes_it_back() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let id = submit(&mut c, 1, true, T0);
    pass(&mut c, T0);
    report(&mut c, "n1", id, None, T0);
    c.check_nodes(T0 + 61_000);
    assert_eq!(state(&c, id), JobState::Pending);
    // The agent comes back and still runs attempt 1: no kill, the job runs again as it was.
    let e = attach_with(&mut c, "n1", &[(id, 1)], T0 + 70_000);
    assert!(commands(&e).is_empty(), "{:?}", commands(&e));
    let j = c.jobs().job(id).unwrap();
    assert_eq!(
        (j.state, j.attempt, j.start_time_ms),
        (JobState::Running, 1, T0)
    );
}

#[test]
fn a_returning_agent_without_a_confirmed_job_fails_it_and_kills_strangers() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let confirmed = submit(&mut c, 1, false, T0);
    let unconfirmed = submit(&mut c, 1, false, T0);
    pass(&mut c, T0);
    report(&mut c, "n1", confirmed, None, T0);
    // The agent restarts (its stream closes with its process): it runs neither, but
    // something the controller never placed.
    let generation = c.fleet().session("n1").unwrap().generation;
    c.disconnected("n1", generation);
    let e = attach_with(&mut c, "n1", &[(77, 1)], T0 + 5_000);
    assert_eq!(commands(&e), vec![to("n1", "kill 77")]);
    let j = c.jobs().job(confirmed).unwrap();
    assert_eq!(j.state, JobState::Failed);
    assert_eq!(j.reason, "agent restarted without the job (lost)");
    let j = c.jobs().job(unconfirmed).unwrap();
    assert_eq!(
        j.state,
        JobState::Pending,
        "a start never delivered is requeued"
    );
    assert_eq!(j.reason, "requeued: start was not delivered");
}

/// What a store would hold after writing every change.
#[derive(Default)]
struct Disk {
    jobs: BTreeMap<u64, Record>,
    nodes: BTreeMap<String, Node>,
}

impl Disk {
    fn write(&mut self, c: &mut Cluster) {
        let changes = c.take_changes();
        for id in changes.jobs.put {
            self.jobs.insert(id, c.jobs().get(id).unwrap().clone());
        }
        for id in changes.jobs.delete {
            self.jobs.remove(&id);
        }
        for n in changes.nodes {
            self.nodes.insert(n.clone(), c.fleet().nodes()[&n].clone());
        }
    }

    /// The cluster a controller started at `now` rebuilds from this (as the daemon
    /// does: `gpuctl_core::restore`).
    fn load(&self, now: i64) -> Cluster {
        let records = gpuctl_core::restore::Records {
            jobs: self.jobs.values().cloned().collect(),
            nodes: self.nodes.values().cloned().collect(),
            ..Default::default()
        };
        let restored = gpuctl_core::restore::restore(Config::default(), records, now);
        assert!(restored.rewrite.is_empty(), "records of this version stay");
        restored.cluster
    }
}

/// A cluster whose node n1 runs one job, and what was written of it (a submit is
/// written by the shell with its id; the test does the same).
fn running_one() -> (Cluster, Disk, u64) {
    let mut c = cluster();
    let mut disk = Disk::default();
    attach(&mut c, "n1", T0);
    let running = submit(&mut c, 1, false, T0);
    disk.jobs
        .insert(running, c.jobs().get(running).unwrap().clone());
    pass(&mut c, T0);
    report(&mut c, "n1", running, None, T0);
    (c, disk, running)
}

#[test]
fn a_restarted_controller_recovers_from_what_was_written() {
    let (mut c, mut disk, running) = running_one();
    let waiting = submit(&mut c, 2, false, T0 + 1);
    disk.jobs
        .insert(waiting, c.jobs().get(waiting).unwrap().clone());
    disk.write(&mut c);
    drop(c);

    let mut c = disk.load(T0 + 2);
    assert_eq!(state(&c, running), JobState::Running);
    assert_eq!(c.next_job_id(), waiting + 1, "ids are never reused");
    // Down until its agent attaches again, then reconciled: the running job stays.
    assert!(pass(&mut c, T0 + 2).sends.is_empty());
    let e = attach_with(&mut c, "n1", &[(running, 1)], T0 + 3);
    assert!(commands(&e).is_empty());
    assert_eq!(state(&c, running), JobState::Running);
    report(
        &mut c,
        "n1",
        running,
        Some((JobState::Completed, 0)),
        T0 + 4,
    );
    let e = pass(&mut c, T0 + 5);
    assert_eq!(commands(&e), vec![to("n1", "start 2")]);
}

#[test]
fn a_restarted_controller_gives_agents_a_full_timeout_and_never_reuses_an_id() {
    let (mut c, mut disk, running) = running_one();
    disk.write(&mut c);
    drop(c);

    // Restarted an hour later: the agent was last heard long ago, but the timeout
    // counts from the start.
    let start = T0 + 3_600_000;
    let mut c = disk.load(start);
    assert!(c.next_job_id() > running);
    c.check_nodes(start + 59_000);
    assert_eq!(state(&c, running), JobState::Running);
    c.check_nodes(start + 61_000);
    assert_eq!(state(&c, running), JobState::NodeFail);
    let next = submit(&mut c, 1, false, start + 62_000);
    assert!(next > running, "ids are never reused");
}

#[test]
fn a_dependency_that_can_never_be_met_cancels_its_job_in_the_pass() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let first = submit(&mut c, 2, false, T0);
    let mut s = spec(1, false);
    s.dependencies = vec![Dependency {
        kind: DependencyKind::AfterOk,
        job_id: first,
    }];
    let after = submit_spec(&mut c, s, T0);
    assert_eq!(c.jobs().job(after).unwrap().reason, "Dependency");
    let e = pass(&mut c, T0);
    assert_eq!(
        commands(&e),
        vec![to("n1", "start 1")],
        "the dependent job waits"
    );
    report(&mut c, "n1", first, Some((JobState::Failed, 1)), T0 + 10);
    let e = pass(&mut c, T0 + 20);
    assert!(e.sends.is_empty());
    let j = c.jobs().job(after).unwrap();
    assert_eq!(j.state, JobState::Cancelled);
    assert_eq!(j.reason, "DependencyNeverSatisfied: job 1 ended FAILED");
}

/// The daemon takes a pass's input in separate holds of its lock: a job submitted
/// between `pass_prepare` and the queue's parts has not had its dependencies looked
/// at, so it is left to the next pass (a race the parallel integration tests hit: a
/// job started while the job it depended on still waited).
#[test]
fn a_job_submitted_while_a_pass_takes_its_input_waits_for_the_next() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let blocker = submit(&mut c, 2, false, T0);
    let mut s = spec(1, false);
    s.dependencies = vec![Dependency {
        kind: DependencyKind::AfterOk,
        job_id: blocker,
    }];
    // The pass settles what it knows, then a submit gets in before the queue is read.
    let waiting = c.pass_prepare(T0);
    let late = submit_spec(&mut c, s, T0);
    let plain = submit(&mut c, 1, false, T0);
    let queue = c.queue(&waiting);
    let ids: Vec<u64> = queue.iter().map(|p| p.id).collect();
    assert_eq!(ids, vec![blocker], "only what pass_prepare saw");
    assert!(waiting.contains(late) && waiting.contains(plain));
    // The next pass takes them (the smaller job first, on one of the two GPUs), the
    // dependent job still waiting.
    let e = pass(&mut c, T0 + 1);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {plain}"))]);
    assert_eq!(state(&c, late), JobState::Pending);
    assert_eq!(c.jobs().job(late).unwrap().reason, "Dependency");
}

#[test]
fn a_start_the_agent_handled_but_did_not_run_fails_its_job() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    let id = submit(&mut c, 1, false, T0);
    let e = pass(&mut c, T0);
    // The shell signs the start as command 1 of the session.
    let generation = c.fleet().session("n1").unwrap().generation;
    let gpuctl_core::command::Command::Start(s) = &e.sends[0].1 else {
        panic!("a start: {:?}", e.sends)
    };
    let start = Some((s.job_id, s.attempt));
    assert!(
        c.leader()
            .command_sent("n1", generation, 1, start)
            .is_some()
    );
    let hb = gpuctl_core::event::Heartbeat {
        node: "n1".into(),
        commands_handled: 1,
        ..gpuctl_core::event::Heartbeat::default()
    };
    let (resp, e) = c.heartbeat(&hb, T0 + 1000);
    assert!(resp.known && e.wake);
    let j = c.jobs().job(id).unwrap();
    assert_eq!(j.state, JobState::Failed);
    assert!(j.reason.contains("did not run the start"), "{}", j.reason);
}

#[test]
fn a_second_agent_cannot_take_a_live_name() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    c.leader().challenge("n1", b"other".to_vec(), T0 + 1);
    let req = gpuctl_core::event::Register {
        node: "n1".into(),
        nonce: b"other".to_vec(),
        agent_id: "someone-else".into(),
        ..gpuctl_core::event::Register::default()
    };
    let err = c.attach(&req, None, T0 + 2).unwrap_err();
    assert_eq!(err.kind, gpuctl_core::Kind::AlreadyExists);
    // A nonce is single use: the same attach again is refused for it.
    let err = c.attach(&req, None, T0 + 3).unwrap_err();
    assert_eq!(err.kind, gpuctl_core::Kind::FailedPrecondition);
}

/// A job of `gpu` (one node, one CPU) as the state holds it, for `deferrable`.
fn job_of_gpu(gpu: Option<GpuPart>, qos: &str) -> Job {
    let mut s = spec(0, false);
    s.qos = qos.into();
    s.resources.gpu = gpu;
    Job {
        spec: s,
        ..Job::default()
    }
}

#[test]
fn a_gpu_jobs_room_is_what_nodes_with_a_free_gpu_have_free() {
    // The room as the state holds it: its view with no plan on top.
    let room = |c: &Cluster| gpu_room(&c.view(), &gpuctl_sched::Plan::default());
    let mut c = cluster();
    assert_eq!(room(&c), GpuRoom::None, "no node up: nothing can start");
    attach(&mut c, "n1", T0); // 2 GPUs, 16 CPUs, 64 GiB
    let all = GpuRoom::Free {
        cpu_milli: 16_000,
        memory_bytes: 64 << 30,
    };
    assert_eq!(room(&c), all);
    let whole = submit(&mut c, 1, false, T0);
    let share = |c: &mut Cluster, cpus: u32| {
        let mut s = spec(0, false);
        let r = &mut s.resources;
        r.cpus = cpus;
        r.gpu = Some(GpuPart::Share(GpuShare {
            compute_milli: 500,
            memory_mib: None,
        }));
        submit_spec(c, s, T0)
    };
    let half = share(&mut c, 14);
    // A plan's starts count as held: the room after the plan, from the view it was
    // made on, is the room of the state it leaves.
    let (view, queue, cfg) = c.pass_input(T0 + 1);
    let plan = gpuctl_sched::schedule(&view, &queue, &cfg, T0 + 1);
    assert_eq!(plan.starts.len(), 2);
    let after_plan = gpu_room(&view, &plan);
    c.apply_plan(&plan, T0 + 1);
    assert_eq!(after_plan, room(&c));
    assert_eq!(
        (state(&c, whole), state(&c, half)),
        (JobState::Running, JobState::Running)
    );
    let one_cpu_left = GpuRoom::Free {
        cpu_milli: 1000,
        memory_bytes: 64 << 30,
    };
    assert_eq!(room(&c), one_cpu_left, "half a GPU free, one CPU");
    let two_cpus = Job {
        spec: spec(1, false),
        ..Job::default()
    };
    let mut req = c
        .deferrable(&two_cpus)
        .expect("a GPU job of the default QoS");
    assert!(one_cpu_left.admits(req.cpu_milli, req.memory_bytes));
    req.cpu_milli = 2000;
    assert!(
        !one_cpu_left.admits(req.cpu_milli, req.memory_bytes),
        "no node with a free GPU has two CPUs"
    );
    let other_half = share(&mut c, 1);
    pass(&mut c, T0 + 2);
    assert_eq!(state(&c, other_half), JobState::Running);
    assert_eq!(room(&c), GpuRoom::None, "both GPUs held");
    assert!(
        !GpuRoom::None.admits(req.cpu_milli, req.memory_bytes)
            && GpuRoom::Any.admits(req.cpu_milli, req.memory_bytes)
    );

    // What may wait for a pass: jobs that need GPU compute and preempt nobody (the
    // default config's `high` preempts `low`).
    let gpus = Some(GpuPart::Gpus(1));
    assert!(c.deferrable(&job_of_gpu(gpus.clone(), "normal")).is_some());
    assert!(
        c.deferrable(&job_of_gpu(gpus, "high")).is_none(),
        "it may preempt"
    );
    assert!(
        c.deferrable(&job_of_gpu(None, "normal")).is_none(),
        "CPUs only"
    );
    let memory_only = GpuPart::Share(GpuShare {
        compute_milli: 0,
        memory_mib: Some(1024),
    });
    assert!(
        c.deferrable(&job_of_gpu(Some(memory_only), "normal"))
            .is_none()
    );

    // A job's end frees its GPU (and wakes the scheduler, whose pass comes anyway).
    let e = report(&mut c, "n1", whole, Some((JobState::Completed, 0)), T0 + 3);
    assert!(e.wake);
    assert_eq!(
        room(&c),
        GpuRoom::Free {
            cpu_milli: 1000,
            memory_bytes: 64 << 30
        }
    );
}

/// The daemon takes a pass's view in parts (nodes by name, then what runs by job id),
/// releasing its lock in between: with nothing changing, the parts make up the view,
/// whatever their size.
#[test]
fn the_view_in_parts_is_the_view() {
    let mut c = cluster();
    for n in ["n1", "n2", "n3", "n4", "n5"] {
        attach(&mut c, n, T0);
    }
    // Running jobs of 1 and 2 GPUs (the nodes have 2), and some left pending.
    for k in 0..12 {
        submit(&mut c, 1 + k % 2, false, T0);
    }
    pass(&mut c, T0 + 1);
    let whole = c.view();
    assert_eq!(whole.nodes.len(), 5);
    assert!(whole.running.len() >= 5, "{:?}", whole.running.len());
    assert!(c.jobs().active().any(|s| s.job.state == JobState::Pending));
    for size in [1, 2, 3, 7, usize::MAX] {
        let (mut parts, mut at) = (Default::default(), gpuctl_core::ViewCursor::default());
        let mut holds = 0;
        while c.view_part(&mut at, &mut parts, size, size) {
            holds += 1;
        }
        if size == 1 {
            // Five nodes, then at least one job a part.
            assert!(holds >= 5 + whole.running.len() / 2, "{holds} parts");
        }
        assert_eq!(parts, whole, "parts of {size}");
    }
}
