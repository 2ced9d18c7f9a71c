//! A `Base` carried from pass to pass plans as a fresh build does (see `base.rs`).

use super::*;

/// What happens between two passes: time goes on, the last plan's starts run, some
/// running jobs end, a node changes its state, a running job's limit moves.
#[derive(Debug, Clone)]
struct Step {
    /// Milliseconds since the last pass (0: a pass at the same instant).
    dt: Millis,
    /// Which running claims end (by position, modulo their count).
    ends: Vec<usize>,
    /// A node whose eligibility flips (by position, modulo the node count).
    flip: Option<usize>,
    /// A running claim whose expected end moves by this much.
    extend: Option<(usize, Millis)>,
    /// A node whose first GPU is replaced (a new UUID: claims on the old one no longer
    /// count there).
    replace: Option<usize>,
}

fn arb_step() -> impl Strategy<Value = Step> {
    (
        prop_oneof![Just(0), 1..2000i64, 1..(3 * H)],
        prop::collection::vec(0usize..50, 0..3),
        prop::option::of(0usize..8),
        prop::option::of((0usize..50, -H..H)),
        prop::option::of(0usize..8),
    )
        .prop_map(|(dt, ends, flip, extend, replace)| Step {
            dt,
            ends,
            flip,
            extend,
            replace,
        })
}

/// The view after `step`: the plan's starts run until their expected end, the rest as
/// the step says. Claims stay in job order, as the controller's views have them.
fn next_view(
    mut c: ClusterView,
    plan: &Plan,
    queue: &[PendingJob],
    step: &Step,
    now: Millis,
) -> ClusterView {
    for s in &plan.starts {
        let d = queue
            .iter()
            .find(|j| j.id == s.job)
            .map_or(H, |j| j.duration_ms);
        for a in &s.allocs {
            c.running.push(Running {
                job: s.job + 10_000,
                alloc: a.clone(),
                end_ms: now + d,
            });
        }
    }
    c.running.sort_by_key(|r| r.job);
    for &e in &step.ends {
        if !c.running.is_empty() {
            let k = e % c.running.len();
            c.running.remove(k);
        }
    }
    if let Some((k, by)) = step.extend
        && !c.running.is_empty()
    {
        let n = c.running.len();
        c.running[k % n].end_ms += by;
    }
    if let Some(r) = step.replace {
        let n = c.nodes.len();
        if let Some(slot) = c.nodes[r % n].slots.first_mut() {
            slot.uuid.push_str("-new");
        }
    }
    if let Some(f) = step.flip {
        let n = c.nodes.len();
        let node = &mut c.nodes[f % n];
        node.eligibility = match node.eligibility {
            Eligibility::Up => Eligibility::Drained,
            _ => Eligibility::Up,
        };
    }
    c
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// Pass after pass, with starts, ends, moved limits, drains and time passing (past
    /// running jobs' expected ends too): the plan from the carried base is the plan of a
    /// fresh build, expected starts and all, under every policy.
    #[test]
    fn base_updates_plan_as_a_fresh_build(
        c in arb_cluster(),
        q in arb_queue(),
        p in arb_policy(),
        backfill in any::<bool>(),
        expected in any::<bool>(),
        steps in prop::collection::vec(arb_step(), 1..6),
    ) {
        let config = SchedConfig { backfill, expected_starts: expected, ..cfg(p) };
        let mut now = 0;
        let mut view = c;
        let mut queue = q;
        // An empty base's first update builds it whole.
        let mut base = Base::default();
        prop_assert!(base.update(view.clone(), now).all || view.nodes.is_empty());
        for step in &steps {
            let fresh = schedule(&view, &queue, &config, now);
            let carried = schedule_from(&base, &queue, &config);
            prop_assert_eq!(&carried, &fresh);
            now += step.dt;
            view = next_view(view, &fresh, &queue, step, now);
            queue.retain(|j| !fresh.starts.iter().any(|s| s.job == j.id));
            let refresh = base.update(view.clone(), now);
            prop_assert!(refresh.nodes <= view.nodes.len());
        }
        prop_assert_eq!(schedule_from(&base, &queue, &config), schedule(&view, &queue, &config, now));
    }
}

/// What `update_touched` is given for `new` after `old`: the jobs whose claims differ
/// and, as a controller's may, some whose claims did not (every third id), with their
/// claims now.
fn touched_between(old: &ClusterView, new: &ClusterView) -> (Vec<u64>, Vec<Running>) {
    let claims = |v: &ClusterView, job: u64| -> Vec<Running> {
        v.running.iter().filter(|r| r.job == job).cloned().collect()
    };
    let mut jobs: Vec<u64> = (old.running.iter().chain(&new.running))
        .map(|r| r.job)
        .collect();
    jobs.sort_unstable();
    jobs.dedup();
    jobs.retain(|&j| j % 3 == 0 || claims(old, j) != claims(new, j));
    let touched_claims = jobs.iter().flat_map(|&j| claims(new, j)).collect();
    (jobs, touched_claims)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// A base brought up to date with what changed (`update_touched`) holds the view
    /// and plans as one given each whole view.
    #[test]
    fn touched_updates_as_a_whole_view(
        c in arb_cluster(),
        q in arb_queue(),
        p in arb_policy(),
        expected in any::<bool>(),
        steps in prop::collection::vec(arb_step(), 1..6),
    ) {
        let config = SchedConfig { expected_starts: expected, ..cfg(p) };
        let mut now = 0;
        let mut view = c;
        let mut queue = q;
        let mut whole = Base::default();
        whole.update(view.clone(), now);
        let mut touched = Base::default();
        let (jobs, claims) = touched_between(&ClusterView::default(), &view);
        touched.update_touched(view.nodes.clone(), &jobs, claims, now);
        for step in &steps {
            let plan = schedule_from(&whole, &queue, &config);
            prop_assert_eq!(&schedule_from(&touched, &queue, &config), &plan);
            now += step.dt;
            let next = next_view(view.clone(), &plan, &queue, step, now);
            queue.retain(|j| !plan.starts.iter().any(|s| s.job == j.id));
            let (jobs, claims) = touched_between(&view, &next);
            let a = whole.update(next.clone(), now);
            let b = touched.update_touched(next.nodes.clone(), &jobs, claims, now);
            prop_assert_eq!(touched.view(), &next);
            prop_assert_eq!(a.all, b.all);
            prop_assert!(b.nodes >= a.nodes || a.all);
            view = next;
        }
        prop_assert_eq!(schedule_from(&touched, &queue, &config), schedule(&view, &queue, &config, now));
    }
}

/// Only the nodes that changed are rebuilt: a start on one node rebuilds that node; a
/// claim reaching its one-second floor rebuilds its node; nothing changed, none.
#[test]
fn an_update_rebuilds_what_changed() {
    let mut c = ClusterView {
        nodes: vec![node("a", 2), node("b", 2), node("c", 2)],
        running: vec![running(1, "a", &[0], 10 * H), running(2, "b", &[1], 2 * H)],
    };
    let mut base = Base::new(c.clone(), 0);
    assert_eq!(
        base.update(c.clone(), 1000),
        Refresh {
            all: false,
            nodes: 0
        }
    );
    c.running.push(running(3, "c", &[0], 5 * H));
    assert_eq!(
        base.update(c.clone(), 2000),
        Refresh {
            all: false,
            nodes: 1
        }
    );
    // Job 2 ends at 2 h: a pass a second before that floors its claim.
    assert_eq!(
        base.update(c.clone(), 2 * H - 500),
        Refresh {
            all: false,
            nodes: 1
        }
    );
    c.nodes.pop();
    assert_eq!(
        base.update(c.clone(), 2 * H),
        Refresh {
            all: true,
            nodes: 2
        }
    );
    // Claims out of job order (held or new) cannot be merged: all are rebuilt.
    c.running.reverse();
    assert!(base.update(c.clone(), 2 * H).all);
    c.running.reverse();
    assert!(
        base.update(c.clone(), 2 * H).all,
        "the held claims were out of order"
    );
    assert!(!base.update(c.clone(), 2 * H).all);
}
