//! The randomized fault test on the real binaries (issue 40; `gpuctl_tests::faults`):
//! a short schedule of kills, freezes, partitions and restarts of three controllers on
//! Raft while clients submit and cancel, then the checker. The seed is printed (set
//! `GPUCTL_FAULT_SEED` to replay one; `GPUCTL_FAULT_SECONDS`, default 45, for longer);
//! the long soak is `cargo bench -p gpuctl-tests --bench faults`.

#[test]
fn random_kills_freezes_and_partitions_lose_and_repeat_nothing() {
    if let Err(why) = gpuctl_tests::replicated::namespaces_available() {
        gpuctl_tests::skipped(
            "GPUCTL_REQUIRE_NETNS",
            &format!("network namespaces for its partitions ({why}): kills and freezes only"),
        );
    }
    let seed = std::env::var("GPUCTL_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            now.map_or(1, |d| d.as_nanos() as u64)
        });
    let seconds = std::env::var("GPUCTL_FAULT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45);
    eprintln!("fault schedule seed {seed} (GPUCTL_FAULT_SEED={seed} replays it), {seconds} s");
    let out = gpuctl_tests::faults::run(seed, seconds, None);
    eprintln!("faults:\n  {}", out.faults.join("\n  "));
    eprintln!(
        "{} submits acknowledged, {} jobs ran, {} listings, longest without one {:?}",
        out.acknowledged, out.ran, out.listings, out.longest_gap
    );
    assert!(
        out.violations.is_empty(),
        "seed {seed}: {} violations:\n  {}",
        out.violations.len(),
        out.violations.join("\n  ")
    );
    assert!(
        out.faults.len() >= 5,
        "a schedule of faults ran: {:?}",
        out.faults
    );
    assert!(
        out.acknowledged > 20,
        "the clients were served: {}",
        out.acknowledged
    );
    assert!(out.ran > 20, "jobs ran through the faults: {}", out.ran);
}
