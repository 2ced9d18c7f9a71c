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
    /// What runs and the queue, whole.
    Whole {
        running: Vec<sched::Running>,
        queue: Vec<sched::PendingJob>,
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

impl Controller {
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
        let mut nodes = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let (part, next) =
                self.step(inline, |c| c.node_views_part(after.as_deref(), NODE_PART));
            nodes.extend(part);
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
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
            None => self.read_whole(waiting, &shares, inline),
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
    fn read_whole(&self, waiting: &Waiting, shares: &FairShareTable, inline: bool) -> Read {
        let mut running = Vec::new();
        let mut after = 0;
        loop {
            let (part, next) = self.step(inline, |c| c.running_views_part(after, PART));
            running.extend(part);
            match next {
                Some(n) => after = n,
                None => break,
            }
        }
        let mut queue = Vec::new();
        let mut after = 0;
        loop {
            let (part, next) = self.step(inline, |c| c.queue_part(waiting, shares, after, PART));
            queue.extend(part);
            match next {
                Some(n) => after = n,
                None => break,
            }
        }
        Read::Whole { running, queue }
    }

    /// A pass's plan on what it read at `now`, from what the last pass left (`carry`),
    /// and the room after it; `None` when its queue is empty (then the room of nothing
    /// planned, `left_out`: jobs still wait). The same plan as `sched::schedule` on the
    /// whole view and queue (sched's `base_updates_plan_as_a_fresh_build`,
    /// `touched_updates_as_a_whole_view`).
    pub(super) fn plan_carried(
        &self,
        read: PassRead,
        cfg: &sched::SchedConfig,
        now: i64,
    ) -> Result<(sched::Plan, GpuRoom), GpuRoom> {
        let left_out = !read.left_out.is_empty();
        let carried = self.carry(read, now);
        let base = &carried.base;
        if carried.queue.is_empty() {
            return Err(gpuctl_core::policy::room_after(base.view(), None, left_out));
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
            Read::Whole { running, queue } => {
                let view = sched::ClusterView {
                    nodes: read.nodes,
                    running,
                };
                c.base.update(view, now);
                c.queue = queue;
            }
            Read::Touched {
                jobs,
                claims,
                pending,
                shares,
            } => {
                c.base.update_touched(read.nodes, &jobs, claims, now);
                c.queue = requeued(std::mem::take(&mut c.queue), pending, &shares);
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

/// The last pass's `queue` with the jobs of `pending` (in id order) replaced by what
/// they are now (`None`: out of the queue), every other job's fair-share factor from
/// this pass's `shares`.
fn requeued(
    queue: Vec<sched::PendingJob>,
    pending: Vec<(u64, Option<sched::PendingJob>)>,
    shares: &FairShareTable,
) -> Vec<sched::PendingJob> {
    let mut out = Vec::with_capacity(queue.len() + pending.len());
    let mut fresh = pending.into_iter().peekable();
    for mut p in queue {
        while let Some((_, new)) = fresh.next_if(|(id, _)| *id < p.id) {
            out.extend(new);
        }
        if let Some((_, new)) = fresh.next_if(|(id, _)| *id == p.id) {
            out.extend(new);
            continue;
        }
        p.fair_share_milli = shares.factor(&p.account, &p.user);
        out.push(p);
    }
    out.extend(fresh.flat_map(|(_, new)| new));
    out
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
    fn a_queue_carried_takes_what_changed_and_the_factors_of_now() {
        let queue = vec![job(2, "ana"), job(4, "bob"), job(6, "ana")];
        let pending = vec![
            (1, Some(job(1, "bob"))),
            (4, None),
            (6, Some(job(6, "cy"))),
            (9, Some(job(9, "ana"))),
        ];
        let shares = FairShareTable {
            rows: vec![sched::fairshare::Row {
                account: "a".into(),
                user: "ana".into(),
                norm_shares: 0.5,
                account_shares: 1.0,
                usage: 0.0,
                effective_usage: 0.0,
                factor_milli: 250,
            }],
        };
        let out = requeued(queue, pending, &shares);
        let ids: Vec<(u64, &str, u32)> = (out.iter())
            .map(|p| (p.id, p.user.as_str(), p.fair_share_milli))
            .collect();
        // 1 and 9 came, 4 went, 6 as it is now (its factor as read), 2's factor anew.
        assert_eq!(
            ids,
            [
                (1, "bob", 1000),
                (2, "ana", 250),
                (6, "cy", 1000),
                (9, "ana", 1000)
            ]
        );
    }
}
