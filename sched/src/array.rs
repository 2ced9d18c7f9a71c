//! Job arrays: the task indexes of an `--array` spec ("0-99%8", "1,5,9", "0-99:10%4"),
//! as sbatch reads them.

/// The tasks of an array and how many may run at once (0 = no limit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArraySpec {
    pub tasks: Vec<u32>,
    pub max_running: u32,
}

/// The largest task index (Slurm's MaxArraySize is 1001 by default; gpuctl allows more
/// tasks than that, but indexes stay below this).
pub const MAX_INDEX: u32 = 1_000_000;

/// Parses an array spec; `max_tasks` bounds how many tasks it may make.
pub fn parse(spec: &str, max_tasks: usize) -> Result<ArraySpec, String> {
    let (list, limit) = match spec.split_once('%') {
        Some((l, n)) => {
            let n: u32 = n
                .trim()
                .parse()
                .map_err(|_| format!("array {spec:?}: after % comes the most tasks at once"))?;
            if n == 0 {
                return Err(format!("array {spec:?}: %0 would run no task"));
            }
            (l, n)
        }
        None => (spec, 0),
    };
    let mut tasks = Vec::new();
    for part in list.split(',') {
        let part = part.trim();
        let (range, step) = match part.split_once(':') {
            Some((r, s)) => (r, s.parse::<u32>().ok().filter(|s| *s > 0)),
            None => (part, Some(1)),
        };
        let step =
            step.ok_or_else(|| format!("array {spec:?}: step in {part:?} must be 1 or more"))?;
        let num = |s: &str| -> Result<u32, String> {
            s.trim()
                .parse::<u32>()
                .ok()
                .filter(|n| *n <= MAX_INDEX)
                .ok_or_else(|| {
                    format!("array {spec:?}: {s:?} is not an index from 0 to {MAX_INDEX}")
                })
        };
        let (a, b) = match range.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let n = num(range)?;
                (n, n)
            }
        };
        if a > b {
            return Err(format!("array {spec:?}: range {range:?} runs backwards"));
        }
        let mut i = a;
        while i <= b {
            tasks.push(i);
            if tasks.len() > max_tasks {
                return Err(format!(
                    "array {spec:?} makes more than {max_tasks} tasks (limits.max_array_tasks)"
                ));
            }
            i = match i.checked_add(step) {
                Some(n) => n,
                None => break,
            };
        }
    }
    tasks.sort_unstable();
    tasks.dedup();
    if tasks.is_empty() {
        return Err(format!("array {spec:?} has no tasks"));
    }
    Ok(ArraySpec {
        tasks,
        max_running: limit,
    })
}

/// Folds task indexes into squeue's form: `[3-5,9]`.
pub fn fold(tasks: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < tasks.len() {
        let mut j = i;
        while j + 1 < tasks.len() && tasks[j + 1] == tasks[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            tasks[i].to_string()
        } else {
            format!("{}-{}", tasks[i], tasks[j])
        });
        i = j + 1;
    }
    format!("[{}]", parts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_like_sbatch() {
        assert_eq!(
            parse("0-3%2", 100).unwrap(),
            ArraySpec {
                tasks: vec![0, 1, 2, 3],
                max_running: 2
            }
        );
        assert_eq!(parse("1,5,9", 100).unwrap().tasks, vec![1, 5, 9]);
        assert_eq!(parse("0-20:10", 100).unwrap().tasks, vec![0, 10, 20]);
        assert_eq!(parse("3,1-2,3", 100).unwrap().tasks, vec![1, 2, 3]);
        for bad in ["", "5-1", "a-b", "0-9%0", "0-9:0", "0-99999999"] {
            assert!(parse(bad, 100).is_err(), "{bad}");
        }
        assert!(parse("0-100", 100).unwrap_err().contains("max_array_tasks"));
    }

    #[test]
    fn folding() {
        assert_eq!(fold(&[3, 4, 5, 9]), "[3-5,9]");
        assert_eq!(fold(&[7]), "[7]");
    }
}
