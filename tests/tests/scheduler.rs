//! End-to-end scheduler behaviour through the real binaries: shares, MIG, gangs.

use std::time::Duration;

use gpuctl_tests::{Cluster, wait_for};

const T: Duration = Duration::from_secs(20);

#[test]
fn fractional_jobs_share_one_gpu() {
    let c = Cluster::start(&[("n1", "2xA100-80GB")]);
    let share = "script = \"echo $CUDA_VISIBLE_DEVICES $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; sleep 30\"\nstdout = \"s-%j.out\"\n[resources]\ngpus = 0.25\n";
    let ids: Vec<u64> = (0..4)
        .map(|i| c.submit(&format!("s{i}.toml"), share))
        .collect();
    for id in &ids {
        c.wait_state(*id, "RUNNING", T);
    }
    let gpus: Vec<String> = ids
        .iter()
        .map(|id| c.job(*id)["gpus"][0].as_str().unwrap().to_string())
        .collect();
    // FGD (the default) packs the four quarters onto one GPU, keeping the other whole.
    assert!(gpus.iter().all(|g| g == &gpus[0]), "{gpus:?}");
    let node = &c.nodes()[0];
    let g = node["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["uuid"] == gpus[0].as_str())
        .unwrap();
    assert_eq!(g["compute_allocated_milli"], 1000);
    assert_eq!(g["memory_allocated_mib"], 81920);
    assert_eq!(g["jobs"].as_array().unwrap().len(), 4);
    // The other GPU is still whole: a 1-GPU job starts on it.
    let whole = c.submit("w.toml", "script = \"sleep 30\"\n[resources]\ngpus = 1\n");
    c.wait_state(whole, "RUNNING", T);
    assert_ne!(c.job(whole)["gpus"][0], gpus[0].as_str());
    // A fifth share does not fit anywhere now.
    let fifth = c.submit("s5.toml", share);
    assert!(wait_for(T, || c.job(fifth)["reason"] == "Resources"));
    let out = std::fs::read_to_string(c.path(&format!("s-{}.out", ids[0]))).unwrap();
    assert_eq!(out, format!("{} 25 0=20480M\n", gpus[0]));
    let table = c.gpuctl_ok(&["queue"]);
    assert!(table.contains(" 0.25 "), "{table}");
    let stats = c.json(&["nodes", "--stats"]);
    assert_eq!(stats["gpus_total"], 2);
    assert_eq!(stats["gpus_allocated"], 2.0);
    let mut all: Vec<String> = ids.iter().map(u64::to_string).collect();
    all.push(whole.to_string());
    all.push(fifth.to_string());
    let mut args = vec!["cancel"];
    args.extend(all.iter().map(String::as_str));
    c.gpuctl_ok(&args);
}

#[test]
fn mig_jobs_land_on_mig_instances() {
    let c = Cluster::start(&[("n1", "1xA100-80GB:mig=3g.40gb+2g.20gb+2g.20gb,1xA100-80GB")]);
    let mig = c.submit(
        "m.toml",
        "script = \"echo $CUDA_VISIBLE_DEVICES\"\nstdout = \"m.out\"\n[resources]\nmig = \"2g.20gb\"\nmig_count = 2\n",
    );
    let j = c.wait_state(mig, "COMPLETED", T);
    let node = &c.nodes()[0];
    let instances: Vec<String> = node["gpus"][0]["mig"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["profile"] == "2g.20gb")
        .map(|m| m["uuid"].as_str().unwrap().to_string())
        .collect();
    let got: Vec<String> = j["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap().to_string())
        .collect();
    assert_eq!(got, instances);
    assert!(got.iter().all(|g| g.starts_with("MIG-")));
    let out = std::fs::read_to_string(c.path("m.out")).unwrap();
    assert_eq!(out.trim(), instances.join(","));

    // Whole-GPU jobs only get the non-MIG GPU; a second one waits.
    let w1 = c.submit("w1.toml", "script = \"sleep 30\"\n[resources]\ngpus = 1\n");
    let w2 = c.submit("w2.toml", "script = \"sleep 30\"\n[resources]\ngpus = 1\n");
    c.wait_state(w1, "RUNNING", T);
    assert_eq!(c.job(w1)["gpus"][0], node["gpus"][1]["uuid"]);
    assert!(wait_for(T, || c.job(w2)["reason"] == "Resources"));
    // An unknown profile is refused at submit.
    std::fs::write(
        c.path("bad.toml"),
        "command = [\"true\"]\n[resources]\nmig = \"1g.10gb\"\n",
    )
    .unwrap();
    let out = c.gpuctl(&["submit", "bad.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("impossible request"));
    c.gpuctl_ok(&["cancel", &w1.to_string(), &w2.to_string()]);
}

#[test]
fn gang_job_starts_on_two_agents_at_once() {
    let c = Cluster::start(&[("n1", "2xA100-80GB"), ("n2", "2xA100-80GB")]);
    let id = c.submit(
        "g.toml",
        r#"
script = """
echo "$GPUCTL_NODE rank=$GPUCTL_NODE_RANK of $GPUCTL_NUM_NODES list=$GPUCTL_NODELIST master=$MASTER_ADDR gpus=$CUDA_VISIBLE_DEVICES" > gang-$GPUCTL_NODE_RANK.out
"""
[resources]
gpus = 2
nodes = 2
"#,
    );
    let j = c.wait_state(id, "COMPLETED", T);
    assert_eq!(j["node"], "n1,n2");
    assert_eq!(j["gpus"].as_array().unwrap().len(), 4);
    let allocs = j["allocations"].as_array().unwrap();
    assert_eq!(allocs.len(), 2);
    let starts: Vec<String> = (0..2)
        .map(|r| std::fs::read_to_string(c.path(&format!("gang-{r}.out"))).unwrap())
        .collect();
    assert!(
        starts[0].starts_with("n1 rank=0 of 2 list=n1,n2 master=127.0.0.1 gpus=GPU-"),
        "{}",
        starts[0]
    );
    assert!(
        starts[1].starts_with("n2 rank=1 of 2 list=n1,n2 master=127.0.0.1 gpus=GPU-"),
        "{}",
        starts[1]
    );

    // All or nothing: with one GPU busy on n2, a 2x2 gang waits; n1 is not held alone.
    let busy = c.submit("b.toml", "script = \"sleep 30\"\n[resources]\ngpus = 1\n");
    c.wait_state(busy, "RUNNING", T);
    let node_of_busy = c.job(busy)["node"].as_str().unwrap().to_string();
    let gang = c.submit(
        "g2.toml",
        "script = \"sleep 30\"\n[resources]\ngpus = 2\nnodes = 2\n",
    );
    assert!(wait_for(T, || c.job(gang)["reason"] == "Resources"));
    let other = if node_of_busy == "n1" { "n2" } else { "n1" };
    assert_eq!(c.node_state(other), "IDLE");
    // A failing rank fails the job and ends the other rank.
    c.gpuctl_ok(&["cancel", &busy.to_string()]);
    c.wait_state(gang, "RUNNING", T);
    c.gpuctl_ok(&["cancel", &gang.to_string()]);
    c.wait_state(gang, "CANCELLED", T);
    let fail = c.submit(
        "f.toml",
        "script = \"if [ $GPUCTL_NODE_RANK = 1 ]; then exit 4; fi; sleep 60\"\n[resources]\ngpus = 1\nnodes = 2\n",
    );
    let j = c.wait_state(fail, "FAILED", T);
    assert_eq!(j["exit_code"], 4);
    assert!(wait_for(T, || c.node_state("n1") == "IDLE"
        && c.node_state("n2") == "IDLE"));
}

/// Dependencies like sbatch --dependency: afterok waits and then runs; a dependency that
/// can never be met cancels the job (and, through it, the jobs waiting on it);
/// afternotok runs after a failure; unknown or already-impossible ones are refused.
#[test]
fn dependencies_wait_run_or_are_never_satisfied() {
    let c = Cluster::start(&[("deps", "2xA100-80GB")]);
    let a = c.submit("a.toml", "script = \"sleep 2\"\n[resources]\ngpus = 1\n");
    // It fails after a second: the jobs below depend on it while it runs (a job starts
    // within milliseconds, and a dependency on a job that already failed is refused at
    // submit).
    let fail = c.submit("f.toml", "script = \"sleep 1; exit 1\"\n");
    let b = c.submit(
        "b.toml",
        &format!("command = [\"true\"]\ndependency = \"afterok:{a}\"\n[resources]\ngpus = 1\n"),
    );
    let never = c.submit(
        "n.toml",
        &format!("command = [\"true\"]\ndependency = \"afterok:{fail}\"\n"),
    );
    let chained = c.submit(
        "ch.toml",
        &format!("command = [\"true\"]\ndependency = \"afterok:{never}\"\n"),
    );
    let notok = c.submit(
        "no.toml",
        &format!("command = [\"true\"]\ndependency = \"afternotok:{fail}\"\n"),
    );
    // b waits while a runs, though a GPU is free.
    c.wait_state(a, "RUNNING", T);
    let jb = c.job(b);
    assert_eq!(jb["state"], "PENDING");
    assert_eq!(jb["reason"], "Dependency");
    assert_eq!(jb["dependencies"][0]["kind"], "afterok");
    let ja = c.wait_state(a, "COMPLETED", T);
    let jb = c.wait_state(b, "COMPLETED", T);
    assert!(jb["start_time"].as_str().unwrap() >= ja["end_time"].as_str().unwrap());

    c.wait_state(fail, "FAILED", T);
    let jn = c.wait_state(never, "CANCELLED", T);
    assert!(
        jn["reason"].as_str().unwrap().contains(&format!(
            "DependencyNeverSatisfied: job {fail} ended FAILED"
        )),
        "{jn}"
    );
    let jc = c.wait_state(chained, "CANCELLED", T);
    assert!(
        jc["reason"]
            .as_str()
            .unwrap()
            .contains("DependencyNeverSatisfied")
    );
    c.wait_state(notok, "COMPLETED", T);

    // Refused at submit: an unknown job, and one that can already never be met.
    for (dep, want) in [
        ("afterok:9999".to_string(), "job 9999, which does not exist"),
        (
            format!("afterok:{fail}"),
            "can never be met: it ended FAILED",
        ),
    ] {
        std::fs::write(
            c.path("bad.toml"),
            format!("command = [\"true\"]\ndependency = \"{dep}\"\n"),
        )
        .unwrap();
        let out = c.gpuctl(&["submit", "bad.toml"]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{err}");
    }
    // A malformed one is the job file's error, with its position.
    std::fs::write(
        c.path("bad.toml"),
        "command = [\"true\"]\ndependency = \"after:1\"\n",
    )
    .unwrap();
    let err = String::from_utf8_lossy(&c.gpuctl(&["submit", "bad.toml"]).stderr).into_owned();
    assert!(
        err.contains("bad.toml:2:") && err.contains("afterok, afterany, afternotok or singleton"),
        "{err}"
    );
}
