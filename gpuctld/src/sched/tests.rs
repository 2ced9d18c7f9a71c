use super::*;
use proptest::prelude::*;

fn node(name: &str, gpus: usize, elig: Eligibility) -> NodeView {
    NodeView {
        name: name.into(),
        eligibility: elig,
        gpus: (0..gpus)
            .map(|i| GpuSlot {
                uuid: format!("GPU-{name}-{i}"),
                model: "A100".into(),
                memory_mib: 81920,
                holder: None,
            })
            .collect(),
        cpus: 64,
        cpus_used: 0,
        memory_bytes: 512 << 30,
        memory_used: 0,
    }
}

fn job(id: JobId, priority: i32, gpus: u32) -> PendingJob {
    PendingJob {
        id,
        priority,
        submit_ms: id as i64 * 1000,
        request: Request {
            gpus,
            cpus: 1,
            memory_bytes: 0,
        },
    }
}

fn run(nodes: Vec<NodeView>, queue: &[PendingJob]) -> (ClusterView, Plan) {
    let cluster = ClusterView { nodes };
    let plan = schedule(&cluster, queue, &SchedConfig::default(), 0);
    check_plan(&cluster, &plan).unwrap();
    (cluster, plan)
}

#[test]
fn first_fit_fills_nodes_in_order() {
    let (_, plan) = run(
        vec![node("a", 2, Eligibility::Up), node("b", 4, Eligibility::Up)],
        &[job(1, 0, 1), job(2, 0, 1), job(3, 0, 2)],
    );
    assert_eq!(plan.starts.len(), 3);
    assert_eq!(plan.starts[0].node, "a");
    assert_eq!(plan.starts[0].gpus, vec!["GPU-a-0"]);
    assert_eq!(plan.starts[1].gpus, vec!["GPU-a-1"]);
    assert_eq!(plan.starts[2].node, "b");
    assert_eq!(plan.starts[2].gpus, vec!["GPU-b-0", "GPU-b-1"]);
    assert!(plan.blocked.is_empty());
}

#[test]
fn priority_orders_before_submit_time() {
    let (_, plan) = run(
        vec![node("a", 1, Eligibility::Up)],
        &[job(1, 0, 1), job(2, 5, 1)],
    );
    assert_eq!(plan.starts.len(), 1);
    assert_eq!(plan.starts[0].job, 2);
    assert_eq!(plan.blocked, vec![(1, Blocked::Resources)]);
}

#[test]
fn blocked_job_blocks_lower_ranked_ones() {
    let (_, plan) = run(
        vec![node("a", 2, Eligibility::Up)],
        &[job(1, 0, 4), job(2, 0, 1)],
    );
    assert!(plan.starts.is_empty());
    assert_eq!(
        plan.blocked,
        vec![
            (1, Blocked::Resources),
            (2, Blocked::Priority { behind: 1 })
        ]
    );
    assert_eq!(plan.blocked[0].1.to_string(), "Resources");
    assert_eq!(plan.blocked[1].1.to_string(), "Priority");
}

#[test]
fn drained_and_down_nodes_are_skipped() {
    let (_, plan) = run(
        vec![
            node("a", 4, Eligibility::Drained),
            node("b", 4, Eligibility::Down),
            node("c", 1, Eligibility::Up),
        ],
        &[job(1, 0, 1), job(2, 0, 1)],
    );
    assert_eq!(plan.starts.len(), 1);
    assert_eq!(plan.starts[0].node, "c");
    assert_eq!(plan.blocked, vec![(2, Blocked::Resources)]);
}

#[test]
fn no_eligible_node_is_its_own_reason() {
    let (_, plan) = run(vec![node("a", 4, Eligibility::Drained)], &[job(1, 0, 1)]);
    assert_eq!(plan.blocked, vec![(1, Blocked::NoEligibleNodes)]);
}

#[test]
fn held_gpus_and_cpus_are_respected() {
    let mut n = node("a", 2, Eligibility::Up);
    n.gpus[0].holder = Some(99);
    n.cpus = 2;
    n.cpus_used = 1;
    let (_, plan) = run(vec![n], &[job(1, 0, 1), job(2, 0, 0)]);
    assert_eq!(plan.starts.len(), 1);
    assert_eq!(plan.starts[0].gpus, vec!["GPU-a-1"]);
    // Job 2 needs a CPU: the last one went to job 1.
    assert_eq!(plan.blocked, vec![(2, Blocked::Resources)]);
}

#[test]
fn memory_is_a_resource() {
    let mut n = node("a", 2, Eligibility::Up);
    n.memory_bytes = 10;
    let mut j = job(1, 0, 1);
    j.request.memory_bytes = 11;
    let (cluster, plan) = run(vec![n], &[j.clone()]);
    assert_eq!(plan.blocked, vec![(1, Blocked::Resources)]);
    assert!(!fits_empty(&cluster.nodes[0], &j.request));
}

#[test]
fn check_plan_catches_double_allocation() {
    let cluster = ClusterView {
        nodes: vec![node("a", 1, Eligibility::Up)],
    };
    let bad = Plan {
        starts: vec![
            Start {
                job: 1,
                node: "a".into(),
                gpus: vec!["GPU-a-0".into()],
            },
            Start {
                job: 2,
                node: "a".into(),
                gpus: vec!["GPU-a-0".into()],
            },
        ],
        blocked: vec![],
    };
    assert!(check_plan(&cluster, &bad).is_err());
}

fn arb_cluster() -> impl Strategy<Value = ClusterView> {
    prop::collection::vec(
        (0usize..9, 0u8..3, prop::collection::vec(any::<bool>(), 8)),
        1..6,
    )
    .prop_map(|specs| ClusterView {
        nodes: specs
            .into_iter()
            .enumerate()
            .map(|(i, (g, e, held))| {
                let elig = [Eligibility::Up, Eligibility::Drained, Eligibility::Down][e as usize];
                let mut n = node(&format!("n{i}"), g, elig);
                for (slot, h) in n.gpus.iter_mut().zip(held) {
                    if h {
                        slot.holder = Some(1_000_000);
                    }
                }
                n
            })
            .collect(),
    })
}

fn arb_queue() -> impl Strategy<Value = Vec<PendingJob>> {
    prop::collection::vec((-3i32..3, 0u32..6), 0..30).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (p, g))| job(i as u64 + 1, p, g))
            .collect()
    })
}

proptest! {
    #[test]
    fn never_over_allocates(cluster in arb_cluster(), queue in arb_queue()) {
        let plan = schedule(&cluster, &queue, &SchedConfig::default(), 0);
        prop_assert!(check_plan(&cluster, &plan).is_ok());
        // Every job is either started or blocked, exactly once.
        prop_assert_eq!(plan.starts.len() + plan.blocked.len(), queue.len());
    }

    #[test]
    fn same_input_same_plan(cluster in arb_cluster(), queue in arb_queue()) {
        let a = schedule(&cluster, &queue, &SchedConfig::default(), 0);
        let b = schedule(&cluster, &queue, &SchedConfig::default(), 0);
        prop_assert_eq!(a, b);
    }
}
