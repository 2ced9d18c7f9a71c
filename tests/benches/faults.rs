//! The randomized fault run as a soak (issue 40; `gpuctl_tests::faults`), on release
//! binaries: `--seconds` of kills, freezes, partitions and restarts of three
//! controllers on Raft while clients submit and cancel, then the checker. Prints the
//! schedule, what was served and every violation; exits 1 on any.
//!
//! ```text
//! cargo bench -p gpuctl-tests --bench faults [-- --seconds 600 --seed N]
//! ```

use gpuctl_tests::{bench_arg, release_bins};

fn main() {
    let bins = release_bins(&["gpuctl", "gpuctld", "gpud"]);
    let seconds = bench_arg("--seconds", 600);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let seed = bench_arg("--seed", now.map_or(1, |d| d.as_nanos() as u64));
    println!("fault soak: seed {seed}, {seconds} s");
    let started = std::time::Instant::now();
    let out = gpuctl_tests::faults::run(seed, seconds, Some(bins));
    println!("  faults: {}", out.faults.len());
    for f in &out.faults {
        println!("    {f}");
    }
    println!(
        "  {} submits acknowledged, {} jobs ran, {} listings; longest without a listing {:.1} s; {:.0} s in all",
        out.acknowledged,
        out.ran,
        out.listings,
        out.longest_gap.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    println!("  violations: {}", out.violations.len());
    for v in &out.violations {
        println!("    {v}");
    }
    if !out.violations.is_empty() {
        std::process::exit(1);
    }
}
