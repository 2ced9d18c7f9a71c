//! Starting and stopping job processes.
//!
//! What a job sees (environment, output paths) is computed by pure functions
//! (`job_env`, `output_path`) that are unit-tested. Processes start through the
//! `Launcher` trait; `ProcessGroupLauncher` puts each job in its own process group so
//! the whole tree can be signalled.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use gpuctl_proto as pb;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Child;

/// PATH for jobs when the agent has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The environment a job runs with: a clean base, the job file's `env`, then the
/// variables gpuctl owns (these win). A pure function of the StartJob.
pub fn job_env(start: &pb::StartJob, node: &str, path: Option<&str>) -> BTreeMap<String, String> {
    let job_id = start.job_id;
    let default_spec = pb::JobSpec::default();
    let spec = start.spec.as_ref().unwrap_or(&default_spec);
    let gpus: Vec<String> = if start.slots.is_empty() {
        start.gpus.clone()
    } else {
        start.slots.iter().map(|s| s.uuid.clone()).collect()
    };
    let mut env = BTreeMap::new();
    env.insert("PATH".to_string(), path.unwrap_or(DEFAULT_PATH).to_string());
    if !spec.user.is_empty() {
        env.insert("USER".into(), spec.user.clone());
        env.insert("LOGNAME".into(), spec.user.clone());
    }
    for (k, v) in &spec.env {
        env.insert(k.clone(), v.clone());
    }
    // An empty list hides every GPU from a job that asked for none.
    env.insert("CUDA_VISIBLE_DEVICES".into(), gpus.join(","));
    env.insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
    env.insert("GPUCTL_JOB_ID".into(), job_id.to_string());
    env.insert("GPUCTL_JOB_ATTEMPT".into(), start.attempt.to_string());
    env.insert("GPUCTL_JOB_NAME".into(), spec.name.clone());
    env.insert("GPUCTL_NODE".into(), node.to_string());
    env.insert("GPUCTL_GPUS".into(), gpus.len().to_string());
    env.insert("GPUCTL_SUBMIT_DIR".into(), spec.workdir.clone());
    // A fractional share: limits for CUDA MPS clients.
    if let Some(s) = start.slots.iter().find(|s| s.compute_milli < 1000) {
        env.insert(
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
            s.compute_milli.div_ceil(10).max(1).to_string(),
        );
        env.insert(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(),
            format!("0={}M", s.memory_mib),
        );
        env.insert("GPUCTL_GPU_SHARE_MILLI".into(), s.compute_milli.to_string());
        env.insert("GPUCTL_GPU_MEMORY_MIB".into(), s.memory_mib.to_string());
    }
    // Multi-node: who is who.
    let nodelist = if start.nodelist.is_empty() {
        vec![node.to_string()]
    } else {
        start.nodelist.clone()
    };
    env.insert("GPUCTL_NODELIST".into(), nodelist.join(","));
    env.insert("GPUCTL_NUM_NODES".into(), nodelist.len().to_string());
    env.insert("GPUCTL_NODE_RANK".into(), start.rank.to_string());
    env.insert("MASTER_ADDR".into(), nodelist[0].clone());
    env.insert("MASTER_PORT".into(), (20_000 + job_id % 10_000).to_string());
    env
}

/// Expands `%j` (job id), `%x` (job name) and `%%` in an output file name, and resolves
/// a relative name against the workdir. An empty template gives `gpuctl-%j.out`.
pub fn output_path(template: &str, job_id: u64, name: &str, workdir: &Path) -> PathBuf {
    let template = if template.is_empty() {
        "gpuctl-%j.out"
    } else {
        template
    };
    let mut out = String::new();
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('j') => out.push_str(&job_id.to_string()),
            Some('x') => out.push_str(name),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    workdir.join(out)
}

/// Everything needed to start one job's process.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub job_id: u64,
    /// Which start of the job (a requeued job starts again with the next number).
    pub attempt: u32,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub workdir: PathBuf,
    pub env: BTreeMap<String, String>,
    pub stdout: PathBuf,
    /// `None`: stderr goes to the stdout file (Slurm's default).
    pub stderr: Option<PathBuf>,
    /// The user to become; `None`: stay the agent's user.
    pub run_as: Option<RunAs>,
    pub limits: crate::cgroup::Limits,
    /// Run the program under `gpud __shim` (this executable), which writes the job's
    /// wait status to this file when it ends (see `shim`).
    pub shim: Option<(PathBuf, PathBuf)>,
}

/// A user the job runs as, resolved on the node from the passwd database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: PathBuf,
}

/// Who a job runs as: the submitting user, looked up on this node. Root only when
/// `allow_root`; an agent that is not root can only run jobs as itself.
pub fn resolve_user(name: &str, allow_root: bool) -> Result<Option<RunAs>, String> {
    use nix::unistd::{Uid, User, geteuid, getgrouplist};
    let user = User::from_name(name)
        .map_err(|e| format!("cannot look up user {name:?}: {e}"))?
        .ok_or_else(|| format!("user {name:?} does not exist on this node"))?;
    if user.uid.is_root() && !allow_root {
        return Err(
            "refusing to run a job as root (start gpud with --allow-root-jobs to allow it)".into(),
        );
    }
    let me = geteuid();
    if !me.is_root() {
        if user.uid == me {
            return Ok(None);
        }
        return Err(format!(
            "gpud runs as uid {me} and cannot start jobs as {name} (uid {}); run gpud as root",
            user.uid
        ));
    }
    if user.uid == Uid::from_raw(0) {
        return Ok(None);
    }
    let cname = std::ffi::CString::new(name).map_err(|_| "bad user name".to_string())?;
    let groups = getgrouplist(&cname, user.gid)
        .map_err(|e| format!("cannot read the groups of {name}: {e}"))?
        .into_iter()
        .map(|g| g.as_raw())
        .collect();
    Ok(Some(RunAs {
        name: user.name,
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
        groups,
        home: user.dir,
    }))
}

impl LaunchSpec {
    /// The job's cgroup directory name: `job-<id>`, `job-<id>.<attempt>` after a requeue.
    pub fn cgroup_leaf(&self) -> String {
        if self.attempt > 1 {
            format!("job-{}.{}", self.job_id, self.attempt)
        } else {
            format!("job-{}", self.job_id)
        }
    }

    /// Builds the launch from a StartJob. A `script` is written to `scratch` first.
    pub fn from_start(
        start: &pb::StartJob,
        node: &str,
        scratch: &Path,
        run_as: Option<RunAs>,
    ) -> std::io::Result<LaunchSpec> {
        let spec = start.spec.clone().unwrap_or_default();
        let workdir = PathBuf::from(&spec.workdir);
        let (program, args) = if let Some((prog, rest)) = spec.command.split_first() {
            (PathBuf::from(prog), rest.to_vec())
        } else {
            std::fs::create_dir_all(scratch)?;
            let path = scratch.join(format!("job-{}.{}.sh", start.job_id, start.attempt));
            std::fs::write(&path, &spec.script)?;
            use std::os::unix::fs::PermissionsExt;
            // Readable (and for #! scripts executable) by the job's user, written by root.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
            if spec.script.starts_with("#!") {
                (path, Vec::new())
            } else {
                (PathBuf::from("/bin/sh"), vec![path.display().to_string()])
            }
        };
        let stdout = output_path(&spec.stdout, start.job_id, &spec.name, &workdir);
        let stderr = (!spec.stderr.is_empty())
            .then(|| output_path(&spec.stderr, start.job_id, &spec.name, &workdir))
            .filter(|p| p != &stdout);
        let path = std::env::var("PATH").ok();
        let mut env = job_env(start, node, path.as_deref());
        if let Some(u) = &run_as {
            env.insert("HOME".into(), u.home.display().to_string());
            env.insert("USER".into(), u.name.clone());
            env.insert("LOGNAME".into(), u.name.clone());
        }
        let res = spec.resources.unwrap_or_default();
        Ok(LaunchSpec {
            job_id: start.job_id,
            attempt: start.attempt,
            program,
            args,
            env,
            workdir,
            stdout,
            stderr,
            run_as,
            shim: None,
            limits: crate::cgroup::Limits {
                cpu_milli: res.cpus.saturating_mul(1000),
                memory_bytes: res.memory_bytes,
                pids: 8192,
            },
        })
    }
}

/// A started job: its first process, and the cgroup holding everything it starts.
pub struct Launched {
    /// The process the agent started; `None` for a job adopted after an agent restart.
    pub child: Option<Child>,
    pub cgroup: Option<crate::cgroup::JobCgroup>,
    pid: Option<u32>,
    /// Where the shim writes the job's wait status.
    status_file: Option<PathBuf>,
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

impl Launched {
    /// A job whose shim is `pid` (started by an earlier agent process).
    pub fn adopt(
        pid: u32,
        cgroup: Option<crate::cgroup::JobCgroup>,
        status_file: PathBuf,
    ) -> Launched {
        Launched {
            child: None,
            cgroup,
            pid: Some(pid),
            status_file: Some(status_file),
        }
    }

    pub fn id(&self) -> Option<u32> {
        self.pid
    }

    /// Waits for the job to end. For an adopted job: polls the pid, then reads the
    /// status the shim left.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        if let Some(child) = &mut self.child {
            return child.wait().await;
        }
        let pid = self.pid.unwrap_or(0);
        let start = proc_start(pid).map(|x| x.1);
        while start.is_some_and(|t| alive(pid, t)) {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.recorded_status().ok_or_else(|| {
            std::io::Error::other("the job ended while its agent was down and left no exit status")
        })
    }

    /// Why the shim could not start the program, if it could not.
    pub fn launch_error(&self) -> Option<String> {
        self.status_file
            .as_deref()
            .and_then(crate::shim::read_launch_error)
    }

    /// The status the shim wrote, if it did.
    pub fn recorded_status(&self) -> Option<std::process::ExitStatus> {
        self.status_file
            .as_deref()
            .and_then(crate::shim::read_status)
    }

    /// Sends `sig` to everything the job started: its process group and its cgroup.
    pub fn signal(&self, sig: Signal) {
        if let Some(pid) = self.pid {
            let _ = killpg(Pid::from_raw(pid as i32), sig);
        }
        if let Some(cg) = &self.cgroup {
            cg.signal(sig);
        }
    }

    pub fn oom_killed(&self) -> bool {
        self.cgroup.as_ref().is_some_and(|c| c.oom_killed())
    }

    /// Kills whatever is left and removes the cgroup.
    pub fn cleanup(&self) {
        self.signal(Signal::SIGKILL);
        if let Some(cg) = &self.cgroup {
            cg.destroy();
        }
    }
}

/// Starts job processes.
pub trait Launcher: Send + Sync {
    fn spawn(&self, spec: &LaunchSpec) -> std::io::Result<Launched>;
}

/// Each job leads its own process group and, where the host allows, lives in its own
/// cgroup with its CPU, memory and pid limits. It becomes its user before exec and
/// opens its output files as that user.
pub struct JobLauncher {
    pub cgroups: crate::cgroup::Mode,
    /// Jobs go to `<parent>/job-<id>` in each hierarchy.
    pub parent: String,
}

fn cstr(p: &Path) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path with a NUL byte"))
}

impl Launcher for JobLauncher {
    fn spawn(&self, spec: &LaunchSpec) -> std::io::Result<Launched> {
        use std::os::unix::process::CommandExt;
        let cgroup = match self
            .cgroups
            .create(&self.parent, &spec.cgroup_leaf(), spec.limits)
        {
            Ok(cg) if !cg.is_empty() => Some(cg),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(job = spec.job_id, "cannot create the job's cgroup: {e}");
                None
            }
        };
        let procs = cgroup
            .as_ref()
            .map(|c| c.open_procs())
            .transpose()?
            .unwrap_or_default();
        let fds = crate::cgroup::raw_fds(&procs);
        let out = cstr(&spec.stdout)?;
        let err = spec.stderr.as_deref().map(cstr).transpose()?;
        let status = spec
            .shim
            .as_ref()
            .map(|(_, status)| cstr(status))
            .transpose()?;
        let run_as = spec.run_as.clone();
        let mut cmd = match &spec.shim {
            Some((exe, _)) => {
                let mut c = std::process::Command::new(exe);
                c.arg(crate::shim::ARG).arg(&spec.program);
                c
            }
            None => std::process::Command::new(&spec.program),
        };
        cmd.args(&spec.args)
            .current_dir(&spec.workdir)
            .env_clear()
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
        // system calls (write, setgroups, setgid, setuid, open, dup2, close) on data
        // prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                crate::cgroup::enter(&fds)?;
                // The shim's status file, opened as the agent (root) before dropping to
                // the job's user, handed over as fd 3.
                if let Some(st) = &status {
                    let fd = nix::libc::open(
                        st.as_ptr(),
                        nix::libc::O_WRONLY | nix::libc::O_CREAT | nix::libc::O_TRUNC,
                        0o600,
                    );
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if fd != crate::shim::STATUS_FD {
                        nix::libc::dup2(fd, crate::shim::STATUS_FD);
                        nix::libc::close(fd);
                    }
                }
                if let Some(u) = &run_as {
                    let groups: Vec<nix::unistd::Gid> = u
                        .groups
                        .iter()
                        .map(|g| nix::unistd::Gid::from_raw(*g))
                        .collect();
                    nix::unistd::setgroups(&groups)?;
                    nix::unistd::setgid(nix::unistd::Gid::from_raw(u.gid))?;
                    nix::unistd::setuid(nix::unistd::Uid::from_raw(u.uid))?;
                }
                let open = |p: &std::ffi::CString| {
                    let fd = nix::libc::open(
                        p.as_ptr(),
                        nix::libc::O_WRONLY
                            | nix::libc::O_CREAT
                            | nix::libc::O_TRUNC
                            | nix::libc::O_NOFOLLOW,
                        0o644,
                    );
                    if fd < 0 {
                        Err(std::io::Error::last_os_error())
                    } else {
                        Ok(fd)
                    }
                };
                let o = open(&out)?;
                nix::libc::dup2(o, 1);
                match &err {
                    Some(e) => {
                        let f = open(e)?;
                        nix::libc::dup2(f, 2);
                        nix::libc::close(f);
                    }
                    None => {
                        nix::libc::dup2(o, 2);
                    }
                }
                nix::libc::close(o);
                Ok(())
            });
        }
        let who = spec
            .run_as
            .as_ref()
            .map_or("the agent's user".to_string(), |u| u.name.clone());
        let child = tokio::process::Command::from(cmd)
            .kill_on_drop(false)
            .spawn()
            .map_err(|e| {
                if let Some(cg) = &cgroup {
                    cg.destroy();
                }
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot run {} as {who} in {} with output to {}: {e}",
                        spec.program.display(),
                        spec.workdir.display(),
                        spec.stdout.display()
                    ),
                )
            })?;
        drop(procs);
        let pid = child.id();
        Ok(Launched {
            child: Some(child),
            cgroup,
            pid,
            status_file: spec.shim.as_ref().map(|s| s.1.clone()),
        })
    }
}

/// SIGTERM, wait up to `grace`, then SIGKILL; returns once the main process is reaped.
pub async fn terminate(
    job: &mut Launched,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    job.signal(Signal::SIGTERM);
    match tokio::time::timeout(grace, job.wait()).await {
        Ok(status) => status,
        Err(_) => {
            job.signal(Signal::SIGKILL);
            job.wait().await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> pb::JobSpec {
        pb::JobSpec {
            name: "train".into(),
            command: vec!["python".into()],
            workdir: "/home/u".into(),
            user: "u".into(),
            env: [
                ("FOO".to_string(), "bar".to_string()),
                ("CUDA_VISIBLE_DEVICES".to_string(), "0".to_string()),
            ]
            .into_iter()
            .collect(),
            ..pb::JobSpec::default()
        }
    }

    fn start(slots: &[(&str, u32, u64)]) -> pb::StartJob {
        pb::StartJob {
            job_id: 7,
            spec: Some(spec()),
            gpus: slots.iter().map(|s| s.0.to_string()).collect(),
            slots: slots
                .iter()
                .map(|&(u, c, m)| pb::SlotUse {
                    uuid: u.into(),
                    compute_milli: c,
                    memory_mib: m,
                })
                .collect(),
            ..pb::StartJob::default()
        }
    }

    #[test]
    fn env_for_several_gpus() {
        let env = job_env(
            &start(&[("GPU-a", 1000, 81920), ("GPU-b", 1000, 81920)]),
            "node1",
            Some("/bin"),
        );
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
        assert_eq!(env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
        assert_eq!(env["GPUCTL_JOB_ID"], "7");
        assert_eq!(env["GPUCTL_NODE"], "node1");
        assert_eq!(env["GPUCTL_GPUS"], "2");
        assert_eq!(env["FOO"], "bar");
        assert_eq!(env["PATH"], "/bin");
        assert_eq!(env["USER"], "u");
        assert_eq!(env["GPUCTL_NUM_NODES"], "1");
        assert_eq!(env["MASTER_ADDR"], "node1");
        assert!(!env.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    }

    #[test]
    fn env_for_one_and_no_gpu() {
        let env = job_env(&start(&[("GPU-a", 1000, 81920)]), "n", None);
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-a");
        assert_eq!(env["PATH"], DEFAULT_PATH);
        // A job without GPUs sees none, whatever its env says.
        let env = job_env(&start(&[]), "n", None);
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "");
        assert_eq!(env["GPUCTL_GPUS"], "0");
    }

    #[test]
    fn env_for_mig_and_share() {
        let env = job_env(&start(&[("MIG-x", 1000, 40960)]), "n", None);
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "MIG-x");
        assert!(!env.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
        let env = job_env(&start(&[("GPU-a", 250, 20480)]), "n", None);
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-a");
        assert_eq!(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
        assert_eq!(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=20480M");
        assert_eq!(env["GPUCTL_GPU_SHARE_MILLI"], "250");
    }

    #[test]
    fn env_for_gang_ranks() {
        let mut s = start(&[("GPU-a", 1000, 81920)]);
        s.rank = 1;
        s.nodelist = vec!["n1".into(), "n2".into()];
        let env = job_env(&s, "n2", None);
        assert_eq!(env["GPUCTL_NODELIST"], "n1,n2");
        assert_eq!(env["GPUCTL_NODE_RANK"], "1");
        assert_eq!(env["GPUCTL_NUM_NODES"], "2");
        assert_eq!(env["MASTER_ADDR"], "n1");
        assert_eq!(env["MASTER_PORT"], "20007");
    }

    #[test]
    fn output_paths_expand() {
        let wd = Path::new("/w");
        assert_eq!(
            output_path("", 5, "x", wd),
            PathBuf::from("/w/gpuctl-5.out")
        );
        assert_eq!(
            output_path("%x-%j.log", 5, "t", wd),
            PathBuf::from("/w/t-5.log")
        );
        assert_eq!(
            output_path("/abs/%j%%", 5, "t", wd),
            PathBuf::from("/abs/5%")
        );
        assert_eq!(output_path("a%q%", 5, "t", wd), PathBuf::from("/w/a%q%"));
    }

    #[test]
    fn stderr_defaults_to_stdout_file() {
        let start = pb::StartJob {
            job_id: 3,
            spec: Some(spec()),
            ..pb::StartJob::default()
        };
        let l = LaunchSpec::from_start(&start, "n", Path::new("/tmp"), None).unwrap();
        assert_eq!(l.limits.pids, 8192);
        assert_eq!(l.stdout, PathBuf::from("/home/u/gpuctl-3.out"));
        assert_eq!(l.stderr, None);
        assert_eq!(l.program, PathBuf::from("python"));
    }
}
