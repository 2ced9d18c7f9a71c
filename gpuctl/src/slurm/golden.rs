//! Golden tests: each Slurm command's whole output for fixed jobs and nodes, against
//! files in `golden/` that follow Slurm's documented layouts (the squeue, sacct, sinfo
//! and scontrol man pages of Slurm 23.11: squeue's default format
//! `%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R` with a pending job's `(Reason)`; sacct's
//! default fields and widths, `-P`'s `|` with no trailing one and `-p`'s trailing one,
//! steps as `N.batch` and `N.0`; sinfo's `%#P %.5a %.10l %.6D %.6t %N` with the
//! default partition starred and nodes folded into hostlists; scontrol's `Key=Value`
//! lines, three spaces in). Times and users are left out of the fixtures where they
//! depend on the machine (its zone, its password file).
//!
//! `GPUCTL_BLESS=1 cargo test -p gpuctl golden` rewrites the files from the output:
//! read the diff against Slurm's pages before committing one.

use gpuctl_proto as pb;

/// Compares `got` with `golden/NAME`, or writes it there under `GPUCTL_BLESS`.
fn golden(name: &str, got: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/slurm/golden")
        .join(name);
    if std::env::var_os("GPUCTL_BLESS").is_some() {
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (GPUCTL_BLESS=1 writes it)", path.display()));
    assert_eq!(got, want, "{name} differs from its golden file");
}

const NOW: i64 = 1_700_000_000_000;
const MIN: i64 = 60_000;

fn spec(name: &str, command: bool) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        user: "nobody-here".into(),
        account: "risk".into(),
        partition: "gpu".into(),
        qos: "normal".into(),
        command: if command {
            vec!["python".into(), "train.py".into()]
        } else {
            Vec::new()
        },
        script: if command {
            String::new()
        } else {
            "#!/bin/sh\nsrun hostname\n".into()
        },
        resources: Some(pb::Resources {
            cpus: 4,
            memory_bytes: 8 << 30,
            gpu: Some(pb::resources::Gpu::Gpus(1)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn jobs() -> Vec<pb::Job> {
    let ended = |id, name: &str, state: pb::JobState, exit: i32, reason: &str| pb::Job {
        id,
        spec: Some(spec(name, false)),
        state: state as i32,
        node: "gpu01".into(),
        exit_code: Some(exit),
        reason: reason.into(),
        time_limit_secs: 3600,
        steps: vec![pb::Step {
            id: 0,
            name: "hostname".into(),
            start_ms: NOW - 9 * MIN,
            end_ms: NOW - 8 * MIN,
            exit_code: Some(exit),
            tasks: 1,
            nodes: vec!["gpu01".into()],
        }],
        ..Default::default()
    };
    let mut done = ended(41, "prep", pb::JobState::Completed, 0, "");
    done.start_time_ms = NOW - 10 * MIN;
    done.end_time_ms = NOW - 7 * MIN;
    let mut failed = ended(42, "eval-long-name", pb::JobState::Failed, 3, "exit 3");
    failed.start_time_ms = NOW - 5 * MIN;
    failed.end_time_ms = NOW - 4 * MIN - 30_000;
    let running = pb::Job {
        id: 43,
        spec: Some(spec("train", true)),
        state: pb::JobState::Running as i32,
        node: "gpu02".into(),
        start_time_ms: NOW - 2 * 3_600_000 - 5 * MIN - 7_000,
        time_limit_secs: 86_400,
        ..Default::default()
    };
    let pending = pb::Job {
        id: 44,
        spec: Some(spec("sweep", true)),
        state: pb::JobState::Pending as i32,
        reason: "Resources".into(),
        time_limit_secs: 1800,
        ..Default::default()
    };
    vec![done, failed, running, pending]
}

fn node(name: &str, state: pb::NodeState, busy: u32, reason: &str) -> pb::Node {
    pb::Node {
        name: name.into(),
        state: state as i32,
        gpus: (0..4)
            .map(|i| pb::Gpu {
                uuid: format!("GPU-{name}-{i}"),
                model: "A100-80GB".into(),
                memory_mib: 81_920,
                index: i,
                allocated_to: u64::from(i < busy),
                ..Default::default()
            })
            .collect(),
        reason: reason.into(),
        cpus: 64,
        cpus_allocated: busy * 8,
        memory_bytes: 512 << 30,
        partitions: vec!["gpu".into()],
        ..Default::default()
    }
}

fn nodes() -> Vec<pb::Node> {
    use pb::NodeState as S;
    vec![
        node("gpu01", S::Idle, 0, ""),
        node("gpu02", S::Mixed, 1, ""),
        node("gpu03", S::Idle, 0, ""),
        node("gpu04", S::Drained, 0, "fan failure"),
    ]
}

fn partitions() -> Vec<pb::PartitionRow> {
    vec![pb::PartitionRow {
        name: "gpu".into(),
        is_default: true,
        state: "up".into(),
        nodes: nodes().iter().map(|n| n.name.clone()).collect(),
        max_time_secs: 3 * 86_400,
        ..Default::default()
    }]
}

#[test]
fn squeue_default_and_asked_formats() {
    let jobs: Vec<pb::Job> = jobs().into_iter().filter(|j| j.id >= 43).collect();
    let default = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";
    let mut out = super::squeue::by_format(&jobs, default, true, NOW);
    out.push_str(&super::squeue::by_format(
        &jobs,
        "%i|%t|%T|%j|%l|%L|%D|%C|%b|%r",
        false,
        NOW,
    ));
    out.push_str(
        &super::squeue::by_fields(
            &jobs,
            "JobID:8,Name:.10,State:10,TimeLimit,Reason",
            true,
            NOW,
        )
        .unwrap(),
    );
    golden("squeue.txt", &out);
}

#[test]
fn sacct_default_parsable_and_steps() {
    use clap::Parser as _;
    let jobs = jobs();
    let run = |args: &[&str]| {
        let a = super::sacct::Args::try_parse_from(args).unwrap();
        let fields = super::sacct::fields(&a.format).unwrap();
        let rows = super::sacct::rows(&jobs, &[], a.allocations, NOW);
        super::sacct::table(&rows, &fields, &a)
    };
    let mut out = run(&["sacct"]);
    out.push_str(&run(&[
        "sacct",
        "-P",
        "-o",
        "JobID,JobName,State,ExitCode,NodeList,Elapsed",
    ]));
    out.push_str(&run(&[
        "sacct",
        "-p",
        "-n",
        "-X",
        "-o",
        "JobID,State,Timelimit",
    ]));
    out.push_str(&run(&["sacct", "-n", "-X", "-o", "JobID,JobName%20,State"]));
    golden("sacct.txt", &out);
}

#[test]
fn sinfo_by_partition_and_by_node() {
    use clap::Parser as _;
    let (nodes, parts) = (nodes(), partitions());
    let run = |args: &[&str]| {
        let a = super::sinfo::Args::try_parse_from(args).unwrap();
        super::sinfo::output(&a, &nodes, &parts)
    };
    let mut out = run(&["sinfo"]);
    out.push_str(&run(&["sinfo", "-N"]));
    out.push_str(&run(&["sinfo", "-h", "-o", "%P %a %l %D %t %N %G"]));
    golden("sinfo.txt", &out);
}

#[test]
fn scontrol_show_job_and_node() {
    let jobs = jobs();
    let mut out = String::new();
    for j in [&jobs[1], &jobs[3]] {
        // The lines that do not read the clock or the password file.
        let shown = super::scontrol::show_job(j, false);
        let kept: Vec<&str> = shown
            .lines()
            .filter(|l| {
                ![
                    "UserId=",
                    "RunTime=",
                    "SubmitTime=",
                    "StartTime=",
                    "AccrueTime=",
                ]
                .iter()
                .any(|k| l.trim_start().starts_with(k))
            })
            .collect();
        out.push_str(&kept.join("\n"));
        out.push_str("\n\n");
    }
    for n in &nodes()[2..] {
        let shown = super::scontrol::show_node(n);
        let kept: Vec<&str> = shown
            .lines()
            .filter(|l| !l.trim_start().starts_with("LastBusyTime="))
            .collect();
        out.push_str(&kept.join("\n"));
        out.push_str("\n\n");
    }
    golden("scontrol.txt", &out);
}
