//! What a scheduling pass reads and what it carries to the next (issue 59): a pass at
//! 25,000 nodes and 100,000 pending jobs copied the whole view (every node, 98,000
//! running jobs' claims) and the whole queue under the lock in parts, 90-130 ms of
//! holds, most of it the same as the last pass's.
//!
//! The jobs keep a log of the ids they changed (`Jobs::touched_since` a cursor). A pass
//! carries, beside its base (`sched::Base`, each node's calendar), the queue it planned
//! and the cursor it read from. The next reads every node (a node's view depends on
//! more than its jobs: its session, drain, MIG changes, lent GPUs), then only the jobs
//! touched since that cursor: their claims (`Cluster::running_of`, onto
//! `Base::update_touched`) and their places in the queue (`Cluster::pending_of`),
//! plus the jobs the last pass left out as waiting (their dependencies or partitions,
//! `Waiting`, may let them in now). Cached queue entries get the fair-share factors of
//! this pass's table. Without a cursor that reaches back (the first pass, a restored
//! state, a log that dropped its oldest, a new configuration) the read is whole.
//!
//! The cursor is taken before the pass's start (`Change::Prepare`), so whatever
//! changes during the pass's reads is read again by the next; what a pass reads is the
//! same as a whole read at some instant for every job it did not touch, and each start
//! is checked again against the state as it is when applied.

use gpuctl_core::jobs::JobsCursor;
use gpuctl_core::log::Waiting;
use gpuctl_core::policy::GpuRoom;
use gpuctl_sched as sched;
use gpuctl_sched::fairshare::FairShareTable;
use parking_lot::MutexGuard;
use std::sync::atomic::Ordering;

use super::{Controller, NODE_PART, PART};

/// What a pass starts from, carried from the last: its base, its queue (pending jobs
/// it planned, by id), the jobs it left out as waiting, and the cursor it read from
/// (`None`: nothing yet; the next read is whole).
#[derive(Default)]
pub(super) struct Carried {
    base: sched::Base,
    queue: Vec<sched::PendingJob>,
    /// The fair-share table the queue's factors are from.
    shares: FairShareTable,
    left_out: Vec<u64>,
    cursor: Option<JobsCursor>,
}

/// What a pass read (`Controller::pass_read`).
pub(super) struct PassRead {
    nodes: Vec<sched::NodeView>,
    what: Read,
    /// The jobs this pass leaves out as waiting (dependencies, partitions).
    left_out: Vec<u64>,
    /// Taken before the pass's start: the next pass reads what changed after it.
    cursor: JobsCursor,
}

enum Read {
    /// What runs and the queue, whole (ranked by `shares`).
    Whole {
        running: Vec<sched::Running>,
        queue: Vec<sched::PendingJob>,
        shares: FairShareTable,
    },
    /// The jobs changed since the last read, the last pass's left out and this one's
    /// (in id order): their claims now, and their places in the queue.
    Touched {
        jobs: Vec<u64>,
        claims: Vec<sched::Running>,
        pending: Vec<(u64, Option<sched::PendingJob>)>,
        shares: FairShareTable,
    },
}

/// A pass that planned nothing (its queue was empty): the room it leaves, and whether
/// jobs were left out of its queue (they wait for others or a partition).
pub(super) struct Unplanned {
    room: GpuRoom,
    left_out: bool,
}

impl Controller {
    /// Everything `part` gives, read a part per hold of the lock: `part` answers one
    /// part from where the last left off (`from`) and where the next goes on, if any.
    fn in_parts<T, K>(
        &self,
        inline: bool,
        mut from: K,
        part: impl Fn(&super::Shared, &K) -> (Vec<T>, Option<K>),
    ) -> Vec<T> {
        let mut all = Vec::new();
        loop {
            let (items, next) = self.step(inline, |c| part(c, &from));
            all.extend(items);
            match next {
                Some(n) => from = n,
                None => return all,
            }
        }
    }

    /// What a pass that planned nothing leaves: the room settled (a pass woken if the
    /// room says so).
    pub(super) fn settle_unplanned(&self, u: Unplanned, now: i64, inline: bool) {
        let wake = self.step(inline, |c| self.settle_room(c, u.left_out, u.room, now));
        if wake {
            self.wake_scheduler();
        }
    }

    /// What a pass plans from, after its start (`waiting`: its answer; `cursor`: taken
    /// before it): every node, what runs and the queue (whole, or what changed since the
    /// last pass's read), and the configuration, in short holds of the lock.
    pub(super) fn pass_read(
        &self,
        waiting: &Waiting,
        cursor: JobsCursor,
        now: i64,
        inline: bool,
    ) -> (PassRead, sched::SchedConfig) {
        let (last, mut recheck) = {
            let carried = self.base.lock();
            (carried.cursor, carried.left_out.clone())
        };
        let nodes = self.in_parts(inline, None, |c, after: &Option<String>| {
            let (part, next) = c.node_views_part(after.as_deref(), NODE_PART);
            (part, next.map(Some))
        });
        let (shares, touched) = self.step(inline, |c| {
            let touched = last.and_then(|at| c.jobs().touched_since(at));
            (c.fair_share_table(), touched)
        });
        let left_out: Vec<u64> = waiting.ids.iter().copied().collect();
        let what = match touched {
            Some(jobs) => {
                recheck.extend(&left_out);
                recheck.extend(&jobs);
                recheck.sort_unstable();
                recheck.dedup();
                self.read_touched(jobs, &recheck, waiting, shares, inline)
            }
            None => self.read_whole(waiting, shares, inline),
        };
        let mut cfg = self.step(inline, |c| c.pass_config(now));
        // Every waiting job planned (expected starts) at most every so often; the
        // passes between stop once nothing else can start (the same starts).
        let last = self.planned_all_ms.load(Ordering::Relaxed);
        cfg.expected_starts = now >= self.planned_all_due_ms() || now < last;
        if cfg.expected_starts {
            self.planned_all_ms.store(now, Ordering::Relaxed);
        }
        let read = PassRead {
            nodes,
            what,
            left_out,
            cursor,
        };
        (read, cfg)
    }

    /// The claims of the touched `jobs` and the queue places of `recheck` (they and the
    /// jobs left out, before and now), in parts.
    fn read_touched(
        &self,
        jobs: Vec<u64>,
        recheck: &[u64],
        waiting: &Waiting,
        shares: FairShareTable,
        inline: bool,
    ) -> Read {
        let mut claims = Vec::new();
        for part in jobs.chunks(PART) {
            claims.extend(self.step(inline, |c| c.running_of(part)));
        }
        let mut pending = Vec::with_capacity(recheck.len());
        for part in recheck.chunks(PART) {
            pending.extend(self.step(inline, |c| c.pending_of(part, &shares)));
        }
        for (id, p) in &mut pending {
            // Left out of this pass (`Waiting`: also what was submitted since its start).
            if waiting.contains(*id) {
                *p = None;
            }
        }
        Read::Touched {
            jobs,
            claims,
            pending,
            shares,
        }
    }

    /// What runs and the queue, whole, in parts.
    fn read_whole(&self, waiting: &Waiting, shares: FairShareTable, inline: bool) -> Read {
        let running = self.in_parts(inline, 0, |c, &after| c.running_views_part(after, PART));
        let queue = self.in_parts(inline, 0, |c, &after| {
            c.queue_part(waiting, &shares, after, PART)
        });
        Read::Whole {
            running,
            queue,
            shares,
        }
    }

    /// A pass's plan on what it read at `now`, from what the last pass left (`carry`),
    /// and the room after it; `Unplanned` when its queue is empty. The same plan as `sched::schedule` on the
    /// whole view and queue (sched's `base_updates_plan_as_a_fresh_build`,
    /// `touched_updates_as_a_whole_view`).
    pub(super) fn plan_carried(
        &self,
        read: PassRead,
        cfg: &sched::SchedConfig,
        now: i64,
    ) -> Result<(sched::Plan, GpuRoom), Unplanned> {
        let left_out = !read.left_out.is_empty();
        let carried = self.carry(read, now);
        let base = &carried.base;
        if carried.queue.is_empty() {
            let room = gpuctl_core::policy::room_after(base.view(), None, left_out);
            return Err(Unplanned { room, left_out });
        }
        let plan = sched::schedule_from(base, &carried.queue, cfg);
        self.unplanned_left
            .store(plan.unplanned > 0, Ordering::Relaxed);
        let room =
            gpuctl_core::policy::room_after(base.view(), Some(&plan), !plan.waiting.is_empty());
        Ok((plan, room))
    }

    /// What the last pass left brought to what this one read at `now`: the base (only
    /// the nodes that changed are rebuilt), the queue, the cursor for the next.
    fn carry(&self, read: PassRead, now: i64) -> MutexGuard<'_, Carried> {
        let mut carried = self.base.lock();
        let c = &mut *carried;
        match read.what {
            Read::Whole {
                running,
                queue,
                shares,
            } => {
                let view = sched::ClusterView {
                    nodes: read.nodes,
                    running,
                };
                c.base.update(view, now);
                c.queue = queue;
                c.shares = shares;
            }
            Read::Touched {
                jobs,
                claims,
                pending,
                shares,
            } => {
                c.base.update_touched(read.nodes, &jobs, claims, now);
                requeue(&mut c.queue, pending);
                if !same_factors(&c.shares, &shares) {
                    for p in &mut c.queue {
                        p.fair_share_milli = shares.factor(&p.account, &p.user);
                    }
                }
                c.shares = shares;
            }
        }
        c.left_out = read.left_out;
        c.cursor = Some(read.cursor);
        #[cfg(debug_assertions)]
        self.check_carried(&carried);
        carried
    }

    /// Debug builds: what a pass carried is what a whole read gives, whenever nothing
    /// changed since its cursor (the claims; the queue, its order and factors).
    #[cfg(debug_assertions)]
    fn check_carried(&self, carried: &Carried) {
        let c = self.lock();
        if Some(c.jobs().cursor()) != carried.cursor {
            return;
        }
        assert_eq!(
            carried.base.view().running,
            c.running_views(),
            "the claims a pass carried differ from what runs"
        );
        let shares = c.fair_share_table();
        let all = Waiting {
            ids: Default::default(),
            first_new: u64::MAX,
        };
        let mut queue = c.queue_part(&all, &shares, 0, usize::MAX).0;
        queue.retain(|p| carried.left_out.binary_search(&p.id).is_err());
        assert!(
            carried.queue == queue,
            "the queue a pass carried differs from the pending jobs"
        );
    }
}

/// The last pass's `queue` (by id) with the jobs of `pending` (in id order) put as they
/// are now (`None`: out of the queue). In place when they are few against the queue (a
/// pass's starts and a few submits against 100,000 waiting), else merged.
fn requeue(queue: &mut Vec<sched::PendingJob>, pending: Vec<(u64, Option<sched::PendingJob>)>) {
    if pending.len() * 16 > queue.len() {
        let old = std::mem::take(queue);
        let mut fresh = pending.into_iter().peekable();
        for p in old {
            while let Some((_, new)) = fresh.next_if(|(id, _)| *id < p.id) {
                queue.extend(new);
            }
            match fresh.next_if(|(id, _)| *id == p.id) {
                Some((_, new)) => queue.extend(new),
                None => queue.push(p),
            }
        }
        queue.extend(fresh.flat_map(|(_, new)| new));
        return;
    }
    let (mut gone, mut added) = (Vec::new(), Vec::new());
    for (id, new) in pending {
        match (queue.binary_search_by_key(&id, |p| p.id), new) {
            (Ok(i), Some(p)) => queue[i] = p,
            (Ok(_), None) => gone.push(id),
            (Err(_), Some(p)) => added.push(p),
            (Err(_), None) => {}
        }
    }
    if !gone.is_empty() {
        queue.retain(|p| gone.binary_search(&p.id).is_err());
    }
    let in_order = (queue.last().zip(added.first())).is_none_or(|(a, b)| a.id < b.id);
    queue.extend(added);
    if !in_order {
        queue.sort_by_key(|p| p.id);
    }
}

/// Whether two fair-share tables give every owner the same factor.
fn same_factors(a: &FairShareTable, b: &FairShareTable) -> bool {
    a.rows.len() == b.rows.len()
        && (a.rows.iter().zip(&b.rows)).all(|(x, y)| {
            (x.factor_milli, &x.account, &x.user) == (y.factor_milli, &y.account, &y.user)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, user: &str) -> sched::PendingJob {
        sched::PendingJob {
            id,
            user: user.into(),
            account: "a".into(),
            fair_share_milli: 1000,
            ..sched::PendingJob::default()
        }
    }

    #[test]
    fn a_queue_carried_takes_what_changed_in_place_or_merged() {
        let queue: Vec<_> = (1..=200).map(|id| job(2 * id, "ana")).collect();
        let ids = |q: &[sched::PendingJob]| -> Vec<(u64, String)> {
            q.iter().map(|p| (p.id, p.user.clone())).collect()
        };
        // Few: in place (a start gone, a job changed, one between, two at the end).
        let few = vec![
            (3, Some(job(3, "cy"))),
            (4, None),
            (6, Some(job(6, "bob"))),
            (401, Some(job(401, "bob"))),
            (403, Some(job(403, "bob"))),
        ];
        // Many: merged (every other job gone, the same changes).
        let many: Vec<_> = few
            .iter()
            .cloned()
            .chain((10..=400).step_by(4).map(|id| (id, None)))
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect();
        for (pending, gone) in [(few, vec![4]), (many, vec![4])] {
            let mut expect: Vec<_> = queue.clone();
            let changed: std::collections::BTreeMap<u64, Option<sched::PendingJob>> =
                pending.iter().cloned().collect();
            expect.retain(|p| !changed.contains_key(&p.id));
            expect.extend(changed.values().flatten().cloned());
            expect.sort_by_key(|p| p.id);
            let mut q = queue.clone();
            requeue(&mut q, pending);
            assert_eq!(ids(&q), ids(&expect));
            assert!(gone.iter().all(|g| q.iter().all(|p| p.id != *g)));
        }
    }

    #[test]
    fn factors_are_the_same_when_every_owner_s_is() {
        let row = |user: &str, factor_milli| sched::fairshare::Row {
            account: "a".into(),
            user: user.into(),
            norm_shares: 0.5,
            account_shares: 1.0,
            usage: 0.0,
            effective_usage: 0.0,
            factor_milli,
        };
        let a = FairShareTable {
            rows: vec![row("ana", 250), row("bob", 900)],
        };
        let mut b = a.clone();
        b.rows[0].usage = 3.0;
        assert!(same_factors(&a, &b), "usage moved, factors did not");
        b.rows[1].factor_milli = 899;
        assert!(!same_factors(&a, &b));
        assert!(!same_factors(&a, &FairShareTable::default()));
    }
}
