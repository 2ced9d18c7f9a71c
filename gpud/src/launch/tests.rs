//! Unit tests of `launch`: the job environment, output paths, the spec and what a
//! job leaves behind.

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

/// A job's end is reported before its cleanup only when nothing of it is left:
/// `left_behind` sees a process the job left in its group, and no longer once the
/// cleanup has killed it.
#[tokio::test]
async fn a_process_left_in_the_jobs_group_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("left.pid");
    let spawn = |script: String| {
        tokio::process::Command::new("/bin/sh")
            .args(["-c", &script])
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let mut alone = Launched::started(spawn("exit 0".into()));
    alone.wait().await.unwrap();
    assert!(!alone.left_behind(), "a job that left nothing");
    let script = format!("sleep 30 & echo $! > {}; exit 0", pid_file.display());
    let mut job = Launched::started(spawn(script));
    job.wait().await.unwrap();
    assert!(job.left_behind(), "the sleep is still in the job's group");
    job.cleanup();
    let gone = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        !job.left_behind()
    });
    assert!(gone, "the cleanup killed what the job left");
}

#[test]
fn env_for_several_gpus() {
    let env = job_env(
        &start(&[("GPU-a", 1000, 81920), ("GPU-b", 1000, 81920)]),
        "node1",
        Some("de_DE.UTF-8"),
    );
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
    assert_eq!(env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    assert_eq!(env["GPUCTL_JOB_ID"], "7");
    assert_eq!(env["GPUCTL_NODE"], "node1");
    assert_eq!(env["GPUCTL_GPUS"], "2");
    assert_eq!(env["FOO"], "bar");
    // Never the agent's PATH.
    assert_eq!(env["PATH"], DEFAULT_PATH);
    assert_eq!(env["LANG"], "de_DE.UTF-8");
    assert_eq!(env["TMPDIR"], "/tmp");
    assert_eq!(env["USER"], "u");
    assert_eq!(env["GPUCTL_NUM_NODES"], "1");
    assert_eq!(env["MASTER_ADDR"], "node1");
    assert!(!env.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
}

#[test]
fn env_for_one_and_no_gpu() {
    let env = job_env(&start(&[("GPU-a", 1000, 81920)]), "n", None);
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-a");
    assert_eq!(env["LANG"], "C.UTF-8");
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
    assert_eq!(env["RANK"], "1");
    assert_eq!(env["NODE_RANK"], "1");
    assert_eq!(env["WORLD_SIZE"], "2");
    assert_eq!(env["LOCAL_RANK"], "0");
    assert_eq!(env["LOCAL_WORLD_SIZE"], "1");
    assert_eq!(env["SLURM_JOB_ID"], "7");
    assert_eq!(env["SLURM_NNODES"], "2");
    assert_eq!(env["SLURM_NODEID"], "1");
    assert_eq!(env["SLURM_PROCID"], "1");
    assert_eq!(env["SLURM_JOB_NODELIST"], "n1,n2");
    assert_eq!(env["SLURM_JOB_NAME"], "train");
    // With the agents' addresses, MASTER_ADDR is rank 0's address; the job's env
    // may still name its own.
    s.addresses = vec!["10.1.2.3".into(), "10.1.2.4".into()];
    assert_eq!(job_env(&s, "n2", None)["MASTER_ADDR"], "10.1.2.3");
    if let Some(spec) = s.spec.as_mut() {
        spec.env.insert("MASTER_ADDR".into(), "192.168.0.9".into());
        spec.env.insert("MASTER_PORT".into(), "29500".into());
    }
    let env = job_env(&s, "n2", None);
    assert_eq!(env["MASTER_ADDR"], "192.168.0.9");
    assert_eq!(env["MASTER_PORT"], "29500");
}

fn vars<'a>(name: &'a str, node: &'a str, rank: u32, ranks: usize) -> OutputVars<'a> {
    OutputVars {
        job_id: 5,
        name,
        user: "ann",
        node,
        rank,
        ranks,
        array: None,
    }
}

#[test]
fn output_paths_expand() {
    let wd = Path::new("/w");
    let one = vars("x", "n1", 0, 1);
    assert_eq!(output_path("", &one, wd), PathBuf::from("/w/gpuctl-5.out"));
    assert_eq!(
        output_path("%x-%j.log", &vars("t", "n1", 0, 1), wd),
        PathBuf::from("/w/t-5.log")
    );
    assert_eq!(output_path("/abs/%j%%", &one, wd), PathBuf::from("/abs/5%"));
    assert_eq!(output_path("a%q%", &one, wd), PathBuf::from("/w/a%q%"));
    assert_eq!(
        output_path("o-%N-%t.txt", &vars("x", "gpu7", 3, 4), wd),
        PathBuf::from("/w/o-gpu7-3.txt")
    );
    // What the tools that drive Slurm write (dask-jobqueue: `%J`), and the rest of
    // sbatch's patterns.
    assert_eq!(
        output_path("logs/dask-worker-%J.out", &one, wd),
        PathBuf::from("/w/logs/dask-worker-5.out")
    );
    assert_eq!(
        output_path("%u-%s-%n.out", &vars("x", "gpu7", 2, 4), wd),
        PathBuf::from("/w/ann-batch-2.out")
    );
}

/// A name (or node) never adds a path separator: `%x` of `../../../var/tmp/x` stays
/// one file name inside the workdir.
#[test]
fn expanded_names_never_climb_out() {
    let wd = Path::new("/w");
    let p = output_path("%x.out", &vars("../../../var/tmp/x", "n", 0, 1), wd);
    assert_eq!(p, PathBuf::from("/w/.._.._.._var_tmp_x.out"));
    assert_eq!(p.parent(), Some(wd));
    let p = output_path("%x", &vars("..", "n", 0, 1), wd);
    assert_eq!(p, PathBuf::from("/w/__"));
    let p = output_path("%x", &vars("a\nb\u{1b}", "n", 0, 1), wd);
    assert_eq!(p, PathBuf::from("/w/a_b_"));
}

#[test]
fn gang_outputs_lose_nothing() {
    let wd = Path::new("/w");
    // By default one file per rank.
    assert_eq!(
        output_path("", &vars("x", "n2", 1, 2), wd),
        PathBuf::from("/w/gpuctl-5.1.out")
    );
    // One file named for all ranks: every rank appends.
    assert!(shared_output("out.txt", 2));
    assert!(!shared_output("out.txt", 1));
    assert!(!shared_output("out-%t.txt", 2));
    assert!(!shared_output("out-%N.txt", 2));
    assert!(!shared_output("", 2));
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

/// A Slurm script's first day: the variables sbatch sets that scripts read.
#[test]
fn env_has_what_sbatch_scripts_read() {
    let mut s = start(&[("GPU-a", 1000, 81920)]);
    if let Some(spec) = s.spec.as_mut() {
        spec.partition = "gpu".into();
        spec.account = "risk".into();
        spec.array = "3-11:4%2".into();
        spec.array_job_id = 5;
        spec.array_task_id = Some(7);
        spec.resources.get_or_insert_default().memory_bytes = 16 << 30;
    }
    let env = job_env(&s, "node7", None);
    assert_eq!(env["SLURMD_NODENAME"], "node7");
    assert_eq!(env["SLURM_JOB_PARTITION"], "gpu");
    assert_eq!(env["SLURM_JOB_ACCOUNT"], "risk");
    assert_eq!(env["SLURM_MEM_PER_NODE"], "16384");
    assert_eq!(env["SLURM_ARRAY_TASK_ID"], "7");
    // Tasks 3, 7, 11.
    assert_eq!(env["SLURM_ARRAY_TASK_COUNT"], "3");
    assert_eq!(env["SLURM_ARRAY_TASK_MIN"], "3");
    assert_eq!(env["SLURM_ARRAY_TASK_MAX"], "11");
}

/// A requeued job's output was truncated at its next attempt, losing the first
/// attempt's lines: later attempts append.
#[test]
fn a_requeued_attempt_appends_to_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = start(&[]);
    if let Some(spec) = s.spec.as_mut() {
        spec.command = vec!["true".into()];
        spec.stdout = "out-%j.txt".into();
    }
    s.attempt = 1;
    let first = LaunchSpec::from_start(&s, "n", dir.path(), None).unwrap();
    assert!(!first.append);
    s.attempt = 2;
    let again = LaunchSpec::from_start(&s, "n", dir.path(), None).unwrap();
    assert!(again.append);
}

/// A wait that a kill interrupts (the agent's `select!` drops it) leaves the job's
/// pipe watched, so that the next wait still sees the end at once: it once dropped the
/// pipe and polled the pid every 250 ms instead.
#[tokio::test]
async fn an_interrupted_wait_keeps_watching_the_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("7.1.status");
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let mut job = Launched {
        child: None,
        done: Some(Done::Pipe(r)),
        launched_ms: Some(1),
        cgroup: None,
        // A pid that is never alive: the fallback would answer at once without a record.
        pid: None,
        status_file: Some(status.clone()),
        record: None,
    };
    for round in 0..2 {
        let waited = tokio::time::timeout(Duration::from_millis(20), job.wait()).await;
        assert!(
            waited.is_err(),
            "wait {round}: the pipe is still open, the wait goes on: {waited:?}"
        );
        assert!(
            matches!(job.done, Some(Done::Watched(_))),
            "wait {round}: the interrupted wait left the pipe watched"
        );
    }
    // The shim records a SIGTERM end and closes its pipe.
    std::fs::write(&status, "15 1700000000000\n").unwrap();
    drop(w);
    let st = tokio::time::timeout(Duration::from_secs(5), job.wait())
        .await
        .expect("the end is seen through the pipe")
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(15));
}

/// Tasks: the batch script learns how many there are; a job `command` with more than
/// one a node is started through the node's `srun`, which is first on every job's PATH;
/// without one it cannot start.
#[test]
fn tasks_are_told_and_started_through_srun() {
    let mut s = start(&[("GPU-a", 1000, 81920), ("GPU-b", 1000, 81920)]);
    s.nodelist = vec!["n1".into(), "n2".into()];
    if let Some(spec) = s.spec.as_mut() {
        spec.command = vec!["python".into(), "train.py".into()];
        let r = spec.resources.get_or_insert_default();
        r.tasks_per_node = 2;
        r.cpus = 8;
    }
    let env = job_env(&s, "n1", None);
    assert_eq!(env["SLURM_NTASKS"], "4");
    assert_eq!(env["SLURM_NTASKS_PER_NODE"], "2");
    assert_eq!(env["SLURM_TASKS_PER_NODE"], "2(x2)");
    assert_eq!(env["SLURM_CPUS_PER_TASK"], "4");
    assert_eq!(env["GPUCTL_TASKS_PER_NODE"], "2");
    let tools = Path::new("/state/bin");
    let l = LaunchSpec::from_start(&s, "n1", Path::new("/tmp"), None)
        .unwrap()
        .with_tools(Some(tools))
        .unwrap();
    assert_eq!(l.program, tools.join("srun"));
    assert_eq!(l.args, ["--", "python", "train.py"]);
    assert!(
        l.env["PATH"].starts_with("/state/bin:/usr/local/sbin:"),
        "{}",
        l.env["PATH"]
    );
    let none = LaunchSpec::from_start(&s, "n1", Path::new("/tmp"), None)
        .unwrap()
        .with_tools(None);
    assert!(
        none.unwrap_err()
            .to_string()
            .contains("no gpuctl next to gpud")
    );
    // One task a node: the command itself, srun on its PATH all the same.
    if let Some(r) = s.spec.as_mut().and_then(|x| x.resources.as_mut()) {
        r.tasks_per_node = 1;
    }
    let l = LaunchSpec::from_start(&s, "n1", Path::new("/tmp"), None)
        .unwrap()
        .with_tools(Some(tools))
        .unwrap();
    assert_eq!(l.program, PathBuf::from("python"));
    assert!(l.env["PATH"].starts_with("/state/bin:"));
}

/// An allocation's holder writes nothing, so no empty `slurm-N.out` is left in the
/// user's directory.
#[test]
fn an_allocation_leaves_no_output_file() {
    let mut s = start(&[("GPU-a", 1000, 0)]);
    let spec = s.spec.as_mut().unwrap();
    spec.interactive = true;
    spec.stdout = "slurm-%j.out".into();
    spec.stderr = "err-%j.out".into();
    let l = LaunchSpec::from_start(&s, "n", Path::new("/tmp"), None).unwrap();
    assert_eq!(l.stdout, Path::new("/dev/null"));
    assert_eq!(l.stderr, None);
}
