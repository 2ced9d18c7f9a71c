//! Facts about processes read from /proc: their process group, their cgroups and when
//! they started. Used by the GPU backends (which group a GPU process belongs to), the
//! monitor (which job a GPU process belongs to) and the job lifecycle (is a recorded job
//! still the same live process).

/// The cgroup paths of `pid`, one per hierarchy (from /proc/PID/cgroup: `0::/a/b` on
/// cgroup2, `N:memory:/a/b` on v1); empty when it is gone.
pub fn cgroups_of(pid: u32) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .map(str::to_string)
        .collect()
}

/// The process group of `pid` (from /proc/PID/stat), if it still exists.
pub fn pgid_of(pid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the ")" closing the command name: state, ppid, pgrp.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// Whether `pid` is a live (not zombie) process that started at `start_ticks`.
pub fn alive(pid: u32, start_ticks: u64) -> bool {
    proc_start(pid).is_some_and(|(state, t)| state != 'Z' && t == start_ticks)
}

/// A process's state letter and start time (clock ticks after boot), from /proc.
pub fn proc_start(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3 of stat, starttime field 22.
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_cgroups_are_read() {
        let ours = cgroups_of(std::process::id());
        assert!(!ours.is_empty(), "every process is in some cgroup");
        assert!(ours.iter().all(|p| p.starts_with('/')), "{ours:?}");
        assert!(cgroups_of(u32::MAX).is_empty());
    }

    #[test]
    fn this_process() {
        let me = std::process::id();
        let (state, start) = proc_start(me).expect("our own /proc entry");
        assert!(matches!(state, 'R' | 'S'), "{state}");
        assert!(alive(me, start));
        assert!(
            !alive(me, start + 1),
            "another start time is another process"
        );
        let pgid = nix::unistd::getpgrp().as_raw();
        assert_eq!(pgid_of(me), Some(pgid));
        assert_eq!(pgid_of(u32::MAX), None);
    }
}
