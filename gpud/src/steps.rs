//! A job's step record: the file its `srun`s (`gpuctl run`) write a line to as each
//! step begins and ends, read by the agent when the job's part on this node ends and
//! sent with its end report.
//!
//! The file is `<state-dir>/scripts/job-ID.ATTEMPT.steps`: made by the agent before the
//! job starts, the job user's own (0600) in a directory only root lists (0711), named to
//! the job in `GPUCTL_STEPS_FILE`. The user can write anything into it, so the agent
//! reads a bounded amount, keeps lines it understands and cleans the names; it is
//! the user's own accounting of their own job, nothing is decided from it.
//!
//! Lines: `B <id> <start_ms> <tasks> <name>` as a step begins (the id is the number of
//! `B` lines before it, counted under a lock), `E <id> <end_ms> <exit_code>` as it ends.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use gpuctl_proto as pb;

/// The most of the file the agent reads.
const MAX_READ: u64 = 1 << 20;

/// The step file of a job's attempt.
pub fn path(state_dir: &Path, job: u64, attempt: u32) -> PathBuf {
    state_dir
        .join("scripts")
        .join(format!("job-{job}.{attempt}.steps"))
}

/// Makes the (empty) step file, the job user's (`uid`/`gid`; `None`: the agent's own).
pub fn create(path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    make(path, owner)
}

/// The step file of a running job, made now if its launch made none (a `command` job
/// of one task, whose first step comes from outside: `agent::remote`); one that exists
/// is kept as it is (steps may be running).
pub fn ensure(path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    match make(path, owner) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        r => r,
    }
}

fn make(path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if let Some(dir) = path.parent() {
        // As for scripts: its users pass through, only root lists it.
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    if let Some((uid, gid)) = owner {
        nix::unistd::fchown(
            &f,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )?;
    }
    Ok(())
}

/// The steps the file records (none when it is missing or unreadable).
pub fn read(path: &Path) -> Vec<pb::Step> {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
    else {
        return Vec::new();
    };
    let regular = f.metadata().is_ok_and(|m| m.is_file());
    let mut text = String::new();
    if !regular || f.take(MAX_READ).read_to_string(&mut text).is_err() {
        return Vec::new();
    }
    parse(&text)
}

/// The steps of a step file's text: begun ones, with their ends where written.
pub fn parse(text: &str) -> Vec<pb::Step> {
    let mut steps: Vec<pb::Step> = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(5, ' ');
        let kind = f.next();
        let id = f.next().and_then(|v| v.parse::<u32>().ok());
        let (Some(kind), Some(id)) = (kind, id) else {
            continue;
        };
        match kind {
            "B" if steps.len() < pb::Step::MAX_PER_JOB && !steps.iter().any(|s| s.id == id) => {
                let start_ms = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                let tasks = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                steps.push(pb::Step {
                    id,
                    name: pb::Step::clean_name(f.next().unwrap_or("")),
                    start_ms,
                    tasks,
                    ..pb::Step::default()
                });
            }
            "E" => {
                let end = f.next().and_then(|v| v.parse::<i64>().ok());
                let exit = f.next().and_then(|v| v.parse::<i32>().ok());
                if let (Some(s), Some(end), Some(exit)) =
                    (steps.iter_mut().find(|s| s.id == id), end, exit)
                {
                    s.end_ms = end;
                    s.exit_code = Some(exit);
                }
            }
            _ => {}
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two steps, one ended; lines the agent does not understand (or a second begin of
    /// an id) are passed over.
    #[test]
    fn the_file_gives_begun_steps_and_their_ends() {
        let text = "B 0 100 2 python train.py --lr 1\nE 0 250 0\nB 1 300 2 srun\tx\ngarbage\nB 0 1 1 again\nE 7 1 1\nE 1 oops 3\n";
        let steps = parse(text);
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].name, "python train.py --lr 1");
        assert_eq!(
            (
                steps[0].start_ms,
                steps[0].end_ms,
                steps[0].exit_code,
                steps[0].tasks
            ),
            (100, 250, Some(0), 2)
        );
        assert_eq!(steps[1].name, "srun x");
        assert_eq!((steps[1].end_ms, steps[1].exit_code), (0, None));
    }

    /// The agent reads a regular file only, never through a link or from a FIFO.
    #[test]
    fn only_a_regular_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::write(&real, "B 0 1 1 x\n").unwrap();
        assert_eq!(read(&real).len(), 1);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(read(&link).is_empty());
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(read(&fifo).is_empty());
        assert!(read(&dir.path().join("missing")).is_empty());
    }

    /// `ensure` makes a missing file and keeps one that has steps in it; `create`
    /// starts it empty (a new attempt).
    #[test]
    fn ensure_keeps_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("scripts").join("job-1.1.steps");
        ensure(&p, None).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "");
        std::fs::write(&p, "B 0 1 1 x\n").unwrap();
        ensure(&p, None).unwrap();
        assert_eq!(read(&p).len(), 1);
        create(&p, None).unwrap();
        assert!(read(&p).is_empty());
    }
}
