//! Job cgroups: cgroup v2 first, v1 (and hybrid) where that is what the host has, and
//! nothing (with one warning) where neither is writable.
//!
//! Each job gets `<root>/gpuctl/job-<id>` with its CPU quota, memory limit and pid limit.
//! On cgroup v2 the job's first process is created inside its cgroup (`clone3` with
//! `CLONE_INTO_CGROUP`, see `forkserver`) and never moved; each v1 hierarchy it joins
//! before it execs (it writes "0" to that hierarchy's `cgroup.procs`), so everything it
//! starts is inside.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// What the host offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The unified hierarchy, with those of the cpu, memory and pids controllers that
    /// its root offers (a limit whose controller is missing is not applied: the agent
    /// says so at start).
    V2 {
        root: PathBuf,
        controllers: Controllers,
    },
    /// Per-controller hierarchies; `unified` is a controller-less cgroup2 mount (hybrid)
    /// used for `cgroup.kill` when present.
    V1 {
        cpu: Option<PathBuf>,
        memory: Option<PathBuf>,
        pids: Option<PathBuf>,
        /// The `devices` controller: GPU isolation (see `devices`).
        devices: Option<PathBuf>,
        unified: Option<PathBuf>,
    },
    None,
}

/// The limit controllers a cgroup2 root offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Controllers {
    pub cpu: bool,
    pub memory: bool,
    pub pids: bool,
}

impl Controllers {
    /// From a `cgroup.controllers` file's text.
    fn parse(text: &str) -> Controllers {
        let has = |c: &str| text.split_whitespace().any(|x| x == c);
        Controllers {
            cpu: has("cpu"),
            memory: has("memory"),
            pids: has("pids"),
        }
    }

    /// The names of those missing.
    pub fn missing(&self) -> Vec<&'static str> {
        [
            ("cpu", self.cpu),
            ("memory", self.memory),
            ("pids", self.pids),
        ]
        .into_iter()
        .filter(|(_, on)| !on)
        .map(|(name, _)| name)
        .collect()
    }

    /// `cgroup.subtree_control`'s line that enables them below a level.
    fn enable_line(&self) -> String {
        [
            ("+cpu", self.cpu),
            ("+memory", self.memory),
            ("+pids", self.pids),
        ]
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(c, _)| c)
        .collect::<Vec<_>>()
        .join(" ")
    }
}

/// Whether moving a process into a cgroup is cheap here: without `favordynmods` on a
/// cgroup2 mount, the kernel waits for an RCU grace period on the first migration of a
/// burst (10-50 ms measured per job launch on this project's hosts; docs/benchmarks.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Migration {
    /// `favordynmods` is on (set by the kernel's `cgroup_favordynmods=true`, the mount,
    /// or `gpud --cgroup-favordynmods`).
    Fast,
    /// Off, on the cgroup2 mount at this path (where it could be turned on).
    Slow(PathBuf),
    /// No cgroup2 mount to set it on (pure v1 or no cgroups): nothing to do.
    Unknown,
    /// Pure cgroup v2 on Linux 5.7+: jobs are created in their cgroup, never moved.
    Created,
}

/// Whether this kernel's release (`uname -r`) has clone3's `CLONE_INTO_CGROUP` (5.7).
pub fn clone_into_cgroup(release: &str) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (5, 7)
}

/// The options of the mount at `path` in `/proc/mounts` text: (fs type, options).
fn mount_options<'a>(mounts: &'a str, path: &Path) -> Option<(&'a str, Vec<&'a str>)> {
    let want = path.to_str()?;
    // The last mount at a path is the one in effect.
    mounts.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 4 && f[1] == want).then(|| (f[2], f[3].split(',').collect()))
    })
}

/// Mount flags among mount options (the rest are the filesystem's own).
fn vfs_flag(opt: &str) -> Option<nix::mount::MsFlags> {
    use nix::mount::MsFlags;
    Some(match opt {
        "ro" => MsFlags::MS_RDONLY,
        "rw" => MsFlags::empty(),
        "nosuid" => MsFlags::MS_NOSUID,
        "nodev" => MsFlags::MS_NODEV,
        "noexec" => MsFlags::MS_NOEXEC,
        "relatime" => MsFlags::MS_RELATIME,
        "noatime" => MsFlags::MS_NOATIME,
        "nodiratime" => MsFlags::MS_NODIRATIME,
        "strictatime" => MsFlags::MS_STRICTATIME,
        _ => return None,
    })
}

impl Mode {
    /// The cgroup2 mount whose `favordynmods` decides migration cost.
    fn cgroup2_mount(&self) -> Option<&Path> {
        match self {
            Mode::V2 { root, .. } => Some(root),
            Mode::V1 { unified, .. } => unified.as_deref(),
            Mode::None => None,
        }
    }

    /// Whether migrations are cheap (reads `/proc/mounts`; `mounts` in tests), or not
    /// needed (`release`: the kernel's, `uname -r`).
    pub fn migration(&self, mounts: &str, release: &str) -> Migration {
        if matches!(self, Mode::V2 { .. }) && clone_into_cgroup(release) {
            return Migration::Created;
        }
        let Some(path) = self.cgroup2_mount() else {
            return Migration::Unknown;
        };
        match mount_options(mounts, path) {
            Some((_, opts)) if opts.contains(&"favordynmods") => Migration::Fast,
            Some(("cgroup2", _)) => Migration::Slow(path.to_path_buf()),
            _ => Migration::Unknown,
        }
    }

    /// Turns `favordynmods` on where it is off: remounts the cgroup2 mount with its
    /// current options plus that one (the kernel's flag is global: it makes v1
    /// migrations cheap too). Answers what holds afterwards.
    pub fn favor_dynmods(&self) -> io::Result<Migration> {
        let mounts = fs::read_to_string("/proc/mounts")?;
        let path = match self.migration(&mounts, "") {
            Migration::Slow(path) => path,
            other => return Ok(other),
        };
        let (_, opts) = mount_options(&mounts, &path).expect("found above");
        let mut flags = nix::mount::MsFlags::MS_REMOUNT;
        let mut data: Vec<&str> = Vec::new();
        for o in opts {
            match vfs_flag(o) {
                Some(f) => flags |= f,
                None => data.push(o),
            }
        }
        data.push("favordynmods");
        let data = data.join(",");
        nix::mount::mount(
            None::<&str>,
            &path,
            None::<&str>,
            flags,
            Some(data.as_str()),
        )
        .map_err(io::Error::from)?;
        Ok(self.migration(&fs::read_to_string("/proc/mounts")?, ""))
    }
}

/// Limits applied to a job's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// CPUs (1000 = one CPU); 0 = no quota.
    pub cpu_milli: u32,
    /// Bytes; 0 = no limit.
    pub memory_bytes: u64,
    pub pids: u32,
}

/// `cpu.max` (v2) for a CPU quota: "<quota> <period>" in microseconds.
pub fn cpu_max(cpu_milli: u32) -> String {
    if cpu_milli == 0 {
        "max 100000".into()
    } else {
        format!("{} 100000", u64::from(cpu_milli) * 100)
    }
}

fn writable(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

impl Mode {
    /// Looks at `/sys/fs/cgroup` (or `base`: another cgroup2 mount, or a tree in
    /// tests). A writable cgroup2 root is v2, whichever controllers it offers; else the
    /// v1 hierarchies below `base` (hybrid: with `unified`).
    pub fn detect(base: &Path) -> Mode {
        if let Ok(text) = fs::read_to_string(base.join("cgroup.controllers"))
            && writable(base)
        {
            return Mode::V2 {
                root: base.to_path_buf(),
                controllers: Controllers::parse(&text),
            };
        }
        let dir = |name: &str| {
            let p = base.join(name);
            (p.join("cgroup.procs").exists() && writable(&p)).then_some(p)
        };
        let cpu = dir("cpu").or_else(|| dir("cpu,cpuacct"));
        let memory = dir("memory");
        let pids = dir("pids");
        let devices = dir("devices");
        let unified = dir("unified");
        if cpu.is_none() && memory.is_none() && pids.is_none() {
            return Mode::None;
        }
        Mode::V1 {
            cpu,
            memory,
            pids,
            devices,
            unified,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Mode::V2 { root, controllers } => match controllers.missing() {
                m if m.is_empty() => format!("cgroup v2 at {}", root.display()),
                m => format!(
                    "cgroup v2 at {} (without the {} controller{}: those limits are not applied)",
                    root.display(),
                    m.join(", "),
                    if m.len() > 1 { "s" } else { "" }
                ),
            },
            Mode::V1 {
                cpu,
                memory,
                pids,
                devices,
                unified,
            } => format!(
                "cgroup v1 (cpu: {}, memory: {}, pids: {}, devices: {}, cgroup2: {})",
                cpu.is_some(),
                memory.is_some(),
                pids.is_some(),
                devices.is_some(),
                unified.is_some()
            ),
            Mode::None => "no writable cgroup hierarchy".into(),
        }
    }

    /// Checks that a process can really be moved into a cgroup here (a hierarchy can be
    /// writable and still refuse, e.g. under some container runtimes): starts `true` in a
    /// probe cgroup the way jobs start.
    /// Whether GPU devices can be confined here: attaches an empty rule set (no GPU
    /// open) to a probe cgroup. `Ok(Unavailable)`: no mechanism; `Err`: one refused.
    pub fn verify_devices(&self, parent: &str) -> io::Result<Isolation> {
        if *self == Mode::None {
            return Ok(Isolation::Unavailable);
        }
        let probe = format!("{parent}/probe-dev-{}", std::process::id());
        let limits = Limits {
            cpu_milli: 0,
            memory_bytes: 0,
            pids: 64,
        };
        let cg = self.create(&probe, "job-0", limits)?;
        let rules = crate::devices::DeviceRules::for_slots(&[], [], None);
        let done = cg.constrain_devices(&rules);
        cg.destroy();
        for d in &cg.dirs {
            if let Some(p) = d.parent() {
                let _ = fs::remove_dir(p);
            }
        }
        done
    }

    pub fn verify(&self, parent: &str) -> io::Result<()> {
        use std::os::unix::process::CommandExt;
        if *self == Mode::None {
            return Ok(());
        }
        let probe = format!("{parent}/probe-{}", std::process::id());
        let cg = self.create(
            &probe,
            "job-0",
            Limits {
                cpu_milli: 0,
                memory_bytes: 0,
                pids: 64,
            },
        )?;
        let procs = cg.open_procs()?;
        let fds = raw_fds(&procs);
        let mut cmd = std::process::Command::new("/bin/true");
        // SAFETY: only write(2) on descriptors opened before the fork (see `enter`).
        unsafe {
            cmd.pre_exec(move || enter(&fds));
        }
        let status = cmd.status();
        drop(procs);
        cg.destroy();
        for d in &cg.dirs {
            if let Some(p) = d.parent() {
                let _ = fs::remove_dir(p);
            }
        }
        match status {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(io::Error::other(format!("probe exited with {s}"))),
            Err(e) => Err(e),
        }
    }

    /// The job's existing cgroup(s) `<parent>/<leaf>` (after an agent restart), limits
    /// untouched; `None` when there is none.
    pub fn existing(&self, parent: &str, leaf: &str) -> Option<JobCgroup> {
        let name = format!("{parent}/{leaf}");
        let at = |root: &Path| Some(root.join(&name)).filter(|d| d.is_dir());
        let mut cg = JobCgroup {
            name: name.clone(),
            ..JobCgroup::default()
        };
        match self {
            Mode::None => return None,
            Mode::V2 { root, .. } => {
                let dir = at(root)?;
                cg.v2 = Some(dir.clone());
                cg.dirs.push(dir);
            }
            Mode::V1 {
                cpu,
                memory,
                pids,
                devices,
                unified,
            } => {
                for root in [cpu, pids].into_iter().flatten() {
                    cg.dirs.extend(at(root));
                }
                if let Some(root) = devices {
                    cg.v1_devices = at(root);
                    cg.dirs.extend(cg.v1_devices.clone());
                }
                if let Some(root) = memory {
                    cg.v1_memory = at(root);
                    cg.dirs.extend(cg.v1_memory.clone());
                }
                if let Some(root) = unified {
                    cg.v2 = at(root);
                    cg.dirs.extend(cg.v2.clone());
                }
            }
        }
        (!cg.dirs.is_empty()).then_some(cg)
    }

    /// Creates the job's cgroup(s), `<parent>/<leaf>` in each hierarchy, with `limits`.
    pub fn create(&self, parent: &str, leaf: &str, limits: Limits) -> io::Result<JobCgroup> {
        let name = format!("{parent}/{leaf}");
        // A job's cgroup is this agent's own: one left over from an earlier start is
        // reused only when empty, never joined while another process lives in it (an
        // agent touches only what it created; a kill there must not reach anyone else's).
        let mk = |root: &Path| -> io::Result<PathBuf> {
            let dir = root.join(&name);
            if let Some(p) = dir.parent() {
                fs::create_dir_all(p)?;
            }
            match fs::create_dir(&dir) {
                Ok(()) => Ok(dir),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                    if procs.trim().is_empty() {
                        Ok(dir)
                    } else {
                        Err(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            format!(
                                "cgroup {} already holds processes this job did not start; refusing to share it",
                                dir.display()
                            ),
                        ))
                    }
                }
                Err(e) => Err(e),
            }
        };
        let w = |dir: &Path, file: &str, value: &str| -> io::Result<()> {
            fs::write(dir.join(file), value)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.join(file).display())))
        };
        let mut cg = JobCgroup {
            name: name.clone(),
            ..JobCgroup::default()
        };
        match self {
            Mode::None => {}
            Mode::V2 { root, controllers } => {
                // Controllers must be enabled on every level on the way down.
                let enable = controllers.enable_line();
                let mut level = root.clone();
                if !enable.is_empty() {
                    let _ = fs::write(level.join("cgroup.subtree_control"), &enable);
                }
                for part in Path::new(parent).components() {
                    level.push(part);
                    fs::create_dir_all(&level)?;
                    if !enable.is_empty() {
                        let _ = fs::write(level.join("cgroup.subtree_control"), &enable);
                    }
                }
                let dir = mk(root)?;
                if controllers.cpu {
                    w(&dir, "cpu.max", &cpu_max(limits.cpu_milli))?;
                }
                if controllers.memory && limits.memory_bytes > 0 {
                    w(&dir, "memory.max", &limits.memory_bytes.to_string())?;
                    let _ = fs::write(dir.join("memory.swap.max"), "0");
                }
                if controllers.pids {
                    w(&dir, "pids.max", &limits.pids.to_string())?;
                }
                cg.v2 = Some(dir.clone());
                cg.dirs.push(dir);
            }
            Mode::V1 {
                cpu,
                memory,
                pids,
                devices,
                unified,
            } => {
                if let Some(root) = cpu {
                    let dir = mk(root)?;
                    if limits.cpu_milli > 0 {
                        w(&dir, "cpu.cfs_period_us", "100000")?;
                        w(
                            &dir,
                            "cpu.cfs_quota_us",
                            &(u64::from(limits.cpu_milli) * 100).to_string(),
                        )?;
                    }
                    cg.dirs.push(dir);
                }
                if let Some(root) = memory {
                    let dir = mk(root)?;
                    if limits.memory_bytes > 0 {
                        w(
                            &dir,
                            "memory.limit_in_bytes",
                            &limits.memory_bytes.to_string(),
                        )?;
                        let _ = fs::write(
                            dir.join("memory.memsw.limit_in_bytes"),
                            limits.memory_bytes.to_string(),
                        );
                    }
                    cg.v1_memory = Some(dir.clone());
                    cg.dirs.push(dir);
                }
                if let Some(root) = pids {
                    let dir = mk(root)?;
                    w(&dir, "pids.max", &limits.pids.to_string())?;
                    cg.dirs.push(dir);
                }
                if let Some(root) = devices {
                    let dir = mk(root)?;
                    cg.v1_devices = Some(dir.clone());
                    cg.dirs.push(dir);
                }
                if let Some(root) = unified {
                    let dir = mk(root)?;
                    cg.v2 = Some(dir.clone());
                    cg.dirs.push(dir);
                }
            }
        }
        Ok(cg)
    }
}

/// One job's cgroup directories (one per hierarchy).
#[derive(Debug, Default, Clone)]
pub struct JobCgroup {
    /// `<parent>/<leaf>`, the same below every hierarchy's root.
    pub name: String,
    pub dirs: Vec<PathBuf>,
    /// The cgroup2 directory (for `cgroup.kill` and `memory.events`).
    v2: Option<PathBuf>,
    v1_memory: Option<PathBuf>,
    v1_devices: Option<PathBuf>,
}

/// How a job's GPU devices are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// By the kernel: the cgroup2 device program, the v1 devices controller, or both.
    Enforced,
    /// Nothing here can confine devices (no cgroup2 directory, no v1 devices controller).
    Unavailable,
}

impl JobCgroup {
    /// A cgroup known by name only (unit tests of what maps processes to jobs).
    #[cfg(test)]
    pub fn named_for_tests(name: &str) -> JobCgroup {
        JobCgroup {
            name: name.to_string(),
            ..JobCgroup::default()
        }
    }

    /// Confines the job to `rules`' devices: the cgroup2 device program where the job
    /// has a cgroup2 directory (one `bpf(2)` load and attach, 0.16 ms a launch
    /// measured), else the v1 devices controller (about 255 writes, 0.48 ms). The kernel
    /// checks the program before v1's lists, so one suffices on hybrid hosts. An error
    /// means a mechanism that exists refused: the job must not start.
    pub fn constrain_devices(&self, rules: &crate::devices::DeviceRules) -> io::Result<Isolation> {
        let bpf = match &self.v2 {
            Some(d) => match rules.apply_bpf(d) {
                Ok(()) => return Ok(Isolation::Enforced),
                Err(e) => Some(e),
            },
            None => None,
        };
        match (&self.v1_devices, bpf) {
            (Some(d), bpf) => {
                // Kernels without cgroup BPF (EINVAL/ENOSYS, EPERM in a container) still
                // have v1's controller where it is mounted.
                if let Some(e) = bpf {
                    tracing::debug!("cgroup2 device filter not attached ({e}); v1 devices enforce");
                }
                rules.apply_v1(d)?;
                Ok(Isolation::Enforced)
            }
            (None, Some(e)) => Err(e),
            (None, None) => Ok(Isolation::Unavailable),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    /// The job's cgroup2 directory, where its first process can be created
    /// (`CLONE_INTO_CGROUP`).
    pub fn v2_dir(&self) -> Option<&Path> {
        self.v2.as_deref()
    }

    /// `cgroup.procs` of every hierarchy, opened for the child to write "0" into.
    pub fn open_procs(&self) -> io::Result<Vec<OwnedFd>> {
        self.dirs
            .iter()
            .map(|d| {
                fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("cgroup.procs"))
                    .map(OwnedFd::from)
            })
            .collect()
    }

    /// Pids in the job's cgroup.
    pub fn pids(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self
            .dirs
            .iter()
            .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|s| {
                s.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Sends `sig` to every process of the job; SIGKILL uses `cgroup.kill` where there is one.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if sig == nix::sys::signal::Signal::SIGKILL
            && let Some(d) = &self.v2
            && fs::write(d.join("cgroup.kill"), "1").is_ok()
        {
            return;
        }
        for pid in self.pids() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
        }
    }

    /// Whether the kernel's OOM killer struck inside the job's memory limit.
    pub fn oom_killed(&self) -> bool {
        let count = |text: &str, key: &str| {
            text.lines()
                .find_map(|l| {
                    l.strip_prefix(key)
                        .map(|v| v.trim().parse::<u64>().unwrap_or(0))
                })
                .unwrap_or(0)
        };
        if let Some(d) = &self.v2
            && let Ok(t) = fs::read_to_string(d.join("memory.events"))
            && count(&t, "oom_kill ") > 0
        {
            return true;
        }
        if let Some(d) = &self.v1_memory
            && let Ok(t) = fs::read_to_string(d.join("memory.oom_control"))
        {
            return count(&t, "oom_kill ") > 0;
        }
        false
    }

    /// The job's CPU time (ms) and peak memory (bytes) so far, where the kernel keeps
    /// them: cgroup2's `cpu.stat` (there even without controllers) and `memory.peak`,
    /// or v1's `memory.max_usage_in_bytes`.
    pub fn stats(&self) -> (Option<u64>, Option<u64>) {
        let read = |p: PathBuf| fs::read_to_string(p).ok();
        let cpu = self
            .v2
            .as_ref()
            .and_then(|d| read(d.join("cpu.stat")))
            .and_then(|t| {
                t.lines().find_map(|l| {
                    l.strip_prefix("usage_usec ")
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(|us| us / 1000)
                })
            });
        let number = |t: String| t.trim().parse::<u64>().ok();
        let mem = self
            .v2
            .as_ref()
            .and_then(|d| read(d.join("memory.peak")))
            .and_then(number)
            .or_else(|| {
                let d = self.v1_memory.as_ref()?;
                read(d.join("memory.max_usage_in_bytes")).and_then(number)
            });
        (cpu, mem)
    }

    /// Kills what is left and removes the directories.
    pub fn destroy(&self) {
        crate::devices::revoke(&self.name);
        // The last process usually leaves within a millisecond of its job's end (the
        // shim closes its pipe before the kernel takes it out of the cgroup): waits
        // start short and grow to 20 ms, about a second in all.
        let waits =
            || (0..60).map(|i| std::time::Duration::from_micros((250u64 << i.min(7)).min(20_000)));
        for wait in waits() {
            if self.pids().is_empty() {
                break;
            }
            self.signal(nix::sys::signal::Signal::SIGKILL);
            std::thread::sleep(wait);
        }
        // The kernel may hold a cgroup busy for a moment after its last process exits.
        for d in &self.dirs {
            for wait in waits() {
                match fs::remove_dir(d) {
                    Err(e) if d.exists() && e.raw_os_error() == Some(nix::libc::EBUSY) => {
                        std::thread::sleep(wait);
                    }
                    _ => break,
                }
            }
        }
    }
}

/// In the child, between fork and exec: move this process into the job's cgroups.
/// Async-signal-safe: only write(2) on descriptors opened before the fork.
pub fn enter(fds: &[i32]) -> io::Result<()> {
    for &fd in fds {
        // SAFETY: fd is an open descriptor owned by the parent's OwnedFd, kept alive
        // across the fork; the buffer is a static byte string.
        let n = unsafe { nix::libc::write(fd, b"0".as_ptr().cast(), 1) };
        if n != 1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

pub fn raw_fds(fds: &[OwnedFd]) -> Vec<i32> {
    fds.iter().map(AsRawFd::as_raw_fd).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quota_values() {
        assert_eq!(cpu_max(2000), "200000 100000");
        assert_eq!(cpu_max(500), "50000 100000");
        assert_eq!(cpu_max(0), "max 100000");
    }

    #[test]
    fn migration_cost_from_mount_options() {
        let hybrid = Mode::V1 {
            cpu: Some("/sys/fs/cgroup/cpu".into()),
            memory: None,
            pids: None,
            devices: None,
            unified: Some("/sys/fs/cgroup/unified".into()),
        };
        let slow = "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
                    cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,relatime,nsdelegate 0 0\n";
        assert_eq!(
            hybrid.migration(slow, "6.1.0"),
            Migration::Slow("/sys/fs/cgroup/unified".into())
        );
        let fast = slow.replace("nsdelegate", "nsdelegate,favordynmods");
        assert_eq!(hybrid.migration(&fast, "6.1.0"), Migration::Fast);
        let v2 = Mode::V2 {
            root: "/sys/fs/cgroup".into(),
            controllers: Controllers::parse("cpu memory pids"),
        };
        assert_eq!(
            v2.migration(
                "cgroup2 /sys/fs/cgroup cgroup2 rw,favordynmods 0 0\n",
                "5.4.0"
            ),
            Migration::Fast
        );
        // Pure v2 on 5.7+: nothing is moved at all (created in place).
        assert_eq!(v2.migration(slow, "6.18.44-fc"), Migration::Created);
        assert_eq!(v2.migration(slow, "5.7.0"), Migration::Created);
        assert_eq!(
            hybrid.migration(slow, "6.18.44-fc"),
            Migration::Slow("/sys/fs/cgroup/unified".into())
        );
        assert!(
            !clone_into_cgroup("5.6.19")
                && !clone_into_cgroup("4.19.0-x")
                && !clone_into_cgroup("junk")
        );
        // Pure v1, or the path is not a cgroup2 mount: nothing to turn on.
        let v1 = Mode::V1 {
            cpu: Some("/sys/fs/cgroup/cpu".into()),
            memory: None,
            pids: None,
            devices: None,
            unified: None,
        };
        assert_eq!(v1.migration(slow, "6.1.0"), Migration::Unknown);
        assert_eq!(v2.migration(slow, "5.4.0"), Migration::Unknown);
        let (_, opts) = mount_options(slow, Path::new("/sys/fs/cgroup/unified")).unwrap();
        let fs_own: Vec<&str> = opts.into_iter().filter(|o| vfs_flag(o).is_none()).collect();
        assert_eq!(fs_own, ["nsdelegate"]);
    }

    #[test]
    fn detect_on_fake_trees() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(Mode::detect(t.path()), Mode::None);
        std::fs::write(
            t.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids",
        )
        .unwrap();
        let full = Mode::detect(t.path());
        assert!(matches!(full, Mode::V2 { controllers, .. } if controllers.missing().is_empty()));
        assert!(!full.describe().contains("without"));
        // A cgroup2 root without controllers (a hybrid host's own cgroup2 mount) is still
        // v2: processes are placed and killed there; its limits are said to be missing.
        let bare = tempfile::tempdir().unwrap();
        std::fs::write(bare.path().join("cgroup.controllers"), "").unwrap();
        let mode = Mode::detect(bare.path());
        assert!(
            matches!(mode, Mode::V2 { controllers, .. } if controllers.missing() == ["cpu", "memory", "pids"])
        );
        assert!(
            mode.describe()
                .contains("without the cpu, memory, pids controllers"),
            "{}",
            mode.describe()
        );
        let cg = mode
            .create(
                "gpuctl",
                "job-1",
                Limits {
                    cpu_milli: 1000,
                    memory_bytes: 1 << 30,
                    pids: 10,
                },
            )
            .unwrap();
        assert_eq!(cg.dirs, vec![bare.path().join("gpuctl/job-1")]);
        assert!(!bare.path().join("gpuctl/job-1/memory.max").exists());
        let t = tempfile::tempdir().unwrap();
        for d in ["memory", "cpu", "unified"] {
            std::fs::create_dir(t.path().join(d)).unwrap();
            std::fs::write(t.path().join(d).join("cgroup.procs"), "").unwrap();
        }
        std::fs::write(t.path().join("unified/cgroup.controllers"), "").unwrap();
        let Mode::V1 {
            cpu,
            memory,
            pids,
            devices,
            unified,
        } = Mode::detect(t.path())
        else {
            panic!("expected v1");
        };
        assert!(cpu.is_some() && memory.is_some() && pids.is_none() && unified.is_some());
        assert!(devices.is_none());
    }

    #[test]
    fn v2_limits_are_written() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("cgroup.controllers"), "cpu memory pids").unwrap();
        let mode = Mode::detect(t.path());
        let cg = mode
            .create(
                "gpuctl",
                "job-7",
                Limits {
                    cpu_milli: 1500,
                    memory_bytes: 1 << 30,
                    pids: 100,
                },
            )
            .unwrap();
        let dir = t.path().join("gpuctl/job-7");
        assert_eq!(cg.dirs, vec![dir.clone()]);
        assert_eq!(
            std::fs::read_to_string(dir.join("cpu.max")).unwrap(),
            "150000 100000"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.max")).unwrap(),
            "1073741824"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("pids.max")).unwrap(),
            "100"
        );
    }
}
