//! Job arrays with a throttle, partitions and the singleton dependency on the real
//! binaries: what runs at once, where, what `queue`, `cancel` and `partitions` show.

use std::time::Duration;

use gpuctl_tests::{Cluster, wait_for};
use serde_json::Value;

const T: Duration = Duration::from_secs(40);

/// (task, start, end) of each task, from the lines the tasks wrote.
fn spans(text: &str) -> Vec<(u32, f64, f64)> {
    let mut out = Vec::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if let [task, start, end] = f[..] {
            out.push((
                task.parse().unwrap(),
                start.parse().unwrap(),
                end.parse().unwrap(),
            ));
        }
    }
    out
}

#[test]
fn an_array_runs_at_most_its_throttle_at_once_and_one_task_can_be_cancelled() {
    let c = Cluster::start(&[("n1", "4xA100-80GB")]);
    std::fs::write(
        c.path("task.toml"),
        "name = \"sweep\"\nstdout = \"sweep-%A_%a.out\"\n\
         script = \"\"\"\ns=$(date +%s.%N); sleep 1.5; \
         echo $GPUCTL_ARRAY_TASK_ID $s $(date +%s.%N) >> spans.log; \
         echo task $SLURM_ARRAY_TASK_ID of $GPUCTL_ARRAY_JOB_ID\n\"\"\"\n\
         [resources]\ngpus = 1\n",
    )
    .unwrap();
    let v = c.json(&["submit", "--array", "0-5%2", "task.toml"]);
    let first = v["job_id"].as_u64().unwrap();
    // The pending tasks fold into one row, with the throttle.
    let q = c.gpuctl_ok(&["queue", "-t", "PD", "-o", "jobid,state,reason", "-h"]);
    assert!(
        q.lines()
            .any(|l| l.trim_start().starts_with(&format!("{first}_[")) && l.contains("%2]")),
        "{q}"
    );
    // Task 5 alone is cancelled (the rest still run).
    let out = c.gpuctl_ok(&["cancel", &format!("{first}_5")]);
    assert!(out.contains("removed from the queue"), "{out}");
    let bad = c.gpuctl(&["cancel", &format!("{first}_9")]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains(&format!("array {first} has no task 9")),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let tasks: Vec<u64> = (first..first + 6).collect();
    for &id in &tasks[..5] {
        c.wait_state(id, "COMPLETED", T);
    }
    let five = c.job(tasks[5]);
    assert_eq!(five["state"], "CANCELLED");
    assert_eq!(five["array_job_id"], first);
    assert_eq!(five["array_task_id"], 5);
    // Never more than two at once, though four GPUs were free.
    let s = spans(&std::fs::read_to_string(c.path("spans.log")).unwrap());
    assert_eq!(s.len(), 5, "{s:?}");
    for &(_, start, _) in &s {
        let at_once = s
            .iter()
            .filter(|&&(_, a, b)| a <= start && start < b)
            .count();
        assert!(at_once <= 2, "{at_once} tasks ran at once: {s:?}");
    }
    let out = std::fs::read_to_string(c.path(&format!("sweep-{first}_3.out"))).unwrap();
    assert_eq!(out.trim(), format!("task 3 of {first}"));
    // The whole array by its id: nothing left to cancel, each says so.
    let again = c.gpuctl(&["cancel", &first.to_string()]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("already finished"));
}

const PARTS: &str = r#"
[partitions.inference]
nodes = ["inf[1-2]"]
max_time = "1h"
[partitions.batch]
default = true
"#;

#[test]
fn partitions_keep_jobs_on_their_nodes_and_show_in_listings() {
    let mut c = Cluster::controller_with_config(PARTS);
    c.add_agent("inf1", "1xA100-80GB", &[]);
    c.add_agent("train1", "1xA100-80GB", &[]);
    c.wait_nodes_up(2);
    let job = "script = \"sleep 30\"\n[resources]\ngpus = 1\n";
    std::fs::write(c.path("j.toml"), job).unwrap();
    let sub = |args: &[&str]| {
        let mut a = vec!["submit"];
        a.extend_from_slice(args);
        a.push("j.toml");
        c.json(&a)["job_id"].as_u64().unwrap()
    };
    let inf = sub(&["-p", "inference", "-t", "10"]);
    let inf2 = sub(&["-p", "inference", "-t", "10"]);
    let batch = sub(&[]);
    let r = c.wait_state(inf, "RUNNING", T);
    assert_eq!(r["node"], "inf1");
    assert_eq!(c.wait_state(batch, "RUNNING", T)["node"], "train1");
    // The second inference job waits: train1 is free but not in its partition.
    assert!(wait_for(T, || c.job(inf2)["reason"] == "Resources"));
    let ex = c.json(&["explain", &inf2.to_string()]);
    let train1 = ex["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == "train1")
        .unwrap()
        .clone();
    assert_eq!(train1["reason"], "not in partition inference", "{ex}");
    // Listings: -p filters, PARTITION shows, `partitions` sums up.
    let only = c.json(&["queue", "-p", "inference"]);
    let ids: Vec<u64> = only
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![inf, inf2]);
    let table = c.gpuctl_ok(&["queue", "-o", "jobid,partition", "-h"]);
    assert!(
        table.contains(&format!("{batch}")) && table.contains("batch"),
        "{table}"
    );
    let parts = c.json(&["partitions"]);
    let row = |n: &str| {
        parts
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == n)
            .unwrap()
            .clone()
    };
    assert_eq!(row("inference")["nodes"], serde_json::json!(["inf1"]));
    assert_eq!(row("inference")["running_jobs"], 1);
    assert_eq!(row("inference")["pending_jobs"], 1);
    assert_eq!(row("batch")["default"], true);
    assert_eq!(row("batch")["nodes"], serde_json::json!(["inf1", "train1"]));
    let text = c.gpuctl_ok(&["partitions"]);
    assert!(
        text.contains("batch*") && text.contains("1:00:00"),
        "{text}"
    );
    // A limit over the partition's is refused at submit, by name.
    let out = c.gpuctl(&["submit", "-p", "inference", "-t", "2:00:00", "j.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("partitions.inference.max_time"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.gpuctl_ok(&[
        "cancel",
        &inf.to_string(),
        &inf2.to_string(),
        &batch.to_string(),
    ]);
}

#[test]
fn singleton_jobs_of_one_name_run_one_after_another() {
    let c = Cluster::start(&[("n1", "2xA100-80GB")]);
    std::fs::write(
        c.path("s.toml"),
        "name = \"nightly\"\ndependency = \"singleton\"\n\
         script = \"s=$(date +%s.%N); sleep 1; echo $GPUCTL_JOB_ID $s $(date +%s.%N) >> s.log\"\n\
         [resources]\ngpus = 1\n",
    )
    .unwrap();
    let a = c.submit(
        "s.toml",
        &std::fs::read_to_string(c.path("s.toml")).unwrap(),
    );
    let b = c.json(&["submit", "s.toml"])["job_id"].as_u64().unwrap();
    c.wait_state(a, "COMPLETED", T);
    c.wait_state(b, "COMPLETED", T);
    let s = spans(&std::fs::read_to_string(c.path("s.log")).unwrap());
    assert_eq!(s.len(), 2, "{s:?}");
    let (first, second) = if s[0].0 as u64 == a {
        (s[0], s[1])
    } else {
        (s[1], s[0])
    };
    assert!(second.1 >= first.2, "they overlapped: {s:?}");
    assert_eq!(
        c.job(b)["dependencies"],
        serde_json::json!([{"kind": "singleton", "job_id": 0}])
    );
}

/// `queue --json` over several of the controller's pages (250 jobs each), dense and
/// sparse runs of ids alike, lists every job it should once, in id order, filtered or
/// not; `--all` adds the ended ones.
#[test]
fn a_listing_over_many_pages_is_whole_and_in_order() {
    let c = Cluster::start(&[("n1", "1xA100-80GB")]);
    std::fs::write(
        c.path("wide.toml"),
        "name = \"wide\"\nscript = \"sleep 300\"\n[resources]\ngpus = 1\n",
    )
    .unwrap();
    // The node takes nothing until the first hundred tasks are held: task 100 runs,
    // inside the first page's run of ids.
    c.gpuctl_ok(&["node", "drain", "n1", "--reason", "setup"]);
    let first = c.json(&["submit", "--array", "0-699", "wide.toml"])["job_id"]
        .as_u64()
        .unwrap();
    let held: Vec<String> = (0..100).map(|i| (first + i).to_string()).collect();
    let mut args = vec!["hold"];
    args.extend(held.iter().map(String::as_str));
    c.gpuctl_ok(&args);
    c.gpuctl_ok(&["node", "resume", "n1"]);
    c.wait_state(first + 100, "RUNNING", T);
    // Past the first page, four tasks in five go: the second page's ids are sparse.
    let gone: Vec<String> = (250..700)
        .filter(|i| i % 5 != 0)
        .map(|i| format!("{first}_{i}"))
        .collect();
    let mut args = vec!["cancel"];
    args.extend(gone.iter().map(String::as_str));
    c.gpuctl_ok(&args);
    let ids = |v: Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_u64().unwrap())
            .collect()
    };
    let active: Vec<u64> = (0..700u64)
        .filter(|i| *i < 250 || i % 5 == 0)
        .map(|i| first + i)
        .collect();
    assert_eq!(ids(c.json(&["queue"])), active);
    assert_eq!(
        ids(c.json(&["queue", "--name", "wide"])),
        active,
        "a filtered listing"
    );
    let pending: Vec<u64> = active
        .iter()
        .copied()
        .filter(|&id| id != first + 100)
        .collect();
    assert_eq!(
        ids(c.json(&["queue", "-t", "PD"])),
        pending,
        "only the pending ones"
    );
    let all: Vec<u64> = (first..first + 700).collect();
    assert_eq!(ids(c.json(&["queue", "--all"])), all);
}
