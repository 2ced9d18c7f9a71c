//! `gpuctl windows`, `gpuctl share` and `gpuctl priority`, answered by core.

mod common;

use common::*;
use gpuctl_core::{Cluster, Config};

fn config(text: &str) -> Config {
    let mut cfg: Config = toml::from_str(text).unwrap();
    cfg.resolve_qos();
    cfg
}

const BANK: &str = r#"
[accounts.inference]
users = ["alice"]
shares = 3
[accounts.training]
users = ["bob", "carol"]
[fairshare]
half_life = "2days"
[partitions.gpu]
nodes = ["n[1-4]"]
[windows.business]
days = ["mon", "tue", "wed", "thu", "fri"]
start = "08:00"
end = "20:00"
floor = { inference = 0.7 }
partition_floor = { gpu = 0.25 }
preemption = true
"#;

/// Monday 2024-01-01 00:00 UTC.
const MONDAY: i64 = 1_704_067_200_000;
const HOUR: i64 = 3_600_000;

#[test]
fn a_window_says_whether_it_is_open_and_when_that_changes() {
    let c = Cluster::new(config(BANK));
    let open = c.windows_answer(MONDAY + 10 * HOUR);
    assert_eq!(open.timezone, "UTC");
    assert_eq!(open.now_ms, MONDAY + 10 * HOUR);
    let w = &open.windows[0];
    assert_eq!(w.name, "business");
    assert!(w.open);
    assert_eq!(w.next_change_ms, MONDAY + 20 * HOUR, "closes at 20:00");
    assert_eq!(w.floor.get("inference"), Some(&0.7));
    assert_eq!(w.floor.get("partition:gpu"), Some(&0.25));
    assert_eq!(w.preemption, "on");
    assert!(open.preemption_allowed);

    // Saturday noon: closed, opens on Monday at 08:00.
    let weekend = c.windows_answer(MONDAY + (5 * 24 + 12) * HOUR);
    let w = &weekend.windows[0];
    assert!(!w.open);
    assert_eq!(w.next_change_ms, MONDAY + (7 * 24 + 8) * HOUR);
}

#[test]
fn the_test_clock_offset_moves_what_windows_see() {
    let mut cfg = config(BANK);
    cfg.clock_offset_ms = 12 * HOUR;
    let c = Cluster::new(cfg);
    // 22:00 on Sunday is Monday 10:00 to the windows.
    let a = c.windows_answer(MONDAY - 2 * HOUR);
    assert_eq!(a.now_ms, MONDAY + 10 * HOUR);
    assert!(a.windows[0].open);
}

#[test]
fn share_lists_every_configured_association_with_its_shares() {
    let mut c = Cluster::new(config(BANK));
    attach(&mut c, "n1", T0);
    let a = c.share_answer();
    assert_eq!(a.half_life, "2days");
    let users: Vec<(&str, &str)> = a
        .rows
        .iter()
        .map(|r| (r.account.as_str(), r.user.as_str()))
        .collect();
    for want in [
        ("inference", "alice"),
        ("training", "bob"),
        ("training", "carol"),
    ] {
        assert!(users.contains(&want), "{want:?} in {users:?}");
    }
    let alice = a.rows.iter().find(|r| r.user == "alice").unwrap();
    let bob = a.rows.iter().find(|r| r.user == "bob").unwrap();
    assert!(
        alice.account_shares > bob.account_shares,
        "3 shares against 1"
    );
    // No usage yet: everyone's factor is the top one.
    assert!(a.rows.iter().all(|r| r.usage_gpu_hours == 0.0), "{a:?}");
    assert!(a.rows.iter().all(|r| r.fair_share > 0.0), "{a:?}");
}

#[test]
fn priorities_rank_the_jobs_a_pass_considers_with_their_factors() {
    let mut c = cluster();
    attach(&mut c, "n1", T0);
    // Two GPUs: the first job runs, the two after it wait; the older one ranks first
    // (age is the only factor that tells them apart).
    let running = submit(&mut c, 2, false, T0);
    pass(&mut c, T0);
    let older = submit(&mut c, 1, false, T0 + 1000);
    let newer = submit(&mut c, 1, false, T0 + 3_600_000);
    let p = c.priorities(T0 + 7_200_000, 10);
    let ids: Vec<u64> = p.iter().map(|j| j.job_id).collect();
    assert_eq!(ids, vec![older, newer], "only pending jobs, older first");
    assert!(!ids.contains(&running));
    assert!(p[0].total > p[1].total, "{p:?}");
    assert_eq!(p[0].user, "alice");
    assert!(p[0].factors["age"] > p[1].factors["age"], "{p:?}");
    assert_eq!(
        p[0].factors.values().sum::<i64>(),
        p[0].total,
        "the factors add up to the total"
    );
    assert_eq!(c.priorities(T0 + 7_200_000, 1).len(), 1, "at most max");
}
