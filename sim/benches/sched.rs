//! One full scheduling pass (priority + reservations + backfill + placement) over 1,000
//! nodes x 8 GPUs, half busy, with 10,000 and 100,000 pending jobs of the Alibaba mix,
//! with the default weights and fair share on (500 users in 50 accounts with uneven
//! usage: `bench::owners`; the factors are given before the timed pass, the table's own
//! cost is what `sched_pass` reports apart).
//!
//! cargo bench -p gpuctl-sim --bench sched

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use gpuctl_sched::{self as sched, SchedConfig};
use gpuctl_sim::bench;

/// The allocator of the daemon (see main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn pass(c: &mut Criterion) {
    gpuctl_sim::alloc::tune();
    // The trace beside the workspace unless GPUCTL_TRACE_DIR names another place.
    let dir = gpuctl_sim::trace::default_dir().unwrap_or_else(|| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/traces/alibaba-gpu-v2023")
    });
    let (pods, source) = bench::pods_in(&dir);
    eprintln!("task mix: {source}");
    let cluster = bench::cluster(1000, 1);
    let mut g = c.benchmark_group("full_pass_1000x8");
    g.sample_size(10);
    for n in [10_000usize, 100_000] {
        let mut queue = bench::queue(&pods, n, 2);
        let usage = bench::owners(&mut queue);
        bench::fair_share(&mut queue, &usage);
        let config = SchedConfig {
            workload: gpuctl_sim::trace::workload(&pods),
            ..SchedConfig::default()
        };
        let plan = sched::schedule(&cluster, &queue, &config, 0);
        eprintln!(
            "{n} pending: {} start now, {} reserved",
            plan.starts.len(),
            plan.waiting
                .iter()
                .filter(|w| w.reservation.is_some())
                .count()
        );
        g.bench_with_input(BenchmarkId::from_parameter(n), &queue, |b, q| {
            b.iter(|| sched::schedule(&cluster, q, &config, 0))
        });
    }
    g.finish();
}

criterion_group!(benches, pass);
criterion_main!(benches);
