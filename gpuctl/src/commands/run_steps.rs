//! A step's record in its job's step file (`GPUCTL_STEPS_FILE`, `gpud::steps`), and
//! the GPUs a sized step (`srun -G N` within a job or an allocation) takes there: the
//! file's lock makes concurrent steps of the job take different GPUs, as Slurm's
//! steps do, and a step that finds too few free waits for them ("step creation
//! temporarily disabled, retrying"). Lines: `B <id> <start_ms> <tasks> <name>` as a
//! step begins, `G <id> <pid> <gpu,...>` for the GPUs it holds (free again at its `E`
//! line, or once its process is gone), `E <id> <end_ms> <exit_code>` as it ends. The
//! agent reads `B` and `E` lines and ignores the others.

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};

/// The GPUs steps hold now, from the file's text (steps that ended, or whose process
/// is gone, hold none).
fn held(text: &str) -> BTreeSet<String> {
    let ended: BTreeSet<&str> = (text.lines())
        .filter_map(|l| l.strip_prefix("E "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let mut out = BTreeSet::new();
    for l in text.lines().filter_map(|l| l.strip_prefix("G ")) {
        let mut f = l.split(' ');
        let (Some(id), Some(pid), Some(gpus)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let alive = pid
            .parse::<i32>()
            .is_ok_and(|p| nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None).is_ok());
        if !ended.contains(id) && alive {
            out.extend(gpus.split(',').map(str::to_string));
        }
    }
    out
}

/// Records a step's beginning: its id (the `B` lines before it, under the file's
/// lock) and, when it asks `want` of `all` the job's GPUs here, the ones it takes:
/// free ones, waiting for them while other steps hold too many.
pub fn begin(
    file: &str,
    tasks: u32,
    name: &str,
    want: usize,
    all: &[String],
) -> std::io::Result<(u32, Vec<String>)> {
    let mut said = false;
    loop {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .open(file)?;
        let mut f = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| std::io::Error::from(e))?;
        let mut text = String::new();
        f.read_to_string(&mut text)?;
        let busy = held(&text);
        let free: Vec<String> = all.iter().filter(|g| !busy.contains(*g)).cloned().collect();
        if free.len() >= want {
            let id = text.lines().filter(|l| l.starts_with("B ")).count() as u32;
            // One line, as the agent keeps it (`Step::clean_name`).
            let name = gpuctl_proto::Step::clean_name(name);
            let now = crate::format::now_ms();
            let mut lines = format!("B {id} {now} {tasks} {name}\n");
            let taken: Vec<String> = free.into_iter().take(want).collect();
            if want > 0 {
                lines.push_str(&format!(
                    "G {id} {} {}\n",
                    std::process::id(),
                    taken.join(",")
                ));
            }
            f.write_all(lines.as_bytes())?;
            return Ok((id, taken));
        }
        drop(f);
        if !said {
            let job = std::env::var("GPUCTL_JOB_ID").unwrap_or_default();
            eprintln!(
                "srun: Job {job} step creation temporarily disabled, retrying (Requested nodes are busy)"
            );
            said = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
}

/// The step's end, as one appended line.
pub fn end(file: &str, id: u32, code: u8) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().append(true).open(file)?;
    let now = crate::format::now_ms();
    f.write_all(format!("E {id} {now} {code}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_steps_take_different_gpus_and_give_them_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("steps");
        std::fs::write(&file, "").unwrap();
        let file = file.to_str().unwrap();
        let all: Vec<String> = ["GPU-a", "GPU-b", "GPU-c"].map(String::from).to_vec();
        let (a, ga) = begin(file, 1, "x", 1, &all).unwrap();
        let (b, gb) = begin(file, 1, "y", 2, &all).unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(ga, vec!["GPU-a"]);
        assert_eq!(gb, vec!["GPU-b", "GPU-c"]);
        end(file, a, 0).unwrap();
        let (_, gc) = begin(file, 1, "z", 1, &all).unwrap();
        assert_eq!(gc, vec!["GPU-a"], "the first step's GPU, free again");
        // A step that asks none takes none and never waits.
        let (_, none) = begin(file, 1, "w", 0, &all).unwrap();
        assert!(none.is_empty());
        // A holder whose process is gone holds nothing.
        let text = "B 0 1 1 x\nG 0 999999999 GPU-a\n";
        assert!(held(text).is_empty());
    }
}
