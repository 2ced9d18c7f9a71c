//! Co-location by measured use on the real binaries: a job run once on a whole GPU
//! (30% busy, 6,000 MiB of GPU memory, as the agent samples them) asks for
//! co-location next time: two runs of it share the node's one GPU at once, each
//! charged half of it with a hard GPU memory limit from the measured peak; a run
//! that outgrows that limit is ended with the reason.

use std::time::Duration;

use gpuctl_tests::{Cluster, wait_for};

const T: Duration = Duration::from_secs(40);

fn job(script: &str, colocate: bool, mib: u32) -> String {
    format!(
        "name = \"serve\"\ncolocate = {colocate}\nscript = \"{script}\"\n\
         [env]\nGPUCTL_FAKE_GPU_MEMORY_MIB = \"{mib}\"\n[resources]\ngpus = 1\n"
    )
}

#[test]
fn jobs_share_a_gpu_by_what_they_used_and_one_over_its_memory_ends() {
    let mut c = Cluster::controller_with_config("[colocation]\nmin_run = \"1s\"\n");
    std::fs::write(
        c.path("gpus.toml"),
        "[[gpus]]\ncount = 1\nmodel = \"A100-80GB\"\n[gpus.metrics]\nutilization = [[0, 30]]\n",
    )
    .unwrap();
    let file = c.path("gpus.toml");
    c.add_agent_raw(
        "co",
        &[
            "--fake-gpus-file",
            file.to_str().unwrap(),
            "--sample-interval",
            "300ms",
            "--gpu-memory-grace",
            "1s",
        ],
    );
    c.wait_nodes_up(1);

    // Asked without measurements: placed as asked, and said so.
    std::fs::write(c.path("first.toml"), job("sleep 3", true, 6000)).unwrap();
    let first = c.json(&["submit", "first.toml"]);
    let note = first["notes"].to_string();
    assert!(note.contains("no earlier completed run"), "{first}");
    let id = first["job_id"].as_u64().unwrap();
    let done = c.wait_state(id, "COMPLETED", T);
    let e = c.json(&["efficiency", &id.to_string()]);
    assert!(
        e.to_string().contains("6000"),
        "the run's memory peak: {e}\n{done}"
    );

    // Measured: two runs share the one GPU at once, each charged half a GPU (30% busy
    // with its margin is under the overcommit floor of half the request) and 8 GiB
    // (6,000 MiB with its margin, rounded up to a GiB).
    std::fs::write(c.path("a.toml"), job("sleep 30", true, 6000)).unwrap();
    let a = c.json(&["submit", "a.toml"]);
    let note = a["notes"].to_string();
    assert!(
        note.contains("compute 0.50 of a GPU charged for 1.00") && note.contains("8 GiB hard"),
        "{a}"
    );
    let b = c.submit("b.toml", &job("sleep 30", true, 6000));
    let a = a["job_id"].as_u64().unwrap();
    let ja = c.wait_state(a, "RUNNING", T);
    let jb = c.wait_state(b, "RUNNING", T);
    assert_eq!(ja["gpus"], jb["gpus"], "one GPU, two jobs: {ja}\n{jb}");
    // Without co-location the same request waits for the GPU.
    let whole = c.submit("whole.toml", &job("sleep 1", false, 100));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(c.job(whole)["state"], "PENDING");
    c.gpuctl_ok(&["cancel", &a.to_string(), &b.to_string(), &whole.to_string()]);

    // A run that now needs 20,000 MiB is over its 8 GiB: ended, with the reason.
    let over = c.submit("over.toml", &job("sleep 30", true, 20000));
    let j = c.wait_state(over, "FAILED", T);
    let reason = j["reason"].as_str().unwrap();
    assert!(
        reason.contains("GPU memory 20000 MiB") && reason.contains("over its share of 8192 MiB"),
        "{reason}"
    );
    // Its peak counts: the next run is given room for it (25 GiB from 20,000 MiB).
    std::fs::write(c.path("next.toml"), job("sleep 1", true, 100)).unwrap();
    let next = c.json(&["submit", "next.toml"]);
    assert!(next["notes"].to_string().contains("25 GiB hard"), "{next}");
    assert!(wait_for(
        T,
        || c.job(next["job_id"].as_u64().unwrap())["state"] == "COMPLETED"
    ));
}
