//! Durability under `kill -9`: clients submit concurrently while the controller is killed
//! at arbitrary moments; every acknowledged job survives, exactly once, whole.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpuctl_tests::{Cluster, bin};

const KILLS: usize = 20;
const CLIENTS: usize = 4;

#[test]
fn acknowledged_jobs_survive_repeated_kill9() {
    let mut c = Cluster::controller_only();
    let url = c.url();
    let dir = c.dir.path().to_path_buf();
    std::fs::write(
        dir.join("job.toml"),
        "name = \"crash\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let acked: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (acked, stop, url, dir) = (acked.clone(), stop.clone(), url.clone(), dir.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let out = std::process::Command::new(bin("gpuctl"))
                        .args(["--controller", &url, "submit", "--json", "job.toml"])
                        .current_dir(&dir)
                        .output()
                        .unwrap();
                    if out.status.success() {
                        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                        let id = v["job_id"].as_u64().unwrap();
                        assert!(
                            acked.lock().unwrap().insert(id),
                            "job id {id} acknowledged twice"
                        );
                    } else {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        })
        .collect();

    let mut jitter = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    for round in 0..KILLS {
        jitter = jitter
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_millis(50 + (jitter >> 33) % 250));
        c.kill9_controller();
        // Only what was acknowledged before the kill must be there.
        let before: BTreeSet<u64> = acked.lock().unwrap().clone();
        c.start_controller();
        let jobs = c.json(&["queue", "--all"]);
        let jobs = jobs.as_array().unwrap();
        let ids: Vec<u64> = jobs.iter().map(|j| j["id"].as_u64().unwrap()).collect();
        let unique: BTreeSet<u64> = ids.iter().copied().collect();
        assert_eq!(
            unique.len(),
            ids.len(),
            "round {round}: duplicate ids {ids:?}"
        );
        let missing: Vec<&u64> = before.difference(&unique).collect();
        assert!(
            missing.is_empty(),
            "round {round}: acknowledged jobs lost: {missing:?}"
        );
        for j in jobs {
            // Whole records only: every job has its spec and a state.
            assert_eq!(j["name"], "crash", "round {round}: {j}");
            assert_eq!(j["state"], "PENDING", "round {round}: {j}");
            assert_eq!(
                j["command"],
                serde_json::json!(["true"]),
                "round {round}: {j}"
            );
            assert!(j["submit_time"].is_string(), "round {round}: {j}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in clients {
        t.join().unwrap();
    }
    let acked = acked.lock().unwrap();
    assert!(
        acked.len() > KILLS,
        "too few submits got through: {}",
        acked.len()
    );
    // Ids keep increasing across restarts: the next one is above every one seen.
    let next = c.submit("job.toml", "name = \"crash\"\ncommand = [\"true\"]\n");
    assert!(next > *acked.iter().max().unwrap());
}
