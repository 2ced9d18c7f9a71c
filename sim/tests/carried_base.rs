//! The replay plans each pass from the base carried from the last pass (as the daemon
//! does, `sched::Base`); planned instead from a fresh build of every node's calendar
//! (`replay --full-pass`), the replay makes the same plans, pass for pass: the same
//! digest of every plan and the same summary. On the Alibaba extract and both Philly
//! weeks carried in the repository (sim/data/SOURCE.md), under each packing policy.

use gpuctl_core::Config;
use gpuctl_sched::packing::Policy;
use gpuctl_sim::replay::agents::Usage;
use gpuctl_sim::replay::{self, Summary, TraceJob, parse_cluster};

fn data(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
}

fn both_ways(cluster: &str, jobs: &[TraceJob], packing: Policy) -> (Summary, Summary) {
    let nodes = parse_cluster(cluster).unwrap();
    let base = Config::default();
    let config = replay::config_for("backfill", packing, None, jobs, &base).unwrap();
    let run = |full_pass| {
        let usage = Usage {
            full_pass,
            ..Usage::default()
        };
        let out = replay::replay_with(&nodes, jobs, &config, &base, "backfill", 0, usage);
        // The pass times differ (that is the point); nothing else may.
        Summary {
            pass_p50_ms: 0.0,
            pass_p99_ms: 0.0,
            pass_max_ms: 0.0,
            ..out.summary
        }
    };
    (run(false), run(true))
}

#[test]
fn carried_and_fresh_bases_plan_the_same_on_the_traces() {
    let alibaba = replay::read_jobs(
        &data("openb_pod_list_gpushare40.earliest1600.csv"),
        20.0,
        2.0,
        8,
    )
    .unwrap();
    let w2 = replay::read_jobs(&data("philly-w2.csv"), 1.0, 2.0, 8).unwrap();
    let w3 = replay::read_jobs(&data("philly-w3.csv"), 1.0, 2.0, 8).unwrap();
    let cases: [(&str, &[TraceJob], Policy); 4] = [
        ("8x8xG2-32GB", &alibaba, Policy::Fgd),
        ("8x8xG2-32GB", &alibaba, Policy::BestFit),
        ("48x8xV100-32GB", &w2, Policy::FirstFit),
        ("48x8xV100-32GB", &w3[..2000], Policy::BestFit),
    ];
    for (cluster, jobs, packing) in cases {
        let (carried, fresh) = both_ways(cluster, jobs, packing);
        assert!(carried.passes > 100, "{cluster} {packing}: {carried:?}");
        assert_eq!(carried.plans_digest.len(), 16);
        assert_eq!(carried, fresh, "{cluster} {packing}");
    }
}
