use super::*;

#[test]
fn durations_like_slurm() {
    assert_eq!(slurm_duration(0), "0:00");
    assert_eq!(slurm_duration(65_000), "1:05");
    assert_eq!(slurm_duration(3_600_000 + 61_000), "1:01:01");
    assert_eq!(slurm_duration(90_000_000), "1-01:00:00");
}

#[test]
fn unprintable_characters_are_escaped_in_tables() {
    assert_eq!(printable("plain ünïcode"), "plain ünïcode");
    assert_eq!(printable("a\u{1b}[31mred"), "a\\u{1b}[31mred");
    assert_eq!(printable("x\ny"), "x\\ny");
    assert_eq!(printable("\u{202e}abc"), "\\u{202e}abc");
    let t = table(&["NAME"], vec![vec!["evil\n 99  forged\u{1b}[2J".into()]]);
    assert_eq!(t.lines().count(), 2, "{t}");
    assert!(!t.contains('\u{1b}'));
}

#[test]
fn times_past_year_9999_do_not_panic() {
    assert_eq!(time_string(0), None);
    assert_eq!(
        time_string(i64::MAX).as_deref(),
        Some("9999-12-31T23:59:59.000Z")
    );
    let j = pb::Job {
        start_time_ms: 1,
        expected_start_ms: i64::MAX,
        time_limit_secs: u64::MAX,
        ..pb::Job::default()
    };
    let _ = job_json(&j);
    let _ = show_job(&j);
    let all: Vec<String> = QUEUE_COLUMNS.iter().map(|c| c.to_string()).collect();
    let t = queue_table(std::slice::from_ref(&j), &all, true);
    assert!(t.starts_with(" JOBID"), "{t}");
    let bare = queue_table(&[j], &default_queue_columns(true), false);
    assert!(
        !bare.contains("JOBID") && bare.lines().count() == 1,
        "{bare}"
    );
}

/// A long warning as a reason padded every queue row to ~200 columns.
#[test]
fn the_reason_column_stays_short() {
    let long = "warning: GPU memory 12000 MiB is over its share of 10240 MiB; MPS is not running on this node, so the limit is not enforced";
    let j = pb::Job {
        reason: long.into(),
        ..pb::Job::default()
    };
    let t = queue_table(&[j], &default_queue_columns(false), true);
    assert!(t.lines().all(|l| l.chars().count() < 120), "{t}");
    assert!(
        t.contains("warning: GPU memory 12000 MiB is over..."),
        "{t}"
    );
    assert_eq!(short_reason(""), "-");
    assert_eq!(short_reason("Resources"), "Resources");
}

#[test]
fn plain_table_matches_tabled() {
    let header = ["JOBID", "NAME", "STATE"];
    let rows: Vec<Vec<String>> = (0..5)
        .map(|i| {
            vec![
                (i * 1000).to_string(),
                format!("job-é{i}"),
                "RUNNING".repeat(i % 2 + 1),
            ]
        })
        .collect();
    let mut b = tabled::builder::Builder::default();
    b.push_record(header.iter().map(|s| s.to_string()));
    for r in &rows {
        b.push_record(r.clone());
    }
    let mut t = b.build();
    t.with(Style::blank());
    assert_eq!(plain_table(&header, &rows), format!("{t}\n"));
}

#[test]
fn job_json_has_the_documented_fields() {
    let j = pb::Job {
        id: 3,
        state: JobState::Completed as i32,
        exit_code: Some(0),
        submit_time_ms: 1_700_000_000_000,
        start_time_ms: 1_700_000_001_000,
        end_time_ms: 1_700_000_003_000,
        gpus: vec!["GPU-x".into()],
        node: "n1".into(),
        ..pb::Job::default()
    };
    let v = job_json(&j);
    for k in [
        "id",
        "name",
        "user",
        "state",
        "node",
        "gpus",
        "reason",
        "exit_code",
        "submit_time",
        "start_time",
        "end_time",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    assert_eq!(v["state"], "COMPLETED");
    assert_eq!(v["submit_time"], "2023-11-14T22:13:20.000Z");
    assert_eq!(v["elapsed_secs"], 2);
}

/// `show` of a finished job: its output file as its node named it, and a script that
/// is no longer kept said so (not "0 lines").
#[test]
fn show_names_the_output_file_and_a_script_no_longer_kept() {
    let spec = pb::JobSpec {
        name: "hello".into(),
        stdout: "hello-%j-%x.out".into(),
        workdir: "/home/ann/run".into(),
        ..pb::JobSpec::default()
    };
    let j = pb::Job {
        id: 42,
        state: pb::JobState::Completed as i32,
        spec: Some(spec),
        allocations: vec![pb::Allocation {
            node: "n1".into(),
            ..pb::Allocation::default()
        }],
        ..pb::Job::default()
    };
    let text = show_job(&j);
    assert!(
        text.contains("StdOut: /home/ann/run/hello-42-hello.out"),
        "{text}"
    );
    assert!(
        text.contains("Script: (not kept once the job ended)"),
        "{text}"
    );
    let mut running = j.clone();
    running.state = pb::JobState::Running as i32;
    running.spec.as_mut().unwrap().script = "a\nb\nc\n".into();
    running.spec.as_mut().unwrap().stdout = String::new();
    let text = show_job(&running);
    assert!(text.contains("Script: 3 lines"), "{text}");
    assert!(
        text.contains("StdOut: /home/ann/run/gpuctl-42.out"),
        "{text}"
    );
}
