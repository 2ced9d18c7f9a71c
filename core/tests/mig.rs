//! Dynamic MIG through the state machine: a dynamic node's free GPU takes the layout
//! waiting MIG jobs need, its jobs wait for the change and start once the agent shows
//! the new instances; a GPU nobody uses goes back to whole for whole-GPU work, no
//! sooner than `min_layout_age`; and, over random job streams, no layout change ever
//! names a GPU that a job holds.

mod common;

use common::*;
use gpuctl_core::command::Command;
use gpuctl_core::event::Register;
use gpuctl_core::node::{Gpu, MigInstance};
use gpuctl_core::operations::Operations as _;
use gpuctl_core::record::{GpuPart, JobSpec, JobState, MigInstances};
use gpuctl_core::{Cluster, Effects};
use proptest::prelude::*;

const MIN: i64 = 60_000;

/// Attaches `node` as a dynamic-MIG agent with `gpus`.
fn attach_dynamic(c: &mut Cluster, node: &str, gpus: Vec<Gpu>, now: i64) -> Effects {
    let nonce = format!("nonce-{node}-{now}").into_bytes();
    // The same agent again (after a layout change): it names its session.
    let previous_session = (c.fleet().session(node)).map_or(Vec::new(), |s| s.session.clone());
    c.leader().challenge(node, nonce.clone(), now);
    let req = Register {
        previous_session,
        node: node.into(),
        gpus,
        cpus: 64,
        memory_bytes: 512 << 30,
        gpu_backend: "fake".into(),
        nonce,
        agent_id: format!("agent-{node}"),
        mig_dynamic: true,
        ..Register::default()
    };
    let e = c.attach(&req, None, now).expect("attach").1;
    checked(c);
    e
}

fn mig_spec(profile: &str) -> JobSpec {
    let mut s = spec(0, false);
    s.resources.gpu = Some(GpuPart::Mig(MigInstances {
        profile: profile.into(),
        count: 1,
    }));
    s
}

/// The layout changes `effects` asks: (node, GPU, layout).
fn mig_asks(effects: &Effects) -> Vec<(String, String, Vec<String>)> {
    (effects.sends.iter())
        .filter_map(|(n, c)| match c {
            Command::Mig(m) => Some((n.clone(), m.gpu.clone(), m.layout.clone())),
            _ => None,
        })
        .collect()
}

/// `gpus` with the layouts `asks` gave (what the agent shows when it attaches again).
fn after(mut gpus: Vec<Gpu>, asks: &[(String, String, Vec<String>)], round: u32) -> Vec<Gpu> {
    for (_, uuid, layout) in asks {
        if let Some(g) = gpus.iter_mut().find(|g| g.uuid == *uuid) {
            g.mig = (layout.iter().enumerate())
                .map(|(i, p)| MigInstance {
                    uuid: format!("MIG-{uuid}-{round}-{i}"),
                    profile: p.clone(),
                    memory_mib: gpuctl_sched::mig::profile_memory_mib(p).unwrap(),
                })
                .collect();
        }
    }
    gpus
}

#[test]
fn seven_small_jobs_get_a_layout_then_the_gpu_goes_back_to_whole() {
    let mut c = cluster();
    let t = T0;
    let one = gpus("n1", 1);
    attach_dynamic(&mut c, "n1", one.clone(), t);
    let ids: Vec<u64> = (0..7)
        .map(|_| submit_spec(&mut c, mig_spec("1g.10gb"), t))
        .collect();
    let e = pass(&mut c, t);
    let asks = mig_asks(&e);
    assert_eq!(
        asks,
        vec![(
            "n1".into(),
            "GPU-n1-0".into(),
            vec!["1g.10gb".to_string(); 7]
        )]
    );
    assert!(commands(&e).iter().all(|(_, w)| !w.starts_with("start")));
    assert_eq!(c.jobs().job(ids[0]).unwrap().reason, "MigLayoutChange");
    assert_eq!(
        c.mig_wait_of(ids[6]).unwrap(),
        "waiting for a MIG layout change on n1 GPU 0 (to 1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb)"
    );
    // Asked once: the next pass waits for the agent.
    assert!(mig_asks(&pass(&mut c, t + 1000)).is_empty());
    // The agent shows the new instances: all seven start at once.
    let seven = after(one.clone(), &asks, 1);
    attach_dynamic(&mut c, "n1", seven.clone(), t + 2000);
    let e = pass(&mut c, t + 2000);
    assert_eq!(commands(&e).len(), 7, "{:?}", commands(&e));
    for &id in &ids {
        report(&mut c, "n1", id, None, t + 2100);
    }
    for &id in &ids {
        report(
            &mut c,
            "n1",
            id,
            Some((JobState::Completed, 0)),
            t + 5 * MIN,
        );
    }
    // A whole-GPU job: the GPU goes back to whole, once its layout is old enough.
    let whole = submit(&mut c, 1, false, t + 5 * MIN);
    let e = pass(&mut c, t + 5 * MIN);
    let back = mig_asks(&e);
    assert_eq!(back, vec![("n1".into(), "GPU-n1-0".into(), Vec::new())]);
    attach_dynamic(&mut c, "n1", after(seven, &back, 2), t + 5 * MIN + 1000);
    let e = pass(&mut c, t + 5 * MIN + 1000);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {whole}"))]);
}

#[test]
fn a_gpu_cut_for_one_small_job_is_filled_for_the_next() {
    let mut c = cluster();
    attach_dynamic(&mut c, "n1", gpus("n1", 1), T0);
    submit_spec(&mut c, mig_spec("2g.20gb"), T0);
    let asks = mig_asks(&pass(&mut c, T0));
    assert_eq!(asks.len(), 1);
    assert_eq!(asks[0].2, vec!["2g.20gb".to_string(); 3], "as many as fit");
}

#[test]
fn layouts_do_not_thrash_and_whole_gpu_work_keeps_its_gpus() {
    let mut c = cluster();
    let t = T0;
    attach_dynamic(&mut c, "n1", gpus("n1", 1), t);
    // A whole-GPU job waits (behind a running one on another node's GPU? none: it
    // waits for this one): MIG jobs do not cut the whole GPU it wants.
    let w = submit(&mut c, 1, false, t);
    let m = submit_spec(&mut c, mig_spec("3g.40gb"), t);
    let e = pass(&mut c, t);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {w}"))]);
    report(&mut c, "n1", w, None, t);
    let e = pass(&mut c, t + 1000);
    assert!(mig_asks(&e).is_empty(), "the GPU is held");
    report(&mut c, "n1", w, Some((JobState::Completed, 0)), t + MIN);
    let e = pass(&mut c, t + MIN);
    let asks = mig_asks(&e);
    assert_eq!(asks.len(), 1, "free now: cut for the MIG job");
    attach_dynamic(&mut c, "n1", after(gpus("n1", 1), &asks, 1), t + MIN + 500);
    let e = pass(&mut c, t + MIN + 500);
    assert_eq!(commands(&e), vec![to("n1", &format!("start {m}"))]);
    report(&mut c, "n1", m, None, t + MIN + 600);
    report(
        &mut c,
        "n1",
        m,
        Some((JobState::Completed, 0)),
        t + MIN + 700,
    );
    // Whole work again within min_layout_age (2 min): no change yet.
    submit(&mut c, 1, false, t + MIN + 800);
    assert!(mig_asks(&pass(&mut c, t + MIN + 800)).is_empty());
    assert_eq!(mig_asks(&pass(&mut c, t + 4 * MIN)).len(), 1);
}

/// One step of a random stream.
#[derive(Debug, Clone)]
enum Step {
    Whole,
    Mig(usize),
    EndOldest,
    Pass,
}

const PROFILES: [&str; 4] = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb"];

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => Just(Step::Whole),
        3 => (0..PROFILES.len()).prop_map(Step::Mig),
        2 => Just(Step::EndOldest),
        3 => Just(Step::Pass),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// No layout change names a GPU that a job's live allocation holds (the GPU or one
    /// of its instances), whatever the stream of submits, ends and passes.
    #[test]
    fn a_layout_change_never_touches_a_gpu_with_a_job(steps in prop::collection::vec(step(), 1..60)) {
        let mut c = cluster();
        let mut t = T0;
        let mut shown = gpus("n1", 2);
        attach_dynamic(&mut c, "n1", shown.clone(), t);
        let mut running: Vec<u64> = Vec::new();
        for (round, s) in steps.into_iter().enumerate() {
            t += 20_000;
            match s {
                Step::Whole => { submit(&mut c, 1, false, t); }
                Step::Mig(p) => { submit_spec(&mut c, mig_spec(PROFILES[p]), t); }
                Step::EndOldest => {
                    if !running.is_empty() {
                        let id = running.remove(0);
                        report(&mut c, "n1", id, Some((JobState::Completed, 0)), t);
                    }
                }
                Step::Pass => {
                    let e = pass(&mut c, t);
                    let asks = mig_asks(&e);
                    let held: Vec<String> = (c.jobs().active())
                        .flat_map(|s| s.job.allocations.iter().filter(|a| !a.ended))
                        .flat_map(|a| a.slots.iter().map(|s| s.uuid.clone()))
                        .collect();
                    for (_, gpu, _) in &asks {
                        let g = shown.iter().find(|g| g.uuid == *gpu).unwrap();
                        let mine = |u: &String| *u == g.uuid || g.mig.iter().any(|m| m.uuid == *u);
                        prop_assert!(!held.iter().any(mine), "GPU {gpu} changed under a job: {held:?}");
                    }
                    for (_, w) in commands(&e) {
                        if let Some(id) = w.strip_prefix("start ") {
                            let id: u64 = id.parse().unwrap();
                            report(&mut c, "n1", id, None, t);
                            running.push(id);
                        }
                    }
                    if !asks.is_empty() {
                        shown = after(shown, &asks, round as u32);
                        attach_dynamic(&mut c, "n1", shown.clone(), t + 1);
                    }
                }
            }
        }
    }
}
