//! Times one full pass over the benchmark inputs (a quick check beside `cargo bench`).
fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let (pods, _) = gpuctl_sim::bench::pods();
    let cluster = gpuctl_sim::bench::cluster(1000, 1);
    let queue = gpuctl_sim::bench::queue(&pods, n, 2);
    let config = gpuctl_sched::SchedConfig {
        workload: gpuctl_sim::trace::workload(&pods),
        ..Default::default()
    };
    let t = std::time::Instant::now();
    let plan = gpuctl_sched::schedule(&cluster, &queue, &config, 0);
    println!(
        "{n} pending: {:?}, {} started",
        t.elapsed(),
        plan.starts.len()
    );
}
