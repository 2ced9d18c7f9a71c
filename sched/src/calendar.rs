//! Per-node calendars: who holds (or has reserved) which slot when, and the two questions
//! the planner asks of them: does a request fit in a time window (`fit`), and from when
//! on does it fit for good (`tail`).
//!
//! Claims of running jobs last from now to their expected end. Reservations are claims in
//! the future. A job that starts now must fit around every claim, reservations
//! included: that is what makes backfill unable to delay a reservation.

use super::model::*;
use super::packing::{FragMemo, Policy};
use smallvec::SmallVec;

/// (slot, free compute milli) per non-MIG GPU of a node: on the stack for up to 8 GPUs.
pub type GpuFree = SmallVec<[(usize, u32); 8]>;

/// The slots a job would take on one node: nearly always one or two.
pub type Picks = SmallVec<[Pick; 2]>;

/// A reservation on a slot or a host: (start, job, end). Kept sorted, so the first that
/// meets a window is the one a miss names.
type Res = (Millis, JobId, Millis);

/// The first reservation in `res` (sorted) that meets [a, b): (job, start).
fn first_reserved(res: &[Res], a: Millis, b: Millis) -> Option<(JobId, Millis)> {
    res.iter()
        .take_while(|r| r.0 < b)
        .find(|r| overlaps(r.0, r.2, a, b))
        .map(|r| (r.1, r.0))
}

fn insert_sorted(res: &mut Vec<Res>, r: Res) {
    let k = res.partition_point(|&x| x < r);
    res.insert(k, r);
}

/// What a job would take on one slot of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    pub slot: usize,
    pub compute: u32,
    pub mem_mib: u64,
}

/// Why a request does not fit a node in a window. Typed, so that `explain` and the
/// REASON column come straight from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// The node is not in the job's partition.
    Partition {
        name: String,
    },
    /// The job's node list leaves the node out (`nodelist`, `exclude`).
    NotListed,
    /// The node lacks the features the job's constraint asks for.
    Features,
    Drained,
    Down,
    /// No GPU of an allowed model (or no GPU at all) on the node.
    GpuModel {
        want: Vec<String>,
    },
    /// The node can never hold the request, even empty.
    TooSmall {
        what: &'static str,
    },
    NoMigProfile {
        profile: String,
    },
    Gpus {
        need: u32,
        free: u32,
    },
    Mig {
        profile: String,
        need: u32,
        free: u32,
    },
    GpuShare {
        need_milli: u32,
        need_mib: u64,
        best_free_milli: u32,
        best_free_mib: u64,
    },
    Cpus {
        need: u32,
        free: u32,
    },
    Memory {
        need: u64,
        free: u64,
    },
    /// It would fit now, but slots it needs are reserved for a higher-priority job.
    Reserved {
        job: JobId,
        from: Millis,
    },
}

/// Usage over time as a step function: point `i` (`t`, `c`, `m`) means usage (c, m) from
/// t until the next point; usage is 0 before the first point and after the last (which
/// always has usage 0). Each point also holds the suffix maxima from it on (`sc`, `sm`:
/// the highest c and m from it on, each on its own), kept up to date on every claim, so
/// peaks need no sorting and tails are a binary search. One vector: a claim makes one
/// allocation and moves one array.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pts: Vec<Point>,
}

#[derive(Debug, Clone, Copy)]
struct Point {
    t: Millis,
    c: i64,
    m: i64,
    sc: i64,
    sm: i64,
}

impl Profile {
    fn split_at(&mut self, t: Millis) -> usize {
        match self.pts.binary_search_by_key(&t, |p| p.t) {
            Ok(i) => i,
            Err(i) => {
                if self.pts.capacity() == 0 {
                    // Nearly every profile that is used at all gets a few claims.
                    self.pts.reserve(8);
                }
                let (c, m) = if i == 0 {
                    (0, 0)
                } else {
                    (self.pts[i - 1].c, self.pts[i - 1].m)
                };
                let p = Point {
                    t,
                    c,
                    m,
                    sc: 0,
                    sm: 0,
                };
                self.pts.insert(i, p);
                i
            }
        }
    }

    pub fn add(&mut self, a: Millis, b: Millis, c: i64, m: i64) {
        if a >= b {
            return;
        }
        let i = self.split_at(a);
        let j = self.split_at(b);
        // One walk back from `j`: the use in [i, j) grows and the suffix maxima follow.
        // After `j` they are unchanged (point `j` itself may be new). Before `i` the points
        // are as they were, so once a maximum comes out as it was, so do all earlier ones.
        let mut acc = self.pts.get(j + 1).map_or((0, 0), |q| (q.sc, q.sm));
        let pj = &mut self.pts[j];
        acc = (acc.0.max(pj.c), acc.1.max(pj.m));
        (pj.sc, pj.sm) = acc;
        for p in self.pts[i..j].iter_mut().rev() {
            p.c += c;
            p.m += m;
            acc = (acc.0.max(p.c), acc.1.max(p.m));
            (p.sc, p.sm) = acc;
        }
        for p in self.pts[..i].iter_mut().rev() {
            acc = (acc.0.max(p.c), acc.1.max(p.m));
            if (p.sc, p.sm) == acc {
                break;
            }
            (p.sc, p.sm) = acc;
        }
    }

    /// Usage at instant t.
    pub fn at(&self, t: Millis) -> (i64, i64) {
        match self.pts.partition_point(|p| p.t <= t) {
            0 => (0, 0),
            k => (self.pts[k - 1].c, self.pts[k - 1].m),
        }
    }

    /// No use at all over [a, b)? (Stops at the first use.)
    pub fn idle(&self, a: Millis, b: Millis) -> bool {
        let start = self.pts.partition_point(|p| p.t <= a).saturating_sub(1);
        for (k, p) in self.pts[start..].iter().enumerate() {
            if p.t >= b {
                break;
            }
            let next = self.pts.get(start + k + 1).map_or(Millis::MAX, |q| q.t);
            if next > a && (p.c != 0 || p.m != 0) {
                return false;
            }
        }
        true
    }

    /// Peak usage over [a, b).
    pub fn peak(&self, a: Millis, b: Millis) -> (i64, i64) {
        let start = self.pts.partition_point(|p| p.t <= a).saturating_sub(1);
        let (mut pc, mut pm) = (0, 0);
        for (k, p) in self.pts[start..].iter().enumerate() {
            if p.t >= b {
                break;
            }
            let next = self.pts.get(start + k + 1).map_or(Millis::MAX, |q| q.t);
            if next <= a {
                continue;
            }
            pc = pc.max(p.c);
            pm = pm.max(p.m);
        }
        (pc, pm)
    }

    /// Earliest T >= lb from which usage + need stays within cap for good.
    pub fn tail(&self, lb: Millis, need: (i64, i64), cap: (i64, i64)) -> Millis {
        let top = self.top();
        if top.0 + need.0 <= cap.0 && top.1 + need.1 <= cap.1 {
            return lb;
        }
        // Points whose usage does not leave room form a prefix of the suffix maxima.
        let over_c = self.pts.partition_point(|p| p.sc + need.0 > cap.0);
        let over_m = self.pts.partition_point(|p| p.sm + need.1 > cap.1);
        match over_c.max(over_m) {
            0 => lb,
            k => self.pts.get(k).map_or(self.pts[k - 1].t, |q| q.t).max(lb),
        }
    }

    /// When the last use ends (`lb` if none after it).
    pub fn last_end(&self, lb: Millis) -> Millis {
        self.pts.last().map_or(lb, |p| p.t).max(lb)
    }

    /// The highest (c, m) use over all time (each on its own).
    fn top(&self) -> (i64, i64) {
        self.pts.first().map_or((0, 0), |p| (p.sc, p.sm))
    }
}

/// What the tail searches need to know of a slot's profile, most of the time.
#[derive(Debug, Clone, Copy)]
struct SlotSummary {
    /// When its last use ends.
    last_end: Millis,
    /// Its highest and lowest (compute, memory) use before `last_end` (each on its own).
    max: (i64, i64),
    min: (i64, i64),
}

impl Default for SlotSummary {
    fn default() -> Self {
        SlotSummary {
            last_end: Millis::MIN,
            max: (0, 0),
            min: (0, 0),
        }
    }
}

impl SlotSummary {
    fn of(p: &Profile) -> SlotSummary {
        let Some((_, used)) = p.pts.split_last() else {
            return SlotSummary::default();
        };
        let min = used
            .iter()
            .fold((i64::MAX, i64::MAX), |a, q| (a.0.min(q.c), a.1.min(q.m)));
        SlotSummary {
            last_end: p.last_end(Millis::MIN),
            max: p.top(),
            min: if used.is_empty() { (0, 0) } else { min },
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Calendar {
    /// Usage profiles (with reservations) per slot and for the host's CPU/memory.
    pub slot_prof: Vec<Profile>,
    /// Per slot, kept next to each other for the tail searches (see `slot_tail`).
    slot_sum: Vec<SlotSummary>,
    pub host_prof: Profile,
    /// The same for held claims alone (no reservations): what a window would meet if
    /// every reservation moved away, which tells "reserved" from "busy" misses.
    slot_held: Vec<Profile>,
    host_held: Profile,
    /// Per slot, its reservations (sorted).
    slot_res: Vec<Vec<Res>>,
    /// Bumped on every change; cached answers about this node are stale when it moves.
    pub version: u64,
    /// Bumped on every claim that is not a reservation (what is held from now on).
    /// With `reservations_before`, it tells whether a window starting now has changed.
    pub held_version: u64,
    /// Free resources at `now`, ignoring reservations: a quick upper bound for `fit`.
    pub free_now: FreeNow,
    /// Per slot (free compute milli, free memory MiB) at `now`, ignoring reservations.
    pub slot_free_now: Vec<(u32, u64)>,
    /// Start times of the reservations here, sorted. A window sees only the
    /// reservations that start before it ends, so `fit` over [now, b) gives the same
    /// answer for every b with the same count of starts before it (and the same
    /// `held_version`): the planner caches on that. A window that meets none sees only
    /// running jobs, whose usage never grows after `now`, so the `slot_free_now`
    /// snapshot answers `fit` exactly (the fast path).
    pub res_starts: Vec<Millis>,
    /// The reservations that take CPUs or memory here (sorted).
    host_res: Vec<Res>,
    pub now: Millis,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FreeNow {
    pub whole: u32,
    pub max_share_milli: u32,
    pub mig: u32,
    pub cpu_milli: u32,
    pub mem: u64,
}

fn overlaps(s: Millis, e: Millis, a: Millis, b: Millis) -> bool {
    s < b && a < e
}

impl Calendar {
    /// Free (CPU milli, memory bytes) now, ignoring reservations.
    pub fn host_free_now(&self) -> (u32, u64) {
        (self.free_now.cpu_milli, self.free_now.mem)
    }

    pub fn new(node: &NodeView) -> Calendar {
        Calendar {
            slot_res: vec![Vec::new(); node.slots.len()],
            slot_prof: vec![Profile::default(); node.slots.len()],
            slot_held: vec![Profile::default(); node.slots.len()],
            slot_sum: vec![SlotSummary::default(); node.slots.len()],
            now: Millis::MIN,
            ..Calendar::default()
        }
    }

    pub fn add(
        &mut self,
        job: JobId,
        picks: &[Pick],
        cpu_milli: u32,
        mem: u64,
        (a, b): (Millis, Millis),
        reserved: bool,
    ) {
        for p in picks {
            // A claim of nothing at all (only malformed input has one) still takes the
            // slot: it counts as one milli, so that "no use" means "no claim".
            let c = if p.compute == 0 && p.mem_mib == 0 {
                1
            } else {
                i64::from(p.compute)
            };
            let prof = &mut self.slot_prof[p.slot];
            prof.add(a, b, c, p.mem_mib as i64);
            self.slot_sum[p.slot] = SlotSummary::of(prof);
            if reserved {
                insert_sorted(&mut self.slot_res[p.slot], (a, job, b));
            } else {
                self.slot_held[p.slot].add(a, b, c, p.mem_mib as i64);
            }
        }
        if reserved {
            let k = self.res_starts.partition_point(|&t| t <= a);
            self.res_starts.insert(k, a);
        }
        if cpu_milli > 0 || mem > 0 {
            if reserved {
                insert_sorted(&mut self.host_res, (a, job, b));
            }
            self.host_prof.add(a, b, i64::from(cpu_milli), mem as i64);
            if !reserved {
                self.host_held.add(a, b, i64::from(cpu_milli), mem as i64);
            }
        }
        self.version += 1;
        if !reserved {
            self.held_version += 1;
        }
    }

    /// Peak (compute milli, memory MiB) over [a, b) on slot `i`, reservations included.
    fn slot_peak(&self, i: usize, a: Millis, b: Millis) -> (u32, u64) {
        let (c, m) = self.slot_prof[i].peak(a, b);
        (c as u32, m as u64)
    }

    /// Does the window [a, b) start now and meet no reservation? Then only running jobs
    /// are in it, whose use never grows after `now`: the snapshot at `now` is its peak.
    fn meets_no_reservation(&self, a: Millis, b: Millis) -> bool {
        a == self.now && b <= self.reserved_from()
    }

    /// What held claims use of slot `i` at `now` (from the snapshot).
    fn held_now(&self, slot: &SlotView, i: usize) -> (u32, u64) {
        let (c, m) = self.slot_free_now[i];
        (GPU_MILLI - c, slot.memory_mib.saturating_sub(m))
    }

    /// Peak held use of slot `i` over [a, b): the snapshot for a window from `now` (held
    /// claims start at or before it, so their use only falls after it).
    fn held_peak(&self, slot: &SlotView, i: usize, a: Millis, b: Millis) -> (u32, u64) {
        if a == self.now {
            self.held_now(slot, i)
        } else {
            let (c, m) = self.slot_held[i].peak(a, b);
            (c as u32, m as u64)
        }
    }

    /// `slot_peak`, from the snapshot when the window meets no reservation.
    fn slot_use(&self, slot: &SlotView, i: usize, a: Millis, b: Millis) -> (u32, u64) {
        if self.meets_no_reservation(a, b) {
            self.held_now(slot, i)
        } else {
            self.slot_peak(i, a, b)
        }
    }

    /// Peak (CPU milli, memory bytes) over [a, b) on the host, reservations included.
    fn host_peak(&self, a: Millis, b: Millis) -> (u32, u64) {
        let (c, m) = self.host_prof.peak(a, b);
        (c as u32, m as u64)
    }

    /// Earliest T >= lb from which a share of (compute, memory) fits slot `i` for good.
    /// The summary answers the common cases (room at all times; no room at any time
    /// before the last use ends) without reading the profile.
    fn slot_tail(&self, i: usize, slot: &SlotView, (c, m): (u32, u64), lb: Millis) -> Millis {
        let need = (i64::from(c), m as i64);
        let cap = (i64::from(GPU_MILLI), slot.memory_mib as i64);
        let sum = &self.slot_sum[i];
        let room = |u: (i64, i64)| u.0 + need.0 <= cap.0 && u.1 + need.1 <= cap.1;
        if room(sum.max) {
            lb
        } else if !room(sum.min) {
            sum.last_end.max(lb)
        } else {
            self.slot_prof[i].tail(lb, need, cap)
        }
    }

    /// Earliest T >= lb from which the host has room for `req`'s CPUs and memory for good.
    fn host_tail(&self, node: &NodeView, req: &Request, lb: Millis) -> Millis {
        if req.cpu_milli == 0 && req.memory_bytes == 0 {
            return lb;
        }
        self.host_prof.tail(
            lb,
            (i64::from(req.cpu_milli), req.memory_bytes as i64),
            (i64::from(node.cpu_milli), node.memory_bytes as i64),
        )
    }

    /// Earliest start of any reservation here (`Millis::MAX`: none).
    pub fn reserved_from(&self) -> Millis {
        self.res_starts.first().copied().unwrap_or(Millis::MAX)
    }

    /// How many reservations start before `b` (those a window ending at `b` meets), and
    /// the window ends that meet the same ones: (lo, hi].
    pub fn reservations_before(&self, b: Millis) -> (usize, (Millis, Millis)) {
        let k = self.res_starts.partition_point(|&t| t < b);
        let lo = k.checked_sub(1).map_or(Millis::MIN, |j| self.res_starts[j]);
        let hi = self.res_starts.get(k).copied().unwrap_or(Millis::MAX);
        (k, (lo, hi))
    }

    pub fn refresh_free_now(&mut self, node: &NodeView, now: Millis) {
        // What running jobs hold at `now` (reservations are not running).
        let mut f = FreeNow::default();
        self.now = now;
        self.slot_free_now.clear();
        for (s, held) in node.slots.iter().zip(&self.slot_held) {
            let (c, m) = held.at(now);
            let (c, m) = (c as u32, m as u64);
            self.slot_free_now
                .push((GPU_MILLI.saturating_sub(c), s.memory_mib.saturating_sub(m)));
            if s.is_mig() {
                f.mig += u32::from(c == 0);
            } else {
                f.whole += u32::from(c == 0 && m == 0);
                if m < s.memory_mib {
                    f.max_share_milli = f.max_share_milli.max(GPU_MILLI.saturating_sub(c));
                }
            }
        }
        let (c, m) = self.host_held.at(now);
        let (c, m) = (c as u32, m as u64);
        f.cpu_milli = node.cpu_milli.saturating_sub(c);
        f.mem = node.memory_bytes.saturating_sub(m);
        self.free_now = f;
    }

    /// Free compute milli per non-MIG GPU at `at`, with reservations (for packing scores).
    pub fn gpu_free_milli(&self, node: &NodeView, at: Millis) -> GpuFree {
        if at == self.now && at < self.reserved_from() {
            return node
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.is_mig())
                .map(|(i, _)| (i, self.slot_free_now[i].0))
                .collect();
        }
        node.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_mig())
            .map(|(i, _)| (i, GPU_MILLI.saturating_sub(self.slot_peak(i, at, at + 1).0)))
            .collect()
    }

    /// Does `req` fit on `node` over [a, b)? Returns the slots it would take.
    pub fn fit(
        &self,
        node: &NodeView,
        req: &Request,
        a: Millis,
        b: Millis,
        policy: Policy,
        frag: &FragMemo<'_>,
    ) -> Result<Picks, Miss> {
        if !node.listed(req) {
            return Err(Miss::NotListed);
        }
        if !node.has_features(req) {
            return Err(Miss::Features);
        }
        if !node.admits(req) {
            return Err(Miss::Partition {
                name: req.partition.clone().unwrap_or_default(),
            });
        }
        match node.eligibility {
            Eligibility::Drained => return Err(Miss::Drained),
            Eligibility::Down => return Err(Miss::Down),
            Eligibility::Up => {}
        }
        if node.cpu_milli < req.cpu_milli {
            return Err(Miss::TooSmall { what: "CPUs" });
        }
        if node.memory_bytes < req.memory_bytes {
            return Err(Miss::TooSmall { what: "memory" });
        }
        if self.meets_no_reservation(a, b)
            && let Some(picks) = self.fit_fast(node, req, policy)
        {
            return Ok(picks);
        }
        // A reservation in the way is the reason only if the job would fit without
        // any: GPUs, CPUs and memory.
        let gpus = self.fit_gpus(node, req, a, b, policy, frag);
        if matches!(gpus, Err(ref m) if !matches!(m, Miss::Reserved { .. })) {
            return gpus;
        }
        if req.cpu_milli == 0 && req.memory_bytes == 0 {
            return gpus;
        }
        let (c, m) = self.host_peak(a, b);
        let host_ok =
            c + req.cpu_milli <= node.cpu_milli && m + req.memory_bytes <= node.memory_bytes;
        if host_ok && gpus.is_ok() {
            return gpus;
        }
        let (c0, m0) = self.host_held.peak(a, b);
        let (c0, m0) = (c0 as u32, m0 as u64);
        if c0 + req.cpu_milli > node.cpu_milli {
            return Err(Miss::Cpus {
                need: req.cpu_milli,
                free: node.cpu_milli.saturating_sub(c0),
            });
        }
        if m0 + req.memory_bytes > node.memory_bytes {
            return Err(Miss::Memory {
                need: req.memory_bytes,
                free: node.memory_bytes.saturating_sub(m0),
            });
        }
        if host_ok {
            return gpus;
        }
        let (job, from) = first_reserved(&self.host_res, a, b).unwrap_or((0, a));
        match gpus {
            // Both are in the way; the GPUs' reservation is named.
            Err(m) => Err(m),
            Ok(_) => Err(Miss::Reserved { job, from }),
        }
    }

    /// `fit` from the snapshot at `now`, for windows that meet no reservation. `None`
    /// means "does not fit" (the slow path then says why). FGD's choice of GPU for a
    /// share is left to the slow path, which scores candidates.
    fn fit_fast(&self, node: &NodeView, req: &Request, policy: Policy) -> Option<Picks> {
        let f = &self.free_now;
        if f.cpu_milli < req.cpu_milli || f.mem < req.memory_bytes {
            return None;
        }
        let exclusive = |count: u32, kind: &dyn Fn(&SlotView) -> bool| -> Option<Picks> {
            let mut picks = Picks::with_capacity(count as usize);
            for ((i, s), &(c, m)) in node.slots.iter().enumerate().zip(&self.slot_free_now) {
                if picks.len() as u32 == count {
                    break;
                }
                // The cheap test first: most slots of a busy node are taken.
                if c == GPU_MILLI && m == s.memory_mib && kind(s) && req.model_ok(&s.model) {
                    picks.push(Pick {
                        slot: i,
                        compute: GPU_MILLI,
                        mem_mib: s.memory_mib,
                    });
                }
            }
            (picks.len() as u32 == count).then_some(picks)
        };
        match &req.gpu {
            GpuRequest::None => Some(Picks::new()),
            GpuRequest::Whole { count } => {
                if f.whole < *count {
                    return None;
                }
                exclusive(*count, &|s| !s.is_mig())
            }
            GpuRequest::Mig { profile, count } => {
                if f.mig < *count {
                    return None;
                }
                exclusive(*count, &|s| s.is_profile(profile))
            }
            GpuRequest::Share { .. } => {
                if policy == Policy::Fgd {
                    return None;
                }
                let mut best: Option<(u32, usize, Pick)> = None;
                for (i, s) in node.slots.iter().enumerate() {
                    if s.is_mig() || !req.model_ok(&s.model) {
                        continue;
                    }
                    let Some((c, m)) = req.share_on(s) else {
                        continue;
                    };
                    let (fc, fm) = self.slot_free_now[i];
                    if c > fc || m > fm {
                        continue;
                    }
                    let p = Pick {
                        slot: i,
                        compute: c,
                        mem_mib: m,
                    };
                    if policy == Policy::FirstFit {
                        return Some(smallvec::smallvec![p]);
                    }
                    let left = fc - c;
                    if best.is_none_or(|b| (left, i) < (b.0, b.1)) {
                        best = Some((left, i, p));
                    }
                }
                best.map(|b| smallvec::smallvec![b.2])
            }
        }
    }

    fn fit_gpus(
        &self,
        node: &NodeView,
        req: &Request,
        a: Millis,
        b: Millis,
        policy: Policy,
        frag: &FragMemo<'_>,
    ) -> Result<Picks, Miss> {
        match &req.gpu {
            GpuRequest::None => Ok(Picks::new()),
            GpuRequest::Whole { count } => self
                .fit_exclusive(node, req, a, b, *count, |s| !s.is_mig())
                .map_err(|(usable, free, reserved)| {
                    if usable == 0 {
                        Miss::GpuModel {
                            want: req.models.clone(),
                        }
                    } else if usable < *count {
                        Miss::TooSmall { what: "GPUs" }
                    } else if let Some((job, from)) = reserved {
                        Miss::Reserved { job, from }
                    } else {
                        Miss::Gpus { need: *count, free }
                    }
                }),
            GpuRequest::Mig { profile, count } => self
                .fit_exclusive(node, req, a, b, *count, |s| s.is_profile(profile))
                .map_err(|(usable, free, reserved)| {
                    if usable == 0 {
                        Miss::NoMigProfile {
                            profile: profile.clone(),
                        }
                    } else if usable < *count {
                        Miss::TooSmall {
                            what: "MIG instances",
                        }
                    } else if let Some((job, from)) = reserved {
                        Miss::Reserved { job, from }
                    } else {
                        Miss::Mig {
                            profile: profile.clone(),
                            need: *count,
                            free,
                        }
                    }
                }),
            GpuRequest::Share { .. } => self.fit_share(node, req, a, b, policy, frag),
        }
    }

    /// Whole GPUs or MIG instances: slots with no claim at all in the window.
    /// On failure: (usable slots, free slots, a reservation that blocks).
    #[allow(clippy::type_complexity)]
    fn fit_exclusive(
        &self,
        node: &NodeView,
        req: &Request,
        a: Millis,
        b: Millis,
        count: u32,
        kind: impl Fn(&SlotView) -> bool,
    ) -> Result<Picks, (u32, u32, Option<(JobId, Millis)>)> {
        let mut picks = Picks::new();
        let (mut usable, mut reserved_only) = (0u32, 0u32);
        let mut blocker = None;
        for (i, s) in node.slots.iter().enumerate() {
            if !kind(s) || !req.model_ok(&s.model) {
                continue;
            }
            usable += 1;
            // Free in the window: its last use ends before it, or no use in it.
            let idle = if self.meets_no_reservation(a, b) {
                self.slot_free_now[i] == (GPU_MILLI, s.memory_mib)
            } else {
                self.slot_sum[i].last_end <= a || self.slot_prof[i].idle(a, b)
            };
            if idle {
                if (picks.len() as u32) < count {
                    picks.push(Pick {
                        slot: i,
                        compute: GPU_MILLI,
                        mem_mib: s.memory_mib,
                    });
                }
            } else if self.held_peak(s, i, a, b) == (0, 0) {
                reserved_only += 1;
                let r = first_reserved(&self.slot_res[i], a, b);
                if blocker.is_none() || r.map(|x| x.1) < blocker.map(|x: (JobId, Millis)| x.1) {
                    blocker = r;
                }
            }
        }
        if picks.len() as u32 == count {
            return Ok(picks);
        }
        let free = picks.len() as u32;
        let reserved = (free + reserved_only >= count).then_some(blocker).flatten();
        Err((usable, free, reserved))
    }

    fn fit_share(
        &self,
        node: &NodeView,
        req: &Request,
        a: Millis,
        b: Millis,
        policy: Policy,
        frag: &FragMemo<'_>,
    ) -> Result<Picks, Miss> {
        let mut candidates: SmallVec<[Pick; 8]> = SmallVec::new();
        let (mut usable, mut best_free) = (0u32, (0u32, 0u64));
        let mut blocker: Option<(JobId, Millis)> = None;
        let mut need_shown = (0u32, 0u64);
        for (i, s) in node.slots.iter().enumerate() {
            if s.is_mig() || !req.model_ok(&s.model) {
                continue;
            }
            let Some((c, m)) = req.share_on(s) else {
                continue;
            };
            usable += 1;
            need_shown = (c, m);
            let (uc, um) = self.slot_use(s, i, a, b);
            if uc + c <= GPU_MILLI && um + m <= s.memory_mib {
                candidates.push(Pick {
                    slot: i,
                    compute: c,
                    mem_mib: m,
                });
                continue;
            }
            let (rc, rm) = self.held_peak(s, i, a, b);
            let free = (
                GPU_MILLI.saturating_sub(rc),
                s.memory_mib.saturating_sub(rm),
            );
            if free.0 > best_free.0 {
                best_free = free;
            }
            if rc + c <= GPU_MILLI && rm + m <= s.memory_mib && blocker.is_none() {
                blocker = first_reserved(&self.slot_res[i], a, b);
            }
        }
        if candidates.is_empty() {
            return Err(if usable == 0 {
                if node
                    .slots
                    .iter()
                    .any(|s| !s.is_mig() && req.model_ok(&s.model))
                {
                    Miss::TooSmall { what: "GPU memory" }
                } else {
                    Miss::GpuModel {
                        want: req.models.clone(),
                    }
                }
            } else if let Some((job, from)) = blocker {
                Miss::Reserved { job, from }
            } else {
                Miss::GpuShare {
                    need_milli: need_shown.0,
                    need_mib: need_shown.1,
                    best_free_milli: best_free.0,
                    best_free_mib: best_free.1,
                }
            });
        }
        let pick = match policy {
            Policy::FirstFit => candidates[0],
            Policy::BestFit => *candidates
                .iter()
                .min_by_key(|p| {
                    (
                        GPU_MILLI - self.slot_use(&node.slots[p.slot], p.slot, a, b).0 - p.compute,
                        p.slot,
                    )
                })
                .expect("non-empty"),
            Policy::Fgd => {
                let mut free = self.gpu_free_milli(node, a);
                let (cpus_free, mem_free) = if self.meets_no_reservation(a, b) {
                    self.host_free_now()
                } else {
                    let (c, m) = self.host_peak(a, b);
                    (
                        node.cpu_milli.saturating_sub(c),
                        node.memory_bytes.saturating_sub(m),
                    )
                };
                let host_after = super::packing::host_left((cpus_free, mem_free), req);
                // Fragmentation after each candidate (the "before" is the same for all).
                let mut best: Option<(f64, Pick)> = None;
                let model_id = frag.model_id(node, &free);
                // The measure depends only on the multiset of free milli: GPUs as free as
                // one already tried give its answer, and the first of equals wins anyway.
                let mut tried: SmallVec<[u32; 8]> = SmallVec::new();
                for p in &candidates {
                    let k = free.iter().position(|x| x.0 == p.slot).expect("a GPU");
                    if tried.contains(&free[k].1) {
                        continue;
                    }
                    tried.push(free[k].1);
                    free[k].1 -= p.compute;
                    let after = frag.node_frag_of(model_id, node, &free, host_after);
                    free[k].1 += p.compute;
                    if best.is_none_or(|b| after < b.0) {
                        best = Some((after, *p));
                    }
                }
                best.expect("non-empty").1
            }
        };
        Ok(smallvec::smallvec![pick])
    }

    /// Earliest T >= lb from which the host has room for `req`'s CPUs and memory for
    /// good (`None`: never).
    pub fn host_tail_time(&self, node: &NodeView, req: &Request, lb: Millis) -> Option<Millis> {
        if !node.admits(req)
            || node.cpu_milli < req.cpu_milli
            || node.memory_bytes < req.memory_bytes
        {
            return None;
        }
        Some(self.host_tail(node, req, lb))
    }

    /// The slot a share fits for good from earliest (the first such slot), as
    /// (time, slot, compute, memory). No slot does better than `lb`, so the search stops
    /// at the first that has room from then on.
    fn share_tail(
        &self,
        node: &NodeView,
        req: &Request,
        lb: Millis,
    ) -> Option<(Millis, usize, u32, u64)> {
        let mut best: Option<(Millis, usize, u32, u64)> = None;
        for (i, s) in node.slots.iter().enumerate() {
            if s.is_mig() || !req.model_ok(&s.model) {
                continue;
            }
            let Some((c, m)) = req.share_on(s) else {
                continue;
            };
            let t = self.slot_tail(i, s, (c, m), lb);
            if best.is_none_or(|b| t < b.0) {
                best = Some((t, i, c, m));
                if t == lb {
                    break;
                }
            }
        }
        best
    }

    /// Earliest T >= lb from which `req` fits on this node for good, and the slots it
    /// would take then. `None`: never (the node is too small or has no matching slots).
    pub fn tail(&self, node: &NodeView, req: &Request, lb: Millis) -> Option<(Millis, Picks)> {
        if !node.admits(req) {
            return None;
        }
        let host_t = self.host_tail_time(node, req, lb)?;
        let exclusive = |pred: &dyn Fn(&SlotView) -> bool, count: u32| -> Option<(Millis, Picks)> {
            let pick = |i: usize| Pick {
                slot: i,
                compute: GPU_MILLI,
                mem_mib: node.slots[i].memory_mib,
            };
            let mut tails: SmallVec<[(Millis, usize); 16]> = SmallVec::new();
            for (i, s) in node.slots.iter().enumerate() {
                if pred(s) && req.model_ok(&s.model) {
                    tails.push((self.slot_sum[i].last_end.max(lb), i));
                }
            }
            if (tails.len() as u32) < count {
                return None;
            }
            if count == 1 {
                // The earliest slot (the lowest index among equals), as the sort would.
                let &(t, i) = tails.iter().min().expect("one slot at least");
                return Some((t, smallvec::smallvec![pick(i)]));
            }
            tails.sort_unstable();
            tails.truncate(count as usize);
            let t = tails.last().map_or(lb, |x| x.0);
            Some((t, tails.iter().map(|&(_, i)| pick(i)).collect()))
        };
        let (gpu_t, picks) = match &req.gpu {
            GpuRequest::None => (lb, Picks::new()),
            GpuRequest::Whole { count } => exclusive(&|s: &SlotView| !s.is_mig(), *count)?,
            GpuRequest::Mig { profile, count } => {
                exclusive(&|s: &SlotView| s.is_profile(profile), *count)?
            }
            GpuRequest::Share { .. } => self.share_tail(node, req, lb).map(|(t, i, c, m)| {
                (
                    t,
                    smallvec::smallvec![Pick {
                        slot: i,
                        compute: c,
                        mem_mib: m,
                    }],
                )
            })?,
        };
        Some((gpu_t.max(host_t), picks))
    }
}

#[cfg(test)]
mod tests;
