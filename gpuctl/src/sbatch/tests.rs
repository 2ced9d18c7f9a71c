use super::*;

/// The share's compute (milli-GPUs) a job asks for; 0 for none.
fn milli(j: &Job) -> u32 {
    match &j.spec.resources.gpu {
        Some(GpuPart::Share(s)) => s.compute_milli,
        _ => 0,
    }
}

fn job(text: &str) -> Job {
    parse("train.sbatch", text).unwrap().0
}

#[test]
fn slurm_time_formats() {
    let s = |v| slurm_time(v).unwrap().as_secs();
    assert_eq!(s("30"), 1800);
    assert_eq!(s("30:15"), 1815);
    assert_eq!(s("2:00:00"), 7200);
    assert_eq!(s("1-0"), 86400);
    assert_eq!(s("1-2:30"), 86400 + 2 * 3600 + 1800);
    assert_eq!(s("2-01:00:05"), 2 * 86400 + 3605);
    assert!(
        slurm_time("UNLIMITED")
            .unwrap_err()
            .contains("no unlimited")
    );
    assert!(slurm_time("1:2:3:4").is_err());
    assert!(slurm_time("0").is_err());
    assert!(slurm_time("abc").is_err());
}

#[test]
fn directives_up_to_the_first_command() {
    let j = job(
        "#!/bin/bash\n#SBATCH -J ddp\n#SBATCH --gres=gpu:a100:4 -c 8\n# plain comment\n#SBATCH --mem=64G --time=1-0\nsrun hostname\n#SBATCH --nodes=9\n",
    );
    assert_eq!(j.spec.name, "ddp");
    assert_eq!(j.whole_gpus(), 4);
    assert_eq!(j.spec.resources.gpu_models, vec!["a100".to_string()]);
    assert_eq!(j.spec.resources.cpus, 8);
    assert_eq!(j.spec.resources.memory_bytes, 64 << 30);
    assert_eq!(j.spec.resources.time_limit_secs, 86400);
    assert_eq!(
        j.spec.resources.nodes, 1,
        "directives after the first command are not read"
    );
    assert!(j.spec.script.starts_with("#!/bin/bash\n"));
    assert_eq!(
        Some(j.spec.stdout.as_str()).filter(|s| !s.is_empty()),
        Some("slurm-%j.out")
    );
}

#[test]
fn option_spellings() {
    let j = job(
        "#!/bin/sh\n#SBATCH --job-name train --output=logs/%x-%j.out -e err.txt\n#SBATCH -N2 --ntasks-per-node=1 --gpus-per-node=8\n#SBATCH --dependency=afterok:12:13 --qos normal --requeue --nice=10 --mem-per-cpu=2000\n#SBATCH -c 4 --chdir=/tmp --export=ALL # trailing comment\n",
    );
    assert_eq!(j.spec.name, "train");
    assert_eq!(
        Some(j.spec.stdout.as_str()).filter(|s| !s.is_empty()),
        Some("logs/%x-%j.out")
    );
    assert_eq!(
        Some(j.spec.stderr.as_str()).filter(|s| !s.is_empty()),
        Some("err.txt")
    );
    assert_eq!(j.spec.resources.nodes, 2);
    assert_eq!(j.whole_gpus(), 8);
    assert_eq!(j.spec.dependencies.len(), 2);
    assert_eq!(j.spec.qos, "normal");
    assert!(j.spec.requeue);
    assert_eq!(j.spec.priority, -10);
    assert_eq!(j.spec.resources.memory_bytes, (4 * 2000) << 20);
    assert_eq!(j.workdir, Some(PathBuf::from("/tmp")));
    let (j, extra) = parse(
        "x",
        "#!/bin/sh\n#SBATCH --export=ALL --mail-type=END\n#SBATCH --comment=\"two words\" -J 'a b'\n",
    )
    .unwrap();
    assert_eq!(j.spec.comment, "two words");
    assert_eq!(extra.export.as_deref(), Some("ALL"));
    // --mail-type and --comment are kept with the job, not warned about.
    assert_eq!(j.spec.mail_type, "END");
    assert!(extra.warnings.is_empty(), "{:?}", extra.warnings);
    let e = parse("x", "#!/bin/sh\n#SBATCH --mail-type=END,SOMETIMES\n")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("x:2:") && e.contains("\"SOMETIMES\""), "{e}");
}

#[test]
fn unsupported_options_are_refused_by_name_with_their_place() {
    let e = parse(
        "t.sbatch",
        "#!/bin/sh\n#SBATCH -J x\n#SBATCH --licenses=matlab\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("t.sbatch:3:9: #SBATCH --licenses"), "{e}");
    let (j, _) = parse("t.sbatch", "#!/bin/sh\n#SBATCH --exclusive -N 2\n").unwrap();
    assert!(j.spec.resources.exclusive);
    // Partitions are read.
    let (j, _) = parse("t.sbatch", "#!/bin/sh\n#SBATCH -p inference\n").unwrap();
    assert_eq!(j.spec.partition, "inference");
    // Arrays are read (and a bad one refused in place).
    let (j, _) = parse("t.sbatch", "#!/bin/sh\n#SBATCH --array=1-10%2\n").unwrap();
    assert_eq!(j.spec.array, "1-10%2");
    let e = parse("t.sbatch", "#!/bin/sh\n#SBATCH --array=9-1\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("runs backwards"), "{e}");
    let e = parse("t.sbatch", "#!/bin/sh\n#SBATCH --licenses=x\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("--licenses is not supported"), "{e}");
    // What the tools that drive Slurm write into every script is accepted, said so.
    let (j, extra) = parse(
        "t.sbatch",
        "#!/bin/sh\n#SBATCH --wckey=x --comment=y --get-user-env --kill-on-bad-exit\n",
    )
    .unwrap();
    assert_eq!((j.spec.wckey.as_str(), j.spec.comment.as_str()), ("x", "y"));
    assert_eq!(extra.warnings.len(), 2, "{:?}", extra.warnings);
    let e = parse("t.sbatch", "#!/bin/sh\n#SBATCH -y node1\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("-y is not supported"), "{e}");
    let e = parse("t.sbatch", "#!/bin/sh\n#SBATCH -N 2 --ntasks=3\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("give a multiple of 2"), "{e}");
    let e = parse(
        "t.sbatch",
        "#!/bin/sh\n#SBATCH -N 2 -n 8 --ntasks-per-node=2\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("disagree"), "{e}");
    let e = parse("t.sbatch", "#!/bin/sh\n#SBATCH --gres=mps:50\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("gpu resource only"), "{e}");
    let e = parse("t.sbatch", "#!/bin/sh\n#SBATCH --time\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs a value"), "{e}");
}

#[test]
fn toml_files_are_not_batch_scripts() {
    assert!(!is_batch_script(
        "name = \"x\"\nscript = \"#SBATCH inside\"\n"
    ));
    assert!(is_batch_script("#!/bin/bash\necho hi\n"));
    assert!(is_batch_script("#SBATCH -J x\necho hi\n"));
}

/// `-G 0.5` was read as a GPU model named "0.5": a number below 1 is a share of one
/// GPU, as `gpus = 0.5` in a job file.
#[test]
fn a_fractional_gpu_count_is_a_share() {
    assert_eq!(gpus_of("0.5", false).unwrap(), (0, None, 500));
    assert_eq!(
        gpus_of("A100:0.25", false).unwrap(),
        (0, Some("A100".into()), 250)
    );
    assert_eq!(
        gpus_of("gpu:a100:2", true).unwrap(),
        (2, Some("a100".into()), 0)
    );
    assert_eq!(gpus_of("a100", false).unwrap(), (1, Some("a100".into()), 0));
    for bad in ["1.5", "0.0001", ".", "0.", "-1", "2.0"] {
        assert!(gpus_of(bad, false).is_err(), "{bad}");
    }
}

#[test]
fn begin_times_as_sbatch_takes_them() {
    let now: jiff::Zoned = "2026-12-03T17:30:00+00:00[UTC]".parse().unwrap();
    let t0 = now.timestamp().as_millisecond();
    let at = |v: &str| begin_time(v, &now).unwrap();
    assert_eq!(at("now"), t0);
    assert_eq!(at("now+90"), t0 + 90_000);
    assert_eq!(at("now+2hours"), t0 + 7_200_000);
    assert_eq!(at("now+30minutes"), t0 + 1_800_000);
    assert_eq!(at("now+1day"), t0 + 86_400_000);
    // A time of day still ahead is today; one past is tomorrow.
    assert_eq!(at("18:00"), t0 + 1_800_000);
    assert_eq!(at("16:00"), t0 + 86_400_000 - 5_400_000);
    assert_eq!(at("teatime"), at("16:00"));
    assert_eq!(at("midnight"), t0 + 6 * 3_600_000 + 1_800_000);
    assert_eq!(at("2026-12-24"), at("2026-12-24T00:00:00"));
    assert_eq!(
        at("2026-12-24T08:00") - t0,
        (20 * 24 + 14) * 3_600_000 + 1_800_000
    );
    for bad in ["tomorrow-ish", "now-1h", "now+1fortnight", "25:00", ""] {
        assert!(begin_time(bad, &now).is_err(), "{bad}");
    }
    // Absurdly far: the rule, not an arithmetic error.
    for far in ["9999-12-31T23:59", "now+99999999999weeks", "2028-01-01"] {
        let e = begin_time(far, &now).unwrap_err();
        assert!(e.contains("within a year from now"), "{far}: {e}");
        assert!(!e.contains("overflow"), "{far}: {e}");
    }
    assert!(begin_time("now+52weeks", &now).is_ok());
    let (job, _) = parse("b.sh", "#!/bin/sh\n#SBATCH --begin=now+1hour\ntrue\n").unwrap();
    assert!(job.spec.begin_ms > 0);
}

#[test]
fn oversubscribe_asks_for_colocation_by_use() {
    assert!(!job("#!/bin/sh\n#SBATCH -G 1\nrun\n").spec.colocate);
    assert!(
        job("#!/bin/sh\n#SBATCH -G 1 --oversubscribe\nrun\n")
            .spec
            .colocate
    );
    let j = job("#!/bin/sh\n#SBATCH -s -G 0.5\nrun\n");
    assert!(j.spec.colocate, "-s is --oversubscribe");
    assert_eq!(milli(&j), 500);
    let err = parse("a.sbatch", "#!/bin/sh\n#SBATCH --oversubscribe=yes\nrun\n").unwrap_err();
    assert!(err.to_string().contains("oversubscribe"), "{err}");
}

#[test]
fn gpus_is_the_jobs_total_and_per_task_and_per_gpu_forms_are_read() {
    // Slurm's -G is the job's total: split over its nodes.
    let j = job("#!/bin/sh\n#SBATCH -N 2 -G a100:8\nrun\n");
    assert_eq!((j.spec.resources.nodes, j.whole_gpus()), (2, 4));
    assert_eq!(j.spec.resources.gpu_models, vec!["a100".to_string()]);
    let j = job("#!/bin/sh\n#SBATCH --gpus=4\n#SBATCH --nodes=2\nrun\n");
    assert_eq!(j.whole_gpus(), 2, "the node count may come after");
    // Per node stays per node.
    assert_eq!(
        job("#!/bin/sh\n#SBATCH -N 2 --gpus-per-node=4\nrun\n").whole_gpus(),
        4
    );
    // One task per node: a task's GPUs are its node's.
    let j = job("#!/bin/sh\n#SBATCH -N 2 --ntasks-per-node=1 --gpus-per-task=2\nrun\n");
    assert_eq!(
        (
            j.spec.resources.nodes,
            j.whole_gpus(),
            j.spec.resources.tasks_per_node
        ),
        (2, 2, 1)
    );
    // Tasks: a node holds its tasks' GPUs and CPUs, whichever order the lines come in.
    for text in [
        "#!/bin/sh\n#SBATCH -N 2 --ntasks-per-node=2 --gpus-per-task=1 -c 3\nsrun run\n",
        "#!/bin/sh\n#SBATCH -c 3 --gpus-per-task=1\n#SBATCH -n 4 -N 2\nsrun run\n",
    ] {
        let j = job(text);
        assert_eq!(
            (
                j.spec.resources.nodes,
                j.spec.resources.tasks_per_node,
                j.whole_gpus(),
                j.spec.resources.cpus
            ),
            (2, 2, 2, 6)
        );
    }
    // --gpus-per-node stays the node's, split over its tasks.
    let j = job("#!/bin/sh\n#SBATCH --ntasks-per-node=4 --gpus-per-node=8\nrun\n");
    assert_eq!(
        (
            j.spec.resources.tasks_per_node,
            j.whole_gpus(),
            j.spec.resources.cpus
        ),
        (4, 8, 4)
    );
    // Memory per GPU: the node's GPUs' worth.
    let j = job("#!/bin/sh\n#SBATCH --gpus-per-node=2 --mem-per-gpu=16G\nrun\n");
    assert_eq!(j.spec.resources.memory_bytes, 32 << 30);
    // CPUs per GPU: the node's GPUs' worth; a number it must be, with file and line.
    let j = job("#!/bin/sh\n#SBATCH --gpus-per-node=4\n#SBATCH --cpus-per-gpu=8\nrun\n");
    assert_eq!(j.spec.resources.cpus, 32);
    let j = job("#!/bin/sh\n#SBATCH -G 1 --cpus-per-gpu 6\nrun\n");
    assert_eq!(j.spec.resources.cpus, 6);
    let e = parse("c.sbatch", "#!/bin/sh\n#SBATCH --cpus-per-gpu=lots\nrun\n").unwrap_err();
    assert!(e.to_string().starts_with("c.sbatch:2:"), "{e}");
    // A total that does not split evenly is refused where it stands.
    let e = parse("t.sbatch", "#!/bin/sh\n#SBATCH -N 2 -G 3\nrun\n").unwrap_err();
    let e = e.to_string();
    assert!(e.starts_with("t.sbatch:2:"), "{e}");
    assert!(e.contains("--gpus=3 over 2 nodes"), "{e}");
}

#[test]
fn nodelist_and_exclude_are_hostlists() {
    let j = job("#!/bin/sh\n#SBATCH -w gpu[01-03,07] -x gpu02\nrun\n");
    assert_eq!(j.spec.resources.nodelist, vec!["gpu[01-03,07]".to_string()]);
    assert_eq!(j.spec.resources.exclude, vec!["gpu02".to_string()]);
    let j = job("#!/bin/sh\n#SBATCH --nodelist=a1,b[2-3]\nrun\n");
    assert_eq!(
        j.spec.resources.nodelist,
        vec!["a1".to_string(), "b[2-3]".to_string()]
    );
    let e = parse("t.sbatch", "#!/bin/sh\n#SBATCH --exclude=gpu[5-1]\nrun\n").unwrap_err();
    let e = e.to_string();
    assert!(e.starts_with("t.sbatch:2:"), "{e}");
    assert!(e.contains("runs backwards"), "{e}");
    let e = parse("t.sbatch", "#!/bin/sh\n#SBATCH -w n1;rm\nrun\n").unwrap_err();
    assert!(e.to_string().contains("no node name has"), "{e}");
}

#[test]
fn constraint_is_read_and_slurms_other_forms_refused_where_they_stand() {
    let j = job("#!/bin/sh\n#SBATCH -C a100&nvlink\nrun\n");
    assert_eq!(j.spec.resources.constraint, "a100&nvlink");
    let j = job("#!/bin/sh\n#SBATCH --constraint=\"h100|a100\"\nrun\n");
    assert_eq!(j.spec.resources.constraint, "h100|a100");
    let j = job("#!/bin/sh\n#SBATCH -C \"a100&nvlink\"\nrun\n");
    assert_eq!(j.spec.resources.constraint, "a100&nvlink");
    let e = parse("t.sbatch", "#!/bin/sh\n#SBATCH --constraint=a100*2\nrun\n").unwrap_err();
    let e = e.to_string();
    assert!(e.starts_with("t.sbatch:2:"), "{e}");
    assert!(e.contains("not supported"), "{e}");
}
