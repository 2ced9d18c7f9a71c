//! One full scheduling pass on the benchmark's inputs, repeated, printing the minimum and
//! median: a quick loop for profiling (`perf record`) without criterion's harness.
//!
//! cargo run --release -p gpuctl-sim --example sched_pass -- [PENDING] [REPEATS]
//! (MSN=N overrides `max_scored_nodes`; FS, SIZE and SMALL=0 the priority weights.) It also prints a digest of the plan, so that a
//! change meant only to be faster can be checked to plan exactly the same.
//!
//! Fair share is on, as in the controller: the jobs belong to 500 users in 50 accounts
//! with usage drawn at random, and each repeat also builds the fair-share table and
//! gives every job its factor (timed with the pass, and on its own).

use gpuctl_sched::{self as sched, SchedConfig};
use gpuctl_sim::bench;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::Instant;

/// The allocator of the daemon (see main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
fn main() {
    gpuctl_sim::alloc::tune();
    let n: usize = std::env::args()
        .nth(1)
        .map_or(10_000, |s| s.parse().unwrap());
    let reps: usize = std::env::args().nth(2).map_or(5, |s| s.parse().unwrap());
    let (pods, _) = bench::pods();
    let cluster = bench::cluster(1000, 1);
    let mut queue = bench::queue(&pods, n, 2);
    let usage = bench::owners(&mut queue);
    let mut config = SchedConfig {
        workload: gpuctl_sim::trace::workload(&pods),
        ..SchedConfig::default()
    };
    // FS=0 / SIZE=0 / SMALL=0 turn the fair-share factor, the size factor or its
    // favouring of small jobs off (to see what each costs).
    if let Ok(v) = std::env::var("FS") {
        config.weights.fair_share = v.parse().unwrap();
    }
    if let Ok(v) = std::env::var("SIZE") {
        config.weights.size = v.parse().unwrap();
    }
    if std::env::var("SMALL").is_ok_and(|v| v == "0") {
        config.weights.favor_small = false;
    }
    if let Ok(m) = std::env::var("MSN") {
        config.max_scored_nodes = Some(m.parse().unwrap());
    }
    let mut t = Vec::new();
    let mut fs = Vec::new();
    let mut digest = String::new();
    for _ in 0..reps {
        let s = Instant::now();
        bench::fair_share(&mut queue, &usage);
        fs.push(s.elapsed().as_secs_f64() * 1e3);
        let plan = sched::schedule(&cluster, &queue, &config, 0);
        let planned = s.elapsed();
        if digest.is_empty() {
            // A fingerprint of the whole plan: a speed-up must leave it as it was.
            let mut h = DefaultHasher::new();
            format!("{plan:?}").hash(&mut h);
            let reserved = plan.waiting.iter().filter(|w| w.reservation.is_some());
            digest = format!(
                "{} starts, {} reservations, plan digest {:016x}",
                plan.starts.len(),
                reserved.count(),
                h.finish()
            );
        }
        // Dropping the plan counts, as in the criterion benchmark.
        let s = Instant::now();
        drop(std::hint::black_box(plan));
        t.push((planned + s.elapsed()).as_secs_f64() * 1e3);
        if std::env::var("EACH").is_ok() {
            eprintln!("{:.1}", t.last().unwrap());
        }
    }
    t.sort_by(f64::total_cmp);
    fs.sort_by(f64::total_cmp);
    eprintln!("{n}: {digest}");
    eprintln!(
        "{n}: min {:.1} ms, median {:.1} ms (of which the fair-share table and factors: median {:.1} ms)",
        t[0],
        t[t.len() / 2],
        fs[fs.len() / 2]
    );
}
