//! Dynamic MIG (`gpud --mig dynamic`): after each pass, the GPUs of such nodes that
//! hold no job are given the MIG layout that waiting jobs need (`sched::mig` plans it
//! by NVIDIA's placement rules; the rest of the GPU is filled with more of the
//! profiles asked for, since a GPU that holds a job is not changed), and a MIG GPU nobody uses goes back to whole when
//! whole-GPU jobs wait and no MIG job wants it. The agent reconfigures the GPU and
//! attaches again with its new inventory; meanwhile the GPU is out of every pass (a
//! reconfiguration never touches a GPU with a job), and the jobs the new layout is for
//! wait with `MigLayoutChange` ("waiting for a MIG layout change on NODE GPU i"). A GPU
//! changes at most once per `[mig] min_layout_age`, so layouts do not thrash; a change
//! the agent does not confirm within `CHANGE_TIMEOUT_MS` is given up (the agent drains
//! its node when a reconfiguration fails). Pure: every replica plans alike.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Deserialize;

use crate::command::{Command, MigLayout};
use crate::record::{GpuPart, JobState};
use crate::state::{Cluster, Effects, live_allocs};

/// A change not confirmed by the agent's new inventory within this is given up.
pub const CHANGE_TIMEOUT_MS: i64 = 120_000;

/// The reason of a job that waits for a layout change made for it.
pub const MIG_LAYOUT_CHANGE: &str = "MigLayoutChange";

/// The `[mig]` table.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MigConfig {
    /// A GPU's layout changes at most once in this long.
    #[serde(with = "humantime_serde")]
    pub min_layout_age: Duration,
}

impl Default for MigConfig {
    fn default() -> Self {
        MigConfig {
            min_layout_age: Duration::from_secs(120),
        }
    }
}

/// A GPU whose layout the controller asked to change.
#[derive(Debug, Clone, PartialEq)]
pub struct Changing {
    pub node: String,
    pub gpu_index: u32,
    /// The layout asked for (empty: the whole GPU).
    pub layout: Vec<String>,
    /// The jobs it is for.
    pub jobs: Vec<u64>,
    pub since: i64,
}

/// What the MIG planner keeps between passes (memory only: an agent that attaches
/// again shows its GPUs as they are).
#[derive(Debug, Clone, Default)]
pub struct MigState {
    /// By GPU UUID.
    pub changing: BTreeMap<String, Changing>,
    /// When each GPU's layout last changed (Unix ms), for `min_layout_age`.
    pub changed_ms: BTreeMap<String, i64>,
    /// Layout changes asked, ever (`gpuctl_mig_reconfigurations_total`).
    pub reconfigurations: u64,
    /// When a GPU that only `min_layout_age` keeps from changing, while jobs wait, may
    /// change: a pass is due then (`Cluster::next_wake_ms`).
    pub next_change_ms: Option<i64>,
}

/// One waiting MIG job: its id, profile and count.
type Want = (u64, String, u32);

impl Cluster {
    /// Whether GPU `index` of `node` is being reconfigured (out of passes).
    pub fn mig_changing(&self, node: &str, index: u32) -> bool {
        (self.mig.changing.values()).any(|c| c.node == node && c.gpu_index == index)
    }

    /// The MIG layout changes under way.
    pub fn mig_state(&self) -> &MigState {
        &self.mig
    }

    /// The end of a pass: layout changes for what waits (see the module's doc).
    pub(crate) fn plan_mig(&mut self, now: i64, effects: &mut Effects) {
        if !self.fleet.nodes.values().any(|n| n.mig_dynamic) {
            return;
        }
        self.mig
            .changing
            .retain(|_, c| now - c.since < CHANGE_TIMEOUT_MS);
        let (mut wants, whole_waiting) = self.mig_wants();
        let used = self.used_slots();
        let min_age = self.config.mig.min_layout_age.as_millis() as i64;
        let mut asked = Vec::new();
        let mut next_change: Option<i64> = None;
        let waiting = whole_waiting || !wants.is_empty();
        for n in self.fleet.nodes.values() {
            if !n.mig_dynamic || self.eligibility(n) != sched::Eligibility::Up {
                continue;
            }
            for g in &n.gpus {
                let busy = used.contains(g.uuid.as_str())
                    || g.mig.iter().any(|m| used.contains(m.uuid.as_str()));
                let changed = self.mig.changed_ms.get(&g.uuid).copied();
                let recent = changed.is_some_and(|t| now - t < min_age);
                if recent && waiting && !busy {
                    let at = changed.unwrap_or(now) + min_age;
                    next_change = Some(next_change.map_or(at, |n: i64| n.min(at)));
                }
                if busy || recent || self.mig.changing.contains_key(&g.uuid) {
                    continue;
                }
                let Some(model) = sched::mig::model_of(&g.model) else {
                    continue;
                };
                let current: Vec<&str> = g.mig.iter().map(|m| m.profile.as_str()).collect();
                if let Some((layout, jobs)) = layout_for(model, &wants, &current, whole_waiting) {
                    wants.retain(|w| !jobs.contains(&w.0));
                    asked.push((n.name.clone(), g.index, g.uuid.clone(), layout, jobs));
                } else if !current.is_empty()
                    && whole_waiting
                    && !wants.iter().any(|w| model.profile(&w.1).is_some())
                {
                    asked.push((
                        n.name.clone(),
                        g.index,
                        g.uuid.clone(),
                        Vec::new(),
                        Vec::new(),
                    ));
                }
            }
        }
        self.mig.next_change_ms = next_change;
        for (node, gpu_index, uuid, layout, jobs) in asked {
            self.ask_layout(node, gpu_index, uuid, layout, jobs, now, effects);
        }
        self.note_mig_waits();
    }

    /// The waiting MIG jobs no change is under way for, in queue order, and whether a
    /// whole-GPU job waits for resources.
    fn mig_wants(&self) -> (Vec<Want>, bool) {
        let covered: BTreeSet<u64> = (self.mig.changing.values())
            .flat_map(|c| c.jobs.iter().copied())
            .collect();
        let mut wants = Vec::new();
        let mut whole = false;
        let mut pending: Vec<&crate::record::Job> = (self.jobs.active())
            .map(|s| &s.job)
            .filter(|j| j.state == JobState::Pending && j.hold.is_empty())
            // Waiting for room, or for instances no GPU has now (`Infeasible` in
            // the pass's view: the layouts it sees).
            .filter(|j| {
                matches!(
                    j.reason.as_str(),
                    "Resources" | "Infeasible" | MIG_LAYOUT_CHANGE
                )
            })
            .collect();
        pending.sort_by_key(|j| (std::cmp::Reverse(j.spec.priority), j.submit_time_ms, j.id));
        for j in pending {
            match &j.spec.resources.gpu {
                Some(GpuPart::Mig(m)) if !covered.contains(&j.id) => {
                    wants.push((j.id, m.profile.clone(), m.count.max(1)));
                }
                Some(GpuPart::Gpus(n)) if *n > 0 => whole = true,
                _ => {}
            }
        }
        (wants, whole)
    }

    /// Every slot (GPU or MIG instance UUID) a job's live allocation holds.
    fn used_slots(&self) -> BTreeSet<&str> {
        (self.jobs.active())
            .flat_map(|s| live_allocs(&s.job))
            .flat_map(|a| a.slots.iter().map(|s| s.uuid.as_str()))
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn ask_layout(
        &mut self,
        node: String,
        gpu_index: u32,
        uuid: String,
        layout: Vec<String>,
        jobs: Vec<u64>,
        now: i64,
        effects: &mut Effects,
    ) {
        tracing::info!(%node, gpu = gpu_index, ?layout, ?jobs, "asking a MIG layout change");
        let cmd = Command::Mig(MigLayout {
            gpu: uuid.clone(),
            layout: layout.clone(),
        });
        effects.sends.push((node.clone(), cmd));
        self.mig.changed_ms.insert(uuid.clone(), now);
        self.mig.reconfigurations += 1;
        self.mig.changing.insert(
            uuid,
            Changing {
                node,
                gpu_index,
                layout,
                jobs,
                since: now,
            },
        );
    }

    /// The jobs a change is for wait with `MigLayoutChange`.
    fn note_mig_waits(&mut self) {
        let waits: Vec<u64> = (self.mig.changing.values())
            .flat_map(|c| c.jobs.iter().copied())
            .collect();
        for id in waits {
            self.jobs.annotate_pending(id, |j| {
                j.reason = MIG_LAYOUT_CHANGE.into();
            });
        }
    }

    /// An agent attached again: its GPUs are as it says, the changes asked of it done.
    pub(crate) fn mig_attached(&mut self, node: &str) {
        self.mig.changing.retain(|_, c| c.node != node);
    }

    /// What `explain` says of a job waiting for a layout change.
    pub fn mig_wait_of(&self, id: u64) -> Option<String> {
        let c = (self.mig.changing.values()).find(|c| c.jobs.contains(&id))?;
        Some(format!(
            "waiting for a MIG layout change on {} GPU {} (to {})",
            c.node,
            c.gpu_index,
            if c.layout.is_empty() {
                "whole".to_string()
            } else {
                c.layout.join("+")
            }
        ))
    }
}

/// The layout an unused GPU of `model` (now `current`) takes for `wants`, and the
/// jobs it serves; `None` when it serves none, or when a whole GPU would be cut while
/// whole-GPU jobs wait.
fn layout_for(
    model: &sched::mig::Model,
    wants: &[Want],
    current: &[&str],
    whole_waiting: bool,
) -> Option<(Vec<String>, Vec<u64>)> {
    let mine: Vec<&Want> = wants
        .iter()
        .filter(|w| model.profile(&w.1).is_some())
        .collect();
    if mine.is_empty() || (current.is_empty() && whole_waiting) {
        return None;
    }
    let wanted: Vec<&str> = (mine.iter())
        .flat_map(|w| std::iter::repeat_n(w.1.as_str(), w.2 as usize))
        .collect();
    let mut layout = model.plan(&wanted);
    // The rest of the GPU: more of the profiles asked for, while they fit (a GPU cut
    // for one small job then serves the next ones, which cannot change it while it
    // holds a job).
    let mut kinds: Vec<&str> = mine
        .iter()
        .filter_map(|w| Some(model.profile(&w.1)?.name))
        .collect();
    kinds.dedup();
    while let Some(more) = kinds.iter().find_map(|k| {
        let mut with: Vec<&str> = layout.iter().map(String::as_str).collect();
        with.push(k);
        model.place(&with).is_ok().then_some(*k)
    }) {
        layout.push(more.to_string());
    }
    // The jobs served: each whose whole count the layout holds, in order.
    let mut left: BTreeMap<&str, u32> = BTreeMap::new();
    for p in &layout {
        *left.entry(p.as_str()).or_default() += 1;
    }
    let mut jobs = Vec::new();
    for w in &mine {
        let have = left.entry(model.profile(&w.1)?.name).or_default();
        if *have >= w.2 {
            *have -= w.2;
            jobs.push(w.0);
        }
    }
    let mut same = current.to_vec();
    same.sort_unstable();
    let mut new: Vec<&str> = layout.iter().map(String::as_str).collect();
    new.sort_unstable();
    (!jobs.is_empty() && same != new).then_some((layout, jobs))
}

use gpuctl_sched as sched;
