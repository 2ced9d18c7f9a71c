//! Job dependencies (like `sbatch --dependency`): which pending jobs may be scheduled,
//! which wait, and which can never run. Pure: the jobs' states go in, a verdict per
//! pending job comes out. The pending jobs and what they wait for form a DAG
//! (petgraph); it is evaluated in topological order so that a job that will never run
//! counts as ended (CANCELLED) for the jobs that wait on it, in the same pass.

use std::collections::{BTreeMap, HashMap};

use petgraph::graphmap::DiGraphMap;

use crate::job::{DepKind, JobState};

/// What a pending job's dependencies allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every dependency is satisfied: schedule it.
    Ready,
    /// Waits for this job to end.
    Waiting { on: u64 },
    /// Can never be satisfied: `job` ended `state` (or is unknown: `None`).
    Never { job: u64, state: Option<JobState> },
}

/// Whether `kind` is satisfied by a job that ended `state`; `None` while it has not
/// ended.
fn satisfied(kind: DepKind, state: JobState) -> Option<bool> {
    if !state.is_final() {
        return None;
    }
    Some(match kind {
        DepKind::AfterOk => state == JobState::Completed,
        DepKind::AfterNotOk => state != JobState::Completed,
        DepKind::AfterAny => true,
    })
}

/// Verdicts for `pending` jobs (id -> their dependencies). `state_of` gives the state of
/// any other job the controller knows (`None`: unknown).
pub fn evaluate(
    pending: &BTreeMap<u64, Vec<(DepKind, u64)>>,
    state_of: impl Fn(u64) -> Option<JobState>,
) -> BTreeMap<u64, Verdict> {
    let mut g: DiGraphMap<u64, ()> = DiGraphMap::new();
    for (&id, deps) in pending {
        g.add_node(id);
        for &(_, on) in deps {
            if pending.contains_key(&on) {
                // on -> id: `on` is decided first.
                g.add_edge(on, id, ());
            }
        }
    }
    // A cycle cannot be made through the API (a job depends only on jobs that exist
    // when it is submitted); if stored state has one anyway, its jobs never run.
    let order: Vec<u64> = match petgraph::algo::toposort(&g, None) {
        Ok(o) => o,
        Err(cycle) => {
            let at = cycle.node_id();
            return pending
                .keys()
                .map(|&id| {
                    let v = if id == at {
                        Verdict::Never {
                            job: at,
                            state: None,
                        }
                    } else {
                        Verdict::Waiting { on: at }
                    };
                    (id, v)
                })
                .collect();
        }
    };
    let mut out: BTreeMap<u64, Verdict> = BTreeMap::new();
    // Pending jobs decided in this pass: those that will never run count as CANCELLED.
    let mut decided: HashMap<u64, JobState> = HashMap::new();
    for id in order {
        let mut verdict = Verdict::Ready;
        for &(kind, on) in &pending[&id] {
            let state = decided.get(&on).copied().or_else(|| {
                if pending.contains_key(&on) {
                    Some(JobState::Pending)
                } else {
                    state_of(on)
                }
            });
            let v = match state {
                None => Verdict::Never {
                    job: on,
                    state: None,
                },
                Some(s) => match satisfied(kind, s) {
                    Some(true) => continue,
                    Some(false) => Verdict::Never {
                        job: on,
                        state: Some(s),
                    },
                    None => Verdict::Waiting { on },
                },
            };
            // "Never" wins over "waiting": the job will not run whatever else happens.
            match (&verdict, &v) {
                (Verdict::Never { .. }, _) => {}
                (_, Verdict::Never { .. }) => verdict = v,
                (Verdict::Ready, _) => verdict = v,
                _ => {}
            }
        }
        if matches!(verdict, Verdict::Never { .. }) {
            decided.insert(id, JobState::Cancelled);
        }
        out.insert(id, verdict);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deps(list: &[(u64, &[(DepKind, u64)])]) -> BTreeMap<u64, Vec<(DepKind, u64)>> {
        list.iter().map(|(id, d)| (*id, d.to_vec())).collect()
    }

    #[test]
    fn kinds_against_ended_and_running_jobs() {
        let states: HashMap<u64, JobState> = [
            (1, JobState::Completed),
            (2, JobState::Failed),
            (3, JobState::Running),
        ]
        .into();
        let st = |id: u64| states.get(&id).copied();
        let p = deps(&[
            (10, &[(DepKind::AfterOk, 1)]),
            (11, &[(DepKind::AfterOk, 2)]),
            (12, &[(DepKind::AfterNotOk, 2)]),
            (13, &[(DepKind::AfterAny, 2), (DepKind::AfterOk, 3)]),
            (14, &[(DepKind::AfterNotOk, 1)]),
            (15, &[(DepKind::AfterOk, 99)]),
        ]);
        let v = evaluate(&p, st);
        assert_eq!(v[&10], Verdict::Ready);
        assert_eq!(
            v[&11],
            Verdict::Never {
                job: 2,
                state: Some(JobState::Failed)
            }
        );
        assert_eq!(v[&12], Verdict::Ready);
        assert_eq!(v[&13], Verdict::Waiting { on: 3 });
        assert_eq!(
            v[&14],
            Verdict::Never {
                job: 1,
                state: Some(JobState::Completed)
            }
        );
        assert_eq!(
            v[&15],
            Verdict::Never {
                job: 99,
                state: None
            }
        );
    }

    #[test]
    fn never_propagates_through_the_dag_in_one_pass() {
        // 2 failed; 10 afterok 2 never runs, so 11 (afterok 10) never runs either, while
        // 12 (afterany 10) is ready: 10 counts as ended.
        let st = |id: u64| (id == 2).then_some(JobState::Failed);
        let p = deps(&[
            (11, &[(DepKind::AfterOk, 10)]),
            (12, &[(DepKind::AfterAny, 10)]),
            (10, &[(DepKind::AfterOk, 2)]),
            (13, &[(DepKind::AfterOk, 12)]),
        ]);
        let v = evaluate(&p, st);
        assert!(matches!(v[&10], Verdict::Never { job: 2, .. }));
        assert_eq!(
            v[&11],
            Verdict::Never {
                job: 10,
                state: Some(JobState::Cancelled)
            }
        );
        assert_eq!(v[&12], Verdict::Ready);
        assert_eq!(v[&13], Verdict::Waiting { on: 12 });
    }

    #[test]
    fn a_stored_cycle_runs_nothing() {
        let p = deps(&[(1, &[(DepKind::AfterOk, 2)]), (2, &[(DepKind::AfterOk, 1)])]);
        let v = evaluate(&p, |_| None);
        assert!(v.values().all(|x| *x != Verdict::Ready));
        assert!(v.values().any(|x| matches!(x, Verdict::Never { .. })));
    }
}
