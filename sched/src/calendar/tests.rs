//! The calendar's tests, with brute-force oracles for its profiles.

use super::*;
use proptest::prelude::*;

proptest! {
    /// A profile built by adds agrees with its claims: peaks over any window, and
    /// tails (checked against a scan of every instant after them).
    #[test]
    fn profile_matches_its_claims(
        adds in proptest::collection::vec((0i64..40, 1i64..20, 1i64..600, 0i64..50), 0..25),
        windows in proptest::collection::vec((0i64..70, 1i64..30), 1..8),
        need in 1i64..1000,
    ) {
        let mut p = Profile::default();
        let mut cs = Vec::new();
        for &(a, len, c, m) in &adds {
            p.add(a, a + len, c, m);
            cs.push(Claim { start: a, end: a + len, job: 1, compute: c as u32, mem_mib: m as u64, reserved: false });
        }
        let usage = |t: i64| -> (i64, i64) {
            cs.iter().filter(|c| c.start <= t && t < c.end)
                .fold((0, 0), |s, c| (s.0 + i64::from(c.compute), s.1 + c.mem_mib as i64))
        };
        for &(a, len) in &windows {
            let (pc, pm) = peak(&cs, a, a + len, true);
            prop_assert_eq!(p.peak(a, a + len), (i64::from(pc), pm as i64));
            prop_assert_eq!(p.at(a), usage(a));
            prop_assert_eq!(p.idle(a, a + len), (pc, pm) == (0, 0));
            let room = |x: i64| {
                let u = usage(x);
                u.0 + need <= 1000 && u.1 <= 200
            };
            let t = p.tail(a, (need, 0), (1000, 200));
            prop_assert!(t >= a);
            let fits_for_good = (t..80).all(room);
            prop_assert!(fits_for_good, "no room after tail {}", t);
            prop_assert!(t == a || !room(t - 1), "tail {} is not the earliest", t);
        }
    }
}

fn claim(start: Millis, end: Millis, compute: u32, reserved: bool) -> Claim {
    Claim {
        start,
        end,
        job: 9,
        compute,
        mem_mib: 0,
        reserved,
    }
}

#[test]
fn peak_counts_overlaps_only() {
    let cs = [
        claim(0, 10, 300, false),
        claim(5, 15, 300, false),
        claim(20, 30, 900, false),
    ];
    assert_eq!(peak(&cs, 0, 20, true).0, 600);
    assert_eq!(peak(&cs, 10, 20, true).0, 300);
    assert_eq!(peak(&cs, 15, 20, true).0, 0);
    // Touching intervals do not overlap.
    assert_eq!(
        peak(
            &[claim(0, 10, 500, false), claim(10, 20, 500, false)],
            0,
            20,
            true
        )
        .0,
        500
    );
}

#[test]
fn profile_tail_and_peak() {
    let mut p = Profile::default();
    p.add(0, 10, 600, 0);
    p.add(20, 30, 600, 0);
    p.add(5, 15, 100, 0);
    assert_eq!(p.peak(0, 20), (700, 0));
    assert_eq!(p.peak(10, 20), (100, 0));
    assert_eq!(p.peak(15, 20), (0, 0));
    assert_eq!(p.peak(25, 26), (600, 0));
    let t = |lb, need| p.tail(lb, (need, 0), (1000, 1));
    assert_eq!(t(0, 300), 0);
    assert_eq!(t(0, 350), 10);
    assert_eq!(t(0, 500), 30);
    assert_eq!(t(40, 1000), 40);
    assert_eq!(p.last_end(0), 30);
    // The profile agrees with the claims it was built from.
    let cs = [
        claim(0, 10, 600, false),
        claim(20, 30, 600, true),
        claim(5, 15, 100, false),
    ];
    for (a, b) in [(0, 5), (3, 12), (12, 25), (29, 40)] {
        assert_eq!(peak(&cs, a, b, true).0 as i64, p.peak(a, b).0, "[{a},{b})");
    }
}

/// One claim on a slot (the tests' brute-force oracle for the profiles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub start: Millis,
    pub end: Millis,
    pub job: JobId,
    pub compute: u32,
    pub mem_mib: u64,
    /// A reservation (not yet running).
    pub reserved: bool,
}

/// Peak of summed (x, y) over [a, b) of intervals (start, end, x, y, reserved),
/// optionally without reservations: the brute-force oracle for the profiles.
fn peak_of(
    items: impl Iterator<Item = (Millis, Millis, i64, i64, bool)>,
    a: Millis,
    b: Millis,
    with_reserved: bool,
) -> (i64, i64) {
    let mut ev: Vec<(Millis, i64, i64)> = Vec::new();
    for (s, e, x, y, reserved) in items {
        if (with_reserved || !reserved) && overlaps(s, e, a, b) {
            ev.push((s.max(a), x, y));
            ev.push((e.min(b), -x, -y));
        }
    }
    // Ends before starts at the same instant.
    ev.sort_unstable_by_key(|&(t, dx, _)| (t, dx));
    let (mut x, mut y, mut px, mut py) = (0i64, 0i64, 0i64, 0i64);
    for (_, dx, dy) in ev {
        x += dx;
        y += dy;
        px = px.max(x);
        py = py.max(y);
    }
    (px, py)
}

/// Peak (compute, memory) over [a, b) of a slot's claims.
fn peak(claims: &[Claim], a: Millis, b: Millis, with_reserved: bool) -> (u32, u64) {
    let (c, m) = peak_of(
        claims.iter().map(|c| {
            (
                c.start,
                c.end,
                i64::from(c.compute),
                c.mem_mib as i64,
                c.reserved,
            )
        }),
        a,
        b,
        with_reserved,
    );
    (c as u32, m as u64)
}
