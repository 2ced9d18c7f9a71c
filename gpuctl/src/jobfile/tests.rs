use super::*;

/// The share's compute (milli-GPUs) a job asks for; 0 for none.
fn milli(j: &Job) -> u32 {
    match &j.spec.resources.gpu {
        Some(GpuPart::Share(s)) => s.compute_milli,
        _ => 0,
    }
}

/// The share's memory (MiB) a job asks for; 0 for none.
fn share_mib(j: &Job) -> u64 {
    match &j.spec.resources.gpu {
        Some(GpuPart::Share(s)) => s.memory_mib.unwrap_or(0),
        _ => 0,
    }
}

/// The MIG profile and count a job asks for.
fn mig(j: &Job) -> (&str, u32) {
    match &j.spec.resources.gpu {
        Some(GpuPart::Mig(m)) => (m.profile.as_str(), m.count),
        _ => ("", 0),
    }
}

fn err(text: &str) -> String {
    parse("job.toml", text).unwrap_err().to_string()
}

#[test]
fn full_example_parses() {
    let job = parse(
        "job.toml",
        r#"
name = "hello"
command = ["python", "train.py", "--epochs", "3"]
workdir = "/data"
stdout = "hello-%j.out"
env = { FOO = "bar" }
priority = 10
[resources]
gpus = 1
cpus = 2
memory = "8GiB"
time_limit = "30m"
"#,
    )
    .unwrap();
    assert_eq!(job.spec.name, "hello");
    assert_eq!(
        job.spec.command,
        vec!["python", "train.py", "--epochs", "3"]
    );
    assert_eq!(job.workdir.as_deref(), Some(Path::new("/data")));
    assert_eq!(
        Some(job.spec.stdout.as_str()).filter(|s| !s.is_empty()),
        Some("hello-%j.out")
    );
    assert_eq!(job.spec.stderr, "");
    assert_eq!(job.spec.env.get("FOO").map(String::as_str), Some("bar"));
    assert_eq!(job.spec.priority, 10);
    assert_eq!(job.whole_gpus(), 1);
    assert_eq!(job.spec.resources.cpus, 2);
    assert_eq!(job.spec.resources.memory_bytes, 8 * 1024 * 1024 * 1024);
    assert_eq!(job.spec.resources.time_limit_secs, 1800);
}

#[test]
fn script_and_defaults() {
    let job = parse("x/train.toml", "script = \"\"\"\necho hi\n\"\"\"\n").unwrap();
    assert_eq!(job.spec.name, "train");
    assert!(job.spec.command.is_empty());
    assert_eq!(job.spec.script, "echo hi\n");
    assert_eq!(
        (
            job.whole_gpus(),
            job.spec.resources.cpus,
            job.spec.resources.memory_bytes
        ),
        (0, 1, 0)
    );
    assert_eq!(job.spec.resources.time_limit_secs, 0);
}

#[test]
fn name_defaults_to_program() {
    let job = parse("j.toml", "command = [\"/usr/bin/env\", \"true\"]").unwrap();
    assert_eq!(job.spec.name, "env");
}

#[test]
fn unknown_key_names_line_and_column() {
    let e = err("command = [\"true\"]\n[resources]\n  gpu = 2\n");
    assert!(e.starts_with("job.toml:3:3: unknown field `gpu`"), "{e}");
    assert!(e.contains("^^^"), "{e}");
}

#[test]
fn wrong_type_names_line_and_column() {
    let e = err("command = [\"true\"]\npriority = \"high\"\n");
    assert!(e.starts_with("job.toml:2:12:"), "{e}");
    assert!(e.contains("invalid type"), "{e}");
}

#[test]
fn negative_gpus_rejected_with_position() {
    let e = err("command = [\"true\"]\n[resources]\ngpus = -1\n");
    assert!(e.starts_with("job.toml:3:8:"), "{e}");
}

#[test]
fn syntax_error_has_position() {
    let e = err("command = [\"true\"\n");
    assert!(e.starts_with("job.toml:"), "{e}");
    let mut parts = e.splitn(4, ':');
    parts.next();
    let line: usize = parts.next().unwrap().parse().unwrap();
    let col: usize = parts.next().unwrap().parse().unwrap();
    assert!(line >= 1 && col >= 1, "{e}");
}

#[test]
fn bad_memory_and_time_limit() {
    let e = err("command = [\"true\"]\n[resources]\nmemory = \"8 gigglebytes\"\n");
    assert!(e.starts_with("job.toml:3:10: `memory`"), "{e}");
    let e = err("command = [\"true\"]\n[resources]\ntime_limit = \"soon\"\n");
    assert!(e.starts_with("job.toml:3:14: `time_limit`"), "{e}");
    let e = err("command = [\"true\"]\n[resources]\ncpus = 0\n");
    assert!(
        e.starts_with("job.toml:3:8: `cpus` must be at least 1"),
        "{e}"
    );
}

#[test]
fn command_and_script_conflict() {
    let e = err("command = [\"true\"]\nscript = \"echo\"\n");
    assert!(e.starts_with("job.toml:2:10: set either"), "{e}");
    let e = err("name = \"x\"\n");
    assert!(e.starts_with("job.toml: the job has nothing to run"), "{e}");
    let e = err("command = []\n");
    assert!(e.starts_with("job.toml:1:11: `command` needs"), "{e}");
}

#[test]
fn gpu_shares_mig_models_and_gangs() {
    let j = parse("j.toml", "command = [\"x\"]\n[resources]\ngpus = 0.25\n").unwrap();
    assert_eq!((j.whole_gpus(), milli(&j)), (0, 250));
    let j = parse("j.toml", "command = [\"x\"]\n[resources]\ngpus = 2.0\n").unwrap();
    assert_eq!((j.whole_gpus(), milli(&j)), (2, 0));
    let j = parse(
        "j.toml",
        "command = [\"x\"]\n[resources]\ngpu_memory = \"10GiB\"\ngpu_compute = 30\ngpu_model = [\"A100\", \"H100\"]\n",
    )
    .unwrap();
    assert_eq!((milli(&j), share_mib(&j)), (300, 10240));
    assert_eq!(j.spec.resources.gpu_models, vec!["A100", "H100"]);
    let j = parse(
        "j.toml",
        "command = [\"x\"]\nqos = \"high\"\n[resources]\nmig = \"3g.40gb\"\nmig_count = 2\n",
    )
    .unwrap();
    assert_eq!(
        (mig(&j).0, mig(&j).1, j.spec.qos.as_str()),
        ("3g.40gb", 2, "high")
    );
    let j = parse(
        "j.toml",
        "command = [\"x\"]\n[resources]\ngpus = 8\nnodes = 2\ngpu_model = \"A100\"\n",
    )
    .unwrap();
    assert_eq!(
        (
            j.whole_gpus(),
            j.spec.resources.nodes,
            j.spec.resources.gpu_models.len()
        ),
        (8, 2, 1)
    );

    let e = err("command = [\"x\"]\n[resources]\ngpus = 1.5\n");
    assert!(
        e.starts_with("job.toml:3:8: `gpus` is a whole number"),
        "{e}"
    );
    let e = err("command = [\"x\"]\n[resources]\ngpus = 1\ngpu_memory = \"1GiB\"\n");
    assert!(
        e.starts_with("job.toml:4:14: `gpu_memory` is for a share"),
        "{e}"
    );
    let e = err("command = [\"x\"]\n[resources]\nmig = \"big\"\n");
    assert!(e.starts_with("job.toml:3:7: `mig` is a MIG profile"), "{e}");
    let e = err("command = [\"x\"]\n[resources]\ngpus = 0.5\nnodes = 2\n");
    assert!(
        e.starts_with("job.toml:4:9: multi-node jobs take whole GPUs"),
        "{e}"
    );
    let e = err("command = [\"x\"]\n[resources]\ngpu_compute = 150\n");
    assert!(
        e.starts_with("job.toml:3:15: `gpu_compute` is a percentage"),
        "{e}"
    );
    let e = err("command = [\"x\"]\n[resources]\nmig_count = 2\n");
    assert!(e.starts_with("job.toml:3:13: `mig_count` needs"), "{e}");
}

#[test]
fn oversized_file_refused() {
    let big = format!(
        "command = [\"true\"]\n#{}\n",
        "x".repeat(MAX_JOB_FILE_BYTES)
    );
    assert!(matches!(
        parse("big.toml", &big),
        Err(JobFileError::TooLarge { .. })
    ));
}

#[test]
fn a_file_that_never_ends_is_refused_unread() {
    // `/dev/zero` would fill memory if read whole.
    let e = load_any(Path::new("/dev/zero")).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "/dev/zero: job file is over {MAX_JOB_FILE_BYTES} bytes; the limit is {MAX_JOB_FILE_BYTES} bytes"
        )
    );
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.toml");
    std::fs::write(&big, vec![b'#'; MAX_JOB_FILE_BYTES + 10]).unwrap();
    let e = load_any(&big).unwrap_err().to_string();
    assert!(
        e.ends_with(&format!(
            "job file is {} bytes; the limit is {MAX_JOB_FILE_BYTES} bytes",
            MAX_JOB_FILE_BYTES + 10
        )),
        "{e}"
    );
    let bad = dir.path().join("latin1.toml");
    std::fs::write(&bad, b"name = \"caf\xe9\"\n").unwrap();
    let e = load_any(&bad).unwrap_err().to_string();
    assert!(
        e.contains("cannot read job file: stream did not contain valid UTF-8"),
        "{e}"
    );
}

#[test]
fn spec_resolves_relative_workdir() {
    let job = parse("j.toml", "command = [\"true\"]\nworkdir = \"sub\"\n").unwrap();
    let spec = job.into_spec(Path::new("/home/u"), "u", 1000, 1000);
    assert_eq!(spec.workdir, "/home/u/sub");
    assert_eq!(spec.user, "u");
    let job = parse("j.toml", "command = [\"true\"]\n").unwrap();
    let spec = job.into_spec(Path::new("/home/u"), "u", 1000, 1000);
    assert_eq!(spec.workdir, "/home/u");
    assert_eq!(spec.resources.time_limit_secs, 0);
}

proptest::proptest! {
    // The parser never panics, whatever the bytes.
    #[test]
    fn parser_never_panics(text in "\\PC{0,200}") {
        let _ = parse("fuzz.toml", &text);
    }
}

#[test]
fn a_huge_bad_line_is_not_echoed_whole() {
    let text = format!(
        "name = \"{}\"\ncpus = \"x\"\nbogus = [{}\n",
        "a".repeat(400_000),
        "1,".repeat(200_000)
    );
    let err = parse("big.toml", &text).unwrap_err().to_string();
    assert!(err.len() < 2_000, "{} bytes of error", err.len());
    assert!(err.starts_with("big.toml:"), "{err}");
}

#[test]
fn max_restarts_reaches_the_spec_and_a_negative_count_is_placed() {
    let job = parse("job.toml", "command = [\"true\"]\nmax_restarts = 3\n").unwrap();
    assert_eq!(job.spec.max_restarts, 3);
    let commented = parse("job.toml", "command = [\"true\"]\ncomment = \"sweep 3\"\n");
    assert_eq!(commented.unwrap().spec.comment, "sweep 3");
    let spec = job.into_spec(Path::new("/tmp"), "ana", 1000, 1000);
    assert_eq!(spec.max_restarts, 3);
    let e = err("command = [\"true\"]\nmax_restarts = -1\n");
    assert!(e.starts_with("job.toml:2:16:"), "{e}");
}

#[test]
fn nodelist_and_exclude_take_a_string_or_a_list_and_are_checked_where_they_stand() {
    let job = parse(
        "job.toml",
        "command = [\"true\"]\n[resources]\nnodelist = \"n[1-4],m1\"\nexclude = [\"n3\"]\n",
    )
    .unwrap();
    assert_eq!(
        job.spec.resources.nodelist,
        vec!["n[1-4]".to_string(), "m1".to_string()]
    );
    assert_eq!(job.spec.resources.exclude, vec!["n3".to_string()]);
    let spec = job.into_spec(Path::new("/tmp"), "ana", 1000, 1000);
    let r = spec.resources;
    assert_eq!((r.nodelist.len(), r.exclude.len()), (2, 1));
    let e = err("command = [\"true\"]\n[resources]\nexclude = \"n[1-\"\n");
    assert!(e.starts_with("job.toml:3:11:"), "{e}");
    let e = err("command = [\"true\"]\n[resources]\nnodelist = []\n");
    assert!(e.contains("names no node"), "{e}");
}

#[test]
fn a_constraint_is_read_and_checked_where_it_stands() {
    let job = parse(
        "job.toml",
        "command = [\"true\"]\n[resources]\nconstraint = \"a100 & nvlink|h100\"\n",
    )
    .unwrap();
    assert_eq!(job.spec.resources.constraint, "a100 & nvlink|h100");
    let spec = job.into_spec(Path::new("/tmp"), "ana", 1000, 1000);
    assert_eq!(spec.resources.constraint, "a100 & nvlink|h100");
    let e = err("command = [\"true\"]\n[resources]\nconstraint = \"[a|b]\"\n");
    assert!(e.starts_with("job.toml:3:14:"), "{e}");
    assert!(e.contains("not supported"), "{e}");
}

#[test]
fn class_is_guaranteed_or_opportunistic_with_position() {
    let job = parse(
        "j.toml",
        "command = [\"true\"]\nclass = \"opportunistic\"\n",
    )
    .unwrap();
    assert!(job.spec.opportunistic);
    let job = parse("j.toml", "command = [\"true\"]\nclass = \"guaranteed\"\n").unwrap();
    assert!(!job.spec.opportunistic);
    let e = err("command = [\"true\"]\nclass = \"scavenger\"\n");
    assert!(e.starts_with("job.toml:2:9:"), "{e}");
    assert!(e.contains("\"guaranteed\" or \"opportunistic\""), "{e}");
}
