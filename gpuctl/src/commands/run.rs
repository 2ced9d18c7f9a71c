//! `gpuctl run` (also `srun`, by the name it is called by): inside a job, runs a
//! command as the job's tasks on this node.
//!
//! A job's batch script runs on each of its nodes (`docs/jobfile.md`), so each node's
//! `gpuctl run` starts that node's tasks: task `i` of node `r` is rank
//! `r * tasks_per_node + i`, with its own GPUs (the node's, split evenly in order, as
//! `--gpus-per-task` with `--gpu-bind=single` gives them) and the variables Slurm's
//! tasks and torch.distributed read. Nothing is asked of the controller: the tasks are
//! processes of the job, in its cgroup, under its limits. It waits for every task,
//! passes TERM, INT and HUP on to them, and ends as the worst of them did.

use std::collections::BTreeMap;

use crate::cli::{Failure, exit, fail};

#[path = "run_steps.rs"]
mod steps;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Tasks in all (srun -n): a multiple of the nodes used; default: the job's tasks.
    #[arg(short = 'n', long)]
    pub ntasks: Option<u32>,
    /// Nodes to run on (srun -N), the job's first ones; default: all of them.
    #[arg(short = 'N', long)]
    pub nodes: Option<u32>,
    /// Tasks on each node; default: the job's (--ntasks-per-node).
    #[arg(long)]
    pub ntasks_per_node: Option<u32>,
    /// Each task's standard output to this file (srun -o): %t the task's rank, %n its
    /// node's rank, %N the node's name, %j the job, %x its name, %% a %; tasks whose
    /// names are the same share one file. Default: the script's own output.
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// Standard error the same way (srun -e); default: with --output, the same file.
    #[arg(short = 'e', long)]
    pub error: Option<String>,
    /// Run in this running job from outside it (srun --jobid), through the controller:
    /// on the job's nodes, as the job's own srun would. Inside `gpuctl alloc`'s
    /// shell, its allocation; outside any job, an allocation of its own (sized by the
    /// options below) for this one step.
    #[arg(long)]
    pub jobid: Option<u64>,
    /// On a pseudo-terminal (srun --pty): interactive programs (a shell, a debugger),
    /// with this terminal's input, window size and Ctrl-C forwarded.
    #[arg(long)]
    pub pty: bool,
    #[command(flatten)]
    pub alloc: crate::commands::interactive::AllocOptions,
    #[command(flatten)]
    pub accepted: Accepted,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true)]
    pub command: Vec<String>,
}

/// srun options that the tools driving Slurm write into every script, accepted: they
/// change nothing here (output is relayed line by line already; tasks are placed and
/// bound by the job's cgroup; MPI starts from the environment srun gives).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct Accepted {
    /// Accepted: output is relayed as it comes.
    #[arg(short = 'u', long)]
    pub unbuffered: bool,
    /// Accepted.
    #[arg(long, value_name = "TYPE")]
    pub mpi: Option<String>,
    /// Accepted.
    #[arg(long, value_name = "TYPE")]
    pub cpu_bind: Option<String>,
    /// Accepted.
    #[arg(short = 'm', long, value_name = "TYPE")]
    pub distribution: Option<String>,
    /// Accepted: a task that fails ends the step's others anyway.
    #[arg(short = 'K', long, num_args = 0..=1, default_missing_value = "1")]
    pub kill_on_bad_exit: Option<String>,
    /// Accepted.
    #[arg(long)]
    pub hint: Option<String>,
    /// Accepted (the step's environment is the job's).
    #[arg(long)]
    pub export: Option<String>,
    /// Each line of output after its task's rank (`0: ...`), as srun -l does (where
    /// the output is not sent to files with -o).
    #[arg(short = 'l', long)]
    pub label: bool,
}

/// What this node's part of the run is, from the job's environment and the options.
#[derive(Debug, PartialEq)]
pub struct Plan {
    pub node_rank: u32,
    pub nodes: u32,
    pub per_node: u32,
    /// Each local task's GPUs (empty lists for a job without GPUs).
    pub gpus: Vec<Vec<String>>,
}

fn var(env: &BTreeMap<String, String>, name: &str) -> Result<u32, Failure> {
    let v = env.get(name).ok_or_else(|| {
        fail(format!(
            "{name} is not set: gpuctl run starts a job's tasks from inside the job (its script); from outside, give --jobid, or run it in gpuctl alloc's shell"
        ))
    })?;
    v.parse()
        .map_err(|_| fail(format!("{name}={v:?} is not a number")))
}

impl RunArgs {
    /// Whether this runs inside a job on its node (no controller asked), not from
    /// outside one.
    pub fn local(&self) -> bool {
        self.jobid.is_none() && std::env::var_os("GPUCTL_NODE_RANK").is_some()
    }

    /// The running job a step from outside goes to: `--jobid`, else the allocation
    /// whose shell this is (`gpuctl alloc` sets GPUCTL_JOB_ID and SLURM_JOB_ID);
    /// `None`: it makes an allocation of its own.
    pub fn target_job(&self) -> Result<Option<u64>, Failure> {
        if let Some(id) = self.jobid {
            return Ok(Some(id));
        }
        for k in ["GPUCTL_JOB_ID", "SLURM_JOB_ID"] {
            if let Ok(v) = std::env::var(k) {
                return v
                    .parse()
                    .map(Some)
                    .map_err(|_| fail(format!("{k}={v:?} is not a job id")));
            }
        }
        Ok(None)
    }

    /// What each of the job's nodes runs for a step from outside (its own srun's
    /// options, `--`, the command); the nodes are `self.nodes` (the first ones) or all.
    pub fn step_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        let opts = [
            ("-N", self.nodes.map(|n| n.to_string())),
            ("-n", self.ntasks.map(|n| n.to_string())),
            (
                "--ntasks-per-node",
                self.ntasks_per_node.map(|n| n.to_string()),
            ),
            ("-t", self.alloc.time.clone()),
            // A step's own sizes within its job (`step_gpus`, `task_cpus`).
            ("-G", self.alloc.gpus.clone()),
            ("-c", self.alloc.cpus.map(|c| c.to_string())),
            ("-J", self.alloc.name.clone()),
            ("-o", self.output.clone()),
            ("-e", self.error.clone()),
        ];
        for (flag, v) in opts {
            if let Some(v) = v {
                a.push(flag.to_string());
                a.push(v);
            }
        }
        a.push("--".into());
        a.extend(self.command.iter().cloned());
        a
    }

    /// This node's part, from the job's variables (`env`).
    pub fn plan(&self, env: &BTreeMap<String, String>) -> Result<Plan, Failure> {
        let usage = |m: String| Failure {
            code: exit::USAGE,
            message: m,
        };
        var(env, "GPUCTL_JOB_ID")?;
        let job_nodes = var(env, "GPUCTL_NUM_NODES")?.max(1);
        let node_rank = var(env, "GPUCTL_NODE_RANK")?;
        let job_tasks = env
            .get("GPUCTL_TASKS_PER_NODE")
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(1)
            .max(1);
        let nodes = self.nodes.unwrap_or(job_nodes);
        if nodes == 0 || nodes > job_nodes {
            return Err(usage(format!(
                "-N {nodes}: the job has {job_nodes} node(s)"
            )));
        }
        let per_node = match (self.ntasks_per_node, self.ntasks) {
            (Some(t), Some(n)) if t * nodes != n => {
                return Err(usage(format!(
                    "-n {n} and --ntasks-per-node {t} over {nodes} node(s) disagree"
                )));
            }
            (Some(t), _) => t,
            (None, Some(n)) if n == 0 || !n.is_multiple_of(nodes) => {
                return Err(usage(format!(
                    "-n {n} over {nodes} node(s): gpuctl runs the same number of tasks on each node; give a multiple of {nodes}"
                )));
            }
            (None, Some(n)) => n / nodes,
            (None, None) => job_tasks,
        };
        if per_node == 0 || per_node > job_tasks {
            return Err(usage(format!(
                "{per_node} tasks per node: the job has {job_tasks} (its --ntasks-per-node)"
            )));
        }
        let all: Vec<String> = env
            .get("CUDA_VISIBLE_DEVICES")
            .map(|v| {
                v.split(',')
                    .filter(|g| !g.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        // The node's GPUs split as the job's tasks split them, whatever this run uses:
        // task i has the same GPUs in every run of the job.
        let gpus = split_gpus(&all, job_tasks, per_node);
        Ok(Plan {
            node_rank,
            nodes,
            per_node,
            gpus,
        })
    }
}

impl Plan {
    /// Local task `i`'s variables (over the job's).
    pub fn task_env(&self, i: u32) -> Vec<(&'static str, String)> {
        let rank = self.node_rank * self.per_node + i;
        let world = self.nodes * self.per_node;
        let gpus = self.gpus[i as usize].join(",");
        vec![
            ("SLURM_PROCID", rank.to_string()),
            ("SLURM_LOCALID", i.to_string()),
            ("SLURM_NODEID", self.node_rank.to_string()),
            ("SLURM_NTASKS", world.to_string()),
            ("SLURM_NPROCS", world.to_string()),
            ("SLURM_NTASKS_PER_NODE", self.per_node.to_string()),
            ("SLURM_STEP_NUM_TASKS", world.to_string()),
            ("SLURM_STEP_NUM_NODES", self.nodes.to_string()),
            ("SLURM_STEP_GPUS", gpus.clone()),
            ("GPUCTL_TASK_ID", rank.to_string()),
            ("RANK", rank.to_string()),
            ("LOCAL_RANK", i.to_string()),
            ("WORLD_SIZE", world.to_string()),
            ("LOCAL_WORLD_SIZE", self.per_node.to_string()),
            ("NODE_RANK", self.node_rank.to_string()),
            ("GPUCTL_GPUS", self.gpus[i as usize].len().to_string()),
            ("CUDA_VISIBLE_DEVICES", gpus),
        ]
    }
}

/// `template` with its `%` patterns filled in for local task `i` (see `RunArgs::output`).
pub fn output_name(template: &str, plan: &Plan, i: u32, env: &BTreeMap<String, String>) -> String {
    let get = |k: &str| Some(env.get(k).cloned().unwrap_or_default());
    gpuctl_proto::text::fill_pattern(template, |p| match p {
        't' => Some((plan.node_rank * plan.per_node + i).to_string()),
        'n' => Some(plan.node_rank.to_string()),
        'N' => get("GPUCTL_NODE"),
        'j' => get("GPUCTL_JOB_ID"),
        // jobid.stepid, as srun writes it.
        'J' => match (env.get("GPUCTL_JOB_ID"), env.get("SLURM_STEP_ID")) {
            (Some(j), Some(s)) => Some(format!("{j}.{s}")),
            (j, _) => Some(j.cloned().unwrap_or_default()),
        },
        's' => get("SLURM_STEP_ID"),
        'u' => get("USER"),
        'A' => env
            .get("SLURM_ARRAY_JOB_ID")
            .or(env.get("GPUCTL_JOB_ID"))
            .cloned(),
        'a' => Some(
            env.get("SLURM_ARRAY_TASK_ID")
                .cloned()
                .unwrap_or_else(|| "0".into()),
        ),
        'x' => get("GPUCTL_JOB_NAME"),
        _ => None,
    })
}

/// The files the tasks write to, opened once each (tasks with the same name share it).
#[derive(Default)]
struct Outputs(BTreeMap<String, std::fs::File>);

impl Outputs {
    fn open(&mut self, name: &str) -> Result<std::process::Stdio, Failure> {
        if !self.0.contains_key(name) {
            let f = std::fs::File::create(name)
                .map_err(|e| fail(format!("cannot open {name}: {e}")))?;
            self.0.insert(name.to_string(), f);
        }
        self.0[name]
            .try_clone()
            .map(std::process::Stdio::from)
            .map_err(|e| fail(format!("{name}: {e}")))
    }
}

/// A step's line in the job's step file (`GPUCTL_STEPS_FILE`, which the agent made and
/// reads when the job's part on this node ends: `gpud/src/steps.rs`): the step's id is
/// the number of steps begun before it, counted under a lock.
/// A step's name as srun gives it: `-J NAME`, else the program's file name (not its
/// whole command line, which may hold anything).
fn step_name(given: &Option<String>, program: &str) -> String {
    given.clone().unwrap_or_else(|| {
        std::path::Path::new(program)
            .file_name()
            .map_or_else(|| program.to_string(), |n| n.to_string_lossy().into_owned())
    })
}

/// Runs this node's tasks and waits for them; the exit code is the worst task's
/// (128 + N for a task ended by signal N).
pub async fn run(args: &RunArgs) -> Result<u8, Failure> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let plan = args.plan(&env)?;
    let limit = match &args.alloc.time {
        Some(t) => Some(crate::submit::time_limit(t).map_err(|e| Failure {
            code: exit::USAGE,
            message: e,
        })?),
        None => None,
    };
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    // Recorded where the agent asks for it; a step that cannot be recorded still runs.
    // A node that takes no part (srun -N below the job's nodes) records it too, with no
    // tasks: a step's id is the same on every node.
    let file = env.get("GPUCTL_STEPS_FILE");
    let mut plan = plan;
    let takes_part = plan.node_rank < plan.nodes;
    let tasks = if takes_part { plan.per_node } else { 0 };
    let (want, all) = step_gpus(args, &plan, &env)?;
    let want = if takes_part { want } else { None };
    let name = step_name(&args.alloc.name, program);
    let (step, taken) = match file {
        Some(f) => match steps::begin(f, tasks, &name, want.unwrap_or(0), &all) {
            Ok((id, taken)) => (Some(id), taken),
            Err(_) => (None, all.iter().take(want.unwrap_or(0)).cloned().collect()),
        },
        None => (None, all.iter().take(want.unwrap_or(0)).cloned().collect()),
    };
    if !takes_part {
        if let (Some(f), Some(id)) = (file, step) {
            let _ = steps::end(f, id, 0);
        }
        return Ok(0);
    }
    if want.is_some() {
        plan.gpus = split_gpus(&taken, plan.per_node, plan.per_node);
    }
    // Watched before any task starts: a TERM as the first task prints is passed on, and
    // does not end this process by its default action first.
    let signals = passed_signals()?;
    let mut tasks = Vec::new();
    let mut files = Outputs::default();
    let mut labels = Vec::new();
    let cpus = task_cpus(args.alloc.cpus, plan.per_node);
    for i in 0..plan.per_node {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(rest).envs(plan.task_env(i));
        if let Some(set) = cpus.get(i as usize).copied() {
            cmd.env(
                "SLURM_CPUS_PER_TASK",
                args.alloc.cpus.unwrap_or(1).to_string(),
            );
            // SAFETY: between fork and exec only the affinity syscall runs (no
            // allocation, no lock).
            unsafe {
                cmd.pre_exec(move || {
                    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
                        .map_err(std::io::Error::from)
                });
            }
        }
        if let Some(id) = step {
            for k in ["SLURM_STEP_ID", "SLURM_STEPID", "GPUCTL_STEP_ID"] {
                cmd.env(k, id.to_string());
            }
        }
        let out = args
            .output
            .as_deref()
            .map(|t| output_name(t, &plan, i, &env));
        let err = args
            .error
            .as_deref()
            .map(|t| output_name(t, &plan, i, &env));
        let mut opened = Ok(());
        if let Some(o) = &out {
            opened = files.open(o).map(|s| {
                cmd.stdout(s);
            });
        }
        if let (Ok(()), Some(e)) = (&opened, err.as_ref().or(out.as_ref())) {
            opened = files.open(e).map(|s| {
                cmd.stderr(s);
            });
        }
        let rank = plan
            .task_env(i)
            .into_iter()
            .find(|(k, _)| *k == "SLURM_PROCID")
            .map_or(i.to_string(), |(_, v)| v);
        let labelled = args.accepted.label && out.is_none();
        if labelled {
            cmd.stdout(std::process::Stdio::piped());
            if err.is_none() {
                cmd.stderr(std::process::Stdio::piped());
            }
        }
        let child = opened.and_then(|()| {
            cmd.spawn().map_err(|e| Failure {
                code: 127,
                message: format!("cannot run {program}: {e}"),
            })
        });
        match child {
            Ok(mut c) => {
                if labelled {
                    labels.extend(c.stdout.take().map(|o| label(o, rank.clone(), false)));
                    labels.extend(c.stderr.take().map(|e| label(e, rank, true)));
                }
                tasks.push(c)
            }
            Err(e) => {
                let pids = tasks.iter().map(tokio::process::Child::id);
                signal_tasks(pids, nix::sys::signal::Signal::SIGKILL);
                if let (Some(f), Some(id)) = (file, step) {
                    let _ = steps::end(f, id, e.code);
                }
                return Err(e);
            }
        }
    }
    let code = wait_all(tasks, limit, signals).await?;
    for l in labels {
        let _ = l.await;
    }
    if let (Some(f), Some(id)) = (file, step) {
        let _ = steps::end(f, id, code);
    }
    Ok(code)
}

/// A sized step's GPUs (`-G N` within a job: N over the step's nodes, each node's
/// share of them taken from its job's GPUs here by `steps::begin`): how many this node
/// takes (`None`: not sized, every task has its GPUs as the job split them) and the
/// job's GPUs here. The options that size an allocation, not a step, are refused.
fn step_gpus(
    args: &RunArgs,
    plan: &Plan,
    env: &BTreeMap<String, String>,
) -> Result<(Option<usize>, Vec<String>), Failure> {
    let usage = |m: String| Failure {
        code: exit::USAGE,
        message: m,
    };
    let a = &args.alloc;
    let refused = a.allocation_only();
    if !refused.is_empty() {
        return Err(usage(format!(
            "{}: a step within a job has its job's memory, partition, account and nodes (srun -G and -c size a step here)",
            refused.join(", ")
        )));
    }
    let all: Vec<String> = (env.get("CUDA_VISIBLE_DEVICES").into_iter())
        .flat_map(|v| v.split(','))
        .filter(|g| !g.is_empty())
        .map(str::to_string)
        .collect();
    let Some(g) = &a.gpus else {
        return Ok((None, all));
    };
    // `-G N` or `-G MODEL:N`: the step's GPUs over its nodes.
    let n: usize = g
        .rsplit(':')
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| usage(format!("-G {g:?} is not a number of GPUs")))?;
    let nodes = plan.nodes.max(1) as usize;
    if n == 0 || !n.is_multiple_of(nodes) || n / nodes > all.len() {
        return Err(usage(format!(
            "-G {n} over {nodes} node(s): each node's share must be a whole number of GPUs, at most the job's {} here",
            all.len()
        )));
    }
    Ok((Some(n / nodes), all))
}

/// Each task's CPUs for `srun -c N`: N of the CPUs this process may use (the job's),
/// task by task in order and round again when there are too few; none without -c.
fn task_cpus(per_task: Option<u32>, tasks: u32) -> Vec<nix::sched::CpuSet> {
    let Some(n) = per_task.filter(|n| *n > 0) else {
        return Vec::new();
    };
    let Ok(mine) = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) else {
        return Vec::new();
    };
    let allowed: Vec<usize> = (0..nix::sched::CpuSet::count())
        .filter(|&c| mine.is_set(c).unwrap_or(false))
        .collect();
    if allowed.is_empty() {
        return Vec::new();
    }
    (0..tasks as usize)
        .map(|t| {
            let mut set = nix::sched::CpuSet::new();
            for k in 0..n as usize {
                let _ = set.set(allowed[(t * n as usize + k) % allowed.len()]);
            }
            set
        })
        .collect()
}

/// `gpus` split into `parts` equal lists when they divide evenly (else each part has
/// them all, as srun without --gpus-per-task gives them), the first `take` of them.
fn split_gpus(gpus: &[String], parts: u32, take: u32) -> Vec<Vec<String>> {
    let each = if gpus.len().is_multiple_of(parts.max(1) as usize) {
        gpus.len() / parts.max(1) as usize
    } else {
        0
    };
    (0..take as usize)
        .map(|i| match each {
            0 => gpus.to_vec(),
            n => gpus[i * n..(i + 1) * n].to_vec(),
        })
        .collect()
}

/// Copies a task's output to this process's, each line after `rank: ` (srun -l).
fn label(
    from: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    rank: String,
    stderr: bool,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
        let mut lines = tokio::io::BufReader::new(from).lines();
        let mut out: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>> = if stderr {
            Box::pin(tokio::io::stderr())
        } else {
            Box::pin(tokio::io::stdout())
        };
        while let Ok(Some(line)) = lines.next_line().await {
            if out
                .write_all(format!("{rank}: {line}\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
        }
        let _ = out.flush().await;
    })
}

/// Sends `sig` to these tasks (those with a pid: not yet reaped).
fn signal_tasks(pids: impl Iterator<Item = Option<u32>>, sig: nix::sys::signal::Signal) {
    for pid in pids.flatten() {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
    }
}

/// The signals a run passes on to what it runs, as they come (this process no longer
/// dies of them). What ends a run (`timeout 60 srun ...`, a script's trap, Ctrl-C) is
/// passed on. The job's own signals (a cancel, `--signal`, a preemption's checkpoint
/// signal) reach every process of the job from its agent, tasks included: USR1 and USR2,
/// which tasks checkpoint on, are not passed on again, so that no handler runs twice.
pub(crate) fn passed_signals()
-> Result<tokio::sync::mpsc::UnboundedReceiver<nix::sys::signal::Signal>, Failure> {
    use nix::sys::signal::Signal;
    use tokio::signal::unix::{SignalKind, signal};
    let kinds = [
        (SignalKind::terminate(), Signal::SIGTERM),
        (SignalKind::interrupt(), Signal::SIGINT),
        (SignalKind::hangup(), Signal::SIGHUP),
    ];
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for (kind, sig) in kinds {
        let mut s = signal(kind).map_err(|e| fail(format!("cannot watch signals: {e}")))?;
        let tx = tx.clone();
        tokio::spawn(async move { while s.recv().await.is_some() && tx.send(sig).is_ok() {} });
    }
    Ok(rx)
}

/// How a process ended, as an exit code: its own, or 128 + N when signal N ended it.
pub(crate) fn exit_code_of(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(s)) => (128 + s).min(255) as u8,
        _ => 1,
    }
}

/// How long a step's tasks have after their time limit's TERM before they are killed.
const STEP_KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

async fn wait_all(
    tasks: Vec<tokio::process::Child>,
    limit: Option<std::time::Duration>,
    mut sig_rx: tokio::sync::mpsc::UnboundedReceiver<nix::sys::signal::Signal>,
) -> Result<u8, Failure> {
    use nix::sys::signal::Signal;
    let pids: Vec<Option<u32>> = tasks.iter().map(tokio::process::Child::id).collect();
    let mut waits = tokio::task::JoinSet::new();
    for (i, mut t) in tasks.into_iter().enumerate() {
        waits.spawn(async move { (i, t.wait().await) });
    }
    let mut ended = vec![false; pids.len()];
    let mut worst: u8 = 0;
    // The step's time limit (srun -t): TERM, then KILL after STEP_KILL_WAIT.
    let far = tokio::time::Instant::now() + std::time::Duration::from_secs(100 * 365 * 86_400);
    let mut deadline = limit.map_or(far, |l| tokio::time::Instant::now() + l);
    let mut term_sent = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                let running = pids.iter().zip(&ended).filter(|(_, e)| !**e);
                let sig = if term_sent { Signal::SIGKILL } else { Signal::SIGTERM };
                if !term_sent {
                    eprintln!(
                        "gpuctl run: step time limit {} reached; ending its tasks",
                        humantime::format_duration(limit.unwrap_or_default())
                    );
                }
                signal_tasks(running.map(|(pid, _)| *pid), sig);
                deadline = if term_sent { far } else { tokio::time::Instant::now() + STEP_KILL_WAIT };
                term_sent = true;
            }
            done = waits.join_next() => {
                let Some(done) = done else { break };
                let (i, status) = done.map_err(|e| fail(format!("waiting for a task: {e}")))?;
                let status = status.map_err(|e| fail(format!("waiting for a task: {e}")))?;
                ended[i] = true;
                worst = worst.max(exit_code_of(status));
            }
            Some(sig) = sig_rx.recv() => {
                let running = pids.iter().zip(&ended).filter(|(_, e)| !**e);
                signal_tasks(running.map(|(pid, _)| *pid), sig);
            }
        }
    }
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct T {
        #[command(flatten)]
        run: RunArgs,
    }

    fn args(a: &[&str]) -> RunArgs {
        let mut v = vec!["run"];
        v.extend(a);
        T::parse_from(v).run
    }

    fn plan_two() -> Plan {
        Plan {
            node_rank: 1,
            nodes: 2,
            per_node: 2,
            gpus: vec![vec![], vec![]],
        }
    }

    fn job_env(node_rank: u32, nodes: u32, tasks: u32, gpus: &str) -> BTreeMap<String, String> {
        [
            ("GPUCTL_JOB_ID", "12".to_string()),
            ("GPUCTL_NODE", "nodeB".to_string()),
            ("GPUCTL_JOB_NAME", "train".to_string()),
            ("GPUCTL_NUM_NODES", nodes.to_string()),
            ("GPUCTL_NODE_RANK", node_rank.to_string()),
            ("GPUCTL_TASKS_PER_NODE", tasks.to_string()),
            ("CUDA_VISIBLE_DEVICES", gpus.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Two nodes of two tasks, one GPU each: node 1's tasks are ranks 2 and 3 of 4,
    /// each with its own GPU.
    #[test]
    fn a_nodes_tasks_get_their_ranks_and_gpus() {
        let plan = args(&["python", "train.py", "--lr", "1"])
            .plan(&job_env(1, 2, 2, "GPU-a,GPU-b"))
            .unwrap();
        assert_eq!((plan.nodes, plan.per_node), (2, 2));
        let env: Vec<BTreeMap<_, _>> = (0..2)
            .map(|i| plan.task_env(i).into_iter().collect())
            .collect();
        assert_eq!(env[0]["RANK"], "2");
        assert_eq!(env[1]["SLURM_PROCID"], "3");
        assert_eq!(env[1]["LOCAL_RANK"], "1");
        assert_eq!(env[1]["WORLD_SIZE"], "4");
        assert_eq!(env[0]["CUDA_VISIBLE_DEVICES"], "GPU-a");
        assert_eq!(env[1]["CUDA_VISIBLE_DEVICES"], "GPU-b");
        assert_eq!(env[1]["SLURM_NODEID"], "1");
    }

    /// Fewer tasks than the job's keep each task's GPUs; -N leaves later nodes out; a
    /// count that does not fit is refused.
    #[test]
    fn options_narrow_the_run() {
        let env = job_env(0, 2, 4, "g0,g1,g2,g3,g4,g5,g6,g7");
        let plan = args(&["-n", "2", "x"]).plan(&env).unwrap();
        assert_eq!(plan.per_node, 1);
        assert_eq!(plan.gpus, vec![vec!["g0".to_string(), "g1".to_string()]]);
        let plan = args(&["-N", "1", "-n", "1", "hostname"])
            .plan(&job_env(1, 2, 1, ""))
            .unwrap();
        assert!(plan.node_rank >= plan.nodes, "node 1 takes no part");
        assert_eq!(plan.gpus, vec![Vec::<String>::new()]);
        let names: Vec<String> = (0..2)
            .map(|i| output_name("out-%j-%t-%n-%N-%x-%%-%q", &plan_two(), i, &env))
            .collect();
        assert_eq!(
            names,
            ["out-12-2-1-nodeB-train-%-%q", "out-12-3-1-nodeB-train-%-%q"]
        );
        for bad in [
            &["-n", "3", "x"][..],
            &["--ntasks-per-node", "5", "x"],
            &["-N", "3", "x"],
        ] {
            assert!(args(bad).plan(&env).is_err(), "{bad:?}");
        }
        let e = args(&["x"]).plan(&BTreeMap::new()).unwrap_err();
        assert!(e.message.contains("from inside the job"), "{}", e.message);
    }

    /// A step from outside passes its options to each node's srun.
    #[test]
    fn steps_from_outside_name_their_options() {
        let a = args(&[
            "--jobid", "7", "-n", "2", "-t", "5", "-o", "out-%t", "python", "-c", "x",
        ]);
        assert_eq!(a.target_job().unwrap(), Some(7));
        assert!(!a.local());
        assert_eq!(
            a.step_args(),
            [
                "-n", "2", "-t", "5", "-o", "out-%t", "--", "python", "-c", "x"
            ]
        );
        let a = args(&["--jobid", "7", "-N", "2", "x"]);
        assert_eq!(a.step_args(), ["-N", "2", "--", "x"]);
    }
}

#[cfg(test)]
mod step_name_tests {
    #[test]
    fn a_step_is_named_by_its_program_or_its_name() {
        assert_eq!(super::step_name(&None, "/usr/bin/python3"), "python3");
        assert_eq!(super::step_name(&None, "hostname"), "hostname");
        assert_eq!(super::step_name(&Some("train".into()), "/bin/sh"), "train");
    }
}
