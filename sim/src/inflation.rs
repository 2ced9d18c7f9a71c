//! The FGD fragmentation experiment (FGD_EVAL.md): per seed, shuffle the trace's tasks,
//! inflate by sampling with replacement until the arrived GPU request reaches 130% of
//! capacity, and place arrivals one by one with no departures and no queue (a task that
//! does not fit is dropped). After each arrival, record the allocated GPU and the
//! fragmentation; bin by arrived request in integer percent of capacity.

use std::fmt::Write as _;
use std::path::Path;

use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::trace::Pod;
use gpuctl_sched::packing::{Policy, Workload};
use gpuctl_sched::{ClusterView, GPU_MILLI, Millis, SchedConfig, Session};

/// Mixed into the seed for the node order, so that it does not follow the task order.
const NODE_ORDER_STREAM: u64 = 0x5eed;

/// Bins 0..=MAX_PCT of arrived request, in percent of capacity.
pub const MAX_PCT: usize = 130;

/// The arrival order for one seed: the tasks shuffled, then clones drawn uniformly with
/// replacement until the next one would push the GPU request past `tune` x capacity.
/// (When the trace alone is above the target, random tasks are removed instead.)
pub fn inflate(pods: &[Pod], capacity_milli: u64, tune: f64, seed: u64) -> Vec<Pod> {
    let mut rng = StdRng::seed_from_u64(seed);
    let target = (capacity_milli as f64 * tune) as u64;
    let mut out: Vec<Pod> = pods.to_vec();
    out.shuffle(&mut rng);
    let mut total: u64 = out.iter().map(Pod::gpu_milli_total).sum();
    if total > target {
        while total > target && !out.is_empty() {
            let i = rng.random_range(0..out.len());
            total -= out.remove(i).gpu_milli_total();
        }
        return out;
    }
    loop {
        let p = &pods[rng.random_range(0..pods.len())];
        if total + p.gpu_milli_total() > target {
            break;
        }
        total += p.gpu_milli_total();
        out.push(p.clone());
    }
    out
}

/// One seed's curves, by integer percent of arrived request (index 0..=130).
#[derive(Debug, Clone, PartialEq)]
pub struct Curves {
    pub seed: u64,
    pub alloc_pct: Vec<f64>,
    pub frag_pct: Vec<f64>,
    pub arrived_pct: f64,
    pub placed: usize,
    pub dropped: usize,
}

/// Runs the arrivals of one seed on `nodes` with `policy`.
pub fn run_seed(
    nodes: &ClusterView,
    pods: &[Pod],
    workload: &Workload,
    policy: Policy,
    seed: u64,
    tune: f64,
) -> Curves {
    let capacity: u64 = nodes
        .nodes
        .iter()
        .map(|n| n.slots.len() as u64 * u64::from(GPU_MILLI))
        .sum();
    let arrivals = inflate(pods, capacity, tune, seed);
    // FGD's protocol permutes the node order per run (a random prefix on node names), so
    // node order decides nothing systematically: placements that tie go to a random node.
    let mut permuted = nodes.clone();
    permuted
        .nodes
        .shuffle(&mut StdRng::seed_from_u64(seed ^ NODE_ORDER_STREAM));
    let nodes = &permuted;
    let config = SchedConfig {
        policy,
        workload: workload.clone(),
        max_scored_nodes: None,
        ..SchedConfig::default()
    };
    // No departures: every placement holds its slots for good.
    let forever: Millis = Millis::MAX / 4;
    let mut session = Session::new(nodes, &config, 0);
    let mut alloc_pct = vec![f64::NAN; MAX_PCT + 1];
    let mut frag_pct = vec![f64::NAN; MAX_PCT + 1];
    let (mut arrived, mut allocated) = (0u64, 0u64);
    let (mut placed, mut dropped) = (0, 0);
    for (i, p) in arrivals.iter().enumerate() {
        arrived += p.gpu_milli_total();
        match session.start_now(i as u64 + 1, &p.request(), forever) {
            Some(_) => {
                placed += 1;
                allocated += p.gpu_milli_total();
            }
            None => dropped += 1,
        }
        let x = (arrived as f64 / capacity as f64 * 100.0).round() as usize;
        if x <= MAX_PCT {
            alloc_pct[x] = allocated as f64 / capacity as f64 * 100.0;
            frag_pct[x] = session.fragmentation() / capacity as f64 * 100.0;
        }
    }
    // Bins no arrival landed in carry the value before them (0 before the first).
    for v in [&mut alloc_pct, &mut frag_pct] {
        let mut last = 0.0;
        for x in v.iter_mut() {
            if x.is_nan() {
                *x = last;
            } else {
                last = *x;
            }
        }
    }
    Curves {
        seed,
        alloc_pct,
        frag_pct,
        arrived_pct: arrived as f64 / capacity as f64 * 100.0,
        placed,
        dropped,
    }
}

/// Rows in the layout of `fgd_expected_results/` (`workload,sc_policy,tune,seed,
/// total_gpus,0..130`; the frag file has no `total_gpus`).
pub fn csv_rows(
    workload: &str,
    policy: &str,
    tune: f64,
    total_gpus: usize,
    runs: &[Curves],
    frag: bool,
) -> String {
    let mut out = String::new();
    for r in runs {
        let v = if frag { &r.frag_pct } else { &r.alloc_pct };
        let _ = write!(out, "{workload},{policy},{tune},{}", r.seed);
        if !frag {
            let _ = write!(out, ",{total_gpus}");
        }
        for x in v {
            let _ = write!(out, ",{:.2}", x);
        }
        out.push('\n');
    }
    out
}

pub fn csv_header(frag: bool) -> String {
    let mut h = String::from("workload,sc_policy,tune,seed");
    if !frag {
        h.push_str(",total_gpus");
    }
    for x in 0..=MAX_PCT {
        let _ = write!(h, ",{x}");
    }
    h.push('\n');
    h
}

/// Mean over seeds of the FGD authors' allocation ratio at `pct`, per policy, for one
/// workload, from their `analysis_allo_discrete.csv`.
pub fn expected(path: &Path, workload: &str, pct: usize) -> Vec<(String, f64)> {
    let Ok(mut rdr) = csv::Reader::from_path(path) else {
        return Vec::new();
    };
    let Ok(headers) = rdr.headers().cloned() else {
        return Vec::new();
    };
    let Some(col) = headers.iter().position(|h| h == pct.to_string()) else {
        return Vec::new();
    };
    let mut sums: Vec<(String, f64, u32)> = Vec::new();
    for rec in rdr.records().flatten() {
        if rec.get(0) != Some(workload) {
            continue;
        }
        let policy = rec.get(1).unwrap_or("").to_string();
        let v: f64 = rec
            .get(col)
            .and_then(|x| x.parse().ok())
            .unwrap_or(f64::NAN);
        match sums.iter_mut().find(|s| s.0 == policy) {
            Some(s) => {
                s.1 += v;
                s.2 += 1;
            }
            None => sums.push((policy, v, 1)),
        }
    }
    sums.into_iter()
        .map(|(p, s, n)| (p, s / f64::from(n)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_sched::{Eligibility, NodeView, SlotView};

    fn pod(num_gpu: u32, gpu_milli: u32) -> Pod {
        Pod {
            name: format!("p{num_gpu}-{gpu_milli}"),
            cpu_milli: 1000,
            memory_mib: 1024,
            num_gpu,
            gpu_milli,
            gpu_spec: None,
            qos: None,
            creation_time: None,
            deletion_time: None,
            scheduled_time: None,
        }
    }

    fn cluster(nodes: usize, gpus: u32) -> ClusterView {
        ClusterView {
            nodes: (0..nodes)
                .map(|i| NodeView {
                    name: format!("n{i}"),
                    eligibility: Eligibility::Up,
                    slots: (0..gpus)
                        .map(|g| SlotView {
                            uuid: format!("n{i}-{g}"),
                            gpu_index: g,
                            model: "T4".into(),
                            memory_mib: 16384,
                            mig_profile: None,
                        })
                        .collect(),
                    cpu_milli: 64_000,
                    memory_bytes: 1 << 40,
                    partitions: Vec::new(),
                    features: Vec::new(),
                })
                .collect(),
            running: vec![],
        }
    }

    #[test]
    fn inflation_reaches_the_target_and_is_reproducible() {
        let pods: Vec<Pod> = (0..50)
            .map(|i| pod(1, if i % 2 == 0 { 1000 } else { 500 }))
            .collect();
        let capacity = 100 * 1000;
        let a = inflate(&pods, capacity, 1.3, 42);
        let b = inflate(&pods, capacity, 1.3, 42);
        let c = inflate(&pods, capacity, 1.3, 43);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let total: u64 = a.iter().map(Pod::gpu_milli_total).sum();
        // Reaches 130% without passing it; the next draw would have.
        assert!(total <= 130_000 && total > 130_000 - 1000, "{total}");
        // The original tasks all come first (shuffled).
        let mut first: Vec<&str> = a[..50].iter().map(|p| p.name.as_str()).collect();
        first.sort();
        let mut orig: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
        orig.sort();
        assert_eq!(first, orig);
        // Too much work to start with: tasks are removed instead.
        let big: Vec<Pod> = (0..300).map(|_| pod(1, 1000)).collect();
        let d = inflate(&big, capacity, 1.3, 1);
        assert_eq!(d.len(), 130);
    }

    #[test]
    fn hand_computed_curve() {
        // 2 nodes x 2 GPUs = 4000 milli. Arrivals of one whole GPU each: every arrival is
        // 25% of capacity. The first four fit, the rest are dropped.
        let pods = vec![pod(1, 1000)];
        let c = run_seed(
            &cluster(2, 2),
            &pods,
            &Workload::default(),
            Policy::BestFit,
            7,
            1.3,
        );
        assert_eq!((c.placed, c.dropped), (4, 1));
        assert_eq!(c.alloc_pct[25], 25.0);
        assert_eq!(c.alloc_pct[24], 0.0);
        assert_eq!(c.alloc_pct[100], 100.0);
        assert_eq!(c.alloc_pct[125], 100.0);
        assert_eq!(c.alloc_pct[130], 100.0);
        assert!((c.arrived_pct - 125.0).abs() < 1e-9);
    }

    #[test]
    fn csv_layout_matches_the_reference() {
        let h = csv_header(false);
        assert!(h.starts_with("workload,sc_policy,tune,seed,total_gpus,0,1,"));
        assert!(h.trim_end().ends_with(",129,130"));
        assert!(!csv_header(true).contains("total_gpus"));
        let c = Curves {
            seed: 42,
            alloc_pct: vec![1.0; MAX_PCT + 1],
            frag_pct: vec![0.5; MAX_PCT + 1],
            arrived_pct: 130.0,
            placed: 1,
            dropped: 0,
        };
        let row = csv_rows("w", "gpuctl-fgd", 1.3, 6212, &[c], false);
        assert!(row.starts_with("w,gpuctl-fgd,1.3,42,6212,1.00,1.00"));
        assert_eq!(row.trim_end().split(',').count(), 5 + MAX_PCT + 1);
    }
}

/// What `gpuctld simulate inflation` was asked to do.
pub struct Options {
    pub nodes: std::path::PathBuf,
    pub pods: Vec<std::path::PathBuf>,
    pub policies: Vec<Policy>,
    pub seeds: Vec<u64>,
    pub tune: f64,
    pub out: std::path::PathBuf,
    /// The FGD authors' `analysis_allo_discrete.csv`, to compare with.
    pub expected: Option<std::path::PathBuf>,
}

/// One line of the summary: a workload under one policy, averaged over seeds.
#[derive(Debug, Clone)]
pub struct SummaryRow {
    pub workload: String,
    pub policy: Policy,
    pub at100: f64,
    pub at130: f64,
    pub frag130: f64,
    /// The FGD authors' FGD and best-fit allocation at 100% / 130%, when known.
    pub fgd: Option<(f64, f64)>,
    pub bestfit: Option<(f64, f64)>,
    pub seconds: f64,
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0u32), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { s / f64::from(n) }
}

pub fn run(opts: &Options) -> anyhow::Result<Vec<SummaryRow>> {
    use anyhow::Context as _;
    let nodes: Vec<_> = crate::trace::read_nodes(&opts.nodes)?
        .into_iter()
        .filter(|n| !n.slots.is_empty())
        .collect();
    let cluster = ClusterView {
        nodes,
        running: vec![],
    };
    let total_gpus: usize = cluster.nodes.iter().map(|n| n.slots.len()).sum();
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("cannot create {}", opts.out.display()))?;
    let mut allo = csv_header(false);
    let mut frag = csv_header(true);
    let mut rows = Vec::new();
    let runs = (opts.pods.len() * opts.policies.len() * opts.seeds.len()) as u64;
    let mut progress = super::Progress::new(runs, "simulating");
    for pods_path in &opts.pods {
        let pods = crate::trace::read_pods(pods_path)?;
        let workload_name = pods_path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let workload = crate::trace::workload(&pods);
        for &policy in &opts.policies {
            let t0 = std::time::Instant::now();
            let threads = std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(opts.seeds.len().max(1));
            let mut curves: Vec<Curves> = Vec::new();
            for chunk in opts.seeds.chunks(threads) {
                let done: Vec<Curves> = std::thread::scope(|s| {
                    let handles: Vec<_> = chunk
                        .iter()
                        .map(|&seed| {
                            let (c, p, w) = (&cluster, &pods, &workload);
                            s.spawn(move || run_seed(c, p, w, policy, seed, opts.tune))
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("simulation thread panicked"))
                        .collect()
                });
                progress.inc(done.len() as u64);
                curves.extend(done);
            }
            let name = format!("gpuctl-{policy}");
            allo.push_str(&csv_rows(
                &workload_name,
                &name,
                opts.tune,
                total_gpus,
                &curves,
                false,
            ));
            frag.push_str(&csv_rows(
                &workload_name,
                &name,
                opts.tune,
                total_gpus,
                &curves,
                true,
            ));
            let theirs = |p: &str, pct| {
                opts.expected
                    .as_deref()
                    .map(|e| expected(e, &workload_name, pct))
                    .and_then(|v| v.into_iter().find(|x| x.0 == p).map(|x| x.1))
            };
            let pair = |p: &str| theirs(p, 100).zip(theirs(p, 130));
            rows.push(SummaryRow {
                workload: workload_name.clone(),
                policy,
                at100: mean(curves.iter().map(|c| c.alloc_pct[100])),
                at130: mean(curves.iter().map(|c| c.alloc_pct[MAX_PCT])),
                frag130: mean(curves.iter().map(|c| c.frag_pct[MAX_PCT])),
                fgd: pair("06-FGD"),
                bestfit: pair("05-BestFit"),
                seconds: t0.elapsed().as_secs_f64(),
            });
        }
    }
    progress.finish();
    std::fs::write(opts.out.join("analysis_allo_discrete.csv"), allo)?;
    std::fs::write(opts.out.join("analysis_frag_discrete.csv"), frag)?;
    std::fs::write(opts.out.join("summary.md"), summary_table(&rows))?;
    Ok(rows)
}

/// The markdown table of allocation ratios: ours against the FGD authors' results.
pub fn summary_table(rows: &[SummaryRow]) -> String {
    let f = |x: Option<(f64, f64)>, i: usize| {
        x.map_or("-".to_string(), |p| {
            format!("{:.2}", if i == 0 { p.0 } else { p.1 })
        })
    };
    let mut out = String::from(
        "| workload | policy | ours @100% | ours @130% | FGD (paper) @100% | FGD @130% | BestFit (paper) @130% | ours - FGD @130% | frag @130% (% GPUs) | run time |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let delta = r
            .fgd
            .map_or("-".to_string(), |p| format!("{:+.2}", r.at130 - p.1));
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.2} | {} | {} | {} | {} | {:.2} | {:.1}s |",
            r.workload.trim_start_matches("openb_pod_list_"),
            r.policy,
            r.at100,
            r.at130,
            f(r.fgd, 0),
            f(r.fgd, 1),
            f(r.bestfit, 1),
            delta,
            r.frag130,
            r.seconds
        );
    }
    out
}
