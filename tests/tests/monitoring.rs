//! GPU monitoring: metrics reach the controller and Prometheus (DCGM names, stable GPU
//! series, jobs as `hpc_job`/`user`), the controller's own metrics, health drains, a
//! real Prometheus scraping both daemons, and a job over its GPU memory share is
//! warned, then ended with the reason.

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

use gpuctl_tests::{Cluster, free_port, wait_for};

const T: Duration = Duration::from_secs(30);

fn scrape(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

#[test]
fn job_over_its_gpu_memory_share_is_warned_then_ended() {
    let mut c = Cluster::controller_only();
    c.add_agent(
        "mon-share",
        "1xA100-80GB",
        &["--sample-interval", "500ms", "--gpu-memory-grace", "2s"],
    );
    c.wait_nodes_up(1);
    let id = c.submit(
        "over.toml",
        "script = \"sleep 60\"\n[env]\nGPUCTL_FAKE_GPU_MEMORY_MIB = \"12000\"\n[resources]\ngpu_memory = \"10GiB\"\n",
    );
    c.wait_state(id, "RUNNING", T);
    // The warning shows as the job's reason while it still runs.
    assert!(wait_for(T, || {
        let j = c.job(id);
        j["state"] != "RUNNING"
            || j["reason"]
                .as_str()
                .unwrap()
                .starts_with("warning: GPU memory 12000 MiB")
    }));
    let j = c.wait_state(id, "FAILED", T);
    let reason = j["reason"].as_str().unwrap();
    assert!(
        reason.contains("GPU memory 12000 MiB") && reason.contains("over its share of 10240 MiB"),
        "{reason}"
    );
    let log = std::fs::read_to_string(c.path("gpud-mon-share.log")).unwrap();
    assert!(log.contains("is over its share of 10240 MiB"), "{log}");
}

#[test]
fn metrics_reach_prometheus_nodes_and_show() {
    let mut c = Cluster::controller_only();
    std::fs::write(
        c.path("gpus.toml"),
        "[[gpus]]\ncount = 2\nmodel = \"A100-80GB\"\n[gpus.metrics]\ntemperature = [[0, 50], [3600, 90]]\npower = [[0, 250]]\n",
    )
    .unwrap();
    let port = free_port();
    let file = c.path("gpus.toml");
    let listen = format!("127.0.0.1:{port}");
    // --fake-gpus-file instead of --fake-gpus: the harness passes the latter, so the
    // file comes through the extra arguments and the spec is a dummy it overrides.
    c.add_agent_raw(
        "mon-prom",
        &[
            "--fake-gpus-file",
            file.to_str().unwrap(),
            "--sample-interval",
            "500ms",
            "--metrics-listen",
            &listen,
            "--inventory-interval",
            "1s",
        ],
    );
    c.wait_nodes_up(1);
    let id = c.submit(
        "use.toml",
        "script = \"sleep 60\"\n[env]\nGPUCTL_FAKE_GPU_MEMORY_MIB = \"3000\"\n[resources]\ngpu_memory = \"10GiB\"\n",
    );
    let j = c.wait_state(id, "RUNNING", T);
    let uuid = j["gpus"][0].as_str().unwrap().to_string();

    // Prometheus: DCGM names with gpu/UUID/Hostname labels that stay the same as jobs
    // come and go, the jobs on each GPU as an info series (hpc_job, user), and the
    // job's memory.
    let mut parsed = None;
    assert!(wait_for(T, || {
        let body = scrape(port);
        let s = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
            .expect("Prometheus text parses");
        let found = s.samples.iter().any(|x| {
            x.metric == "gpuctl_job_gpu_memory_used_mib"
                && x.labels.get("hpc_job") == Some(id.to_string().as_str())
        });
        if found {
            parsed = Some(s);
        }
        found
    }));
    let s = parsed.unwrap();
    let value = |m: &str, uuid: &str| {
        s.samples
            .iter()
            .find(|x| x.metric == m && x.labels.get("UUID") == Some(uuid))
            .map(|x| match x.value {
                prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
                _ => panic!("{m} is not a gauge"),
            })
            .unwrap_or_else(|| panic!("no {m} for {uuid}"))
    };
    let temp = s
        .samples
        .iter()
        .find(|x| x.metric == "DCGM_FI_DEV_GPU_TEMP" && x.labels.get("UUID") == Some(uuid.as_str()))
        .unwrap();
    assert_eq!(temp.labels.get("Hostname"), Some("mon-prom"));
    assert_eq!(temp.labels.get("hpc_job"), None);
    let info = s
        .samples
        .iter()
        .find(|x| x.metric == "gpuctl_gpu_job_info" && x.labels.get("UUID") == Some(uuid.as_str()))
        .expect("the job's info series");
    assert_eq!(info.labels.get("hpc_job"), Some(id.to_string().as_str()));
    assert_eq!(info.labels.get("user"), Some("root"));
    assert!((50.0..=51.0).contains(&value("DCGM_FI_DEV_GPU_TEMP", &uuid)));
    assert_eq!(value("DCGM_FI_DEV_POWER_USAGE", &uuid), 250.0);
    assert_eq!(value("DCGM_FI_DEV_FB_USED", &uuid), 3000.0);
    assert_eq!(value("DCGM_FI_DEV_GPU_UTIL", &uuid), 100.0);
    assert_eq!(value("gpuctl_job_gpu_memory_used_mib", &uuid), 3000.0);
    let idle = s
        .samples
        .iter()
        .find(|x| x.metric == "DCGM_FI_DEV_GPU_UTIL" && x.labels.get("UUID") != Some(uuid.as_str()))
        .unwrap();
    assert!(
        !s.samples.iter().any(|x| x.metric == "gpuctl_gpu_job_info"
            && x.labels.get("UUID") == idle.labels.get("UUID")),
        "an idle GPU has no job series"
    );

    // The controller has them from the heartbeat: nodes and show.
    assert!(wait_for(T, || {
        let n = c.nodes();
        n[0]["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["uuid"] == uuid.as_str() && g["metrics"]["mem_used_mib"] == 3000)
    }));
    let shown = c.job(id);
    assert_eq!(shown["gpu_use"][0]["job_mem_used_mib"], 3000, "{shown}");
    assert_eq!(shown["gpu_use"][0]["gpu"], uuid.as_str());
    let table = c.gpuctl_ok(&["nodes"]);
    assert!(
        table.contains("UTIL") && table.contains("250/400W"),
        "{table}"
    );

    // The inventory changes under the running agent (a GPU more, with a MIG layout):
    // the agent registers again, the running job stays.
    std::fs::write(
        c.path("gpus.toml"),
        "[[gpus]]\ncount = 2\nmodel = \"A100-80GB\"\n[[gpus]]\nmodel = \"A100-80GB\"\nmig = [\"3g.40gb\"]\n",
    )
    .unwrap();
    assert!(wait_for(T, || c.nodes()[0]["gpus"]
        .as_array()
        .unwrap()
        .len()
        == 3));
    assert_eq!(c.nodes()[0]["gpus"][2]["mig"][0]["profile"], "3g.40gb");
    assert_eq!(c.job(id)["state"], "RUNNING");
    c.gpuctl_ok(&["cancel", &id.to_string()]);
}

#[test]
fn share_jobs_get_an_mps_daemon_or_a_warning_saying_there_is_none() {
    // With an MPS control program (a stand-in that logs its calls).
    let mut c = Cluster::controller_only();
    let calls = c.path("mps-calls");
    let exe = c.path("fake-mps-control");
    std::fs::write(
        &exe,
        format!(
            "#!/bin/sh\nin=$(cat)\necho \"$* [$CUDA_VISIBLE_DEVICES] $in\" >> {}\n",
            calls.display()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    c.add_agent(
        "mps-yes",
        "1xA100-80GB",
        &["--mps-control", exe.to_str().unwrap()],
    );
    c.wait_nodes_up(1);
    let job = "script = \"echo pipe=$CUDA_MPS_PIPE_DIRECTORY\"\nstdout = \"mps-%j.out\"\n[resources]\ngpus = 0.5\n";
    let a = c.submit("a.toml", job);
    let j = c.wait_state(a, "COMPLETED", T);
    let uuid = j["gpus"][0].as_str().unwrap().to_string();
    let out = std::fs::read_to_string(c.path(&format!("mps-{a}.out"))).unwrap();
    assert!(out.contains(&format!("mps/{uuid}/pipe")), "{out}");
    assert!(wait_for(T, || std::fs::read_to_string(&calls)
        .is_ok_and(|s| s.lines().count() == 2)));
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        format!("-d [{uuid}] \n [{uuid}] quit\n")
    );
    assert_eq!(j["warnings"], serde_json::json!([]));

    // Without one: the job runs and its record says so.
    let mut c = Cluster::controller_only();
    c.add_agent(
        "mps-no",
        "1xA100-80GB",
        &["--mps-control", "/nonexistent/nvidia-cuda-mps-control"],
    );
    c.wait_nodes_up(1);
    let b = c.submit("b.toml", "script = \"sleep 1\"\n[resources]\ngpus = 0.5\n");
    let j = c.wait_state(b, "COMPLETED", T);
    let w = j["warnings"][0].as_str().unwrap_or("");
    assert!(
        w.contains("cannot run /nonexistent/nvidia-cuda-mps-control"),
        "{j}"
    );
}

/// gpuctld's own metrics: jobs by state, pending by reason, nodes, GPUs allocated, per
/// user running GPUs, submits and pass times, from a real scrape over HTTP.
#[test]
fn controller_metrics_count_jobs_nodes_gpus_and_passes() {
    let port = free_port();
    let mut c = Cluster::controller_with_args(&["--metrics-listen", &format!("127.0.0.1:{port}")]);
    c.add_agent("n1", "2xA100-80GB", &[]);
    c.wait_nodes_up(1);
    let running = c.submit("r.toml", "script = \"sleep 30\"\n[resources]\ngpus = 2\n");
    c.wait_state(running, "RUNNING", T);
    let waiting = c.submit("w.toml", "script = \"true\"\n[resources]\ngpus = 1\n");
    assert!(wait_for(T, || c.job(waiting)["reason"] == "Resources"));
    let done = c.submit("d.toml", "script = \"true\"\n");
    c.wait_state(done, "COMPLETED", T);

    let body = scrape(port);
    let s = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("Prometheus text parses");
    let value = |metric: &str, label: Option<(&str, &str)>| {
        s.samples
            .iter()
            .find(|x| x.metric == metric && label.is_none_or(|(k, v)| x.labels.get(k) == Some(v)))
            .map(|x| match x.value {
                prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
            .unwrap_or_else(|| panic!("no {metric} {label:?} in\n{body}"))
    };
    assert_eq!(value("gpuctl_jobs", Some(("state", "RUNNING"))), 1.0);
    assert_eq!(value("gpuctl_jobs", Some(("state", "PENDING"))), 1.0);
    assert_eq!(value("gpuctl_jobs", Some(("state", "COMPLETED"))), 1.0);
    assert_eq!(
        value("gpuctl_jobs_pending", Some(("reason", "Resources"))),
        1.0
    );
    assert_eq!(value("gpuctl_nodes", Some(("state", "ALLOCATED"))), 1.0);
    assert_eq!(value("gpuctl_gpus", None), 2.0);
    assert_eq!(value("gpuctl_gpus_allocated", None), 2.0);
    // The one measure (docs/utilisation.md): both GPUs allocated; busy as sampled.
    assert_eq!(value("gpuctl_cluster_gpu_allocation_ratio", None), 1.0);
    let busy = value("gpuctl_cluster_gpu_utilization_ratio", None);
    assert!((0.0..=1.0).contains(&busy), "{busy}");
    assert_eq!(
        value("gpuctl_user_running_gpus", Some(("user", "root"))),
        2.0
    );
    assert_eq!(
        value("gpuctl_account_running_gpus", Some(("account", "root"))),
        2.0
    );
    assert_eq!(value("gpuctl_slices", Some(("state", "mig_total"))), 0.0);
    assert_eq!(value("gpuctl_submits_total", None), 3.0);
    assert!(
        body.contains("gpuctl_schedule_pass_seconds_count"),
        "{body}"
    );
    assert!(body.contains("gpuctl_store_commit_seconds_count"), "{body}");
    c.gpuctl_ok(&["cancel", &running.to_string()]);
}

/// Health: a GPU heating past `health.max_gpu_temp_c` drains its node with a hardware
/// reason within seconds; the drain is lifted once it is cool again. An admin's drain
/// is never lifted by it.
#[test]
fn a_hot_gpu_drains_its_node_until_it_cools() {
    let mut c =
        Cluster::controller_with_config("[health]\nmax_gpu_temp_c = 90\nresume_gpu_temp_c = 80");
    c.add_agent_gpus_file(
        "hot",
        "[[gpus]]\ncount = 2\nmodel = \"A100-80GB\"\n[gpus.metrics]\ntemperature = [[0, 40], [4, 40], [4.2, 97], [9, 97], [9.2, 50]]\n",
        "300ms",
    );
    c.wait_nodes_up(1);
    assert!(wait_for(T, || c.node_state("hot") == "DRAINED"));
    let n = &c.nodes()[0];
    let reason = n["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("health (hardware): GPU ") && reason.contains("at 97 C"),
        "{reason}"
    );
    assert!(
        wait_for(T, || c.node_state("hot") == "IDLE"),
        "drain not lifted"
    );
    // An admin's drain stays, hot or cool.
    c.gpuctl_ok(&["node", "drain", "hot", "--reason", "fan swap"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(c.nodes()[0]["reason"], "fan swap");
}

#[test]
fn an_xid_on_a_gpu_drains_its_node_and_requeues_the_job_on_it() {
    let mut c = Cluster::controller_only();
    // One GPU that falls off the bus 4 s after the agent starts.
    c.add_agent_gpus_file(
        "xid",
        "[[gpus]]\ncount = 1\nmodel = \"A100-80GB\"\n[gpus.metrics]\nxid = [[4, 79]]\n",
        "300ms",
    );
    c.wait_nodes_up(1);
    let id = c.submit(
        "x.toml",
        "script = \"sleep 120\"\nrequeue = true\n[resources]\ngpus = 1\n",
    );
    c.wait_state(id, "RUNNING", T);
    assert!(wait_for(T, || c.node_state("xid") == "DRAINED"));
    let reason = c.nodes()[0]["reason"].as_str().unwrap().to_string();
    assert!(
        reason.starts_with("health (hardware): XID 79 (GPU has fallen off the bus) on GPU "),
        "{reason}"
    );
    // The job on it goes back to the queue (its node is drained: it waits).
    let j = c.wait_state(id, "PENDING", T);
    assert!(j["warnings"][0].as_str().unwrap().contains("XID 79"), "{j}");
    // Handled once: after an admin resumes the node, the job runs again and the same
    // (still reported) XID drains nothing.
    c.gpuctl_ok(&["node", "resume", "xid"]);
    let j = c.wait_state(id, "RUNNING", T);
    assert_eq!(j["attempt"], 2, "{j}");
    std::thread::sleep(Duration::from_secs(2));
    assert_ne!(c.node_state("xid"), "DRAINED");
    c.gpuctl_ok(&["cancel", &id.to_string()]);
}

/// A whole-GPU job, two shares of one GPU, a job on a MIG instance (each using GPU
/// memory where it says so) and a job waiting for GPUs: every panel has data.
fn jobs_for_the_dashboard(c: &Cluster) -> (u64, Vec<u64>, u64) {
    let id = c.submit(
        "r.toml",
        "script = \"sleep 60\"\n[env]\nGPUCTL_FAKE_GPU_MEMORY_MIB = \"2000\"\n[resources]\ngpus = 1\n",
    );
    c.wait_state(id, "RUNNING", T);
    // Two shares of the other GPU: two holders of one GPU, which the dashboard's join
    // must take (a many-to-one join the wrong way round fails on it).
    let shares: Vec<u64> = (0..2)
        .map(|k| {
            c.submit(
                &format!("s{k}.toml"),
                "script = \"sleep 60\"\n[resources]\ngpus = 0.25\n",
            )
        })
        .collect();
    // A job on a MIG instance, using memory there.
    let mig = c.submit(
        "m.toml",
        "script = \"sleep 60\"\n[env]\nGPUCTL_FAKE_GPU_MEMORY_MIB = \"3000\"\n[resources]\nmig = \"3g.40gb\"\n",
    );
    for j in shares.iter().chain([&mig]) {
        c.wait_state(*j, "RUNNING", T);
    }
    // A job that waits for GPUs, so that the queue's panels have something to show.
    let waiting = c.submit("w.toml", "script = \"true\"\n[resources]\ngpus = 2\n");
    assert!(wait_for(T, || c.job(waiting)["reason"] == "Resources"));
    (id, shares, mig)
}

/// The result of an instant query of the Prometheus on `port` (empty when it fails).
fn prom_query(port: u16, q: &str) -> Vec<serde_json::Value> {
    let path = format!(
        "/api/v1/query?query={}",
        q.bytes()
            .map(|b| if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            })
            .collect::<String>()
    );
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return Vec::new();
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return Vec::new();
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let body = out.split_once("\r\n\r\n").map_or("", |x| x.1);
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["data"]["result"].as_array().cloned())
        .unwrap_or_default()
}

/// A real Prometheus scrapes both daemons, and the queries operators write return
/// data: every panel of the Grafana dashboard in `deploy/grafana/`, the per-job join on
/// `UUID` with `hpc_job`/`user`, utilisation of the cluster, running jobs. Skipped
/// without Prometheus unless CI asks.
#[test]
fn a_real_prometheus_scrapes_both_daemons_and_the_queries_return_data() {
    if Command::new("prometheus")
        .arg("--version")
        .output()
        .is_err()
    {
        gpuctl_tests::skipped(
            "GPUCTL_REQUIRE_PROMTOOL",
            "prometheus (apt-get install prometheus)",
        );
        return;
    }
    let (ctld_port, gpud_port, prom_port) = (free_port(), free_port(), free_port());
    let mut c =
        Cluster::controller_with_args(&["--metrics-listen", &format!("127.0.0.1:{ctld_port}")]);
    // Two whole GPUs and one in MIG mode.
    c.add_agent(
        "p1",
        "2xA100-80GB,1xA100-80GB:mig=3g.40gb+3g.40gb",
        &[
            "--metrics-listen",
            &format!("127.0.0.1:{gpud_port}"),
            "--sample-interval",
            "500ms",
        ],
    );
    c.wait_nodes_up(1);
    let (id, shares, mig) = jobs_for_the_dashboard(&c);
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/gpuctl.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let panels: Vec<(String, String)> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap().to_string();
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap().to_string()))
        })
        .collect();
    assert!(
        panels.len() >= 30,
        "a dashboard of {} queries",
        panels.len()
    );
    let config = c.path("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gpuctld\n    static_configs: [{{targets: ['127.0.0.1:{ctld_port}']}}]\n  - job_name: gpud\n    static_configs: [{{targets: ['127.0.0.1:{gpud_port}']}}]\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(c.path("prometheus.log")).unwrap();
    let mut prom = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", c.path("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stderr(log)
        .spawn()
        .unwrap();
    let query = |q: &str| prom_query(prom_port, q);
    let join = "gpuctl_gpu_job_info * on(UUID) group_left() DCGM_FI_DEV_GPU_UTIL";
    let mig_join = "gpuctl_mig_job_info * on(UUID, GPU_I_ID) group_left() DCGM_FI_DEV_FB_USED";
    let utilisation_q = "sum(gpuctl_gpus_allocated) / sum(gpuctl_gpus)";
    let running_q = "gpuctl_jobs{state=\"RUNNING\"}";
    let ok = wait_for(Duration::from_secs(60), || {
        [join, utilisation_q, running_q]
            .iter()
            .all(|q| !query(q).is_empty())
    });
    // Rates need two scrapes of the counters; by then every panel has data.
    let empty_panels = |_: ()| -> Vec<String> {
        panels
            .iter()
            .filter(|(_, q)| query(q).is_empty())
            .map(|(t, q)| format!("{t}: {q}"))
            .collect()
    };
    let all_panels = wait_for(Duration::from_secs(30), || empty_panels(()).is_empty());
    let missing = empty_panels(());
    let results = query(join);
    let on_mig = query(mig_join);
    let utilisation = query(utilisation_q);
    let running = query(running_q);
    let _ = prom.kill();
    let _ = prom.wait();
    assert!(
        ok,
        "no data for the join; see {}",
        c.path("prometheus.log").display()
    );
    assert!(all_panels, "dashboard panels without data: {missing:#?}");
    // One row per job and GPU: the whole GPU's job, both shares, the MIG job.
    let mut jobs: Vec<String> = results
        .iter()
        .map(|r| r["metric"]["hpc_job"].as_str().unwrap().to_string())
        .collect();
    jobs.sort();
    let mut want: Vec<String> = [id, shares[0], shares[1], mig]
        .iter()
        .map(u64::to_string)
        .collect();
    want.sort();
    assert_eq!(jobs, want, "{results:#?}");
    assert!(results.iter().all(|r| r["metric"]["user"] == "root"));
    assert_eq!(
        results[0]["metric"]["job"], "gpud",
        "Prometheus's own job label is free"
    );
    // The MIG job's row is its instance's memory, with the instance's labels.
    assert_eq!(on_mig.len(), 1, "{on_mig:#?}");
    assert_eq!(on_mig[0]["metric"]["hpc_job"], mig.to_string());
    assert_eq!(on_mig[0]["metric"]["GPU_I_PROFILE"], "3g.40gb");
    assert_eq!(on_mig[0]["value"][1], "3000");
    let u: f64 = utilisation[0]["value"][1]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(u > 0.5 && u < 1.0, "{u}: 1.5 GPUs and a MIG instance of 3");
    assert_eq!(running[0]["value"][1], "4");
    for j in [id, shares[0], shares[1], mig] {
        c.gpuctl_ok(&["cancel", &j.to_string()]);
    }
}

/// The site's health program (`gpud --health-program`, like Slurm's
/// HealthCheckProgram): while it fails, the node is drained with its first line of
/// output as a site-check reason; once it passes, the drain is lifted.
#[test]
fn a_failing_health_program_drains_its_node_until_it_passes() {
    let mut c = Cluster::controller_only();
    let flag = c.path("ib0-down");
    let script = c.path("check.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nif [ -e {f} ]; then echo \"ib0 link down\"; exit 1; fi\nexit 0\n",
            f = flag.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(&flag, "").unwrap();
    let script = script.to_str().unwrap().to_string();
    c.add_agent(
        "site1",
        "1xA100-80GB",
        &["--health-program", &script, "--health-interval", "300ms"],
    );
    assert!(
        wait_for(T, || c.node_state("site1") == "DRAINED"),
        "{}\n{}",
        c.nodes(),
        c.agent_log("site1")
    );
    assert_eq!(c.nodes()[0]["reason"], "health (site check): ib0 link down");
    std::fs::remove_file(&flag).unwrap();
    assert!(
        wait_for(T, || c.node_state("site1") == "IDLE"),
        "drain not lifted"
    );
}

/// While no GPU is free, a submit of a GPU job does not run a pass of its own: its pass
/// waits up to a second, shared with other submits (`gpuctl_submits_deferred_total`
/// counts them). Nothing is lost by it: the deferred jobs still get their reason, a
/// CPU-only job is not deferred, and the jobs start as soon as the GPU is free.
#[test]
fn submits_to_a_full_cluster_share_a_deferred_pass_and_lose_no_start() {
    let port = free_port();
    let mut c = Cluster::controller_with_args(&["--metrics-listen", &format!("127.0.0.1:{port}")]);
    c.add_agent("n1", "1xA100-80GB", &[]);
    c.wait_nodes_up(1);
    let deferred = || {
        let body = scrape(port);
        let line = body
            .lines()
            .find(|l| l.starts_with("gpuctl_submits_deferred_total "))
            .unwrap_or_else(|| panic!("no deferred counter in\n{body}"));
        line.rsplit(' ').next().unwrap().parse::<f64>().unwrap()
    };
    let long = c.submit(
        "long.toml",
        "script = \"sleep 300\"\n[resources]\ngpus = 1\n",
    );
    c.wait_state(long, "RUNNING", T);
    // Its launch report (an event: it wakes a pass) is in before the submits below.
    assert!(wait_for(T, || !c.job(long)["launch_time"].is_null()));
    let gpu_job = "script = \"true\"\n[resources]\ngpus = 1\n";
    // The last pass left the only GPU held: these defer (the first may still run a
    // pass of its own if the launch report's pass has not run yet).
    let waiting: Vec<u64> = (1..=4)
        .map(|i| c.submit(&format!("w{i}.toml"), gpu_job))
        .collect();
    let before = deferred();
    assert!(before >= 3.0, "{before}");
    for &id in &waiting {
        assert!(wait_for(T, || c.job(id)["reason"] == "Resources"), "{id}");
    }
    let cpu = c.submit("cpu.toml", "script = \"true\"\n");
    c.wait_state(cpu, "COMPLETED", T);
    assert_eq!(deferred(), before, "a CPU-only job can start: not deferred");
    c.gpuctl_ok(&["cancel", &long.to_string()]);
    for id in waiting {
        c.wait_state(id, "COMPLETED", T);
    }
}
