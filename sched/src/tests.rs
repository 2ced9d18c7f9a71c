use super::packing::{Policy, TaskShape, Workload};
use super::*;
use proptest::prelude::*;

const H: Millis = 3_600_000;

fn gpu(node: &str, i: usize, model: &str) -> SlotView {
    SlotView {
        uuid: format!("GPU-{node}-{i}"),
        gpu_index: i as u32,
        model: model.into(),
        memory_mib: 81920,
        mig_profile: None,
    }
}

fn node(name: &str, gpus: usize) -> NodeView {
    node_model(name, gpus, "A100-80GB")
}

fn node_model(name: &str, gpus: usize, model: &str) -> NodeView {
    NodeView {
        name: name.into(),
        eligibility: Eligibility::Up,
        slots: (0..gpus).map(|i| gpu(name, i, model)).collect(),
        cpu_milli: 64_000,
        memory_bytes: 512 << 30,
        partitions: Vec::new(),
        features: Vec::new(),
    }
}

fn mig_node(name: &str, profiles: &[&str]) -> NodeView {
    NodeView {
        name: name.into(),
        eligibility: Eligibility::Up,
        slots: profiles
            .iter()
            .enumerate()
            .map(|(i, p)| SlotView {
                uuid: format!("MIG-{name}-{i}"),
                gpu_index: 0,
                model: "A100-80GB".into(),
                memory_mib: 40960,
                mig_profile: Some((*p).into()),
            })
            .collect(),
        cpu_milli: 64_000,
        memory_bytes: 512 << 30,
        partitions: Vec::new(),
        features: Vec::new(),
    }
}

fn job(id: JobId, priority: i32, req: Request, hours: i64) -> PendingJob {
    PendingJob {
        id,
        priority,
        qos: String::new(),
        submit_ms: id as i64,
        request: req,
        duration_ms: hours * H,
        ..PendingJob::default()
    }
}

fn whole(n: u32) -> Request {
    Request::whole(n)
}

fn share(milli: u32) -> Request {
    Request {
        gpu: GpuRequest::Share {
            compute_milli: Some(milli),
            memory_mib: None,
        },
        ..Request::default()
    }
}

fn running(job: JobId, node: &str, gpus: &[usize], end: Millis) -> Running {
    Running {
        job,
        alloc: Alloc {
            node: node.into(),
            slots: gpus
                .iter()
                .map(|i| SlotUse {
                    uuid: format!("GPU-{node}-{i}"),
                    compute_milli: 1000,
                    memory_mib: 81920,
                })
                .collect(),
            cpu_milli: 1000,
            memory_bytes: 0,
        },
        end_ms: end,
    }
}

fn cfg(policy: Policy) -> SchedConfig {
    SchedConfig {
        policy,
        ..SchedConfig::default()
    }
}

fn run(cluster: &ClusterView, queue: &[PendingJob], config: &SchedConfig) -> Plan {
    let plan = schedule(cluster, queue, config, 0);
    check_plan(cluster, queue, &plan, 0).unwrap();
    assert_eq!(plan.starts.len() + plan.waiting.len(), queue.len());
    plan
}

fn started(plan: &Plan) -> Vec<JobId> {
    plan.starts.iter().map(|s| s.job).collect()
}

#[test]
fn whole_gpus_first_fit_in_node_order() {
    let c = ClusterView {
        nodes: vec![node("a", 2), node("b", 4)],
        running: vec![],
    };
    let q = [
        job(1, 0, whole(1), 1),
        job(2, 0, whole(1), 1),
        job(3, 0, whole(2), 1),
    ];
    let config = SchedConfig {
        weights: priority::PriorityWeights::fifo(),
        ..cfg(Policy::FirstFit)
    };
    let plan = run(&c, &q, &config);
    assert_eq!(started(&plan), vec![1, 2, 3]);
    assert_eq!(plan.starts[0].allocs[0].node, "a");
    assert_eq!(plan.starts[1].allocs[0].slots[0].uuid, "GPU-a-1");
    assert_eq!(plan.starts[2].allocs[0].node, "b");
}

#[test]
fn best_fit_prefers_the_fuller_node() {
    let c = ClusterView {
        nodes: vec![node("a", 4), node("b", 4)],
        running: vec![running(9, "b", &[0, 1, 2], 10 * H)],
    };
    let plan = run(&c, &[job(1, 0, whole(1), 1)], &cfg(Policy::BestFit));
    assert_eq!(plan.starts[0].allocs[0].node, "b");
    let plan = run(&c, &[job(1, 0, whole(1), 1)], &cfg(Policy::FirstFit));
    assert_eq!(plan.starts[0].allocs[0].node, "a");
}

#[test]
fn gpu_model_constraint() {
    let c = ClusterView {
        nodes: vec![node_model("t4", 2, "T4-16GB"), node("a100", 2)],
        running: vec![],
    };
    let mut r = whole(1);
    r.models = vec!["a100".into()];
    let plan = run(&c, &[job(1, 0, r.clone(), 1)], &cfg(Policy::FirstFit));
    assert_eq!(plan.starts[0].allocs[0].node, "a100");
    r.models = vec!["H100".into()];
    let plan = run(&c, &[job(1, 0, r.clone(), 1)], &cfg(Policy::FirstFit));
    assert_eq!(plan.waiting[0].reason, Blocked::Infeasible);
    let ex = explain(&c, &[job(1, 0, r, 1)], &cfg(Policy::FirstFit), 0, 1).unwrap();
    assert!(
        matches!(ex.nodes[0].1, Some(Miss::GpuModel { .. })),
        "{ex:?}"
    );
}

#[test]
fn shares_pack_onto_one_gpu_and_never_exceed_it() {
    let c = ClusterView {
        nodes: vec![node("a", 2)],
        running: vec![],
    };
    let q: Vec<PendingJob> = (1..=5).map(|i| job(i, 0, share(250), 1)).collect();
    for p in [Policy::FirstFit, Policy::BestFit, Policy::Fgd] {
        let plan = run(&c, &q, &cfg(p));
        assert_eq!(plan.starts.len(), 5, "{p}");
        let on_first = plan
            .starts
            .iter()
            .filter(|s| s.allocs[0].slots[0].uuid == "GPU-a-0")
            .count();
        // Four quarters fill one GPU (best-fit and FGD keep packing it); the fifth goes
        // to the other.
        if p != Policy::FirstFit {
            assert_eq!(on_first, 4, "{p}");
        }
        let s = &plan.starts[0].allocs[0].slots[0];
        assert_eq!((s.compute_milli, s.memory_mib), (250, 20480));
    }
    // A share never lands where a whole GPU job runs.
    let c = ClusterView {
        nodes: vec![node("a", 1)],
        running: vec![running(9, "a", &[0], H)],
    };
    let plan = run(&c, &[job(1, 0, share(100), 1)], &cfg(Policy::Fgd));
    assert!(plan.starts.is_empty());
    assert_eq!(plan.waiting[0].reason, Blocked::Resources);
    assert_eq!(plan.waiting[0].reservation.as_ref().unwrap().start, H);
}

#[test]
fn share_by_memory_derives_compute() {
    let c = ClusterView {
        nodes: vec![node("a", 1)],
        running: vec![],
    };
    let r = Request {
        gpu: GpuRequest::Share {
            compute_milli: None,
            memory_mib: Some(20480),
        },
        ..Request::default()
    };
    let plan = run(&c, &[job(1, 0, r, 1)], &cfg(Policy::Fgd));
    let s = &plan.starts[0].allocs[0].slots[0];
    assert_eq!((s.compute_milli, s.memory_mib), (250, 20480));
    let too_big = Request {
        gpu: GpuRequest::Share {
            compute_milli: Some(100),
            memory_mib: Some(100_000),
        },
        ..Request::default()
    };
    assert!(!fits_empty(&c.nodes[0], &too_big));
}

#[test]
fn mig_jobs_only_on_matching_instances_and_mig_gpus_never_whole() {
    let c = ClusterView {
        nodes: vec![
            mig_node("m", &["3g.40gb", "2g.20gb", "2g.20gb"]),
            node("w", 1),
        ],
        running: vec![],
    };
    let mig = |p: &str, n| Request {
        gpu: GpuRequest::Mig {
            profile: p.into(),
            count: n,
        },
        ..Request::default()
    };
    let q = [
        job(1, 0, mig("2g.20gb", 2), 1),
        job(2, 0, mig("3g.40gb", 1), 1),
        job(3, 0, whole(1), 1),
        job(4, 0, whole(1), 1),
        job(5, 0, mig("1g.10gb", 1), 1),
    ];
    let plan = run(&c, &q, &cfg(Policy::Fgd));
    assert_eq!(started(&plan), vec![1, 2, 3]);
    let uuids: Vec<&str> = plan.starts[0].allocs[0]
        .slots
        .iter()
        .map(|s| s.uuid.as_str())
        .collect();
    assert_eq!(uuids, ["MIG-m-1", "MIG-m-2"]);
    assert_eq!(plan.starts[2].allocs[0].node, "w");
    // Job 4 waits for the whole GPU, never taking the MIG GPU.
    assert_eq!(plan.waiting(4).unwrap().reason, Blocked::Resources);
    assert_eq!(plan.waiting(5).unwrap().reason, Blocked::Infeasible);
    let ex = explain(&c, &q, &cfg(Policy::Fgd), 0, 5).unwrap();
    assert_eq!(
        ex.nodes[0].1,
        Some(Miss::NoMigProfile {
            profile: "1g.10gb".into()
        })
    );
    // A share never lands on a MIG instance.
    let plan = run(
        &ClusterView {
            nodes: vec![mig_node("m", &["3g.40gb"])],
            running: vec![],
        },
        &[job(1, 0, share(100), 1)],
        &cfg(Policy::Fgd),
    );
    assert_eq!(plan.waiting[0].reason, Blocked::Infeasible);
}

#[test]
fn gang_jobs_take_whole_nodes_together() {
    let c = ClusterView {
        nodes: vec![node("a", 4), node("b", 4), node("c", 4)],
        running: vec![running(9, "b", &[0], 2 * H)],
    };
    let mut r = whole(4);
    r.nodes = 2;
    let plan = run(&c, &[job(1, 0, r.clone(), 1)], &cfg(Policy::FirstFit));
    let nodes: Vec<&str> = plan.starts[0]
        .allocs
        .iter()
        .map(|a| a.node.as_str())
        .collect();
    assert_eq!(nodes, ["a", "c"]);
    // Three nodes: not now (b is busy until 2h): all-or-nothing, reserved at 2h.
    r.nodes = 3;
    let plan = run(&c, &[job(1, 0, r, 1)], &cfg(Policy::FirstFit));
    assert!(plan.starts.is_empty());
    let res = plan.waiting[0].reservation.as_ref().unwrap();
    assert_eq!(res.start, 2 * H);
    assert_eq!(res.allocs.len(), 3);
}

#[test]
fn backfill_fills_around_a_reservation_without_delaying_it() {
    // 4 GPUs; 2 busy for 2h. Big job (4 GPUs) must wait until 2h and reserves all four.
    let c = ClusterView {
        nodes: vec![node("a", 4)],
        running: vec![running(9, "a", &[0, 1], 2 * H)],
    };
    let q = [
        job(1, 10, whole(4), 1),
        job(2, 0, whole(1), 1), // ends at 1h < 2h: backfills now
        job(3, 0, whole(1), 3), // would end at 3h: would delay job 1
    ];
    let plan = run(&c, &q, &cfg(Policy::Fgd));
    assert_eq!(started(&plan), vec![2]);
    let w1 = plan.waiting(1).unwrap();
    assert_eq!(w1.reason, Blocked::Resources);
    assert_eq!(w1.reservation.as_ref().unwrap().start, 2 * H);
    let w3 = plan.waiting(3).unwrap();
    assert_eq!(w3.reason, Blocked::Priority { behind: 1 });
    // It gets a reservation after job 1's: 2h + 1h.
    assert_eq!(w3.reservation.as_ref().unwrap().start, 3 * H);
    let ex = explain(&c, &q, &cfg(Policy::Fgd), 0, 3).unwrap();
    assert_eq!(
        ex.nodes[0].1,
        Some(Miss::Reserved {
            job: 1,
            from: 2 * H
        })
    );
    assert_eq!(ex.rank, 2);
}

#[test]
fn without_backfill_order_is_strict() {
    let c = ClusterView {
        nodes: vec![node("a", 4)],
        running: vec![running(9, "a", &[0, 1], 2 * H)],
    };
    let q = [job(1, 10, whole(4), 1), job(2, 0, whole(2), 1)];
    let config = SchedConfig {
        backfill: false,
        ..cfg(Policy::FirstFit)
    };
    let plan = run(&c, &q, &config);
    assert!(plan.starts.is_empty());
    assert_eq!(
        plan.waiting(2).unwrap().reason,
        Blocked::Priority { behind: 1 }
    );
    assert!(plan.waiting(2).unwrap().reservation.as_ref().unwrap().start >= 2 * H);
}

#[test]
fn drained_down_and_unavailable() {
    let mut a = node("a", 4);
    a.eligibility = Eligibility::Drained;
    let mut b = node("b", 8);
    b.eligibility = Eligibility::Down;
    let c = ClusterView {
        nodes: vec![a, b, node("c", 1)],
        running: vec![],
    };
    let q = [job(1, 0, whole(1), 1), job(2, 0, whole(4), 1)];
    let plan = run(&c, &q, &cfg(Policy::FirstFit));
    assert_eq!(plan.starts[0].allocs[0].node, "c");
    assert_eq!(plan.waiting(2).unwrap().reason, Blocked::NodesUnavailable);
    let ex = explain(&c, &q, &cfg(Policy::FirstFit), 0, 2).unwrap();
    assert_eq!(ex.nodes[0].1, Some(Miss::Drained));
    assert_eq!(ex.nodes[1].1, Some(Miss::Down));
    assert_eq!(ex.nodes[2].1, Some(Miss::TooSmall { what: "GPUs" }));
}

/// The pass caches a node's answer per request shape. Jobs of one shape can have
/// different time limits, so a later job's window can meet a different set of
/// reservations even when as many of them start inside it: here job 2's window met job
/// 1's reservation (from 20h), job 4's shorter one meets only job 3's (from 5h, CPUs
/// only). Job 4 fits now on GPU 0; a cache keyed on the count alone said "reserved".
#[test]
fn a_shorter_window_meeting_other_reservations_is_not_taken_from_the_cache() {
    // CPUs: 64 on the node, 63 held now (1 until 20h), job 3 takes 62 from 5h to 6h.
    let mut cpus = running(101, "a", &[], 5 * H);
    cpus.alloc.cpu_milli = 62_000;
    let c = ClusterView {
        nodes: vec![node("a", 2)],
        running: vec![running(100, "a", &[1], 20 * H), cpus],
    };
    let cpu_only = Request {
        cpu_milli: 62_000,
        ..Request::default()
    };
    let q = [
        job(1, 4, whole(2), 100),
        job(2, 3, whole(1), 50),
        job(3, 2, cpu_only, 1),
        job(4, 1, whole(1), 10),
    ];
    let config = cfg(Policy::FirstFit);
    let plan = run(&c, &q, &config);
    let start_of = |j: JobId| {
        plan.waiting(j)
            .and_then(|w| w.reservation.as_ref())
            .map(|r| r.start)
    };
    assert_eq!(start_of(1), Some(20 * H));
    assert_eq!(start_of(3), Some(5 * H));
    assert_eq!(
        plan.waiting(2).map(|w| &w.reason),
        Some(&Blocked::Priority { behind: 1 })
    );
    assert_eq!(started(&plan), vec![4]);
    let ex = explain(&c, &q, &config, 0, 4).unwrap();
    assert!(ex.outcome.is_ok(), "{:?}", ex.outcome);
}

#[test]
fn cpus_and_memory_count() {
    let mut n = node("a", 4);
    n.cpu_milli = 2000;
    n.memory_bytes = 10 << 30;
    let c = ClusterView {
        nodes: vec![n],
        running: vec![],
    };
    let mut r = whole(1);
    r.cpu_milli = 2000;
    let mut m = whole(1);
    m.memory_bytes = 11 << 30;
    let q = [job(1, 0, r.clone(), 1), job(2, 0, r, 1)];
    let plan = run(&c, &q, &cfg(Policy::FirstFit));
    assert_eq!(started(&plan), vec![1]);
    let ex = explain(&c, &q, &cfg(Policy::FirstFit), 0, 2).unwrap();
    assert_eq!(
        ex.nodes[0].1,
        Some(Miss::Cpus {
            need: 2000,
            free: 0
        })
    );
    let plan = run(&c, &[job(3, 0, m, 1)], &cfg(Policy::FirstFit));
    assert_eq!(plan.waiting[0].reason, Blocked::Infeasible);
}

#[test]
fn explain_reports_missing_gpus_and_shares() {
    let c = ClusterView {
        nodes: vec![node("a", 2)],
        running: vec![running(9, "a", &[0], H)],
    };
    let ex = explain(&c, &[job(1, 0, whole(2), 1)], &cfg(Policy::Fgd), 0, 1).unwrap();
    assert_eq!(ex.nodes[0].1, Some(Miss::Gpus { need: 2, free: 1 }));
    let mut c2 = c.clone();
    c2.running.push(Running {
        job: 8,
        alloc: Alloc {
            node: "a".into(),
            slots: vec![SlotUse {
                uuid: "GPU-a-1".into(),
                compute_milli: 700,
                memory_mib: 100,
            }],
            cpu_milli: 0,
            memory_bytes: 0,
        },
        end_ms: H,
    });
    let ex = explain(&c2, &[job(1, 0, share(500), 1)], &cfg(Policy::Fgd), 0, 1).unwrap();
    assert!(
        matches!(
            ex.nodes[0].1,
            Some(Miss::GpuShare {
                need_milli: 500,
                best_free_milli: 300,
                ..
            })
        ),
        "{ex:?}"
    );
    assert!(ex.outcome.is_err());
}

/// A job held back by a cap said "fits now" for every node, even nodes that could
/// not take it: each node keeps its own answer.
#[test]
fn explain_of_a_held_job_keeps_each_nodes_answer() {
    let c = ClusterView {
        nodes: vec![node("a", 4), node("b", 2)],
        running: vec![],
    };
    let mut config = cfg(Policy::FirstFit);
    config.caps.qos.insert(
        String::new(),
        limits::QosCaps {
            per_user_milli: Some(1000),
            per_account_milli: None,
        },
    );
    let ex = explain(&c, &[job(1, 0, whole(4), 1)], &config, 0, 1).unwrap();
    assert!(
        matches!(
            ex.outcome,
            Err(Waiting {
                reason: Blocked::Cap(_),
                ..
            })
        ),
        "{ex:?}"
    );
    assert_eq!(ex.nodes[0].1, None, "a has room for it");
    assert_eq!(ex.nodes[1].1, Some(Miss::TooSmall { what: "GPUs" }));
}

#[test]
fn reservation_depth_limits_reservations() {
    let c = ClusterView {
        nodes: vec![node("a", 1)],
        running: vec![running(9, "a", &[0], H)],
    };
    let q: Vec<PendingJob> = (1..=3).map(|i| job(i, 0, whole(1), 1)).collect();
    let config = SchedConfig {
        reservation_depth: Some(1),
        ..cfg(Policy::Fgd)
    };
    let plan = run(&c, &q, &config);
    assert!(plan.waiting(1).unwrap().reservation.is_some());
    assert_eq!(plan.waiting(2).unwrap().reason, Blocked::BeyondDepth);
    assert!(plan.waiting(3).unwrap().reservation.is_none());
}

#[test]
fn every_pending_job_gets_an_expected_start() {
    let c = ClusterView {
        nodes: vec![node("a", 2)],
        running: vec![running(9, "a", &[0, 1], H)],
    };
    let q: Vec<PendingJob> = (1..=4).map(|i| job(i, 0, whole(1), 1)).collect();
    let plan = run(&c, &q, &cfg(Policy::Fgd));
    let starts: Vec<Millis> = plan
        .waiting
        .iter()
        .map(|w| w.reservation.as_ref().unwrap().start)
        .collect();
    assert_eq!(starts, vec![H, H, 2 * H, 2 * H]);
}

#[test]
fn fgd_avoids_breaking_a_whole_gpu() {
    // Node a: one GPU with 500 free. Node b: a fresh GPU. A 400 share should go to a's
    // partly used GPU under FGD (it keeps b's GPU whole for whole-GPU jobs).
    let c = ClusterView {
        nodes: vec![node("a", 1), node("b", 1)],
        running: vec![Running {
            job: 9,
            alloc: Alloc {
                node: "a".into(),
                slots: vec![SlotUse {
                    uuid: "GPU-a-0".into(),
                    compute_milli: 500,
                    memory_mib: 1000,
                }],
                cpu_milli: 0,
                memory_bytes: 0,
            },
            end_ms: H,
        }],
    };
    let config = SchedConfig {
        workload: Workload {
            shapes: vec![
                TaskShape {
                    gpus: 1,
                    milli: 1000,
                    cpu_milli: 1000,
                    models: vec![],
                    weight: 0.5,
                    mem_bytes: 0,
                },
                TaskShape {
                    gpus: 1,
                    milli: 400,
                    cpu_milli: 1000,
                    models: vec![],
                    weight: 0.5,
                    mem_bytes: 0,
                },
            ],
        },
        ..cfg(Policy::Fgd)
    };
    let plan = run(&c, &[job(1, 0, share(400), 1)], &config);
    assert_eq!(plan.starts[0].allocs[0].node, "a");
}

#[test]
fn ledger_refuses_what_is_taken() {
    let c = ClusterView {
        nodes: vec![node("a", 2)],
        running: vec![running(9, "a", &[0], H)],
    };
    let start = |job, gpu: usize, compute| Start {
        job,
        allocs: vec![Alloc {
            node: "a".into(),
            slots: vec![SlotUse {
                uuid: format!("GPU-a-{gpu}"),
                compute_milli: compute,
                memory_mib: 1000,
            }],
            cpu_milli: 1000,
            memory_bytes: 0,
        }],
    };
    let mut l = Ledger::new(&c);
    assert!(l.take(&start(1, 0, 300)).is_err(), "GPU 0 is held whole");
    assert!(l.take(&start(1, 1, 600)).is_ok());
    assert!(l.take(&start(2, 1, 400)).is_ok());
    assert!(l.take(&start(3, 1, 1)).is_err(), "GPU 1 is full");
}

// ---------------------------------------------------------------- properties

fn arb_cluster() -> impl Strategy<Value = ClusterView> {
    let node_spec = (
        0usize..5,
        0u8..4,
        prop::collection::vec((0u8..4, 1i64..6), 0..6),
        any::<bool>(),
    );
    prop::collection::vec(node_spec, 1..5).prop_map(|specs| {
        let mut c = ClusterView::default();
        for (i, (g, kind, busy, mig)) in specs.into_iter().enumerate() {
            let name = format!("n{i}");
            let mut n = if mig && g > 0 {
                mig_node(&name, &["3g.40gb", "2g.20gb", "2g.20gb"][..g.min(3)])
            } else {
                node(&name, g)
            };
            n.eligibility = match kind {
                0 => Eligibility::Drained,
                1 => Eligibility::Down,
                _ => Eligibility::Up,
            };
            n.cpu_milli = 8000;
            // Running jobs: exclusive or shares, on distinct slots.
            let mut used = vec![0u32; n.slots.len()];
            for (k, (slot, hours)) in busy.into_iter().enumerate() {
                let s = slot as usize;
                if s >= n.slots.len() {
                    continue;
                }
                let exclusive = n.slots[s].is_mig() || k % 2 == 0;
                let compute = if exclusive { 1000 } else { 300 };
                if used[s] + compute > 1000 || (exclusive && used[s] > 0) {
                    continue;
                }
                used[s] += compute;
                c.running.push(Running {
                    job: 1000 + c.running.len() as JobId,
                    alloc: Alloc {
                        node: name.clone(),
                        slots: vec![SlotUse {
                            uuid: n.slots[s].uuid.clone(),
                            compute_milli: compute,
                            memory_mib: if exclusive {
                                n.slots[s].memory_mib
                            } else {
                                1000
                            },
                        }],
                        cpu_milli: 1000,
                        memory_bytes: 0,
                    },
                    end_ms: hours * H,
                });
            }
            c.nodes.push(n);
        }
        c
    })
}

fn arb_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (0u32..5).prop_map(whole),
        (50u32..1000).prop_map(share),
        (1u32..3).prop_map(|n| Request {
            gpu: GpuRequest::Mig {
                profile: "2g.20gb".into(),
                count: n
            },
            ..Request::default()
        }),
        (1u32..3, 1u32..3).prop_map(|(g, n)| Request {
            nodes: n,
            ..whole(g)
        }),
    ]
}

fn arb_queue() -> impl Strategy<Value = Vec<PendingJob>> {
    prop::collection::vec((-2i32..3, arb_request(), 1i64..5, 1u32..4), 0..25).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (p, mut r, h, cpus))| {
                r.cpu_milli = cpus * 1000;
                job(i as JobId + 1, p, r, h)
            })
            .collect()
    })
}

fn arb_policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::FirstFit),
        Just(Policy::BestFit),
        Just(Policy::Fgd)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// No GPU, share, MIG instance, CPU or memory is ever over-allocated, now or in any
    /// reservation; every job is started or waiting, once.
    #[test]
    fn never_over_allocates(c in arb_cluster(), q in arb_queue(), p in arb_policy(), backfill in any::<bool>()) {
        let config = SchedConfig { backfill, ..cfg(p) };
        let plan = schedule(&c, &q, &config, 0);
        prop_assert_eq!(check_plan(&c, &q, &plan, 0), Ok(()));
        prop_assert_eq!(plan.starts.len() + plan.waiting.len(), q.len());
    }

    /// Every start of a plan passes the controller's re-check against the same state.
    #[test]
    fn plans_pass_the_ledger(c in arb_cluster(), q in arb_queue(), p in arb_policy()) {
        let plan = schedule(&c, &q, &cfg(p), 0);
        let mut l = Ledger::new(&c);
        for s in &plan.starts {
            prop_assert_eq!(l.take(s), Ok(()));
        }
    }

    /// Lower-priority jobs never delay a reservation: planning only the jobs ranked at or
    /// above a waiting job gives it the same reservation.
    #[test]
    fn backfill_never_delays_a_reservation(c in arb_cluster(), q in arb_queue(), p in arb_policy()) {
        let config = cfg(p);
        let plan = schedule(&c, &q, &config, 0);
        let ranked: Vec<JobId> = priority::rank(&q, &config.weights, 0, size_norm(&c))
            .iter().map(|(j, _)| j.id).collect();
        for w in &plan.waiting {
            let pos = ranked.iter().position(|&id| id == w.job).unwrap();
            let upto: Vec<PendingJob> = q.iter().filter(|j| ranked[..=pos].contains(&j.id)).cloned().collect();
            let alone = schedule(&c, &upto, &config, 0);
            prop_assert_eq!(
                alone.waiting(w.job).and_then(|x| x.reservation.as_ref()).map(|r| r.start),
                w.reservation.as_ref().map(|r| r.start)
            );
        }
    }

    /// A pass that stops reserving once nothing else can start (the replay's mode, and
    /// the controller's between expected starts) starts exactly the same jobs in the
    /// same places, and gives the jobs it planned before it stopped what the full pass
    /// gives them.
    #[test]
    fn starts_only_gives_the_same_starts(c in arb_cluster(), q in arb_queue(), p in arb_policy(), backfill in any::<bool>()) {
        let full = SchedConfig { backfill, ..cfg(p) };
        let quick = SchedConfig { expected_starts: false, ..full.clone() };
        let a = schedule(&c, &q, &full, 0);
        let b = schedule(&c, &q, &quick, 0);
        prop_assert_eq!(&a.starts, &b.starts);
        prop_assert_eq!(a.starts.len() + b.waiting.len(), q.len());
        // What it planned before it stopped is the full pass's, entry for entry.
        let (planned, unplanned) = b.planned_and_not();
        prop_assert_eq!(planned, &a.waiting[..planned.len()]);
        prop_assert_eq!(a.unplanned, 0);
        prop_assert!(unplanned.iter().all(|w| w.reason == Blocked::Resources && w.reservation.is_none()));
    }

    /// `explain` recomputes a job's turn with no caches and every node looked at; its
    /// outcome is the plan's (so the pass's per-shape caches change nothing). Without
    /// backfill too, where reservations can start now and so move a node's base.
    #[test]
    fn explain_agrees_with_the_plan(c in arb_cluster(), q in arb_queue(), p in arb_policy(), backfill in any::<bool>()) {
        let config = SchedConfig { backfill, ..cfg(p) };
        let plan = schedule(&c, &q, &config, 0);
        for j in q.iter().take(6) {
            let e = explain(&c, &q, &config, 0, j.id).expect("a pending job");
            match e.outcome {
                Ok(start) => prop_assert_eq!(Some(&start), plan.starts.iter().find(|s| s.job == j.id)),
                Err(w) => prop_assert_eq!(Some(&w), plan.waiting(j.id)),
            }
        }
    }

    /// Jobs of a partition start and are reserved only on its nodes; the plan stays
    /// valid and explain agrees with it.
    #[test]
    fn partitions_keep_jobs_on_their_nodes(mut c in arb_cluster(), mut q in arb_queue(), p in arb_policy(), backfill in any::<bool>()) {
        for (i, n) in c.nodes.iter_mut().enumerate() {
            n.partitions = if i % 2 == 1 { vec!["p".into()] } else { vec!["q".into()] };
        }
        for j in &mut q {
            if j.id % 2 == 0 {
                j.request.partition = Some("p".into());
            }
        }
        let config = SchedConfig { backfill, ..cfg(p) };
        let plan = schedule(&c, &q, &config, 0);
        prop_assert_eq!(check_plan(&c, &q, &plan, 0), Ok(()));
        let node = |name: &str| c.nodes.iter().find(|n| n.name == name).unwrap();
        let req = |id: JobId| &q.iter().find(|j| j.id == id).unwrap().request;
        for s in &plan.starts {
            for a in &s.allocs {
                prop_assert!(node(&a.node).admits(req(s.job)), "job {} started on {}", s.job, a.node);
            }
        }
        for w in &plan.waiting {
            for a in w.reservation.iter().flat_map(|r| &r.allocs) {
                prop_assert!(node(&a.node).admits(req(w.job)), "job {} reserved on {}", w.job, a.node);
            }
        }
        for j in q.iter().take(4) {
            let e = explain(&c, &q, &config, 0, j.id).expect("a pending job");
            match e.outcome {
                Ok(start) => prop_assert_eq!(Some(&start), plan.starts.iter().find(|s| s.job == j.id)),
                Err(w) => prop_assert_eq!(Some(&w), plan.waiting(j.id)),
            }
        }
    }

    /// The same input gives the same plan.
    #[test]
    fn deterministic(c in arb_cluster(), q in arb_queue(), p in arb_policy()) {
        let a = schedule(&c, &q, &cfg(p), 0);
        let b = schedule(&c, &q, &cfg(p), 0);
        prop_assert_eq!(a, b);
    }
}

fn extreme_ms() -> impl Strategy<Value = Millis> {
    prop_oneof![
        Just(i64::MAX),
        Just(i64::MAX - 1),
        Just(i64::MAX / 2),
        Just(i64::MIN),
        Just(-1),
        Just(0),
        1i64..(100 * H),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Time math never wraps: with time limits and running ends anywhere in i64 and
    /// `now` late in it, the plan is valid, every start and reservation is at or after
    /// now, and backfill still never delays a reservation (a huge limit is long, never
    /// short).
    #[test]
    fn extreme_times_never_wrap(
        c in arb_cluster(),
        q in arb_queue(),
        durations in prop::collection::vec(extreme_ms(), 25),
        now in prop_oneof![Just(0i64), Just(1_800_000_000_000i64), Just(i64::MAX / 2), Just(i64::MAX - 1000)],
        p in arb_policy(),
    ) {
        let q: Vec<PendingJob> = q
            .into_iter()
            .zip(durations)
            .map(|(mut j, d)| {
                j.duration_ms = d;
                j
            })
            .collect();
        let config = cfg(p);
        let plan = schedule(&c, &q, &config, now);
        prop_assert_eq!(plan.starts.len() + plan.waiting.len(), q.len());
        prop_assert_eq!(check_plan(&c, &q, &plan, now), Ok(()));
        for w in &plan.waiting {
            if let Some(r) = &w.reservation {
                prop_assert!(r.start >= now, "reservation at {} before now {}", r.start, now);
            }
        }
        // Planning only the jobs ranked at or above a waiting job gives it the same
        // reservation: nothing ranked below (however its limit was written) delays it.
        let ranked: Vec<JobId> = priority::rank(&q, &config.weights, now, size_norm(&c))
            .iter().map(|(j, _)| j.id).collect();
        for w in &plan.waiting {
            let pos = ranked.iter().position(|&id| id == w.job).unwrap();
            let upto: Vec<PendingJob> = q.iter().filter(|j| ranked[..=pos].contains(&j.id)).cloned().collect();
            let alone = schedule(&c, &upto, &config, now);
            prop_assert_eq!(
                alone.waiting(w.job).and_then(|x| x.reservation.as_ref()).map(|r| r.start),
                w.reservation.as_ref().map(|r| r.start)
            );
        }
    }
}

#[test]
fn tail_keys_order_as_their_tuples() {
    let tuples = [
        (-5_000i64, 3usize, 7u64),
        (0, 0, 0),
        (0, 0, 1),
        (0, 1, 0),
        (1, 0, u64::from(u32::MAX)),
        (1_700_000_000_000, 999, 12),
        (Millis::MAX, 0, 0),
    ];
    for w in tuples.windows(2) {
        let (a, b) = (w[0], w[1]);
        assert!(
            tail_key(a.0, a.1, a.2) < tail_key(b.0, b.1, b.2),
            "{a:?} {b:?}"
        );
    }
    for (t, i, v) in tuples {
        assert_eq!(tail_unkey(tail_key(t, i, v)), (t, i, v as u32));
    }
}

#[path = "base_tests.rs"]
mod base_tests;
