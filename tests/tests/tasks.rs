//! Tasks: several processes a node, each with its rank and its own GPUs, started by
//! `srun` (`gpuctl run`) in a batch script or by the job itself for a `command`; real
//! gpuctld, gpud and gpuctl.

use std::collections::BTreeSet;
use std::time::Duration;

use gpuctl_tests::{Cluster, submitted_id};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);

/// Each task says who it is; rank 0 listens at MASTER_ADDR:MASTER_PORT and the others
/// report to it over TCP, as torch.distributed's TCP store has ranks meet; rank 0 prints
/// every rank it met.
const RENDEZVOUS: &str = r#"
import json, os, socket, time
e = os.environ
me = {k: e[k] for k in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                        "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS",
                        "CUDA_VISIBLE_DEVICES", "GPUCTL_NODE"]}
rank, world = int(e["RANK"]), int(e["WORLD_SIZE"])
addr, port = e["MASTER_ADDR"], int(e["MASTER_PORT"])
if rank == 0:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(world); s.settimeout(30)
    met = [me]
    for _ in range(world - 1):
        c = s.accept()[0]
        met.append(json.loads(c.makefile().readline()))
    print("MET " + json.dumps(sorted(met, key=lambda m: int(m["RANK"]))), flush=True)
else:
    for _ in range(300):
        try:
            c = socket.create_connection((addr, port), timeout=1); break
        except OSError:
            time.sleep(0.1)
    c.sendall((json.dumps(me) + "\n").encode()); c.close()
"#;

/// A Lightning-style batch script, unmodified: two nodes, two tasks a node, one GPU a
/// task, `srun python3 ...`. Four ranks meet, each with its own rank, local rank and GPU.
#[test]
fn a_batch_script_starts_its_tasks_with_srun() {
    let c = Cluster::start(&[
        ("node-a.invalid", "2xA100-80GB"),
        ("node-b.invalid", "2xA100-80GB"),
    ]);
    std::fs::write(c.path("rdv.py"), RENDEZVOUS).unwrap();
    let script = "#!/bin/bash\n#SBATCH --job-name=lightning\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --gpus-per-task=1\n#SBATCH --output=rdv-%j.%t.out\n\nsrun python3 rdv.py\n";
    let id = c.submit("train.sbatch", script);
    let j = c.wait_state(id, "COMPLETED", T);
    assert_eq!(j["resources"]["gpus"], 2, "{j}");
    let out = std::fs::read_to_string(c.path(&format!("rdv-{id}.0.out"))).unwrap();
    let met = out
        .lines()
        .find_map(|l| l.strip_prefix("MET "))
        .unwrap_or_else(|| panic!("rank 0 met nobody: {out}"));
    let met: Vec<Value> = serde_json::from_str(met).unwrap();
    assert_eq!(met.len(), 4, "{met:?}");
    let mut gpus_of_node: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for (rank, m) in met.iter().enumerate() {
        let node = m["GPUCTL_NODE"].as_str().unwrap().to_string();
        let local = rank % 2;
        assert_eq!(m["RANK"], rank.to_string(), "{m}");
        assert_eq!(m["SLURM_PROCID"], rank.to_string(), "{m}");
        assert_eq!(m["LOCAL_RANK"], local.to_string(), "{m}");
        assert_eq!(m["SLURM_LOCALID"], local.to_string(), "{m}");
        assert_eq!(m["SLURM_NODEID"], (rank / 2).to_string(), "{m}");
        assert_eq!(m["WORLD_SIZE"], "4");
        assert_eq!(m["SLURM_NTASKS"], "4");
        assert_eq!(m["LOCAL_WORLD_SIZE"], "2");
        let gpus = m["CUDA_VISIBLE_DEVICES"].as_str().unwrap();
        assert!(gpus.starts_with("GPU-") && !gpus.contains(','), "{m}");
        gpus_of_node
            .entry(node)
            .or_default()
            .insert(gpus.to_string());
    }
    assert_eq!(gpus_of_node.len(), 2, "two nodes: {gpus_of_node:?}");
    assert!(
        gpus_of_node.values().all(|g| g.len() == 2),
        "each task its own GPU: {gpus_of_node:?}"
    );
    // One step over both nodes' parts: four tasks, both nodes.
    let steps = c.job(id)["steps"].clone();
    let steps = steps.as_array().unwrap();
    assert_eq!(steps.len(), 1, "{steps:?}");
    // Named as srun names a step: its program (not its whole command line).
    assert_eq!(steps[0]["name"], "python3");
    assert_eq!(steps[0]["tasks"], 4);
    assert_eq!(steps[0]["exit_code"], 0);
    assert_eq!(steps[0]["nodes"].as_array().unwrap().len(), 2);
}

/// The python with torch that the torch test uses: GPUCTL_TORCH_PYTHON, else the venv
/// `.ci/run` makes (`/opt/gpuctl-torch`); `None` where neither is (a developer's
/// machine without torch: the test says it was skipped).
fn torch_python() -> Option<String> {
    let p = std::env::var("GPUCTL_TORCH_PYTHON")
        .unwrap_or_else(|_| "/opt/gpuctl-torch/bin/python".into());
    if std::path::Path::new(&p).exists() {
        Some(p)
    } else {
        gpuctl_tests::skipped(
            "GPUCTL_REQUIRE_TORCH",
            &format!("a python with torch at {p} (.ci/run installs one; set GPUCTL_TORCH_PYTHON)"),
        );
        None
    }
}

/// The same Lightning-style script with real torch.distributed: `init_process_group`
/// over gloo from the environment srun gives (MASTER_ADDR, MASTER_PORT, RANK,
/// WORLD_SIZE), an all-reduce of every rank's number and an all-gather of who each
/// rank is: four ranks over two nodes, each its own GPU.
#[test]
fn a_lightning_script_runs_torch_distributed_gloo_over_both_nodes() {
    let Some(python) = torch_python() else {
        return;
    };
    let c = Cluster::start(&[
        ("node-a.invalid", "2xA100-80GB"),
        ("node-b.invalid", "2xA100-80GB"),
    ]);
    let train = r#"
import datetime, json, os
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
me = {"rank": rank, "local": int(os.environ["LOCAL_RANK"]), "node": os.environ["GPUCTL_NODE"],
      "gpu": os.environ["CUDA_VISIBLE_DEVICES"]}
everyone = [None] * world
dist.all_gather_object(everyone, me)
if rank == 0:
    print("SUM %g WORLD %d" % (t.item(), world))
    print("RANKS " + json.dumps(everyone), flush=True)
dist.destroy_process_group()
"#;
    std::fs::write(c.path("train.py"), train).unwrap();
    let script = format!(
        "#!/bin/bash\n#SBATCH --job-name=gloo\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --gpus-per-task=1\n#SBATCH --time=5\n#SBATCH --output=gloo-%j.%t.out\nexport GLOO_SOCKET_IFNAME=lo\nsrun {python} train.py\n"
    );
    let id = c.submit("gloo.sbatch", &script);
    let j = c.wait_state(id, "COMPLETED", Duration::from_secs(180));
    assert_eq!(j["steps"][0]["tasks"], 4, "{j}");
    let out = std::fs::read_to_string(c.path(&format!("gloo-{id}.0.out"))).unwrap();
    assert!(
        out.contains("SUM 10 WORLD 4"),
        "1+2+3+4 over four ranks: {out}"
    );
    let ranks = out
        .lines()
        .find_map(|l| l.strip_prefix("RANKS "))
        .unwrap_or_else(|| panic!("no gather: {out}"));
    let ranks: Vec<Value> = serde_json::from_str(ranks).unwrap();
    let gpus: BTreeSet<&str> = ranks.iter().map(|r| r["gpu"].as_str().unwrap()).collect();
    assert_eq!(gpus.len(), 4, "each rank its own GPU: {ranks:?}");
    for (i, r) in ranks.iter().enumerate() {
        assert_eq!(r["rank"], i, "{r}");
        assert_eq!(r["local"], i % 2, "{r}");
        let node = if i < 2 {
            "node-a.invalid"
        } else {
            "node-b.invalid"
        };
        assert_eq!(r["node"], node, "{r}");
    }
}

/// Steps in accounting, as sacct shows them: `ID.batch`, then one row for each `srun`
/// of the script in the order they ran, with its tasks' worst exit code.
#[test]
fn each_srun_is_a_step_in_history() {
    let c = Cluster::start(&[("n1", "2xA100-80GB")]);
    let id = c.submit(
        "s.sbatch",
        "#!/bin/sh\n#SBATCH --ntasks-per-node=2 --gpus-per-task=1 -o s.out\nsrun -n 2 true\nsrun sh -c 'exit $((3 - SLURM_LOCALID))' || echo step failed\nsrun --ntasks-per-node 1 echo once\n",
    );
    c.wait_state(id, "COMPLETED", T);
    let rows = c.json(&["history"]);
    let rows: Vec<&Value> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["job_id"].as_str().unwrap().starts_with(&id.to_string()))
        .collect();
    let ids: Vec<&str> = rows.iter().map(|r| r["job_id"].as_str().unwrap()).collect();
    let want: Vec<String> = ["", ".batch", ".0", ".1", ".2"]
        .iter()
        .map(|s| format!("{id}{s}"))
        .collect();
    assert_eq!(ids, want);
    let field = |i: usize, k: &str| rows[i][k].clone();
    assert_eq!(field(2, "name"), "true");
    assert_eq!(field(2, "state"), "COMPLETED");
    assert_eq!(field(2, "reason"), "2 tasks");
    assert_eq!(field(3, "state"), "FAILED");
    assert_eq!(field(3, "exit_code"), 3, "the worst task's");
    assert_eq!(field(4, "reason"), "1 task");
    assert_eq!(field(4, "node"), "n1");
    let text = c.gpuctl_ok(&["history", "-o", "jobid,name,state,exit_code"]);
    assert!(
        text.contains(&format!("{id}.1")) && text.contains("FAILED"),
        "{text}"
    );
    let out = std::fs::read_to_string(c.path("s.out")).unwrap();
    assert!(out.contains("step failed") && out.contains("once"), "{out}");
}

/// A job `command` with tasks: the node starts each (through its srun); the job ends
/// as its worst task did.
#[test]
fn a_command_job_starts_each_task_and_ends_as_the_worst() {
    let c = Cluster::start(&[("n1", "4xA100-80GB")]);
    let id = c.submit(
        "t.toml",
        "command = [\"/bin/sh\", \"-c\", \"echo $RANK/$WORLD_SIZE $CUDA_VISIBLE_DEVICES >> tasks.txt\"]\n[resources]\ngpus = 4\ntasks_per_node = 2\n",
    );
    c.wait_state(id, "COMPLETED", T);
    let text = std::fs::read_to_string(c.path("tasks.txt")).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{text}");
    let (r0, r1) = (lines[0], lines[1]);
    assert!(
        r0.starts_with("0/2 GPU-") && r1.starts_with("1/2 GPU-"),
        "{text}"
    );
    let gpus = |l: &str| l.split(' ').nth(1).unwrap().split(',').count();
    assert_eq!((gpus(r0), gpus(r1)), (2, 2), "two GPUs a task: {text}");
    assert_ne!(r0.split(' ').nth(1), r1.split(' ').nth(1), "{text}");
    assert_eq!(c.job(id)["resources"]["cpus"], 2, "a CPU a task by default");

    // Per-task output files (srun -o with %t), opened in the job's directory.
    let id = c.submit(
        "o.sbatch",
        "#!/bin/sh\n#SBATCH --ntasks-per-node=2\nsrun -o per-%j-%t.out sh -c 'echo task $SLURM_PROCID; echo err >&2'\n",
    );
    c.wait_state(id, "COMPLETED", T);
    for t in 0..2 {
        let out = std::fs::read_to_string(c.path(&format!("per-{id}-{t}.out"))).unwrap();
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort();
        assert_eq!(lines, ["err", format!("task {t}").as_str()], "{out}");
    }

    // Task 1 fails worse than task 0: the job's exit code is task 1's.
    let id = c.submit(
        "f.sbatch",
        "#!/bin/sh\n#SBATCH --ntasks-per-node=2\nsrun sh -c 'exit $((3 + SLURM_LOCALID))'\n",
    );
    let j = c.wait_state(id, "FAILED", T);
    assert_eq!(j["exit_code"], 4, "{j}");
}

/// Task counts that cannot be placed evenly are refused at submit, where they stand.
#[test]
fn uneven_tasks_are_refused_at_submit() {
    let c = Cluster::controller_only();
    std::fs::write(
        c.path("u.toml"),
        "command = [\"true\"]\n[resources]\ngpus = 3\ntasks_per_node = 2\n",
    )
    .unwrap();
    let out = c.gpuctl(&["submit", "u.toml"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("u.toml:4:") && err.contains("do not split over 2 tasks"),
        "{err}"
    );
}

/// A job of an ordinary user: srun (the agent's link to gpuctl) runs as that user, its
/// tasks are theirs, and it records its step in the job's step file, which is theirs
/// alone.
#[test]
fn a_users_job_runs_its_tasks_and_steps_as_that_user() {
    let user = "gpuctl-test-tasks";
    if gpuctl_tests::ensure_user(user).is_none() {
        gpuctl_tests::skipped("GPUCTL_REQUIRE_ROOT", "a test user (root to make it)");
        return;
    }
    let c = Cluster::start(&[("n1", "2xA100-80GB")]);
    let dir = c.user_dir(user);
    std::fs::write(
        dir.join("u.sbatch"),
        "#!/bin/sh\n#SBATCH --ntasks-per-node=2 -o u.out\nls -l \"$GPUCTL_STEPS_FILE\"\nsrun sh -c 'echo $(id -un) task $SLURM_PROCID step $SLURM_STEP_ID'\n",
    )
    .unwrap();
    let id = submitted_id(&c.gpuctl_as(user, &dir, &["submit", "--json", "u.sbatch"]));
    c.wait_state(id, "COMPLETED", T);
    let text = std::fs::read_to_string(dir.join("u.out")).unwrap();
    assert!(text.contains(&format!("-rw------- 1 {user}")), "{text}");
    for t in 0..2 {
        assert!(text.contains(&format!("{user} task {t} step 0")), "{text}");
    }
    let steps = c.job(id)["steps"].clone();
    assert_eq!(steps[0]["tasks"], 2, "{steps}");
    assert_eq!(steps[0]["exit_code"], 0, "{steps}");
}

/// Steps running now, from the agents' heartbeats: `queue --steps` lists them (as
/// squeue --steps) and the job's JSON has them without an end; cancelling the job ends
/// them with it.
#[test]
fn running_steps_are_listed_while_they_run() {
    let c = Cluster::start(&[("n1", "2xA100-80GB")]);
    let id = c.submit(
        "r.sbatch",
        "#!/bin/sh\n#SBATCH --ntasks-per-node=2 -o r.out\nsrun true\nsrun sleep 60\n",
    );
    c.wait_state(id, "RUNNING", T);
    let step = format!("{id}.1");
    assert!(
        gpuctl_tests::wait_for(T, || c.gpuctl_ok(&["queue", "--steps"]).contains(&step)),
        "{}",
        c.gpuctl_ok(&["queue", "--steps"])
    );
    let text = c.gpuctl_ok(&["queue", "--steps"]);
    let line = text.lines().find(|l| l.contains(&step)).unwrap();
    assert!(
        line.contains(" sleep ") && line.contains(" 2 ") && line.contains("n1"),
        "{text}"
    );
    assert!(
        !text.contains(&format!("{id}.0 ")),
        "step 0 has ended: {text}"
    );
    // While the job runs, its JSON has the steps running now.
    let steps = c.job(id)["steps"].clone();
    let running: Vec<&Value> = steps.as_array().unwrap().iter().collect();
    assert_eq!(running.len(), 1, "{steps}");
    assert_eq!(running[0]["id"], 1, "{steps}");
    assert!(
        running[0]["end_time"].is_null() && running[0]["exit_code"].is_null(),
        "{steps}"
    );
    c.gpuctl_ok(&["cancel", &id.to_string()]);
    c.wait_state(id, "CANCELLED", T);
    assert!(!c.gpuctl_ok(&["queue", "--steps"]).contains(&step));
}

/// Steps sized within their job (`srun -G 1`, `srun -c 2`): two concurrent one-GPU
/// steps of a two-GPU job take different GPUs, a third waits for one of them (Slurm's
/// "step creation temporarily disabled"), and `-c 1` binds the task to one CPU.
#[test]
fn sized_steps_take_their_own_gpus_and_cpus_within_the_job() {
    let c = Cluster::start(&[("steps-a", "2xA100-80GB")]);
    let script = "#!/bin/bash\n#SBATCH -G 2 -c 2 --output=steps-%j.out\n\
        srun -G 1 sh -c 'echo $CUDA_VISIBLE_DEVICES > a.gpu; sleep 2' &\n\
        srun -G 1 sh -c 'echo $CUDA_VISIBLE_DEVICES > b.gpu; sleep 2' &\n\
        sleep 0.5\n\
        srun -G 1 sh -c 'echo $CUDA_VISIBLE_DEVICES > c.gpu'\n\
        wait\n\
        srun -c 1 sh -c 'nproc > c1.cpus; echo $SLURM_CPUS_PER_TASK >> c1.cpus'\n\
        srun -G 3 true || echo refused > g3.out\n";
    let id = c.submit("steps.sbatch", script);
    let j = c.wait_state(id, "COMPLETED", T);
    let read = |f: &str| {
        std::fs::read_to_string(c.path(f))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let (a, b, third) = (read("a.gpu"), read("b.gpu"), read("c.gpu"));
    let all: BTreeSet<&str> = j["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        all.contains(a.as_str()) && all.contains(b.as_str()),
        "{a} {b} {all:?}"
    );
    assert_ne!(a, b, "two concurrent steps, two GPUs");
    assert!(all.contains(third.as_str()), "{third}");
    let out = read(&format!("steps-{id}.out"));
    assert!(out.contains("step creation temporarily disabled"), "{out}");
    // One CPU of the job's (nproc counts the CPUs the task may run on).
    assert_eq!(read("c1.cpus"), "1\n1");
    assert_eq!(read("g3.out"), "refused");
}
