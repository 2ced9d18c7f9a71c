//! The tools that drive Slurm run unchanged (issue 57): gpuctl called as sbatch,
//! squeue, sacct, scancel, sinfo and scontrol takes their options and prints what the
//! programs that call them parse.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gpuctl_tests::{Cluster, wait_for};

const T: Duration = Duration::from_secs(30);

fn tool(c: &Cluster, links: &Path, name: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(links.join(name))
        .args(args)
        .env("GPUCTL_CONTROLLER", c.url())
        .current_dir(c.dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn out(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn sbatch_squeue_sacct_scancel_sinfo_and_scontrol_speak_slurm() {
    let c = Cluster::start(&[("sl1", "2xA100-80GB")]);
    let links = c.slurm_links();

    // A script on standard input, with what generated scripts carry.
    let script = "#!/bin/sh\n#SBATCH -t 5 --wckey=proj --comment=\"from a tool\"\n#SBATCH --cpus-per-gpu=2\nsrun --unbuffered -l hostname\n";
    let id: u64 = out(&tool(
        &c,
        &links,
        "sbatch",
        &["--parsable", "-J", "hello", "-G", "1"],
        Some(script),
    ))
    .trim()
    .parse()
    .expect("--parsable prints the id alone");
    c.wait_state(id, "COMPLETED", T);
    // srun -l: each line after its task's rank, in sbatch's default output file.
    let output = std::fs::read_to_string(c.path(&format!("slurm-{id}.out"))).unwrap();
    assert!(
        output.starts_with("0: ") && output.lines().count() == 1,
        "{output:?}"
    );

    // A file, and the sentence tools look for.
    std::fs::write(c.path("long.sh"), "#!/bin/sh\nsleep 300\n").unwrap();
    let said = out(&tool(
        &c,
        &links,
        "sbatch",
        &[
            "-t",
            "10",
            "--gres=gpu:1",
            "--comment",
            "long run",
            "long.sh",
        ],
        None,
    ));
    let long: u64 = said
        .trim()
        .strip_prefix("Submitted batch job ")
        .unwrap_or_else(|| panic!("{said}"))
        .parse()
        .unwrap();
    c.wait_state(long, "RUNNING", T);

    squeue_formats(&c, &links, long);
    sacct_formats(&c, &links, id);
    scancel_signals(&c, &links);
    scontrol_updates(&c, &links, long);
    // scancel: silent, and the cancel is by uid in sacct.
    let s = tool(&c, &links, "scancel", &[&long.to_string()], None);
    assert!(out(&s).is_empty());
    c.wait_state(long, "CANCELLED", T);
    let a = out(&tool(
        &c,
        &links,
        "sacct",
        &["-j", &long.to_string(), "-X", "-n", "-P", "-o", "State"],
        None,
    ));
    assert_eq!(a.trim(), "CANCELLED by 0");
    // A finished job again: said, not a failure.
    assert!(
        tool(&c, &links, "scancel", &[&id.to_string()], None)
            .status
            .success()
    );

    info_formats(&c, &links, id);
}

/// `scancel -s USR1`: the job hears it and runs on; `scancel` then cancels it.
fn scancel_signals(c: &Cluster, links: &Path) {
    let seen = c.path("usr1.seen");
    let ready = c.path("usr1.ready");
    // The file is written whole and then renamed, so its existence means its content.
    let script = format!(
        "#!/bin/sh\ntrap 'echo heard > {s}.tmp && mv {s}.tmp {s}' USR1\ntouch {r}\n\
         while :; do sleep 0.2; done\n",
        s = seen.display(),
        r = ready.display()
    );
    let id: u64 = out(&tool(
        c,
        links,
        "sbatch",
        &["--parsable", "-t", "5"],
        Some(&script),
    ))
    .trim()
    .parse()
    .unwrap();
    c.wait_state(id, "RUNNING", T);
    // The shell says when its trap is set (a USR1 before it would end the job).
    let t = std::time::Instant::now();
    while !ready.exists() && t.elapsed() < T {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ready.exists(), "the job never set its trap");
    let s = tool(c, links, "scancel", &["-s", "USR1", &id.to_string()], None);
    assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    let t = std::time::Instant::now();
    while !seen.exists() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "heard\n");
    let q = out(&tool(
        c,
        links,
        "squeue",
        &["-h", "-o", "%T", "-j", &id.to_string()],
        None,
    ));
    assert_eq!(q.trim(), "RUNNING", "a signal does not end the job");
    // A signal the controller does not send (WINCH) is refused.
    let bad = tool(c, links, "scancel", &["-s", "WINCH", &id.to_string()], None);
    assert!(!bad.status.success());
    let s = tool(c, links, "scancel", &[&id.to_string()], None);
    assert!(s.status.success());
    c.wait_state(id, "CANCELLED", T);
}

/// `scontrol update`: a running job's limit (raised by root, then one already passed
/// ends a job TIMEOUT), a held job's name and comment, a node's state; other keys are
/// refused, named.
fn scontrol_updates(c: &Cluster, links: &Path, long: u64) {
    let ok = |args: &[&str]| {
        let o = tool(c, links, "scontrol", args, None);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        out(&o)
    };
    let shown = |id: u64| ok(&["show", "job", &id.to_string()]);
    assert!(
        shown(long).contains("TimeLimit=00:10:00"),
        "{}",
        shown(long)
    );
    ok(&["update", &format!("JobId={long}"), "TimeLimit=+5"]);
    assert!(
        shown(long).contains("TimeLimit=00:15:00"),
        "{}",
        shown(long)
    );
    // A running job's limit cut to 2 seconds, which it has passed: TIMEOUT now.
    let short: u64 = out(&tool(
        c,
        links,
        "sbatch",
        &["--parsable", "-t", "10"],
        Some(
            "#!/bin/sh
sleep 300
",
        ),
    ))
    .trim()
    .parse()
    .unwrap();
    c.wait_state(short, "RUNNING", T);
    std::thread::sleep(Duration::from_secs(3));
    ok(&["update", &format!("JobId={short}"), "TimeLimit=0:02"]);
    c.wait_state(short, "TIMEOUT", T);
    // A held job renamed and commented (values with spaces, as a shell passes them).
    let held: u64 = out(&tool(
        c,
        links,
        "sbatch",
        &["--parsable", "-H", "-J", "before"],
        Some(
            "#!/bin/sh
true
",
        ),
    ))
    .trim()
    .parse()
    .unwrap();
    ok(&[
        "update",
        &format!("JobId={held}"),
        "JobName=after",
        "Comment=two words",
        "Nice",
    ]);
    let q = ok(&["show", "job", &held.to_string()]);
    assert!(q.contains("JobName=after") && q.contains("Nice=100"), "{q}");
    let q = out(&tool(
        c,
        links,
        "squeue",
        &["-h", "-o", "%j|%k", "-j", &held.to_string()],
        None,
    ));
    assert_eq!(q.trim(), "after|two words");
    // What gpuctl does not change is refused, named; the job is as it was.
    let bad = tool(
        c,
        links,
        "scontrol",
        &["update", &format!("JobId={held}"), "Dependency=afterok:1"],
        None,
    );
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("Dependency=afterok:1"));
    let bad = tool(
        c,
        links,
        "scontrol",
        &["update", &format!("JobId={held}"), "JobName=x\u{1b}y"],
        None,
    );
    assert!(
        !bad.status.success(),
        "a control character in a name is refused"
    );
    assert!(shown(held).contains("JobName=after"));
    ok(&["release", &held.to_string()]);
    c.wait_state(held, "COMPLETED", T);
    let ended = tool(
        c,
        links,
        "scontrol",
        &["update", &format!("JobId={held}"), "TimeLimit=5"],
        None,
    );
    assert!(!ended.status.success(), "an ended job is not updated");
    // A node: drained with a reason (one is required), then resumed.
    let bare = tool(
        c,
        links,
        "scontrol",
        &["update", "NodeName=sl1", "State=DRAIN"],
        None,
    );
    assert!(!bare.status.success());
    ok(&[
        "update",
        "NodeName=sl1",
        "State=DRAIN",
        "Reason=maintenance",
    ]);
    let n = ok(&["show", "node", "sl1"]);
    assert!(n.contains("DRAIN") && n.contains("maintenance"), "{n}");
    ok(&["update", "NodeName=sl1", "State=RESUME"]);
    assert!(!ok(&["show", "node", "sl1"]).contains("DRAIN"));
}

fn squeue_formats(c: &Cluster, links: &Path, long: u64) {
    // squeue's formats.
    let q = out(&tool(
        c,
        links,
        "squeue",
        &["-h", "-o", "%i %t %j %u %D %R"],
        None,
    ));
    assert_eq!(q.trim(), format!("{long} R long.sh root 1 sl1"), "{q}");
    let q = out(&tool(
        c,
        links,
        "squeue",
        &["--noheader", "--format=%.10i|%T", "-j", &long.to_string()],
        None,
    ));
    assert_eq!(q.trim_end(), format!("{long:>10}|RUNNING"));
    let q = out(&tool(
        c,
        links,
        "squeue",
        &["-O", "JobID:8,State:10,Name", "-t", "R"],
        None,
    ));
    let mut lines = q.lines();
    assert!(
        lines.next().unwrap().starts_with("JOBID   STATE     NAME"),
        "{q}"
    );
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with(&format!("{long:<8}RUNNING   long.sh")),
        "{q}"
    );
    let q = out(&tool(c, links, "squeue", &["--json"], None));
    let v: serde_json::Value = serde_json::from_str(&q).unwrap();
    assert_eq!(v["jobs"][0]["job_state"][0], "RUNNING", "{v}");
    assert_eq!(v["jobs"][0]["comment"], "long run", "{v}");
    // --comment is kept and shown (%k, like squeue's).
    let q = out(&tool(c, links, "squeue", &["-h", "-o", "%i|%k"], None));
    assert_eq!(q.trim(), format!("{long}|long run"), "{q}");
}

fn sacct_formats(c: &Cluster, links: &Path, id: u64) {
    // The script's --comment, as sacct shows it.
    let a = out(&tool(
        c,
        links,
        "sacct",
        &[
            "-j",
            &id.to_string(),
            "-X",
            "-n",
            "-P",
            "-o",
            "JobID,Comment,WCKey",
        ],
        None,
    ));
    assert_eq!(a.trim(), format!("{id}|from a tool|proj"), "{a}");
    // sacct: the job, its batch step and its srun step, parsable.
    let a = out(&tool(
        c,
        links,
        "sacct",
        &[
            "-j",
            &id.to_string(),
            "-o",
            "JobID,JobName,State,ExitCode,NodeList",
            "-P",
            "-n",
        ],
        None,
    ));
    let rows: Vec<&str> = a.lines().collect();
    assert_eq!(rows[0], format!("{id}|hello|COMPLETED|0:0|sl1"), "{a}");
    assert_eq!(
        rows[1],
        format!("{id}.batch|batch|COMPLETED|0:0|sl1"),
        "{a}"
    );
    assert_eq!(rows[2], format!("{id}.0|hostname|COMPLETED|0:0|sl1"), "{a}");
    let with_header = out(&tool(
        c,
        links,
        "sacct",
        &[
            "-j",
            &id.to_string(),
            "-X",
            "-o",
            "JobID,State",
            "--parsable",
        ],
        None,
    ));
    assert_eq!(with_header, format!("JobID|State|\n{id}|COMPLETED|\n"));
}

fn info_formats(c: &Cluster, links: &Path, id: u64) {
    // sinfo and scontrol.
    assert!(wait_for(T, || c.node_state("sl1") == "IDLE"));
    let i = out(&tool(
        c,
        links,
        "sinfo",
        &["-h", "-o", "%P %a %D %t %N %G"],
        None,
    ));
    assert_eq!(i.trim(), "default* up 1 idle sl1 gpu:A100-80GB:2", "{i}");
    let n = out(&tool(c, links, "sinfo", &["-N", "-h", "-o", "%N %t"], None));
    assert_eq!(n.trim(), "sl1 idle");
    let j = out(&tool(
        c,
        links,
        "scontrol",
        &["show", "job", &id.to_string()],
        None,
    ));
    assert!(j.starts_with(&format!("JobId={id} JobName=hello\n")), "{j}");
    assert!(
        j.contains("JobState=COMPLETED") && j.contains("ExitCode=0:0"),
        "{j}"
    );
    let n = out(&tool(c, links, "scontrol", &["show", "node", "sl1"], None));
    assert!(
        n.starts_with("NodeName=sl1 ") && n.contains("Gres=gpu:A100-80GB:2"),
        "{n}"
    );
    let u = tool(
        c,
        links,
        "scontrol",
        &["update", "JobId=1", "Features=fast"],
        None,
    );
    assert!(!u.status.success());
    assert!(String::from_utf8_lossy(&u.stderr).contains("Features=fast: not changed by gpuctl"));
}

/// dask-jobqueue's `SLURMCluster`, unchanged, on gpuctl's `sbatch` and `scancel`: it
/// writes its worker script, submits it twice, parses `Submitted batch job N`, the two
/// workers connect back and compute a sum, and closing the cluster cancels them.
#[test]
fn dask_jobqueue_scales_to_two_workers_and_computes_a_sum() {
    let Some(python) = gpuctl_tests::venv_python(
        "GPUCTL_DASK_PYTHON",
        "/opt/gpuctl-dask/bin/python",
        "dask_jobqueue, distributed",
        "GPUCTL_REQUIRE_DASK",
    ) else {
        return;
    };
    let c = Cluster::start(&[("dk1", "1xA100-80GB")]);
    let links = c.slurm_links();
    let script = r#"
import sys
from dask_jobqueue import SLURMCluster
from dask.distributed import Client
cluster = SLURMCluster(cores=1, processes=1, memory="1GB", walltime="00:10:00",
                       python=sys.executable, scheduler_options={"host": "127.0.0.1"},
                       log_directory="dask-logs")
cluster.scale(2)
client = Client(cluster)
client.wait_for_workers(2, timeout=120)
total = client.submit(sum, range(1001)).result()
print("workers", len(client.scheduler_info()["workers"]), "sum", total, flush=True)
client.close()
cluster.close()
"#;
    let run = c
        .slurm_tool(&python, &links, &[])
        .args(["-c", script])
        .current_dir(c.dir.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && said.contains("workers 2 sum 500500"),
        "{said}\n{}\n{}",
        String::from_utf8_lossy(&run.stderr),
        c.controller_log()
    );
    // Both worker jobs ran under gpuctl, and closing the cluster cancelled them.
    let a = out(&tool(
        &c,
        &links,
        "sacct",
        &["-a", "-X", "-n", "-P", "-o", "JobName,State"],
        None,
    ));
    let workers: Vec<&str> = a
        .lines()
        .filter(|l| l.starts_with("dask-worker|"))
        .collect();
    assert_eq!(workers.len(), 2, "{a}");
    assert!(
        wait_for(T, || {
            let q = out(&tool(&c, &links, "squeue", &["-h", "-o", "%i"], None));
            q.trim().is_empty()
        }),
        "the workers' jobs still run after the cluster closed"
    );
}

/// Snakemake with its SLURM executor plugin, unchanged: a three-rule workflow submitted
/// through gpuctl's sbatch (each rule a job), followed with sacct, its account checked
/// with sacctmgr, and its outputs made in order.
#[test]
fn snakemake_runs_a_three_rule_workflow_through_its_slurm_executor() {
    let venv = std::env::var("GPUCTL_SNAKEMAKE_VENV").unwrap_or_else(|_| "/opt/gpuctl-smk".into());
    let snakemake = Path::new(&venv).join("bin/snakemake");
    let ok = Command::new(&snakemake)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        gpuctl_tests::skipped(
            "GPUCTL_REQUIRE_SNAKEMAKE",
            &format!("snakemake and its SLURM executor plugin in {venv} (.ci/run installs them)"),
        );
        return;
    }
    let c = Cluster::start(&[("sm1", "1xA100-80GB")]);
    let links = c.slurm_links();
    let work = c.path("workflow");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(
        work.join("Snakefile"),
        "rule all:\n    input: \"out/c.txt\"\n\
         rule a:\n    output: \"out/a.txt\"\n    shell: \"echo a > {output}\"\n\
         rule b:\n    input: \"out/a.txt\"\n    output: \"out/b.txt\"\n    shell: \"cat {input} > {output}; echo b >> {output}\"\n\
         rule c:\n    input: \"out/b.txt\"\n    output: \"out/c.txt\"\n    shell: \"cat {input} > {output}; echo c >> {output}\"\n",
    )
    .unwrap();
    let venv_bin = Path::new(&venv).join("bin");
    let run = c
        .slurm_tool(&snakemake, &links, &[&venv_bin])
        .args(["--executor", "slurm", "--jobs", "2", "--latency-wait", "5"])
        .args([
            "--default-resources",
            "slurm_account=root",
            "runtime=5",
            "mem_mb=1000",
        ])
        .args(["--slurm-init-seconds-before-status-checks", "1"])
        .args(["--seconds-between-status-checks", "2"])
        .current_dir(&work)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success() && said.contains("4 of 4 steps (100%) done"),
        "{said}\n{}",
        String::from_utf8_lossy(&run.stdout)
    );
    assert_eq!(
        std::fs::read_to_string(work.join("out/c.txt")).unwrap(),
        "a\nb\nc\n"
    );
    // Three rules, three jobs, each COMPLETED in gpuctl's accounting.
    let a = out(&tool(
        &c,
        &links,
        "sacct",
        &["-a", "-X", "-n", "-P", "-o", "State"],
        None,
    ));
    assert_eq!(a.lines().filter(|l| *l == "COMPLETED").count(), 3, "{a}");
}
