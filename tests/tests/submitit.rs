//! submitit (facebookincubator/submitit), unchanged, on gpuctl's Slurm commands: its
//! generated batch script (`--signal=USR2@90`, `--open-mode=append`, `--wckey`,
//! `--gpus-per-node`, `srun --unbuffered --output %j_%t_log.out python -u -m
//! submitit.core._submit`), `sbatch`'s "Submitted batch job N", and its watcher's
//! `sacct -o JobID,State,NodeList --parsable2 -j N`: a function submitted from Python
//! runs as a job and its result comes back.

use std::time::Duration;

use gpuctl_tests::Cluster;

#[test]
fn submitit_runs_a_function_as_a_job_and_gets_its_result() {
    let Some(python) = gpuctl_tests::venv_python(
        "GPUCTL_SUBMITIT_PYTHON",
        "/opt/gpuctl-submitit/bin/python",
        "submitit",
        "GPUCTL_REQUIRE_SUBMITIT",
    ) else {
        return;
    };
    let c = Cluster::start(&[("sub1", "1xA100-80GB")]);
    let links = c.slurm_links();
    let script = r#"
import os, submitit
def work(a, b):
    return {"sum": a + b, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "job": os.environ.get("SLURM_JOB_ID")}
ex = submitit.AutoExecutor(folder="submitit-logs", cluster="slurm")
ex.update_parameters(timeout_min=5, slurm_gpus_per_node=1, slurm_job_name="sub")
job = ex.submit(work, 20, 22)
r = job.result()
print("RESULT", r["sum"], "JOB", r["job"], job.job_id, "GPUS", r["gpus"], "STATE", job.state, flush=True)
"#;
    let run = c
        .slurm_tool(&python, &links, &[])
        .args(["-c", script])
        .current_dir(c.dir.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&run.stdout);
    let line = said
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .unwrap_or_default();
    let w: Vec<&str> = line.split(' ').collect();
    assert!(
        run.status.success() && w.len() == 9 && w[1] == "42" && w[3] == w[4],
        "{said}\n{}\n{}",
        String::from_utf8_lossy(&run.stderr),
        c.controller_log()
    );
    assert!(w[6].starts_with("GPU-"), "the job's GPU: {line}");
    // Its state as submitit's watcher read it from sacct (the result file may come
    // before the job has ended).
    assert!(matches!(w[8], "RUNNING" | "COMPLETED"), "{line}");
    let id: u64 = w[3].parse().unwrap();
    c.wait_state(id, "COMPLETED", Duration::from_secs(10));
}
