use super::*;
use crate::record::*;

/// Monday 2026-11-30 00:00 UTC.
const MON: i64 = 1_796_083_200_000 - 86_400_000;
const H: i64 = 3_600_000;

fn slot(uuid: &str, milli: u32, mib: u64) -> SlotUse {
    SlotUse {
        uuid: uuid.into(),
        compute_milli: milli,
        memory_mib: mib,
    }
}

/// (uuid, samples, utilisation sum, memory peak MiB)
fn usage(slots: &[(&str, u64, f64, u64)]) -> JobUsage {
    JobUsage {
        slots: slots
            .iter()
            .map(|&(uuid, samples, util_sum, mem_peak_mib)| SlotUsage {
                node: "n1".into(),
                uuid: uuid.into(),
                samples,
                util_sum,
                mem_peak_mib,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

#[allow(clippy::too_many_arguments)]
fn job(
    id: u64,
    user: &str,
    account: &str,
    start: i64,
    end: i64,
    limit_h: u64,
    slots: Vec<SlotUse>,
    u: JobUsage,
) -> Job {
    Job {
        id,
        state: JobState::Completed,
        start_time_ms: start,
        end_time_ms: end,
        time_limit_secs: limit_h * 3600,
        spec: JobSpec {
            user: user.into(),
            account: account.into(),
            ..Default::default()
        },
        allocations: vec![Allocation {
            node: "n1".into(),
            slots,
            ..Default::default()
        }],
        usage: Some(u),
        ..Default::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn a_small_week_adds_up_by_hand() {
    let jobs = vec![
        // 2 h on a whole GPU at 50%, 20 GiB of its 80 used, half of a 4 h limit.
        job(
            1,
            "alice",
            "ml",
            MON + 8 * H,
            MON + 10 * H,
            4,
            vec![slot("A", 1000, 81920)],
            usage(&[("A", 2, 100.0, 20480)]),
        ),
        // 1 h on two GPUs: one 2% busy with no memory (idle), one never sampled; a
        // tenth of a 10 h limit.
        job(
            2,
            "bob",
            "ml",
            MON + 9 * H + H / 2,
            MON + 10 * H + H / 2,
            10,
            vec![slot("B", 1000, 81920), slot("C", 1000, 81920)],
            usage(&[("B", 4, 8.0, 0)]),
        ),
        // A quarter share from Sunday 23:00 to Monday 01:00: one hour in the window,
        // fully busy, 10 of its 20 GiB used, its whole 2 h limit.
        job(
            3,
            "carol",
            "cv",
            MON - H,
            MON + H,
            2,
            vec![slot("D", 250, 20480)],
            usage(&[("D", 1, 100.0, 10240)]),
        ),
    ];
    let r = report(&jobs, MON, MON + 7 * 24 * H, MON + 8 * 24 * H, By::Account);
    let t = &r.total;
    assert_eq!(t.jobs, 3);
    assert!(close(t.gpu_hours_allocated, 4.25), "{t:?}");
    assert!(close(t.gpu_hours_measured, 3.25), "{t:?}");
    assert!(close(t.gpu_hours_used, 1.0 + 0.02 + 0.25), "{t:?}");
    assert!(close(t.gpu_hours_idle, 1.0), "{t:?}");
    assert!(
        close(t.gpu_efficiency_pct.unwrap(), 1.27 * 100.0 / 3.25),
        "{t:?}"
    );
    // 60 GiB x 2 h + 80 GiB x 1 h + 10 GiB x 1 h.
    assert!(close(t.gpu_memory_unused_gib_hours, 210.0), "{t:?}");
    // Run time over limit: 0.5, 0.1 and 1.0.
    assert!(close(t.time_limit_used_pct.unwrap(), 160.0 / 3.0), "{t:?}");
    assert_eq!(t.time_limit_over_2x, 1);
    // Groups, most allocated first; only ml wasted measured GPU-hours.
    let names: Vec<&str> = r.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["ml", "cv"]);
    assert!(close(r.groups[0].figures.gpu_hours_allocated, 4.0));
    assert_eq!(r.top_wasters.len(), 1);
    assert!(close(
        r.top_wasters[0].figures.gpu_hours_wasted(),
        3.0 - 1.02
    ));
    // Monday: 0.25 at midnight, 1 at 08:00, 1 + 2 x 0.5 at 09:00, 2 x 0.5 at 10:00.
    let mon = &r.demand_gpu_hours[0];
    assert!(
        close(mon[0], 0.25) && close(mon[8], 1.0) && close(mon[9], 2.0) && close(mon[10], 1.0),
        "{mon:?}"
    );
    let all: f64 = r.demand_gpu_hours.iter().flatten().sum();
    assert!(close(all, t.gpu_hours_allocated));
    // Sunday 23:00 is outside the window: nothing on day 6.
    assert!(r.demand_gpu_hours[6].iter().all(|&x| x == 0.0));
    // On 4 GPUs for the week: 672 GPU-hours; busy 1.27, allocated 4.25 of them.
    assert!(r.cluster.is_none());
    let c = r.with_capacity(4).cluster.unwrap();
    assert!(close(c.gpu_hours_available, 672.0));
    assert!(close(c.utilization, 1.27 / 672.0), "{c:?}");
    assert!(close(c.allocation, 4.25 / 672.0), "{c:?}");
    assert!(close(c.measured, 3.25 / 4.25), "{c:?}");
}

#[test]
fn jobs_outside_the_window_or_never_started_count_nothing() {
    let jobs = vec![
        job(
            1,
            "a",
            "x",
            MON - 3 * H,
            MON - H,
            1,
            vec![slot("A", 1000, 1)],
            usage(&[]),
        ),
        Job {
            id: 2,
            state: JobState::Pending,
            ..Default::default()
        },
    ];
    let r = report(&jobs, MON, MON + H, MON + H, By::User);
    assert_eq!(r.total.jobs, 0);
    assert!(r.groups.is_empty());
    assert_eq!(r.total.gpu_efficiency_pct, None);
}

fn borrowing_job(id: u64, account: &str, milli: u32, opportunistic: bool) -> Job {
    Job {
        id,
        spec: JobSpec {
            account: account.into(),
            opportunistic,
            ..JobSpec::default()
        },
        state: JobState::Completed,
        node: "n1".into(),
        exit_code: Some(0),
        start_time_ms: 1,
        end_time_ms: 1 + 2 * HOUR_MS as i64,
        allocations: vec![Allocation {
            node: "n1".into(),
            slots: vec![slot("GPU-0", milli, 0)],
            ..Allocation::default()
        }],
        attempt: 1,
        ..Job::default()
    }
}

#[test]
fn borrowed_gpu_hours_are_counted_apart_from_allocated_ones() {
    // A guaranteed job holds GPU-0 for 2 h; a half-GPU borrower runs beside it.
    let jobs = [
        borrowing_job(1, "training", 1000, false),
        borrowing_job(2, "research", 500, true),
    ];
    let r = report(&jobs, 0, 3 * HOUR_MS as i64, 10, By::Account).with_capacity(1);
    assert!((r.total.gpu_hours_allocated - 2.0).abs() < 1e-9);
    assert!((r.total.gpu_hours_borrowed - 1.0).abs() < 1e-9);
    let research = r.groups.iter().find(|g| g.name == "research").unwrap();
    assert_eq!(research.figures.gpu_hours_allocated, 0.0);
    assert!((research.figures.gpu_hours_borrowed - 1.0).abs() < 1e-9);
    // The GPU counts as allocated once, whoever borrows it.
    let c = r.cluster.unwrap();
    assert!((c.allocation - 2.0 / 3.0).abs() < 1e-9);
}

#[test]
fn energy_per_account_clipped_to_the_window_and_per_busy_gpu_hour() {
    // Two hours at 300 W on one GPU, busy 50%: 0.6 kWh, 1 busy GPU-hour.
    let mut u = usage(&[("g1", 10, 500.0, 1000)]);
    u.slots[0].energy_j = 300.0 * 2.0 * 3600.0;
    let a = job(
        1,
        "alice",
        "risk",
        MON,
        MON + 2 * H,
        4,
        vec![slot("g1", 1000, 81920)],
        u,
    );
    let r = report(
        std::slice::from_ref(&a),
        MON,
        MON + 10 * H,
        MON + 10 * H,
        By::Account,
    );
    assert!(close(r.total.energy_kwh, 0.6), "{}", r.total.energy_kwh);
    assert!(close(r.total.kwh_per_busy_gpu_hour.unwrap(), 0.6));
    assert!(close(r.groups[0].figures.energy_kwh, 0.6));
    assert_eq!(r.groups[0].name, "risk");
    // A window that holds half the run holds half its energy.
    let half = report(&[a], MON + H, MON + 10 * H, MON + 10 * H, By::Account);
    assert!(
        close(half.total.energy_kwh, 0.3),
        "{}",
        half.total.energy_kwh
    );
    // Unmeasured jobs draw nothing measured: no ratio.
    let b = job(
        2,
        "bob",
        "ml",
        MON,
        MON + H,
        4,
        vec![slot("g2", 1000, 81920)],
        JobUsage::default(),
    );
    let r = report(&[b], MON, MON + 10 * H, MON + 10 * H, By::Account);
    assert_eq!(
        (r.total.energy_kwh, r.total.kwh_per_busy_gpu_hour),
        (0.0, None)
    );
}

#[test]
fn energy_while_each_window_was_open() {
    // Four hours at 250 W, fully busy; a window open for the middle two.
    let mut u = usage(&[("g1", 10, 1000.0, 1000)]);
    u.slots[0].energy_j = 250.0 * 4.0 * 3600.0;
    let a = job(
        1,
        "alice",
        "risk",
        MON,
        MON + 4 * H,
        8,
        vec![slot("g1", 1000, 81920)],
        u,
    );
    let windows = vec![
        ("night".to_string(), vec![(MON + H, MON + 3 * H)]),
        ("never".to_string(), Vec::new()),
    ];
    let w = window_energy(&[a], &windows, MON, MON + 10 * H, MON + 10 * H);
    assert_eq!(w[0].name, "night");
    assert!(close(w[0].hours_open, 2.0));
    assert!(close(w[0].energy_kwh, 0.5), "{}", w[0].energy_kwh);
    assert!(close(w[0].gpu_hours_used, 2.0));
    assert!(close(w[0].kwh_per_busy_gpu_hour.unwrap(), 0.25));
    assert_eq!((w[1].energy_kwh, w[1].kwh_per_busy_gpu_hour), (0.0, None));
}
