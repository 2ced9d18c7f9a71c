//! `Base`: what a pass starts from (each node's calendar with what runs on it), kept
//! between passes so that a pass rebuilds only the calendars of the nodes that changed.
//!
//! A pass's calendars before its first claim are a function of the view and `now` alone:
//! every running job claims its slots, CPUs and memory from `now` to the later of its
//! expected end and a second from now (a job past its limit is being ended). From one
//! pass to the next, a node's calendar is the same, for every question a pass asks
//! (windows and tails from `now` on), when
//! - its `NodeView` is the same,
//! - the running claims on it are the same (job, allocation, expected end), and
//! - none of them reaches the one-second floor: each ends at least a second after the
//!   new `now` (then the claim covers the same instants from the new `now` on, and what
//!   is free now is what was free then).
//!
//! `Base::update` finds the nodes where one of these fails by comparing the new view
//! with the one it holds (running claims merged by job id, nodes side by side) and
//! rebuilds those alone; a node list that changed (a node added, removed or renamed) or
//! claims out of job order rebuild all. The full build (`held_calendars`) is what a pass
//! without a base uses, and the check: `schedule_from` on an updated base gives the plan
//! `schedule` gives on the same view (tests: `base_updates_plan_as_a_fresh_build`).

use super::*;

/// Every node's calendar with every running job's claim from `now` to its expected
/// end (at least a second from now), refreshed at `now`.
pub(crate) fn held_calendars(cluster: &ClusterView, now: Millis) -> Vec<Calendar> {
    let index = node_index(cluster);
    let mut cals: Vec<Calendar> = cluster.nodes.iter().map(Calendar::new).collect();
    for r in &cluster.running {
        if let Some(&i) = index.get(r.alloc.node.as_str()) {
            claim_running(&mut cals[i], &cluster.nodes[i], r, now);
        }
    }
    for (cal, node) in cals.iter_mut().zip(&cluster.nodes) {
        cal.refresh_free_now(node, now);
    }
    cals
}

fn node_index(cluster: &ClusterView) -> FastMap<&str, usize> {
    cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect()
}

/// A running job's claim on its node's calendar (slots by UUID; one the node does not
/// have is left out).
fn claim_running(cal: &mut Calendar, node: &NodeView, r: &Running, now: Millis) {
    let picks: Picks = r
        .alloc
        .slots
        .iter()
        .filter_map(|u| {
            node.slots
                .iter()
                .position(|s| s.uuid == u.uuid)
                .map(|slot| Pick {
                    slot,
                    compute: u.compute_milli,
                    mem_mib: u.memory_mib,
                })
        })
        .collect();
    let end = r.end_ms.max(floor_end(now));
    let (cpu, mem) = (r.alloc.cpu_milli, r.alloc.memory_bytes);
    cal.add(r.job, &picks, cpu, mem, (now, end), false);
}

/// The earliest a running claim ends in a pass at `now`.
fn floor_end(now: Millis) -> Millis {
    now.saturating_add(1000)
}

/// What a pass starts from, kept between passes (see the module's comment).
pub struct Base {
    view: ClusterView,
    now: Millis,
    cals: Vec<Calendar>,
    /// Per node, the earliest expected end among its running claims (`Millis::MAX`:
    /// none): once it falls under a pass's one-second floor, the node is rebuilt.
    first_end: Vec<Millis>,
    /// Per entry of `view.running`, its node's index (`usize::MAX`: a node the view
    /// does not have).
    running_node: Vec<usize>,
}

/// What an update rebuilt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refresh {
    /// Every node (a new node list, or claims out of job order).
    pub all: bool,
    /// How many nodes' calendars were rebuilt.
    pub nodes: usize,
}

/// A base of no nodes: its first `update` builds every calendar.
impl Default for Base {
    fn default() -> Base {
        Base {
            view: ClusterView::default(),
            now: Millis::MIN,
            cals: Vec::new(),
            first_end: Vec::new(),
            running_node: Vec::new(),
        }
    }
}

impl Base {
    pub fn new(view: ClusterView, now: Millis) -> Base {
        let mut base = Base::default();
        base.rebuild_all(view, now);
        base
    }

    /// The view the calendars are of.
    pub fn view(&self) -> &ClusterView {
        &self.view
    }

    pub fn now(&self) -> Millis {
        self.now
    }

    /// The calendars for a pass, borrowed (a pass copies a node's on its first claim).
    pub(crate) fn calendars(&self) -> Vec<Cow<'_, Calendar>> {
        self.cals.iter().map(Cow::Borrowed).collect()
    }

    /// Brings the base to `view` at `now` (not earlier than the last update's): the
    /// calendars of the nodes that changed are rebuilt, the others kept.
    pub fn update(&mut self, view: ClusterView, now: Millis) -> Refresh {
        // The merge needs both lists in job order (the held one may not be, when a
        // caller's was not).
        if !self.keeps(&view.nodes, now) || !by_job(&view.running) || !by_job(&self.view.running) {
            self.rebuild_all(view, now);
            return self.all_rebuilt();
        }
        let mut changed = self.nodes_changed(&view.nodes);
        let running_node = self.diff_running(&view.running, &mut changed);
        self.take(view, running_node, changed, now)
    }

    /// Whether an update to `nodes` at `now` can keep calendars: the same node list
    /// (names, in order), and time not gone back.
    fn keeps(&self, nodes: &[NodeView], now: Millis) -> bool {
        now >= self.now
            && nodes.len() == self.view.nodes.len()
            && (nodes.iter().zip(&self.view.nodes)).all(|(a, b)| a.name == b.name)
    }

    /// Per node, whether its view differs from the one held.
    fn nodes_changed(&self, nodes: &[NodeView]) -> Vec<bool> {
        (nodes.iter().zip(&self.view.nodes))
            .map(|(a, b)| a != b)
            .collect()
    }

    fn all_rebuilt(&self) -> Refresh {
        Refresh {
            all: true,
            nodes: self.cals.len(),
        }
    }

    /// Takes `view` (each claim's node in `running_node`) at `now`, rebuilding the
    /// `changed` nodes and those with a claim reaching the one-second floor.
    fn take(
        &mut self,
        view: ClusterView,
        running_node: Vec<usize>,
        mut changed: Vec<bool>,
        now: Millis,
    ) -> Refresh {
        let floor = floor_end(now);
        for (c, &end) in changed.iter_mut().zip(&self.first_end) {
            *c |= end < floor;
        }
        self.view = view;
        self.running_node = running_node;
        self.now = now;
        let nodes = self.rebuild(&changed);
        for cal in &mut self.cals {
            // Every claim kept covers [old now, new now + 1 s): what is held now is
            // what was held then.
            cal.now = now;
        }
        Refresh { all: false, nodes }
    }

    /// `update` to a view given as what changed: every node (`nodes`) and the claims now
    /// of the jobs in `touched` (`claims`, by job id; a touched job with none runs no
    /// more), every other job's claims as held. `touched` may name jobs whose claims did
    /// not change. The same base as `update` to the whole view (tests:
    /// `touched_updates_as_a_whole_view`), at a cost of the touched jobs, not of all.
    pub fn update_touched(
        &mut self,
        nodes: Vec<NodeView>,
        touched: &[u64],
        claims: Vec<Running>,
        now: Millis,
    ) -> Refresh {
        debug_assert!(
            touched.windows(2).all(|w| w[0] < w[1]),
            "touched: ids in order"
        );
        let old = std::mem::take(&mut self.view.running);
        let old_node = std::mem::take(&mut self.running_node);
        if !self.keeps(&nodes, now) || !by_job(&claims) || !by_job(&old) {
            let running = merge_touched(old, touched, claims);
            self.rebuild_all(ClusterView { nodes, running }, now);
            return self.all_rebuilt();
        }
        let mut changed = self.nodes_changed(&nodes);
        let index = node_index(&self.view);
        let mut running = Vec::with_capacity(old.len() + claims.len());
        let mut running_node = Vec::with_capacity(running.capacity());
        let mut old = old.into_iter().zip(old_node).peekable();
        let mut claims = claims.into_iter().peekable();
        for &job in touched {
            // Untouched jobs before this one: kept as held.
            while let Some((r, i)) = old.next_if(|(r, _)| r.job < job) {
                running.push(r);
                running_node.push(i);
            }
            let mut before = Vec::new();
            while let Some(x) = old.next_if(|(r, _)| r.job == job) {
                before.push(x);
            }
            let mut after = Vec::new();
            while let Some(r) = claims.next_if(|r| r.job == job) {
                after.push(r);
            }
            let same = before.len() == after.len()
                && (before.iter().zip(&after)).all(|((a, _), b)| a == b);
            if same {
                for (r, i) in before {
                    running.push(r);
                    running_node.push(i);
                }
                continue;
            }
            for (_, i) in &before {
                if let Some(c) = changed.get_mut(*i) {
                    *c = true;
                }
            }
            for r in after {
                let i = index
                    .get(r.alloc.node.as_str())
                    .copied()
                    .unwrap_or(usize::MAX);
                if let Some(c) = changed.get_mut(i) {
                    *c = true;
                }
                running.push(r);
                running_node.push(i);
            }
        }
        drop(index);
        for (r, i) in old {
            running.push(r);
            running_node.push(i);
        }
        debug_assert!(claims.next().is_none(), "claims of jobs not touched");
        self.take(ClusterView { nodes, running }, running_node, changed, now)
    }

    /// Merges the held claims with `new` (both by job id), marking the nodes of every
    /// claim that came, went or changed; answers `new`'s node per entry.
    fn diff_running(&self, new: &[Running], changed: &mut [bool]) -> Vec<usize> {
        let old = &self.view.running;
        let mut index: Option<FastMap<&str, usize>> = None;
        let mut lookup = |name: &str| -> usize {
            let index = index.get_or_insert_with(|| node_index(&self.view));
            index.get(name).copied().unwrap_or(usize::MAX)
        };
        let mut mark = |i: usize| {
            if let Some(c) = changed.get_mut(i) {
                *c = true;
            }
        };
        let mut out = Vec::with_capacity(new.len());
        let (mut a, mut b) = (0, 0);
        while a < old.len() || b < new.len() {
            let take_old = b == new.len() || (a < old.len() && old[a].job < new[b].job);
            let take_new = a == old.len() || (b < new.len() && new[b].job < old[a].job);
            if take_old {
                mark(self.running_node[a]);
                a += 1;
            } else if take_new {
                let i = lookup(&new[b].alloc.node);
                mark(i);
                out.push(i);
                b += 1;
            } else if old[a] == new[b] {
                out.push(self.running_node[a]);
                a += 1;
                b += 1;
            } else {
                mark(self.running_node[a]);
                let i = if old[a].alloc.node == new[b].alloc.node {
                    self.running_node[a]
                } else {
                    lookup(&new[b].alloc.node)
                };
                mark(i);
                out.push(i);
                a += 1;
                b += 1;
            }
        }
        out
    }

    /// Rebuilds the marked nodes' calendars from the view; answers how many.
    fn rebuild(&mut self, changed: &[bool]) -> usize {
        let now = self.now;
        let mut n = 0;
        for (i, _) in changed.iter().enumerate().filter(|(_, c)| **c) {
            self.cals[i] = Calendar::new(&self.view.nodes[i]);
            self.first_end[i] = Millis::MAX;
            n += 1;
        }
        if n == 0 {
            return 0;
        }
        for (r, &i) in self.view.running.iter().zip(&self.running_node) {
            if changed.get(i).copied().unwrap_or(false) {
                claim_running(&mut self.cals[i], &self.view.nodes[i], r, now);
                self.first_end[i] = self.first_end[i].min(r.end_ms);
            }
        }
        for (i, _) in changed.iter().enumerate().filter(|(_, c)| **c) {
            self.cals[i].refresh_free_now(&self.view.nodes[i], now);
        }
        n
    }

    fn rebuild_all(&mut self, view: ClusterView, now: Millis) {
        let index = node_index(&view);
        self.running_node = (view.running.iter())
            .map(|r| *index.get(r.alloc.node.as_str()).unwrap_or(&usize::MAX))
            .collect();
        drop(index);
        let n = view.nodes.len();
        self.cals = vec![Calendar::default(); n];
        self.first_end = vec![Millis::MAX; n];
        self.view = view;
        self.now = now;
        self.rebuild(&vec![true; n]);
    }
}

/// `held` (by job) with the claims of the `touched` jobs replaced by `claims`.
fn merge_touched(held: Vec<Running>, touched: &[u64], claims: Vec<Running>) -> Vec<Running> {
    let touched: std::collections::HashSet<u64> = touched.iter().copied().collect();
    let mut running: Vec<Running> = (held.into_iter())
        .filter(|r| !touched.contains(&r.job))
        .chain(claims)
        .collect();
    running.sort_by_key(|r| r.job);
    running
}

/// Whether running claims come in job order (the controller's views do): the update
/// merges by it.
fn by_job(running: &[Running]) -> bool {
    running.windows(2).all(|w| w[0].job <= w[1].job)
}
