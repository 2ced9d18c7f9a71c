//! The plan itself: jobs in priority order, each started now if it fits without
//! delaying a reservation (conservative backfill), else given its reservation.

use super::*;

pub(super) fn plan(
    mut pass: Pass<'_>,
    queue: &[PendingJob],
    explain_job: Option<JobId>,
) -> (Plan, Option<Explanation>) {
    let (cluster, config, now) = (pass.cluster, pass.config, pass.now);
    let ranked = priority::rank(queue, &config.weights, now, size_norm(cluster));
    let mut plan = Plan::default();
    let mut explanation = None;
    let mut first_blocked: Option<JobId> = None;
    let mut strict_lb = now;
    let mut reservations = 0usize;
    let shapes: Vec<usize> = ranked.iter().map(|(j, _)| pass.shape(&j.request)).collect();
    // Without expected starts: the first job (from the current rank on) that might still
    // start now. What is free now only shrinks, so this only moves forward.
    let mut may_start_from = 0;
    let mut caps = (!config.caps.is_empty()).then(|| config.caps.clone());
    let mut floors = (!config.floors.is_empty()).then(|| config.floors.clone());
    for (rank, &(job, prio)) in ranked.iter().enumerate() {
        if !config.expected_starts && explain_job.is_none() {
            pass.refresh_max_free();
            may_start_from = may_start_from.max(rank);
            while ranked
                .get(may_start_from)
                .is_some_and(|&(j, _)| !pass.may_start(shapes[may_start_from], j))
            {
                may_start_from += 1;
            }
            let any_start =
                may_start_from < ranked.len() && (config.backfill || first_blocked.is_none());
            if !any_start {
                // Nothing left can start: the rest wait, without reservations.
                plan.waiting
                    .extend(ranked[rank..].iter().map(|(j, _)| Waiting {
                        job: j.id,
                        reason: Blocked::Resources,
                        reservation: None,
                    }));
                plan.unplanned = ranked.len() - rank;
                break;
            }
        }
        let req = &job.request;
        let d = job.duration_ms.max(1000);
        let gang = req.nodes.max(1) as usize;
        let explaining = explain_job == Some(job.id);
        if let Some(reason) = held_back(caps.as_ref(), floors.as_ref(), job, now, d) {
            let waiting = Waiting {
                job: job.id,
                reason,
                reservation: None,
            };
            if explaining {
                // Each node's own answer still (a node that could not take the job
                // must not read as one that could, were it not held back).
                let mut misses = Vec::new();
                let _ = pass.fit_now_all(req, d, gang, &mut misses);
                let out = Err(waiting.clone());
                explanation = Some(explain_of(cluster, job.id, rank, prio, &misses, out));
            }
            plan.waiting.push(waiting);
            continue;
        }
        let may_start = config.backfill || first_blocked.is_none();
        let mut misses: Vec<(usize, Miss)> = Vec::new();
        let shape = shapes[rank];
        let mut reserved_by = None;
        let placed = if may_start || explaining {
            let fits = if explaining {
                let fits = pass.fit_now_all(req, d, gang, &mut misses);
                reserved_by = misses.iter().find_map(|(_, m)| match m {
                    Miss::Reserved { job, .. } => Some(*job),
                    _ => None,
                });
                fits
            } else {
                let (fits, blocker) = pass.fit_now(shape, req, d, gang);
                reserved_by = blocker;
                fits
            };
            (may_start && fits.len() == gang).then_some(fits)
        } else {
            None
        };
        if let Some(fits) = placed {
            let mut allocs = Vec::new();
            for (i, picks) in fits {
                pass.claim(job.id, i, &picks, req, (now, now.saturating_add(d)), false);
                allocs.push(alloc_of(&cluster.nodes[i], &picks, req));
            }
            let start = Start {
                job: job.id,
                allocs,
            };
            if let Some(c) = caps.as_mut() {
                c.add(&job.qos, &job.user, &job.account, limits::norm_milli(req));
                c.add_task(job.array);
            }
            if let Some(f) = floors.as_mut() {
                f.add(job, now, d);
            }
            if explaining {
                let out = Ok(start.clone());
                explanation = Some(explain_of(cluster, job.id, rank, prio, &misses, out));
            }
            plan.starts.push(start);
            continue;
        }

        // Not now: a reservation in the way tells Priority from Resources; reserve its
        // earliest slots.
        let lb = if config.backfill { now } else { strict_lb };
        let within_depth = config.reservation_depth.is_none_or(|d| reservations < d);
        let reservation = if within_depth {
            reserve(&mut pass, cluster, job, shape, lb)
        } else {
            None
        };
        if reservation.is_some() {
            reservations += 1;
        }
        if let Some(r) = &reservation {
            strict_lb = strict_lb.max(r.start);
        }
        let blockers = (first_blocked, reserved_by);
        let reason = blocked_reason(cluster, config, req, &reservation, within_depth, blockers);
        first_blocked.get_or_insert(job.id);
        let waiting = Waiting {
            job: job.id,
            reason,
            reservation,
        };
        if explaining {
            let out = Err(waiting.clone());
            explanation = Some(explain_of(cluster, job.id, rank, prio, &misses, out));
        }
        plan.waiting.push(waiting);
    }
    (plan, explanation)
}

/// A cap (QoS, account, user, array throttle) or an open window's floor that keeps
/// `job` (of time limit `d`) from starting now, whatever is free.
fn held_back(
    caps: Option<&limits::Caps>,
    floors: Option<&floors::Floors>,
    job: &PendingJob,
    now: Millis,
    d: Millis,
) -> Option<Blocked> {
    if let Some(cap) = caps.and_then(|c| c.check(job)) {
        return Some(Blocked::Cap(cap));
    }
    let window = floors?.check(job, now, d)?.to_string();
    Some(Blocked::WindowFloor { window })
}

/// Why a job that does not start now waits: behind the first blocked job (strict
/// order) or the job whose reservation is in the way, for resources, past the
/// reservation depth, or for nodes it cannot use (`unplaceable`). `blockers`: (the
/// first blocked job so far, the job reserved where it would fit).
fn blocked_reason(
    cluster: &ClusterView,
    config: &SchedConfig,
    req: &Request,
    reservation: &Option<Reservation>,
    within_depth: bool,
    blockers: (Option<JobId>, Option<JobId>),
) -> Blocked {
    if reservation.is_some() {
        match blockers {
            (Some(b), _) if !config.backfill => Blocked::Priority { behind: b },
            (_, Some(b)) => Blocked::Priority { behind: b },
            _ => Blocked::Resources,
        }
    } else if !within_depth {
        Blocked::BeyondDepth
    } else {
        unplaceable(cluster, req)
    }
}

/// The earliest reservation for `job` from `lb` on: its slots are claimed for its time
/// limit from then on.
fn reserve(
    pass: &mut Pass<'_>,
    cluster: &ClusterView,
    job: &PendingJob,
    shape: usize,
    lb: Millis,
) -> Option<Reservation> {
    let req = &job.request;
    let d = job.duration_ms.max(1000);
    let gang = req.nodes.max(1) as usize;
    if gang == 1 {
        return pass
            .reserve_one(job.id, shape, req, lb, d)
            .map(|(t, i, picks)| Reservation {
                start: t,
                allocs: vec![alloc_of(&cluster.nodes[i], &picks, req)],
            });
    }
    pass.earliest_gang(req, gang, lb).map(|(t, picks)| {
        let mut allocs = Vec::new();
        for (i, p) in picks {
            pass.claim(job.id, i, &p, req, (t, t.saturating_add(d)), true);
            allocs.push(alloc_of(&cluster.nodes[i], &p, req));
        }
        Reservation { start: t, allocs }
    })
}

/// Why a job that gets no reservation cannot be placed: it would fit nodes that are
/// down or drained (or enough nodes for its gang), or no node could ever run it.
fn unplaceable(cluster: &ClusterView, req: &Request) -> Blocked {
    let gang = req.nodes.max(1) as usize;
    if cluster
        .nodes
        .iter()
        .any(|n| n.eligibility != Eligibility::Up && fits_empty(n, req))
        || (gang > 1 && cluster.nodes.iter().filter(|n| fits_empty(n, req)).count() >= gang)
    {
        Blocked::NodesUnavailable
    } else {
        Blocked::Infeasible
    }
}

fn explain_of(
    cluster: &ClusterView,
    job: JobId,
    rank: usize,
    priority: i64,
    misses: &[(usize, Miss)],
    outcome: Result<Start, Waiting>,
) -> Explanation {
    let nodes = cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                n.name.clone(),
                misses.iter().find(|(j, _)| *j == i).map(|(_, m)| m.clone()),
            )
        })
        .collect();
    Explanation {
        job,
        rank,
        priority,
        nodes,
        outcome,
    }
}
