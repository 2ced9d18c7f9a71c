//! Slurm batch scripts as they are (`examples/sbatch/`): each is submitted with
//! `gpuctl submit FILE.sbatch` and gets the resources its `#SBATCH` lines ask for;
//! unsupported options are refused by name; jobs see the `SLURM_*` variables.

use std::path::PathBuf;
use std::time::Duration;

use gpuctl_tests::{Cluster, submitted_id};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);

fn example(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/sbatch")
        .join(name)
        .display()
        .to_string()
}

fn submit(c: &Cluster, name: &str) -> u64 {
    c.json(&["submit", &example(name)])["job_id"]
        .as_u64()
        .unwrap()
}

/// (file, name, gpus, gpu models, cpus, memory bytes, nodes, time limit secs)
type Want = (&'static str, &'static str, u64, Value, u64, u64, u64, u64);

/// What each example script asks for, as `queue --json` must show it.
fn wants() -> [Want; 10] {
    let gib = 1u64 << 30;
    [
        (
            "multi_gpu_node.sbatch",
            "finetune-4gpu",
            4,
            json!([]),
            16,
            64 * gib,
            1,
            4 * 3600,
        ),
        (
            "ddp_torchrun.sbatch",
            "ddp-llm",
            8,
            json!([]),
            8,
            48 * gib,
            2,
            2 * 86400,
        ),
        (
            "typed_gpu.sbatch",
            "typed_gpu.sbatch",
            2,
            json!(["a100"]),
            2,
            0,
            1,
            1800,
        ),
        (
            "gpus_flag.sbatch",
            "gpus_flag.sbatch",
            1,
            json!(["a100"]),
            1,
            8000 << 20,
            1,
            1800,
        ),
        (
            "dependency.sbatch",
            "eval-after",
            1,
            json!([]),
            1,
            0,
            1,
            1200,
        ),
        (
            "requeue_low.sbatch",
            "batch-scoring",
            1,
            json!([]),
            1,
            0,
            1,
            6 * 3600,
        ),
        (
            "cpu_only.sbatch",
            "preprocess",
            0,
            json!([]),
            2,
            2 * gib,
            1,
            600,
        ),
        (
            "mail_and_account.sbatch",
            "nightly",
            1,
            json!([]),
            1,
            0,
            1,
            5400,
        ),
        (
            "spaced_options.sbatch",
            "eval",
            2,
            json!([]),
            6,
            32 * gib,
            1,
            7200,
        ),
        (
            "output_error_chdir.sbatch",
            "split-logs",
            0,
            json!([]),
            1,
            0,
            1,
            300,
        ),
    ]
}

#[test]
fn sbatch_scripts_get_what_they_ask_for() {
    let c = Cluster::start(&[("n1", "8xA100-80GB"), ("n2", "8xA100-80GB")]);
    let first = submit(&c, "single_gpu.sbatch");
    assert_eq!(first, 1, "dependency.sbatch names job 1");
    let done = c.wait_state(first, "COMPLETED", T);
    let out = std::fs::read_to_string(c.path("single-1.out")).unwrap();
    assert!(
        out.starts_with("job 1 (single-gpu) on n1 with 1 GPU(s): GPU-")
            || out.starts_with("job 1 (single-gpu) on n2 with 1 GPU(s): GPU-"),
        "{out}"
    );
    assert_eq!(done["resources"]["memory_bytes"], 16u64 << 30);

    // As with sbatch, an output directory must exist before the job starts.
    std::fs::create_dir_all(c.path("logs")).unwrap();
    for (file, name, gpus, models, cpus, mem, nodes, limit) in wants() {
        let id = submit(&c, file);
        let j = c.job(id);
        let r = &j["resources"];
        assert_eq!(j["name"], name, "{file}");
        assert_eq!(r["gpus"], gpus, "{file}: {j}");
        assert_eq!(r["gpu_models"], models, "{file}: {j}");
        assert_eq!(r["cpus"], cpus, "{file}: {j}");
        assert_eq!(r["memory_bytes"], mem, "{file}: {j}");
        assert_eq!(r["nodes"], nodes, "{file}: {j}");
        assert_eq!(j["time_limit_secs"], limit, "{file}: {j}");
        c.wait_state(id, "COMPLETED", T);
    }
    let low = c.json(&["queue", "--all"]);
    let scoring = low
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["name"] == "batch-scoring")
        .unwrap();
    assert_eq!(scoring["qos"], "low");
    assert_eq!(scoring["priority"], -100);
    // Each rank of the gang wrote its own file; the chdir job wrote into /tmp.
    for r in 0..2 {
        let f = std::fs::read_dir(c.dir.path())
            .unwrap()
            .flatten()
            .find(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("ddp-") && n.ends_with(&format!(".{r}.out"))
            })
            .expect("a ddp rank output");
        let text = std::fs::read_to_string(f.path()).unwrap();
        assert!(
            text.starts_with(&format!("node {r} of 2, master 127.0.0.1:")),
            "{text}"
        );
    }
}

#[test]
fn unsupported_options_are_refused_by_name_and_harmless_ones_warn() {
    let c = Cluster::start(&[("n1", "2xA100-80GB")]);
    let out = c.gpuctl(&["submit", &example("licenses.sbatch")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("licenses.sbatch:3:") && err.contains("--licenses"),
        "{err}"
    );
    assert!(c.json(&["queue", "--all"]).as_array().unwrap().is_empty());
    // -p names a partition; an unknown one is refused by the controller.
    let p = c.json(&["submit", &example("partition.sbatch")]);
    let id = p["job_id"].as_u64().unwrap();
    assert_eq!(c.job(id)["partition"], "default");
    let out = c.gpuctl(&["submit", "--wrap", "true", "-p", "nowhere"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown partition \"nowhere\"") && err.contains("default"),
        "{err}"
    );
    // --wrap, and command-line options that win over the file's.
    let wrapped = c.json(&[
        "submit",
        "--wrap",
        "echo wrapped $SLURM_GPUS_ON_NODE",
        "--gpus",
        "2",
        "-t",
        "5",
    ]);
    let id = wrapped["job_id"].as_u64().unwrap();
    let j = c.wait_state(id, "COMPLETED", T);
    assert_eq!(j["time_limit_secs"], 300);
    let out = std::fs::read_to_string(c.path(&format!("slurm-{id}.out"))).unwrap();
    assert_eq!(out, "wrapped 2\n");
    let over = c.json(&[
        "submit",
        &example("typed_gpu.sbatch"),
        "-J",
        "renamed",
        "--gpus",
        "1",
        "-c",
        "1",
    ]);
    let j = c.job(over["job_id"].as_u64().unwrap());
    assert_eq!(j["name"], "renamed");
    assert_eq!(j["resources"]["gpus"], 1);
    assert_eq!(j["resources"]["gpu_models"], json!([]));
    let out = c.gpuctl(&["submit", "--json", &example("mail_and_account.sbatch")]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // The account is the job's (the scheduler sees it), and so are the comment and
    // the mail options: kept, not warned about.
    for o in ["--account", "--comment", "--mail-type", "--mail-user"] {
        assert!(!err.contains(o), "{o}: {err}");
    }
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["job_id"]
        .as_u64()
        .unwrap();
    assert_eq!(c.job(id)["account"], "research");
    assert_eq!(c.job(id)["comment"], "nightly regression");
    assert_eq!(c.job(id)["mail_type"], "END,FAIL");
}

#[test]
fn a_script_on_standard_input_is_submitted_as_sbatch_reads_one() {
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let script = b"#!/bin/sh\n#SBATCH -G 1 -o piped-%j.out\necho from stdin\n";
    let out = c.gpuctl_stdin(&["submit", "-", "--json"], script);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = v["job_id"].as_u64().unwrap();
    let j = c.wait_state(id, "COMPLETED", T);
    assert_eq!(j["name"], "sbatch", "{j:#}");
    let text = std::fs::read_to_string(c.path(&format!("piped-{id}.out"))).unwrap();
    assert_eq!(text, "from stdin\n");
    // A bad line is placed in "stdin".
    let out = c.gpuctl_stdin(&["submit", "-"], b"#!/bin/sh\n#SBATCH --licenses=x\ntrue\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stdin:2:") && err.contains("--licenses"),
        "{err}"
    );
}

/// sbatch's default `--export=ALL`: a batch script gets the submitting shell's
/// environment, but never another job's identity (a stale SLURM_JOB_ID, MASTER_ADDR);
/// a TOML job file gets none of it; `--export=NONE` turns it off.
#[test]
fn a_batch_script_takes_the_submitting_shells_environment() {
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    let submit = |file: &str, text: &str, extra: &[&str]| -> u64 {
        std::fs::write(c.path(file), text).unwrap();
        let out = std::process::Command::new(gpuctl_tests::bin("gpuctl"))
            .args(["submit", "--json"])
            .args(extra)
            .arg(file)
            .env("GPUCTL_CONTROLLER", c.url())
            .env("FROM_SHELL", "yes")
            .env("SLURM_JOB_ID", "999999")
            .env("MASTER_ADDR", "192.0.2.1")
            .current_dir(c.path(""))
            .output()
            .unwrap();
        submitted_id(&out)
    };
    let line = "echo \"${FROM_SHELL:-unset} $SLURM_JOB_ID $MASTER_ADDR\"";
    let batch = submit(
        "e.sbatch",
        &format!("#!/bin/sh\n#SBATCH -o e.out\n{line}\n"),
        &[],
    );
    let none = submit(
        "n.sbatch",
        &format!("#!/bin/sh\n#SBATCH -o n.out\n{line}\n"),
        &["--export", "NONE"],
    );
    let toml = submit(
        "t.toml",
        &format!("script = '{line}'\nstdout = \"t.out\"\n"),
        &[],
    );
    for id in [batch, none, toml] {
        c.wait_state(id, "COMPLETED", T);
    }
    let read = |f: &str| std::fs::read_to_string(c.path(f)).unwrap();
    let first = |f: &str| read(f).split(' ').next().unwrap().to_string();
    let e = read("e.out");
    assert!(e.starts_with(&format!("yes {batch} ")), "{e}");
    assert!(!e.contains("192.0.2.1"), "{e}");
    assert_eq!(first("n.out"), "unset");
    assert_eq!(first("t.out"), "unset");
}

/// `--exclusive`: the job takes the whole node (both its GPUs, all its CPUs and memory),
/// so a one-GPU job waits beside it; over nodes of different sizes it is refused with
/// both sizes named.
#[test]
fn an_exclusive_job_has_its_node_to_itself() {
    let mut c = Cluster::start(&[("n1", "2xA100-80GB")]);
    let first = c.submit("hold.sbatch", "#!/bin/sh\n#SBATCH --exclusive\nsleep 30\n");
    let j = c.wait_state(first, "RUNNING", T);
    assert_eq!(j["resources"]["gpus"], 2, "{j}");
    assert_eq!(j["gpus"].as_array().unwrap().len(), 2, "{j}");
    let small = c.submit("one.toml", "command = [\"true\"]\n[resources]\ngpus = 1\n");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(c.job(small)["state"], "PENDING", "nothing fits beside it");
    c.gpuctl_ok(&["cancel", &first.to_string()]);
    c.wait_state(small, "COMPLETED", T);
    let id = submit(&c, "exclusive.sbatch");
    c.wait_state(id, "COMPLETED", T);
    let out = std::fs::read_to_string(c.path(&format!("exclusive-{id}.out"))).unwrap();
    assert_eq!(out, "exclusive: 2 GPUs\n");

    c.add_agent("n2", "4xA100-80GB", &[]);
    c.wait_nodes_up(2);
    std::fs::write(c.path("x.sbatch"), "#!/bin/sh\n#SBATCH --exclusive\ntrue\n").unwrap();
    let out = c.gpuctl(&["submit", "x.sbatch"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("differ in size") && err.contains("n2"),
        "{err}"
    );
    // Kept to alike nodes, it is taken.
    std::fs::write(
        c.path("y.sbatch"),
        "#!/bin/sh\n#SBATCH --exclusive -w n2\ntrue\n",
    )
    .unwrap();
    let id = c.json(&["submit", "y.sbatch"])["job_id"].as_u64().unwrap();
    let j = c.wait_state(id, "COMPLETED", T);
    assert_eq!(j["resources"]["gpus"], 4, "{j}");
}
