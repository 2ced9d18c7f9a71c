//! The opportunistic class on the state machine: a borrower waits until a held GPU has
//! been measured little busy, runs there with the room its holder leaves as its memory
//! limit, and yields (never the holder) when the holder's use rises, when a guaranteed
//! job takes its GPU, or when an idle allocation's use resumes.

mod common;

use gpuctl_core::operations::Operations as _;
use std::time::Duration;

use common::*;
use gpuctl_core::log::{Change, Entry};
use gpuctl_core::record::{JobSpec, JobState};
use gpuctl_core::{Cluster, Effects};

const SEC: i64 = 1000;

fn configured() -> Cluster {
    let mut c = cluster();
    configure(&mut c, |cfg| {
        cfg.opportunistic.measure = Duration::from_secs(60);
        cfg.opportunistic.yield_window = Duration::from_secs(10);
    });
    c
}

/// A pass as the daemon runs it: its start (with the lend pass), then the main plan.
fn full_pass(c: &mut Cluster, now: i64) -> Effects {
    let mut e = c.apply(Entry::new(now, Change::Prepare)).1;
    e.merge(pass(c, now));
    checked(c);
    e
}

fn borrower_spec() -> JobSpec {
    JobSpec {
        name: "sweep".into(),
        opportunistic: true,
        signal: "USR1@30".into(),
        requeue: true,
        ..spec(1, true)
    }
}

/// A heartbeat of n1: each (job, GPU index, busy %, memory MiB) as the agent reads its
/// processes, the GPUs' totals their sums.
fn beat(c: &mut Cluster, uses: &[(u64, u32, u32, u64)], now: i64) -> Effects {
    let mut running: Vec<gpuctl_core::event::Running> = Vec::new();
    for &(id, ..) in uses {
        let attempt = c.jobs().job(id).unwrap().attempt;
        if !running.iter().any(|r| r.job_id == id) {
            running.push(gpuctl_core::event::Running::new(id, attempt));
        }
    }
    let metrics = (0..2)
        .map(|gpu| {
            let on: Vec<_> = uses.iter().filter(|u| u.1 == gpu).collect();
            gpuctl_core::node::GpuMetrics {
                uuid: format!("GPU-n1-{gpu}"),
                util_pct: on.iter().map(|u| u.2).sum::<u32>().min(100),
                mem_used_mib: on.iter().map(|u| u.3).sum(),
                time_ms: now,
                jobs: on
                    .iter()
                    .map(|u| gpuctl_core::node::JobGpuUse {
                        job_id: u.0,
                        mem_used_mib: u.3,
                        processes: 1,
                        util_pct: Some(u.2),
                    })
                    .collect(),
                ..Default::default()
            }
        })
        .collect();
    let req = gpuctl_core::event::Heartbeat {
        node: "n1".into(),
        running,
        metrics,
        ..Default::default()
    };
    let e = c.heartbeat(&req, now).1;
    checked(c);
    e
}

fn kills(e: &Effects) -> Vec<String> {
    commands(e)
        .into_iter()
        .filter(|(_, w)| w.starts_with("kill"))
        .map(|(_, w)| w)
        .collect()
}

/// n1 with a guaranteed job on GPU 0 and a borrower waiting.
fn held_and_waiting(c: &mut Cluster) -> (u64, u64) {
    attach(c, "n1", T0);
    let holder = submit(c, 1, false, T0);
    full_pass(c, T0);
    report(c, "n1", holder, None, T0);
    let borrower = submit_spec(c, borrower_spec(), T0);
    full_pass(c, T0);
    (holder, borrower)
}

#[test]
fn a_borrower_waits_for_a_measured_gpu_then_runs_in_its_idle() {
    let mut c = configured();
    let (holder, borrower) = held_and_waiting(&mut c);
    // GPU 1 is free but a borrower never takes a free GPU: it waits for a lent one.
    assert_eq!(state(&c, borrower), JobState::Pending);
    let why = &c.jobs().job(borrower).unwrap().reason;
    assert!(why.contains("no GPU is lent"), "{why}");
    // A minute of samples at 40% busy and 20 GiB: lent, and the scheduler is woken.
    let mut woke = false;
    for s in (5..=65).step_by(5) {
        woke |= beat(&mut c, &[(holder, 0, 40, 20_480)], T0 + s * SEC).wake;
    }
    assert!(
        woke,
        "a GPU becoming lendable while a borrower waits asks for a pass"
    );
    let e = full_pass(&mut c, T0 + 66 * SEC);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {borrower}"))]);
    let j = c.jobs().job(borrower).unwrap();
    assert_eq!(j.state, JobState::Running);
    let slot = &j.allocations[0].slots[0];
    assert_eq!(slot.uuid, "GPU-n1-0", "the holder's GPU, not the free one");
    // Its memory limit: 80 GiB less the holder's 20 GiB peak with the 25% margin.
    assert_eq!(slot.memory_mib, 81_920 - 25_600);
    assert!(
        j.reason.starts_with("Borrowing idle: n1 GPU"),
        "{}",
        j.reason
    );
    // The holder keeps its GPU as the main pass sees it: a whole-GPU job still fits
    // GPU 1 only, and the listing charges the borrower nothing.
    let usage = c.usage();
    assert_eq!(usage["n1"].slots["GPU-n1-0"].0, 1000);
}

#[test]
fn the_holders_rising_use_makes_the_borrower_yield_never_the_holder() {
    let mut c = configured();
    let (holder, borrower) = held_and_waiting(&mut c);
    for s in (5..=65).step_by(5) {
        beat(&mut c, &[(holder, 0, 40, 20_480)], T0 + s * SEC);
    }
    full_pass(&mut c, T0 + 66 * SEC);
    report(&mut c, "n1", borrower, None, T0 + 62 * SEC);
    // The borrower fills the idle: the GPU reads 100%, the holder still 40%: no yield.
    let both = |h: u32| [(holder, 0, h, 20_480), (borrower, 0, 100 - h, 30_000)];
    for s in (65..=120).step_by(5) {
        assert!(kills(&beat(&mut c, &both(40), T0 + s * SEC)).is_empty());
    }
    // The holder rises to 95%: within the 10 s window the borrower gets its signal.
    let mut killed = Vec::new();
    let mut at = 0;
    for s in (121..=140).step_by(1) {
        let k = kills(&beat(&mut c, &both(95), T0 + s * SEC));
        if !k.is_empty() && killed.is_empty() {
            at = s - 120;
        }
        killed.extend(k);
    }
    assert_eq!(
        killed,
        vec![format!("kill {borrower}")],
        "once, and only the borrower"
    );
    assert!(at <= 15, "yielded {at} s after the rise");
    let r = c.jobs().get(borrower).unwrap();
    assert!(
        r.requeue_requested.contains("busy share rose"),
        "{}",
        r.requeue_requested
    );
    assert_eq!(state(&c, holder), JobState::Running);
    assert!(c.jobs().get(holder).unwrap().requeue_requested.is_empty());
    // It ends on its signal and waits again; the GPU is not lent while the holder is busy.
    report(
        &mut c,
        "n1",
        borrower,
        Some((JobState::Cancelled, 143)),
        T0 + 150 * SEC,
    );
    assert_eq!(state(&c, borrower), JobState::Pending);
    // The holder's GPU is not lent while the holder is busy; the free GPU beside it,
    // which nobody has held for `measure`, is.
    full_pass(&mut c, T0 + 151 * SEC);
    let j = c.jobs().job(borrower).unwrap();
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.allocations[0].slots[0].uuid, "GPU-n1-1");
    assert!(j.reason.contains("nobody holds it"), "{}", j.reason);
}

#[test]
fn a_guaranteed_job_starting_on_a_borrowed_gpu_takes_it_back() {
    let mut c = configured();
    let (holder, borrower) = held_and_waiting(&mut c);
    for s in (5..=65).step_by(5) {
        beat(&mut c, &[(holder, 0, 30, 10_000)], T0 + s * SEC);
    }
    full_pass(&mut c, T0 + 66 * SEC);
    report(&mut c, "n1", borrower, None, T0 + 66 * SEC);
    // Another guaranteed job takes GPU 1; the holder of GPU 0 ends; a third guaranteed
    // job then starts on GPU 0, where the borrower runs: the borrower yields.
    let other = submit(&mut c, 1, false, T0 + 62 * SEC);
    full_pass(&mut c, T0 + 62 * SEC);
    report(&mut c, "n1", other, None, T0 + 62 * SEC);
    report(
        &mut c,
        "n1",
        holder,
        Some((JobState::Completed, 0)),
        T0 + 70 * SEC,
    );
    let third = submit(&mut c, 1, false, T0 + 71 * SEC);
    let e = full_pass(&mut c, T0 + 71 * SEC);
    // The borrower's memory limit leaves the whole GPU the third job is given no room:
    // the job waits for the borrower's yield (its signal's lead) instead of starting
    // beside it.
    assert_eq!(commands(&e), vec![to("n1", &format!("kill {borrower}"))]);
    assert!(
        (c.jobs().get(borrower).unwrap().requeue_requested)
            .contains(&format!("job {third} needs its memory"))
    );
    let j = c.jobs().job(third).unwrap();
    assert_eq!(j.state, JobState::Pending);
    assert!(j.reason.contains("to yield"), "{}", j.reason);
    // Passes until then kill nobody else and start nothing.
    let e = full_pass(&mut c, T0 + 80 * SEC);
    assert!(commands(&e).is_empty(), "{:?}", commands(&e));
    // It ends on its signal; the next pass gives the GPU to the third job, not back to
    // the borrower (the GPU is measured anew).
    report(
        &mut c,
        "n1",
        borrower,
        Some((JobState::Cancelled, 143)),
        T0 + 100 * SEC,
    );
    beat(&mut c, &[(other, 1, 50, 10_000)], T0 + 101 * SEC);
    let e = full_pass(&mut c, T0 + 101 * SEC);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {third}"))]);
    assert_eq!(state(&c, borrower), JobState::Pending);
}

/// `spec` asking for half a GPU's compute and `mib` of its memory.
fn half_gpu(mut spec: JobSpec, mib: u64) -> JobSpec {
    spec.resources.gpu = Some(gpuctl_core::record::GpuPart::Share(
        gpuctl_core::record::GpuShare {
            compute_milli: 500,
            memory_mib: Some(mib),
        },
    ));
    spec
}

#[test]
fn a_guaranteed_share_that_fits_beside_a_borrower_starts_at_once_and_takes_the_gpu_back() {
    let mut c = configured();
    attach(&mut c, "n1", T0);
    let borrower = submit_spec(&mut c, half_gpu(borrower_spec(), 8_192), T0);
    // Nobody holds either GPU: after a minute of samples both are lent.
    for s in (5..=65).step_by(5) {
        beat(&mut c, &[], T0 + s * SEC);
    }
    full_pass(&mut c, T0 + 66 * SEC);
    report(&mut c, "n1", borrower, None, T0 + 66 * SEC);
    let gpu = c.jobs().job(borrower).unwrap().allocations[0].slots[0]
        .uuid
        .clone();
    // Fill the other GPU, so a guaranteed share must go beside the borrower.
    let whole = submit(&mut c, 1, false, T0 + 70 * SEC);
    let e = full_pass(&mut c, T0 + 70 * SEC);
    // The main pass tries the GPU without borrowers first.
    assert_eq!(commands(&e), vec![to("n1", &format!("start {whole}"))]);
    report(&mut c, "n1", whole, None, T0 + 70 * SEC);
    let share = submit_spec(&mut c, half_gpu(spec(1, false), 16_384), T0 + 71 * SEC);
    let e = full_pass(&mut c, T0 + 71 * SEC);
    let mut got = commands(&e);
    got.sort();
    assert_eq!(
        got,
        vec![
            to("n1", &format!("kill {borrower}")),
            to("n1", &format!("start {share}"))
        ]
    );
    let j = c.jobs().job(share).unwrap();
    assert_eq!(j.allocations[0].slots[0].uuid, gpu);
}

#[test]
fn an_idle_allocation_lends_its_gpu_and_gets_it_back_when_its_use_resumes() {
    let mut c = cluster();
    configure(&mut c, |cfg| {
        cfg.opportunistic.measure = Duration::from_secs(3600);
        cfg.idle.lend_after = Some(Duration::from_secs(30));
    });
    let (holder, borrower) = held_and_waiting(&mut c);
    for s in (5..=25).step_by(5) {
        beat(&mut c, &[(holder, 0, 0, 4_000)], T0 + s * SEC);
    }
    full_pass(&mut c, T0 + 26 * SEC);
    assert_eq!(
        state(&c, borrower),
        JobState::Pending,
        "not idle for 30 s yet"
    );
    beat(&mut c, &[(holder, 0, 0, 4_000)], T0 + 36 * SEC);
    full_pass(&mut c, T0 + 37 * SEC);
    assert_eq!(state(&c, borrower), JobState::Running);
    report(&mut c, "n1", borrower, None, T0 + 37 * SEC);
    // Its use resumes at 20% (under lend_below, but it was lent as idle): yield at once.
    let e = beat(
        &mut c,
        &[(holder, 0, 20, 4_000), (borrower, 0, 60, 8_000)],
        T0 + 40 * SEC,
    );
    assert_eq!(kills(&e), vec![format!("kill {borrower}")]);
    assert!((c.jobs().get(borrower).unwrap().requeue_requested).contains("use resumed"));
}

#[test]
fn opportunistic_requests_that_cannot_borrow_are_refused() {
    let mut c = configured();
    attach(&mut c, "n1", T0);
    let none = JobSpec {
        resources: gpuctl_core::record::Resources {
            gpu: None,
            cpus: 1,
            ..Default::default()
        },
        ..borrower_spec()
    };
    let err = c.admit(&alice(), none, "", T0).unwrap_err();
    assert!(err.to_string().contains("must ask for GPUs"), "{err}");
    // A QoS an admin marks makes its jobs opportunistic.
    configure(&mut c, |cfg| {
        let mut q = gpuctl_core::config::QosConfig::open(0);
        q.opportunistic = true;
        cfg.qos.insert("scavenger".into(), q);
    });
    let id = submit_spec(
        &mut c,
        JobSpec {
            qos: "scavenger".into(),
            ..spec(1, true)
        },
        T0,
    );
    assert!(c.jobs().job(id).unwrap().spec.opportunistic);
}

/// A borrower is charged to its account by what it used, not by the GPU it ran on: an
/// hour beside a holder at 40% busy, itself 30% busy, costs its owner 0.3 GPU-hours of
/// fair share; the holder, who holds the whole GPU, is charged the whole GPU.
#[test]
fn a_borrower_is_charged_by_what_it_used() {
    let mut c = configured();
    attach(&mut c, "n1", T0);
    let holder = submit(&mut c, 1, false, T0);
    full_pass(&mut c, T0);
    report(&mut c, "n1", holder, None, T0);
    let bob = gpuctl_core::Actor {
        user: "bob".into(),
        admin: false,
    };
    let spec = JobSpec {
        user: "bob".into(),
        workdir: "/home/bob".into(),
        ..borrower_spec()
    };
    let borrower = submit_spec_as(&mut c, &bob, spec, T0);
    for s in (5..=65).step_by(5) {
        beat(&mut c, &[(holder, 0, 40, 20_480)], T0 + s * SEC);
    }
    full_pass(&mut c, T0 + 66 * SEC);
    assert_eq!(state(&c, borrower), JobState::Running);
    report(&mut c, "n1", borrower, None, T0 + 66 * SEC);
    let start = T0 + 66 * SEC;
    let usage = |c: &Cluster, id: u64| {
        let j = c.jobs().job(id).unwrap();
        let key = (j.spec.account.clone(), j.spec.user.clone());
        c.fair_usage().by_user.get(&key).copied().unwrap_or(0.0)
    };
    let (holder0, borrower0) = (usage(&c, holder), usage(&c, borrower));
    let both = [(holder, 0, 40, 20_480), (borrower, 0, 30, 30_000)];
    for s in (1..=120).map(|k| start + k * 30 * SEC) {
        beat(&mut c, &both, s);
        if s % (300 * SEC) == 0 {
            full_pass(&mut c, s);
        }
    }
    full_pass(&mut c, start + 3600 * SEC);
    assert_eq!(state(&c, borrower), JobState::Running, "no yield at 40%");
    let holder_s = usage(&c, holder) - holder0;
    let borrower_s = usage(&c, borrower) - borrower0;
    assert!(
        (holder_s - 3600.0).abs() < 0.03 * 3600.0,
        "holder {holder_s}"
    );
    assert!(
        (borrower_s - 0.3 * 3600.0).abs() < 0.05 * 0.3 * 3600.0,
        "the borrower is charged its 30% of the hour: {borrower_s} GPU-s"
    );
}

/// The index of the GPU job `id` runs on (n1's GPUs are `GPU-n1-0` and `GPU-n1-1`).
fn gpu_of(c: &Cluster, id: u64) -> u32 {
    let uuid = &c.jobs().job(id).unwrap().allocations[0].slots[0].uuid;
    uuid.trim_start_matches("GPU-n1-").parse().unwrap()
}

/// n1 with a guaranteed whole GPU and a guaranteed half-GPU share (16 GiB) on the
/// other GPU, both running, and a borrower waiting: (whole, share, borrower).
fn whole_share_and_borrower(c: &mut Cluster) -> (u64, u64, u64) {
    attach(c, "n1", T0);
    let whole = submit(c, 1, false, T0);
    let share = submit_spec(c, half_gpu(spec(1, false), 16_384), T0);
    full_pass(c, T0);
    report(c, "n1", whole, None, T0);
    report(c, "n1", share, None, T0);
    assert_ne!(gpu_of(c, whole), gpu_of(c, share));
    (whole, share, submit_spec(c, borrower_spec(), T0))
}

#[test]
fn the_part_of_a_shared_gpu_nobody_holds_is_lent_without_measuring_its_holder() {
    let mut c = configured();
    // A whole GPU kept busy, and half of the other held by a share kept 70% busy:
    // neither is lent by measure (over lend_below, 60%), whatever the time.
    let (whole, share, borrower) = whole_share_and_borrower(&mut c);
    let (g_whole, g_share) = (gpu_of(&c, whole), gpu_of(&c, share));
    let uses = [(whole, g_whole, 95, 60_000), (share, g_share, 70, 10_240)];
    for s in (5..=30).step_by(5) {
        beat(&mut c, &uses, T0 + s * SEC);
    }
    // Not before the same holders held it for free_after (a minute).
    full_pass(&mut c, T0 + 31 * SEC);
    assert_eq!(state(&c, borrower), JobState::Pending);
    let mut woke = false;
    for s in (35..=65).step_by(5) {
        woke |= beat(&mut c, &uses, T0 + s * SEC).wake;
    }
    assert!(woke, "the part becoming lendable asks for a pass");
    let e = full_pass(&mut c, T0 + 66 * SEC);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {borrower}"))]);
    let j = c.jobs().job(borrower).unwrap();
    assert_eq!(gpu_of(&c, borrower), g_share, "the shared GPU's free part");
    // Its room: 80 GiB less the share's 16 GiB limit (more than its 10 GiB peak with
    // the 25% margin).
    assert_eq!(j.allocations[0].slots[0].memory_mib, 81_920 - 16_384);
    assert!(
        j.reason.contains(&format!("of job {share} (70% busy)")),
        "{}",
        j.reason
    );
    // The holder keeps what it was given, and nothing of the whole GPU was lent.
    report(&mut c, "n1", borrower, None, T0 + 66 * SEC);
    let usage = c.usage();
    assert_eq!(usage["n1"].slots[&format!("GPU-n1-{g_share}")].0, 500);
    // A guaranteed share placed in that free part takes it back: the borrower's limit
    // leaves it no room, so it waits for the yield, and then starts there.
    let second = submit_spec(&mut c, half_gpu(spec(1, false), 16_384), T0 + 70 * SEC);
    let e = full_pass(&mut c, T0 + 70 * SEC);
    assert_eq!(commands(&e), vec![to("n1", &format!("kill {borrower}"))]);
    assert_eq!(state(&c, second), JobState::Pending);
    report(
        &mut c,
        "n1",
        borrower,
        Some((JobState::Cancelled, 143)),
        T0 + 90 * SEC,
    );
    let e = full_pass(&mut c, T0 + 91 * SEC);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {second}"))]);
    assert_eq!(gpu_of(&c, second), g_share);
    assert_eq!(state(&c, borrower), JobState::Pending);
}

#[test]
fn a_shared_gpu_whose_holders_use_most_of_it_is_not_lent() {
    let mut c = configured();
    let (whole, share, borrower) = whole_share_and_borrower(&mut c);
    let (g_whole, g_share) = (gpu_of(&c, whole), gpu_of(&c, share));
    // Over yield_above (80%): a borrower there would yield at once.
    let uses = [(whole, g_whole, 95, 60_000), (share, g_share, 90, 10_240)];
    for s in (5..=125).step_by(5) {
        beat(&mut c, &uses, T0 + s * SEC);
    }
    full_pass(&mut c, T0 + 126 * SEC);
    assert_eq!(state(&c, borrower), JobState::Pending);
}
