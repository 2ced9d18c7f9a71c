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
use tokio::process::{Child, Command};

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
    pub program: PathBuf,
    pub args: Vec<String>,
    pub workdir: PathBuf,
    pub env: BTreeMap<String, String>,
    pub stdout: PathBuf,
    /// `None`: stderr goes to the stdout file (Slurm's default).
    pub stderr: Option<PathBuf>,
}

impl LaunchSpec {
    /// Builds the launch from a StartJob. A `script` is written to `scratch` first.
    pub fn from_start(
        start: &pb::StartJob,
        node: &str,
        scratch: &Path,
    ) -> std::io::Result<LaunchSpec> {
        let spec = start.spec.clone().unwrap_or_default();
        let workdir = PathBuf::from(&spec.workdir);
        let (program, args) = if let Some((prog, rest)) = spec.command.split_first() {
            (PathBuf::from(prog), rest.to_vec())
        } else {
            std::fs::create_dir_all(scratch)?;
            let path = scratch.join(format!("job-{}.sh", start.job_id));
            std::fs::write(&path, &spec.script)?;
            if spec.script.starts_with("#!") {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
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
        Ok(LaunchSpec {
            job_id: start.job_id,
            program,
            args,
            env: job_env(start, node, path.as_deref()),
            workdir,
            stdout,
            stderr,
        })
    }
}

/// Starts job processes and signals their whole tree.
pub trait Launcher: Send + Sync {
    fn spawn(&self, spec: &LaunchSpec) -> std::io::Result<Child>;
    /// Sends `signal` to everything the job started. Errors for an already-gone job are
    /// ignored.
    fn signal(&self, child_pid: u32, signal: Signal);
}

/// Each job leads its own process group; signals go to the group.
pub struct ProcessGroupLauncher;

impl Launcher for ProcessGroupLauncher {
    fn spawn(&self, spec: &LaunchSpec) -> std::io::Result<Child> {
        let open = |p: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(p)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display())))
        };
        let out = open(&spec.stdout)?;
        let err = match &spec.stderr {
            Some(p) => open(p)?,
            None => out.try_clone()?,
        };
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .current_dir(&spec.workdir)
            .env_clear()
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(false);
        cmd.spawn().map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot run {}: {e}", spec.program.display()),
            )
        })
    }

    fn signal(&self, child_pid: u32, signal: Signal) {
        let _ = killpg(Pid::from_raw(child_pid as i32), signal);
    }
}

/// SIGTERM, wait up to `grace`, then SIGKILL; returns once the main process is reaped.
pub async fn terminate(
    launcher: &dyn Launcher,
    child: &mut Child,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    let Some(pid) = child.id() else {
        return child.wait().await;
    };
    launcher.signal(pid, Signal::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            launcher.signal(pid, Signal::SIGKILL);
            child.wait().await
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
        let l = LaunchSpec::from_start(&start, "n", Path::new("/tmp")).unwrap();
        assert_eq!(l.stdout, PathBuf::from("/home/u/gpuctl-3.out"));
        assert_eq!(l.stderr, None);
        assert_eq!(l.program, PathBuf::from("python"));
    }
}
