//! Job steps (each `srun` / `gpuctl run` of a job's script) as its nodes report them
//! when their part of the job ends: merged into the job's record by step id, bounded,
//! their names cleaned (they come from the job's user).

use crate::record::Step;

/// Merges node `node`'s parts of steps into `steps` (kept in id order): the earliest
/// start, the latest end (0 while any part has not ended), the worst exit code (none
/// while any part has none), the tasks summed, the node listed once.
pub fn merge(steps: &mut Vec<Step>, node: &str, reported: &[Step]) {
    for r in reported {
        // A node that took no part (srun -N below the job's nodes) recorded the step
        // only to keep the ids alike on every node.
        if r.tasks == 0 {
            continue;
        }
        let at = match steps.binary_search_by_key(&r.id, |s| s.id) {
            Ok(at) => at,
            Err(_) if steps.len() >= Step::MAX_PER_JOB => continue,
            Err(at) => {
                steps.insert(
                    at,
                    Step {
                        id: r.id,
                        name: Step::clean_name(&r.name),
                        start_ms: r.start_ms,
                        end_ms: r.end_ms,
                        exit_code: r.exit_code,
                        ..Step::default()
                    },
                );
                at
            }
        };
        let s = &mut steps[at];
        if !s.nodes.is_empty() {
            if r.start_ms > 0 && (s.start_ms == 0 || r.start_ms < s.start_ms) {
                s.start_ms = r.start_ms;
            }
            s.end_ms = if s.end_ms == 0 || r.end_ms == 0 {
                0
            } else {
                s.end_ms.max(r.end_ms)
            };
            s.exit_code = match (s.exit_code, r.exit_code) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
        if s.nodes.iter().any(|n| n == node) {
            continue; // a node's part counts once
        }
        s.tasks = s.tasks.saturating_add(r.tasks);
        s.nodes.push(node.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(id: u32, start: i64, end: i64, exit: Option<i32>, tasks: u32) -> Step {
        Step {
            id,
            name: format!("python train.py\u{1b}[2J #{id}"),
            start_ms: start,
            end_ms: end,
            exit_code: exit,
            tasks,
            nodes: vec![],
        }
    }

    /// Two nodes' parts of two steps: one step over both (earliest start, latest end,
    /// worst exit, tasks summed), one that had not ended on the second node.
    #[test]
    fn nodes_parts_merge_into_one_step() {
        let mut steps = Vec::new();
        merge(
            &mut steps,
            "n1",
            &[part(1, 200, 300, Some(0), 2), part(0, 100, 150, Some(0), 2)],
        );
        merge(
            &mut steps,
            "n2",
            &[part(0, 90, 160, Some(3), 2), part(1, 210, 0, None, 2)],
        );
        assert_eq!(steps.iter().map(|s| s.id).collect::<Vec<_>>(), [0, 1]);
        let s0 = &steps[0];
        assert_eq!(
            (s0.start_ms, s0.end_ms, s0.exit_code, s0.tasks),
            (90, 160, Some(3), 4)
        );
        assert_eq!(s0.nodes, ["n1", "n2"]);
        assert_eq!(s0.name, "python train.py [2J #0");
        let s1 = &steps[1];
        assert_eq!(
            (s1.start_ms, s1.end_ms, s1.exit_code, s1.tasks),
            (200, 0, None, 4)
        );
        // A node reporting again (a resent report) changes nothing.
        let before = steps.clone();
        merge(&mut steps, "n2", &[part(0, 90, 160, Some(3), 2)]);
        assert_eq!(steps, before);
    }

    #[test]
    fn steps_and_names_are_bounded() {
        let mut steps = Vec::new();
        let max = Step::MAX_PER_JOB;
        let many: Vec<Step> = (0..max as u32 + 5)
            .map(|i| part(i, 1, 2, Some(0), 1))
            .collect();
        merge(&mut steps, "n1", &many);
        assert_eq!(steps.len(), max);
        let long = "é".repeat(300);
        let name = Step::clean_name(&long);
        let most = Step::MAX_NAME;
        assert!(
            name.len() <= most && name.len() > most - 2,
            "{}",
            name.len()
        );
        assert_eq!(Step::clean_name("a\u{200b}b\nc"), "a b c");
    }

    /// A node's part with no tasks (its srun took no part) keeps ids alike but is not
    /// counted: neither its node nor its times.
    #[test]
    fn parts_without_tasks_are_not_counted() {
        let mut steps = Vec::new();
        merge(&mut steps, "n2", &[part(0, 50, 60, Some(0), 0)]);
        assert!(steps.is_empty());
        merge(&mut steps, "n1", &[part(0, 100, 150, Some(3), 1)]);
        merge(&mut steps, "n2", &[part(0, 50, 60, Some(0), 0)]);
        assert_eq!(steps.len(), 1);
        assert_eq!((steps[0].start_ms, steps[0].tasks), (100, 1));
        assert_eq!(steps[0].nodes, vec!["n1".to_string()]);
        assert_eq!(steps[0].exit_code, Some(3));
    }
}
