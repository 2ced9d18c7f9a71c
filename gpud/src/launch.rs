//! Starting and stopping job processes.
//!
//! What a job sees (environment, output paths) is computed by pure functions
//! (`job_env`, `output_path`) that are unit-tested. Processes start through the
//! `Launcher` trait; `JobLauncher` (`launch/job.rs`) starts each job, and each step of
//! a job opened from outside it, through the launch server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuctl_proto as pb;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Child;

/// PATH for jobs: the system's directories, never the agent's own PATH (root's may
/// hold directories the job's user cannot search, which turns a missing program into
/// "Permission denied").
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The environment a job runs with: a login-like base (PATH, LANG, TMPDIR; HOME, SHELL,
/// USER are added for its user by `LaunchSpec::from_start`), the rendezvous variables
/// frameworks read (the job's `env` may override MASTER_ADDR and MASTER_PORT), the job
/// file's `env`, then the variables gpuctl owns (these win). A pure function of the
/// StartJob.
pub fn job_env(start: &pb::StartJob, node: &str, lang: Option<&str>) -> BTreeMap<String, String> {
    let job_id = start.job_id;
    let default_spec = pb::JobSpec::default();
    let spec = start.spec.as_ref().unwrap_or(&default_spec);
    let gpus: Vec<String> = start.slots.iter().map(|s| s.uuid.clone()).collect();
    let mut env = BTreeMap::new();
    env.insert("PATH".to_string(), DEFAULT_PATH.to_string());
    env.insert("LANG".into(), lang.unwrap_or("C.UTF-8").to_string());
    env.insert("TMPDIR".into(), "/tmp".into());
    if !spec.user.is_empty() {
        env.insert("USER".into(), spec.user.clone());
        env.insert("LOGNAME".into(), spec.user.clone());
    }
    // Multi-node: who is who. One process per node, so a node's rank is its rank.
    let nodelist = if start.nodelist.is_empty() {
        vec![node.to_string()]
    } else {
        start.nodelist.clone()
    };
    let master = start
        .addresses
        .first()
        .filter(|a| !a.is_empty())
        .cloned()
        .unwrap_or_else(|| nodelist[0].clone());
    env.insert("MASTER_ADDR".into(), master);
    env.insert("MASTER_PORT".into(), (20_000 + job_id % 10_000).to_string());
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
    if let Some(task) = spec.array_task_id {
        for (k, v) in [
            ("GPUCTL_ARRAY_JOB_ID", spec.array_job_id.to_string()),
            ("GPUCTL_ARRAY_TASK_ID", task.to_string()),
            ("SLURM_ARRAY_JOB_ID", spec.array_job_id.to_string()),
            ("SLURM_ARRAY_TASK_ID", task.to_string()),
        ] {
            env.insert(k.into(), v);
        }
    }
    // A fractional share: limits for CUDA MPS clients. A co-located job's compute is
    // what it is charged, not a cap: it may use what its neighbours leave idle.
    if let Some(s) = start.slots.iter().find(|s| s.compute_milli < 1000) {
        if !spec.colocate {
            env.insert(
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
                s.compute_milli.div_ceil(10).max(1).to_string(),
            );
        }
        env.insert(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(),
            format!("0={}M", s.memory_mib),
        );
        env.insert("GPUCTL_GPU_SHARE_MILLI".into(), s.compute_milli.to_string());
        env.insert("GPUCTL_GPU_MEMORY_MIB".into(), s.memory_mib.to_string());
    }
    // The opportunistic class: it runs in the idle of GPUs other jobs hold. Under MPS
    // its kernels go below the holders' (client priority 1, "below normal"; CUDA 12.3
    // on); its GPU memory is a hard limit, the room the holders' peak leaves.
    if spec.opportunistic {
        env.insert("GPUCTL_OPPORTUNISTIC".into(), "1".into());
        env.insert("CUDA_MPS_CLIENT_PRIORITY".into(), "1".into());
        if let Some(s) = start.slots.iter().find(|s| s.memory_mib > 0) {
            env.insert(
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(),
                format!("0={}M", s.memory_mib),
            );
            env.insert("GPUCTL_GPU_MEMORY_MIB".into(), s.memory_mib.to_string());
        }
    }
    env.insert("GPUCTL_NODELIST".into(), nodelist.join(","));
    env.insert("GPUCTL_NUM_NODES".into(), nodelist.len().to_string());
    env.insert("GPUCTL_NODE_RANK".into(), start.rank.to_string());
    // What torch.distributed and friends read without a launcher.
    env.insert("RANK".into(), start.rank.to_string());
    env.insert("NODE_RANK".into(), start.rank.to_string());
    env.insert("WORLD_SIZE".into(), nodelist.len().to_string());
    env.insert("LOCAL_RANK".into(), "0".into());
    env.insert("LOCAL_WORLD_SIZE".into(), "1".into());
    slurm_env(&mut env, start, spec, &nodelist, gpus.len());
    env.insert("SLURMD_NODENAME".into(), node.to_string());
    env
}

/// `<state-dir>/bin`, holding `srun`: a link to the `gpuctl` installed next to this
/// gpud (`gpuctl run` under the name Slurm scripts call), put first on every job's PATH.
/// `None`, said once, where there is no such gpuctl.
pub fn job_tools(state_dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let gpuctl = std::env::current_exe().ok()?.with_file_name("gpuctl");
    if !gpuctl.is_file() {
        tracing::warn!(
            "no gpuctl next to gpud ({}): jobs find no srun, and jobs with tasks_per_node above 1 cannot start",
            gpuctl.display()
        );
        return None;
    }
    let dir = state_dir.join("bin");
    let made = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)))
        .and_then(|()| {
            let link = dir.join("srun");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&gpuctl, &link)
        });
    match made {
        Ok(()) => Some(dir),
        Err(e) => {
            tracing::warn!("cannot make {}/srun: {e}; jobs find no srun", dir.display());
            None
        }
    }
}

/// The `SLURM_*` variables that scripts written for Slurm read (one task per node).
fn slurm_env(
    env: &mut BTreeMap<String, String>,
    start: &pb::StartJob,
    spec: &pb::JobSpec,
    nodelist: &[String],
    gpus: usize,
) {
    let cpus = spec.resources.as_ref().map_or(1, |r| r.cpus.max(1));
    let tasks = spec
        .resources
        .as_ref()
        .map_or(1, |r| r.tasks_per_node.max(1));
    let ntasks = (nodelist.len() as u32 * tasks).to_string();
    let per_node = if nodelist.len() > 1 {
        format!("{tasks}(x{})", nodelist.len())
    } else {
        tasks.to_string()
    };
    let nodes = nodelist.len().to_string();
    for (k, v) in [
        ("SLURM_JOB_ID", start.job_id.to_string()),
        ("SLURM_JOBID", start.job_id.to_string()),
        ("SLURM_JOB_NAME", spec.name.clone()),
        ("SLURM_JOB_USER", spec.user.clone()),
        ("SLURM_NNODES", nodes.clone()),
        ("SLURM_JOB_NUM_NODES", nodes),
        ("SLURM_NTASKS", ntasks.clone()),
        ("SLURM_NPROCS", ntasks),
        ("SLURM_NTASKS_PER_NODE", tasks.to_string()),
        ("SLURM_TASKS_PER_NODE", per_node),
        ("GPUCTL_TASKS_PER_NODE", tasks.to_string()),
        ("SLURM_NODEID", start.rank.to_string()),
        ("SLURM_PROCID", start.rank.to_string()),
        ("SLURM_LOCALID", "0".into()),
        ("SLURM_JOB_NODELIST", nodelist.join(",")),
        ("SLURM_SUBMIT_DIR", spec.workdir.clone()),
        ("SLURM_CPUS_PER_TASK", (cpus / tasks).max(1).to_string()),
        ("SLURM_GPUS_ON_NODE", gpus.to_string()),
        (
            "SLURM_RESTART_COUNT",
            start.attempt.saturating_sub(1).to_string(),
        ),
        ("SLURM_JOB_PARTITION", spec.partition.clone()),
        ("SLURM_JOB_ACCOUNT", spec.account.clone()),
    ] {
        env.insert(k.into(), v);
    }
    // sbatch sets it from --mem: MiB on each node.
    if let Some(mem) = spec
        .resources
        .as_ref()
        .map(|r| r.memory_bytes)
        .filter(|&m| m > 0)
    {
        env.insert("SLURM_MEM_PER_NODE".into(), (mem >> 20).max(1).to_string());
    }
    // An array task learns its array's shape, as sbatch's tasks do.
    if spec.array_task_id.is_some()
        && let Ok(a) = gpuctl_sched::array::parse(&spec.array, usize::MAX)
    {
        let (min, max) = (a.tasks.iter().min(), a.tasks.iter().max());
        if let (Some(min), Some(max)) = (min, max) {
            env.insert("SLURM_ARRAY_TASK_COUNT".into(), a.tasks.len().to_string());
            env.insert("SLURM_ARRAY_TASK_MIN".into(), min.to_string());
            env.insert("SLURM_ARRAY_TASK_MAX".into(), max.to_string());
        }
    }
}

/// Where one rank's output goes.
#[derive(Debug, Clone, Copy)]
pub struct OutputVars<'a> {
    pub job_id: u64,
    pub name: &'a str,
    /// Who submitted it (`%u`).
    pub user: &'a str,
    pub node: &'a str,
    pub rank: u32,
    /// Ranks in the job (1 for a one-node job).
    pub ranks: usize,
    /// A task of an array: (array id, task index). Outside an array %A is the job id
    /// and %a is 0.
    pub array: Option<(u64, u32)>,
}

/// A value put into a file name: never a path separator or NUL, never `.` or `..`.
fn file_name_part(v: &str) -> String {
    let cleaned: String = v
        .chars()
        .map(|c| {
            if c == '/' || c == '\0' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if cleaned == "." || cleaned == ".." {
        cleaned.replace('.', "_")
    } else {
        cleaned
    }
}

/// The `%` patterns output paths may use (the controller refuses others at submit).
pub const OUTPUT_PATTERNS: &str = "%j and %J (job id), %x (job name), %u (user), %N (node), %t and %n (rank), %s (step), %A (array id), %a (array task), %%";

/// Expands `%j` (job id), `%x` (job name), `%N` (node), `%t` (rank) and `%%` in an output
/// file name, and resolves a relative name against the workdir. An expanded value never
/// adds a path separator. An empty template gives `gpuctl-%j.out`, and for a job on
/// several nodes `gpuctl-%j.%t.out` (one file per rank). Unknown patterns are kept as
/// they are (the controller refuses them at submit).
pub fn output_path(template: &str, v: &OutputVars<'_>, workdir: &Path) -> PathBuf {
    let template = match template {
        "" if v.ranks > 1 => "gpuctl-%j.%t.out",
        "" => "gpuctl-%j.out",
        t => t,
    };
    let out = gpuctl_proto::text::fill_pattern(template, |p| match p {
        // %J is jobid.stepid in Slurm; the batch script's is the job's id.
        'j' | 'J' => Some(v.job_id.to_string()),
        'x' => Some(file_name_part(v.name)),
        'u' => Some(file_name_part(v.user)),
        'N' => Some(file_name_part(v.node)),
        // The batch script runs once a node: its rank is the node's.
        't' | 'n' => Some(v.rank.to_string()),
        's' => Some("batch".into()),
        'A' => Some(v.array.map_or(v.job_id, |a| a.0).to_string()),
        'a' => Some(v.array.map_or(0, |a| a.1).to_string()),
        _ => None,
    });
    workdir.join(out)
}

/// Whether every rank of a gang job writes the same file (no `%t` or `%N`): then they
/// all append to it, so that no rank truncates another's lines.
pub fn shared_output(template: &str, ranks: usize) -> bool {
    ranks > 1 && !template.is_empty() && !template.contains("%t") && !template.contains("%N")
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
    /// Open outputs for appending (ranks of a gang job sharing one file, attempts of a
    /// requeued job), not truncated.
    pub append: bool,
    /// The script file written for the job (removed when it ends).
    pub script: Option<PathBuf>,
    /// The user to become; `None`: stay the agent's user.
    pub run_as: Option<RunAs>,
    pub limits: crate::cgroup::Limits,
    /// Where the job's shim writes its wait status when it ends (see `shim`).
    pub status_file: Option<PathBuf>,
    /// The GPU device nodes the job may open (`None`: the agent does not confine).
    pub devices: Option<crate::devices::DeviceRules>,
    /// The job's tasks on this node (`Resources.tasks_per_node`, at least 1).
    pub tasks_per_node: u32,
    /// A line written to its output before the program starts: a requeued job's later
    /// attempts append to the first's output, each marked (`attempt_banner`).
    pub banner: Option<String>,
}

/// A user the job runs as, resolved on the node from the passwd database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: PathBuf,
    pub shell: PathBuf,
}

/// Who a job runs as: the submitting user, looked up on this node. Root only when
/// `allow_root`; an agent that is not root can only run jobs as itself.
/// A launch refused for a reason of the node's own (its options, its users), not of the
/// job's: the controller requeues the job and drains the node.
#[derive(Debug)]
pub struct NodeFault(pub String);

impl std::fmt::Display for NodeFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NodeFault {}

impl NodeFault {
    /// The node's reason in `e`, if it is one.
    pub fn of(e: &std::io::Error) -> Option<&NodeFault> {
        e.get_ref().and_then(|i| i.downcast_ref::<NodeFault>())
    }
}

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
        shell: user.shell,
    }))
}

impl LaunchSpec {
    /// Puts `tools` (`job_tools`: `srun`) first on the job's PATH. A job `command` with
    /// more than one task a node is started through that `srun` (`gpuctl run`), which
    /// starts its tasks; a script starts them itself, with `srun`.
    pub fn with_tools(mut self, tools: Option<&Path>) -> std::io::Result<LaunchSpec> {
        if let Some(dir) = tools {
            let path = self.env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
            let path = format!("{}:{path}", dir.display());
            self.env.insert("PATH".into(), path);
        }
        if self.tasks_per_node > 1 && self.script.is_none() {
            let Some(dir) = tools else {
                return Err(std::io::Error::other(
                    "the job has tasks_per_node above 1, and this node has no gpuctl next to gpud to start them with",
                ));
            };
            let program = std::mem::replace(&mut self.program, dir.join("srun"));
            let mut args = vec!["--".to_string(), program.display().to_string()];
            args.append(&mut self.args);
            self.args = args;
        }
        Ok(self)
    }

    /// The job's cgroup directory name: `job-<id>`, `job-<id>.<attempt>` after a requeue.
    pub fn cgroup_leaf(&self) -> String {
        if self.attempt > 1 {
            format!("job-{}.{}", self.job_id, self.attempt)
        } else {
            format!("job-{}", self.job_id)
        }
    }

    /// Builds the launch from a StartJob. A `script` is written to `scratch` first,
    /// readable by the job's user alone (scratch itself lists for nobody but root).
    pub fn from_start(
        start: &pb::StartJob,
        node: &str,
        scratch: &Path,
        run_as: Option<RunAs>,
    ) -> std::io::Result<LaunchSpec> {
        let spec = start.spec.clone().unwrap_or_default();
        let workdir = PathBuf::from(&spec.workdir);
        let mut script = None;
        let (program, args) = if spec.interactive {
            // An allocation runs nothing of its own: a holder keeps it until it is
            // released (its steps come from `agent::remote`).
            (PathBuf::from("sleep"), vec!["infinity".to_string()])
        } else if let Some((prog, rest)) = spec.command.split_first() {
            (PathBuf::from(prog), rest.to_vec())
        } else {
            let path = write_script(scratch, start, run_as.as_ref())?;
            script = Some(path.clone());
            if spec.script.starts_with("#!") {
                (path, Vec::new())
            } else {
                (PathBuf::from("/bin/sh"), vec![path.display().to_string()])
            }
        };
        let ranks = start.nodelist.len().max(1);
        let vars = OutputVars {
            job_id: start.job_id,
            name: &spec.name,
            user: &spec.user,
            node,
            rank: start.rank,
            ranks,
            array: spec.array_task_id.map(|t| (spec.array_job_id, t)),
        };
        // An allocation's holder prints nothing: no empty output file is left in the
        // user's directory (its steps write where they are told).
        let stdout = if spec.interactive {
            PathBuf::from("/dev/null")
        } else {
            output_path(&spec.stdout, &vars, &workdir)
        };
        let stderr = (!spec.stderr.is_empty() && !spec.interactive)
            .then(|| output_path(&spec.stderr, &vars, &workdir))
            .filter(|p| p != &stdout);
        // A requeued job's later attempts append: the first attempt's lines stay.
        let append = shared_output(&spec.stdout, ranks)
            || shared_output(&spec.stderr, ranks)
            || start.attempt > 1;
        let env = launch_env(start, node, run_as.as_ref());
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
            append,
            script,
            run_as,
            status_file: None,
            devices: None,
            banner: (start.attempt > 1).then(|| attempt_banner(start, node)),
            // An allocation's holder is one process, whatever its steps' tasks.
            tasks_per_node: if spec.interactive {
                1
            } else {
                res.tasks_per_node.max(1)
            },
            limits: crate::cgroup::Limits {
                cpu_milli: gpuctl_proto::convert::cpu_milli(&res),
                memory_bytes: res.memory_bytes,
                pids: 8192,
            },
        })
    }
}

/// The line that opens a later attempt's part of a requeued job's output (appended to
/// the earlier attempts'), so that a reader sees where each attempt begins.
pub fn attempt_banner(start: &pb::StartJob, node: &str) -> String {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    format!(
        "--- gpuctl: job {}, attempt {}, on {node}, {now} ---\n",
        start.job_id, start.attempt
    )
}

/// A job's environment on this node (`job_env` with its user's login variables; the
/// job's own HOME, SHELL, LANG, TMPDIR or PATH win): what its program and its steps see.
pub fn launch_env(
    start: &pb::StartJob,
    node: &str,
    run_as: Option<&RunAs>,
) -> BTreeMap<String, String> {
    let lang = std::env::var("LANG").ok();
    let mut env = job_env(start, node, lang.as_deref());
    if let Some(u) = run_as {
        env.insert("HOME".into(), u.home.display().to_string());
        env.insert("SHELL".into(), u.shell.display().to_string());
        env.insert("USER".into(), u.name.clone());
        env.insert("LOGNAME".into(), u.name.clone());
    } else if let Ok(Some(me)) = nix::unistd::User::from_uid(nix::unistd::geteuid()) {
        env.entry("HOME".into())
            .or_insert_with(|| me.dir.display().to_string());
        env.entry("SHELL".into())
            .or_insert_with(|| me.shell.display().to_string());
    }
    // The job's own env wins over the login defaults it names.
    for (k, v) in start.spec.iter().flat_map(|s| &s.env) {
        if matches!(k.as_str(), "HOME" | "SHELL" | "LANG" | "TMPDIR" | "PATH") {
            env.insert(k.clone(), v.clone());
        }
    }
    env
}

/// Writes a job's script to `scratch/job-ID.ATTEMPT.sh`: owned by the job's user, mode
/// 0500, in a directory only root lists (0711): the user runs it, nobody else reads it.
fn write_script(
    scratch: &Path,
    start: &pb::StartJob,
    run_as: Option<&RunAs>,
) -> std::io::Result<PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::create_dir_all(scratch)?;
    std::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o711))?;
    let path = scratch.join(format!("job-{}.{}.sh", start.job_id, start.attempt));
    let _ = std::fs::remove_file(&path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o500)
        .open(&path)?;
    let text = start.spec.as_ref().map_or("", |s| s.script.as_str());
    f.write_all(text.as_bytes())?;
    if let Some(u) = run_as {
        nix::unistd::fchown(
            &f,
            Some(nix::unistd::Uid::from_raw(u.uid)),
            Some(nix::unistd::Gid::from_raw(u.gid)),
        )?;
    }
    Ok(path)
}

/// A started job: its first process, and the cgroup holding everything it starts.
pub struct Launched {
    /// The process the agent started itself (launchers other than `JobLauncher`).
    pub child: Option<Child>,
    /// How the agent learns that the shim ended (`None`: an adopted job, its pid polled).
    done: Option<Done>,
    /// When the program was started (Unix ms), as the shim answered.
    launched_ms: Option<i64>,
    pub cgroup: Option<crate::cgroup::JobCgroup>,
    pid: Option<u32>,
    /// Where the shim writes the job's wait status.
    status_file: Option<PathBuf>,
    /// That file as read once the job ended (`wait`).
    record: Option<crate::shim::Record>,
}

/// The pipe the shim holds open until it ends (`forkserver`), registered with the
/// runtime on the first wait.
enum Done {
    Pipe(std::os::fd::OwnedFd),
    Watched(tokio::io::unix::AsyncFd<std::fs::File>),
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
            done: None,
            launched_ms: None,
            cgroup,
            pid: Some(pid),
            status_file: Some(status_file),
            record: None,
        }
    }

    /// A job whose first process is `child`, with no cgroup and no shim (launchers
    /// other than `JobLauncher`, such as the agent tests' double).
    pub fn started(child: Child) -> Launched {
        Launched {
            pid: child.id(),
            child: Some(child),
            done: None,
            launched_ms: None,
            cgroup: None,
            status_file: None,
            record: None,
        }
    }

    pub fn id(&self) -> Option<u32> {
        self.pid
    }

    /// When the job's program was started (Unix ms), where the launcher knows it.
    pub fn launched_ms(&self) -> Option<i64> {
        self.launched_ms
    }

    /// Waits for the job to end: for the child the agent started; for a shim, the end
    /// of its pipe and then the status it recorded (a shim killed before it could
    /// record one, which only SIGKILL does, reads as killed by SIGKILL); for an adopted
    /// job, polls the pid, then reads the status the shim left.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        if let Some(child) = &mut self.child {
            return child.wait().await;
        }
        // Only a pipe not yet watched is taken (a wait cancelled by a kill leaves it
        // watched: taking that too dropped it, and the next wait fell back to polling
        // the pid every 250 ms, so every killed job's end was seen up to 250 ms late).
        if let Some(Done::Pipe(_)) = &self.done
            && let Some(Done::Pipe(fd)) = self.done.take()
        {
            nix::fcntl::fcntl(
                &fd,
                nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
            )?;
            // SAFETY: the File owns the fd for as long as the AsyncFd lives.
            let watched = unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(
                    std::fs::File::from(fd),
                    tokio::io::Interest::READABLE,
                )
            }?;
            self.done = Some(Done::Watched(watched));
        }
        if let Some(Done::Watched(fd)) = &self.done {
            wait_eof(fd).await?;
            let r = self.read_record();
            if r.launch_error.is_some() {
                return Ok(std::process::ExitStatus::from_raw(127 << 8));
            }
            return Ok(r
                .status
                .unwrap_or_else(|| std::process::ExitStatus::from_raw(nix::libc::SIGKILL)));
        }
        let pid = self.pid.unwrap_or(0);
        let start = crate::procfs::proc_start(pid).map(|x| x.1);
        while start.is_some_and(|t| crate::procfs::alive(pid, t)) {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.read_record().status.ok_or_else(|| {
            std::io::Error::other("the job ended while its agent was down and left no exit status")
        })
    }

    /// Reads the shim's status file once the job ended and keeps what it says.
    fn read_record(&mut self) -> &crate::shim::Record {
        let path = self.status_file.as_deref();
        self.record.get_or_insert_with(|| file_record(path))
    }

    /// What the shim recorded: as `wait` read it, or read now.
    fn record(&self) -> crate::shim::Record {
        self.record
            .clone()
            .unwrap_or_else(|| file_record(self.status_file.as_deref()))
    }

    /// Why the shim could not start the program, if it could not.
    pub fn launch_error(&self) -> Option<String> {
        self.record().launch_error
    }

    /// When the job ended, as the shim recorded it (Unix ms).
    pub fn ended_ms(&self) -> Option<i64> {
        self.record().end_ms
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

    /// The cgroup's CPU time (ms) and peak memory (bytes), where they can be read.
    pub fn usage(&self) -> (Option<u64>, Option<u64>) {
        self.cgroup.as_ref().map_or((None, None), |c| c.stats())
    }

    /// Whether a process of the job is still there: in its cgroup, or where it has
    /// none, in its process group.
    pub fn left_behind(&self) -> bool {
        match &self.cgroup {
            Some(cg) => !cg.pids().is_empty(),
            None => self
                .pid
                .is_some_and(|p| killpg(Pid::from_raw(p as i32), None).is_ok()),
        }
    }

    /// Kills whatever is left and removes the cgroup.
    pub fn cleanup(&self) {
        self.signal(Signal::SIGKILL);
        if let Some(cg) = &self.cgroup {
            cg.destroy();
        }
    }
}

/// The shim's status file as it is now (an empty record for a job without one).
fn file_record(path: Option<&Path>) -> crate::shim::Record {
    path.map(crate::shim::read_record).unwrap_or_default()
}

/// Starts job processes.
pub trait Launcher: Send + Sync {
    fn spawn(&self, spec: &LaunchSpec) -> std::io::Result<Launched>;
    /// A step of a running job started from outside it, with the stdio given (a
    /// terminal when `tty`); see `JobLauncher::launch_step`.
    fn spawn_step(
        &self,
        _spec: &LaunchSpec,
        _stdio: &[std::os::fd::OwnedFd],
        _tty: bool,
    ) -> std::io::Result<Launched> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this agent's launcher starts no steps from outside jobs",
        ))
    }
    /// Whether jobs' cgroups confine their GPU devices.
    fn confines_devices(&self) -> bool {
        false
    }
}

/// Reads `fd` (a pipe only its writer's end closes) until its end of file.
async fn wait_eof(fd: &tokio::io::unix::AsyncFd<std::fs::File>) -> std::io::Result<()> {
    use std::io::Read;
    let mut b = [0u8; 64];
    loop {
        let mut ready = fd.readable().await?;
        match ready.try_io(|f| f.get_ref().read(&mut b)) {
            Ok(Ok(0)) => return Ok(()),
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {}
        }
    }
}

/// `first` (SIGTERM when `None`), wait up to `grace`, then SIGKILL; returns once the
/// main process is reaped.
pub async fn terminate(
    job: &mut Launched,
    grace: Duration,
    first: Option<Signal>,
) -> std::io::Result<std::process::ExitStatus> {
    job.signal(first.unwrap_or(Signal::SIGTERM));
    match tokio::time::timeout(grace, job.wait()).await {
        Ok(status) => status,
        Err(_) => {
            job.signal(Signal::SIGKILL);
            job.wait().await
        }
    }
}

mod job;
pub use job::JobLauncher;
pub(crate) use job::open_output;

#[cfg(test)]
mod tests;
