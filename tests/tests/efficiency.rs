//! The efficiency loop on real binaries: a fake GPU with scripted usage (a constant
//! utilisation curve, a job declaring its GPU memory), the figures and advice of
//! `gpuctl efficiency`, and `gpuctl history` before and after `kill -9` of the
//! controller.

use std::time::Duration;

use gpuctl_tests::{Cluster, wait_for};

const T: Duration = Duration::from_secs(30);

#[test]
fn scripted_usage_gives_the_figures_and_advice_and_history_survives_kill9() {
    let mut c = Cluster::controller_only();
    // One 80 GB GPU, 20% busy and drawing 250 W whatever runs on it.
    c.add_agent_gpus_file(
        "eff",
        "[[gpus]]\ncount = 1\nmodel = \"A100-80GB\"\n[gpus.metrics]\nutilization = [[0, 20]]\npower = [[0, 250]]\n",
        "500ms",
    );
    c.wait_nodes_up(1);
    // A whole GPU, 4 CPUs, 2 hours: for 6 seconds of sleep with 3,000 MiB of GPU memory.
    let id = c.submit(
        "eff.toml",
        "name = \"oversized\"\nscript = \"sleep 6\"\n[env]\nGPUCTL_FAKE_GPU_MEMORY_MIB = \"3000\"\n[resources]\ngpus = 1\ncpus = 4\ntime_limit = \"2h\"\n",
    );
    c.wait_state(id, "COMPLETED", T);
    let e = c.json(&["efficiency", &id.to_string()]);
    // Every sample said 20%: the mean and the maximum are 20.
    assert_eq!(e["gpu_util_mean"], 20.0, "{e:#}");
    assert_eq!(e["gpu_util_max"], 20.0, "{e:#}");
    assert_eq!(e["gpu_memory_peak_mib"], 3000, "{e:#}");
    assert_eq!(e["gpu_memory_requested_mib"], 81920, "{e:#}");
    let samples = e["gpu_samples"].as_u64().unwrap();
    assert!(samples >= 3, "{e:#}");
    // 250 W over the time between the first and the last sample, at most the run.
    let elapsed = e["elapsed_secs"].as_f64().unwrap();
    let energy = e["gpu_energy_j"].as_f64().unwrap();
    assert!(energy > 0.0 && energy <= 250.0 * (elapsed + 1.0), "{e:#}");
    // The cgroup's CPU time: a sleeping job keeps well under one CPU busy.
    let cpus = e["cpus_used_mean"]
        .as_f64()
        .expect("CPU time from the cgroup");
    assert!((0.0..0.5).contains(&cpus), "{e:#}");
    // max(20% x 1.25, 3000 x 1.25 / 81920) = 0.25 of a GPU; 6-7 s x 1.25 rounds up to
    // 5 minutes; under half a CPU x 1.25 rounds up to 1.
    let advice: Vec<String> = e["advice"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().split("  #").next().unwrap().to_string())
        .collect();
    assert_eq!(
        advice,
        ["gpus = 0.25", "time_limit = \"5m\"", "cpus = 1"],
        "{e:#}"
    );
    let text = c.gpuctl_ok(&["efficiency", &id.to_string()]);
    assert!(text.contains("gpus = 0.25"), "{text}");
    assert!(text.contains("REQUESTED"), "{text}");

    let check_history = |c: &Cluster| {
        let rows = c.json(&["history", "--name", "oversized"]);
        let rows = rows.as_array().unwrap();
        assert_eq!(rows.len(), 1, "{rows:?}");
        let r = &rows[0];
        assert_eq!(r["job_id"], id.to_string());
        assert_eq!(r["state"], "COMPLETED");
        assert_eq!(r["gpu_util_mean"], 20.0);
        assert_eq!(r["gpu_memory_peak_mib"], 3000);
        assert_eq!(r["exit_code"], 0);
        let csv = c.gpuctl_ok(&[
            "history",
            "--csv",
            "-o",
            "jobid,name,state,gpu_util,gpu_mem_peak",
            "-S",
            "1h",
        ]);
        assert!(
            csv.lines()
                .any(|l| l == format!("{id},oversized,COMPLETED,20.0%,3000MiB")),
            "{csv}"
        );
    };
    check_history(&c);
    // The report: one job of root's, measured all along, 20% busy.
    let svg = c.path("report.svg");
    let r = c.json(&["report", "--by", "user", "--plot", svg.to_str().unwrap()]);
    let total = &r["total"];
    assert_eq!(total["jobs"], 1, "{r:#}");
    let alloc = total["gpu_hours_allocated"].as_f64().unwrap();
    assert!(alloc > 0.0 && alloc < 10.0 / 3600.0, "{r:#}");
    assert_eq!(total["gpu_hours_measured"].as_f64(), Some(alloc), "{r:#}");
    let eff = total["gpu_efficiency_pct"].as_f64().unwrap();
    assert!((eff - 20.0).abs() < 1e-6, "{r:#}");
    assert_eq!(r["groups"][0]["name"], "root", "{r:#}");
    // Energy from the fake GPU's power samples (60 W + 3.4 W per % busy: 128 W at
    // 20%), per busy GPU-hour about 128 / 0.2 W.
    let kwh = total["energy_kwh"].as_f64().unwrap();
    let per_busy = total["kwh_per_busy_gpu_hour"].as_f64().unwrap_or(0.0);
    assert!(kwh > 0.0 && (0.3..1.5).contains(&per_busy), "{r:#}");
    let demand: f64 = r["demand_gpu_hours"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| d.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
        .sum();
    assert!((demand - alloc).abs() < 1e-9, "{r:#}");
    // The cluster's measures (docs/utilisation.md): one GPU over the window, which
    // starts at the first job (the cluster is a minute old, not a week: 168 GPU-hours
    // were never there to use), allocated for those seconds, busy a fifth of them,
    // every hour measured.
    let cl = &r["cluster"];
    assert_eq!(cl["gpus"], 1, "{r:#}");
    let hours = cl["gpu_hours_available"].as_f64().unwrap();
    let window = (r["until_ms"].as_i64().unwrap() - r["since_ms"].as_i64().unwrap()) as f64;
    assert!((hours - window / 3.6e6).abs() < 1e-9, "{r:#}");
    assert!(
        hours > 0.0 && hours < 0.5,
        "the window is the cluster's life: {r:#}"
    );
    let allocation = cl["allocation"].as_f64().unwrap();
    assert!((allocation - alloc / hours).abs() < 1e-9, "{r:#}");
    let utilization = cl["utilization"].as_f64().unwrap();
    assert!((utilization - 0.2 * alloc / hours).abs() < 1e-9, "{r:#}");
    assert_eq!(cl["measured"].as_f64(), Some(1.0), "{r:#}");
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(
        picture.contains("<svg") && picture.contains("GPU-hours"),
        "{picture}"
    );
    let text = c.gpuctl_ok(&["report", "--by", "account"]);
    assert!(
        text.contains("TOTAL") && text.contains("Mon") && text.contains("KWH/BUSY GPU-H"),
        "{text}"
    );
    assert!(
        text.contains("Cluster: 1 GPUs, 0 GPU-hours in the window: utilisation"),
        "{text}"
    );
    // Nothing of it is lost with the controller.
    c.kill9_controller();
    c.start_controller();
    check_history(&c);
    right_size_from_that_run(&c);
    // A window that ends before the job was submitted leaves it out.
    let rows = c.json(&["history", "-S", "30d", "-E", "2000-01-01"]);
    assert_eq!(rows.as_array().map(Vec::len), Some(0), "{rows}");
    assert!(wait_for(T, || c.node_state("eff") != "DOWN"));
}

/// The same job again, right-sized from the completed run of `eff.toml`.
fn right_size_from_that_run(c: &Cluster) {
    // A quarter GPU, 5 minutes, 1 CPU.
    let out = c.json(&[
        "submit",
        c.path("eff.toml").to_str().unwrap(),
        "--right-size",
    ]);
    let notes: Vec<&str> = out["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(notes.len(), 3, "{out:#}");
    assert!(
        notes[0].starts_with("right-size: gpus 1 -> 0.25 (last 1 run(s)"),
        "{out:#}"
    );
    assert!(
        notes[1].starts_with("right-size: time_limit 2h -> 5m"),
        "{out:#}"
    );
    assert!(notes[2].starts_with("right-size: cpus 4 -> 1"), "{out:#}");
    let again = c.job(out["job_id"].as_u64().unwrap());
    assert_eq!(again["resources"]["gpu_milli"], 250, "{again:#}");
    assert_eq!(again["resources"]["cpus"], 1, "{again:#}");
    assert_eq!(again["time_limit_secs"], 300, "{again:#}");
    // A job name with no earlier run is left as written, and says so.
    std::fs::write(
        c.path("new.toml"),
        "name = \"fresh\"\nscript = \"true\"\nright_size = true\n[resources]\ngpus = 1\n",
    )
    .unwrap();
    let out = c.json(&["submit", c.path("new.toml").to_str().unwrap()]);
    assert!(
        out["notes"][0]
            .as_str()
            .unwrap()
            .contains("no earlier completed run"),
        "{out:#}"
    );
}

#[test]
fn idle_allocations_are_cancelled_with_the_reason_and_exempt_qos_left_alone() {
    let mut c = Cluster::controller_with_config(
        "[idle]\nafter = \"3s\"\nutil_below = 5\naction = \"cancel\"\nexempt_qos = [\"low\"]\n",
    );
    // Two GPUs that never get over 1% busy.
    c.add_agent_gpus_file(
        "idle",
        "[[gpus]]\ncount = 2\nmodel = \"A100-80GB\"\n[gpus.metrics]\nutilization = [[0, 1]]\n",
        "500ms",
    );
    c.wait_nodes_up(1);
    let idle = c.submit(
        "a.toml",
        "name = \"idler\"\nscript = \"sleep 120\"\n[resources]\ngpus = 1\n",
    );
    let exempt = c.submit(
        "b.toml",
        "name = \"exempt\"\nqos = \"low\"\nscript = \"sleep 120\"\n[resources]\ngpus = 1\n",
    );
    c.wait_state(exempt, "RUNNING", T);
    // gpuctl top, one frame as text: the node's GPUs with their owners, and the queue.
    assert!(wait_for(T, || {
        let top = c.gpuctl_ok(&["top", "--once", "--width", "120"]);
        top.contains(&format!("{exempt}:root"))
    }));
    let top = c.gpuctl_ok(&["top", "--once", "--width", "120"]);
    assert!(
        top.contains("idle ") && top.contains("A100-80GB") && top.contains("RUNNING"),
        "{top}"
    );
    let j = c.wait_state(idle, "CANCELLED", T);
    let reason = j["reason"].as_str().unwrap();
    assert!(reason.contains("idle: its GPUs were under 5% for"), "{j:#}");
    // The exempt job, as idle, still runs.
    assert_eq!(c.job(exempt)["state"], "RUNNING");
    let rows = c.json(&["history", "--name", "idler"]);
    assert!(
        rows[0]["reason"].as_str().unwrap().contains("idle:"),
        "{rows:#}"
    );
    // The efficiency report of the cancelled job: 1% busy.
    let e = c.json(&["efficiency", &idle.to_string()]);
    assert_eq!(e["gpu_util_mean"], 1.0, "{e:#}");
    c.gpuctl_ok(&["cancel", &exempt.to_string()]);
}
