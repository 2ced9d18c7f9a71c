//! Helpers shared by the state machine's tests: a cluster, agents that attach, jobs
//! submitted as alice, passes, reports, and the commands effects carry.
#![allow(dead_code)]

use gpuctl_core::command::Command;
use gpuctl_core::event::{Register, Report, ReportKind, Running};
use gpuctl_core::node::Gpu;
use gpuctl_core::operations::Operations as _;
use gpuctl_core::ops::Admission;
use gpuctl_core::record::{GpuPart, JobSpec, JobState, Resources};
use gpuctl_core::{Actor, Cluster, Config, Effects};
use gpuctl_sched::job::JobState as State;

pub const T0: i64 = 1_700_000_000_000;

pub fn alice() -> Actor {
    Actor {
        user: "alice".into(),
        admin: false,
    }
}

pub fn gpus(node: &str, n: u32) -> Vec<Gpu> {
    (0..n)
        .map(|i| Gpu {
            index: i,
            uuid: format!("GPU-{node}-{i}"),
            model: "A100-80GB".into(),
            memory_mib: 81920,
            ..Gpu::default()
        })
        .collect()
}

/// Takes `c`'s configuration changed by `edit`, as an admin's edit and reload does
/// (`Cluster::reconfigure`).
pub fn configure(c: &mut Cluster, edit: impl FnOnce(&mut Config)) {
    let mut cfg = c.config().clone();
    edit(&mut cfg);
    c.reconfigure(cfg);
}

/// A cluster with the default configuration (node timeout 60 s).
pub fn cluster() -> Cluster {
    Cluster::new(Config::default())
}

pub fn attach_with(c: &mut Cluster, node: &str, running: &[(u64, u32)], now: i64) -> Effects {
    attach_as(c, node, running, &[], now)
}

/// `attach_with`, the agent offering `features` (`gpud --features`).
pub fn attach_as(
    c: &mut Cluster,
    node: &str,
    running: &[(u64, u32)],
    features: &[&str],
    now: i64,
) -> Effects {
    attach_shaped(c, node, (2, 16, 64 << 30), running, features, now)
}

/// `attach_as` for a node of `shape`: (GPUs, CPUs, memory bytes).
pub fn attach_shaped(
    c: &mut Cluster,
    node: &str,
    shape: (u32, u32, u64),
    running: &[(u64, u32)],
    features: &[&str],
    now: i64,
) -> Effects {
    let nonce = format!("nonce-{node}-{now}").into_bytes();
    c.leader().challenge(node, nonce.clone(), now);
    let req = Register {
        node: node.into(),
        gpus: gpus(node, shape.0),
        cpus: shape.1,
        memory_bytes: shape.2,
        gpu_backend: "fake".into(),
        running: running
            .iter()
            .map(|&(job_id, attempt)| Running::new(job_id, attempt))
            .collect(),
        nonce,
        agent_id: format!("agent-{node}"),
        features: features.iter().map(|f| f.to_string()).collect(),
        previous_session: Vec::new(),
        ..Register::default()
    };
    let e = c.attach(&req, None, now).expect("attach").1;
    checked(c);
    e
}

/// The cluster's invariants hold (`Cluster::check`): every helper here that changes
/// the state calls it after the step.
pub fn checked(c: &Cluster) {
    if let Err(why) = c.check() {
        panic!("an invariant broke: {why}");
    }
}

pub fn attach(c: &mut Cluster, node: &str, now: i64) -> Effects {
    attach_with(c, node, &[], now)
}

pub fn spec(gpus: u32, requeue: bool) -> JobSpec {
    JobSpec {
        user: "alice".into(),
        name: "train".into(),
        command: vec!["python".into(), "train.py".into()],
        workdir: "/home/alice".into(),
        env: [("TOKEN".to_string(), "secret".to_string())].into(),
        requeue,
        resources: Resources {
            gpu: Some(GpuPart::Gpus(gpus)),
            cpus: 1,
            time_limit_secs: 3600,
            ..Resources::default()
        },
        ..JobSpec::default()
    }
}

pub fn submit_spec(c: &mut Cluster, spec: JobSpec, now: i64) -> u64 {
    submit_spec_as(c, &alice(), spec, now)
}

/// Submits `spec` for `who` (its `user` as given) and commits it; its id (an array's:
/// its first task's).
pub fn submit_spec_as(c: &mut Cluster, who: &Actor, spec: JobSpec, now: i64) -> u64 {
    match c.admit(who, spec, "", now).expect("admitted") {
        Admission::New(stored) => {
            let id = stored.job.id;
            let effects = c.commit_submit(*stored);
            assert!(effects.wake, "a submit asks for a pass");
            checked(c);
            id
        }
        Admission::Array(tasks) => {
            let first = tasks[0].job.id;
            for t in tasks {
                c.commit_submit(t);
            }
            checked(c);
            first
        }
        Admission::Repeat(id) => panic!("not a repeat: {id}"),
    }
}

pub fn submit(c: &mut Cluster, gpus: u32, requeue: bool, now: i64) -> u64 {
    submit_spec(c, spec(gpus, requeue), now)
}

/// One scheduling pass at `now`, as the shell runs it.
pub fn pass(c: &mut Cluster, now: i64) -> Effects {
    let (view, queue, cfg) = c.pass_input(now);
    let plan = gpuctl_sched::schedule(&view, &queue, &cfg, now);
    let e = c.apply_plan(&plan, now);
    checked(c);
    e
}

pub fn state(c: &Cluster, id: u64) -> JobState {
    c.jobs().job(id).unwrap().state
}

pub fn report(
    c: &mut Cluster,
    node: &str,
    id: u64,
    end: Option<(JobState, i32)>,
    now: i64,
) -> Effects {
    let r = job_report(c, node, id, end, now);
    let e = c.report(&r, now).1;
    checked(c);
    e
}

/// The agent's report of job `id`'s current attempt on `node`: STARTED (`end` None) or
/// ENDED in `end`'s state with its exit code.
pub fn job_report(
    c: &Cluster,
    node: &str,
    id: u64,
    end: Option<(JobState, i32)>,
    now: i64,
) -> Report {
    let attempt = c.jobs().job(id).unwrap().attempt;
    let kind = if end.is_some() {
        ReportKind::Ended
    } else {
        ReportKind::Started
    };
    Report {
        state: end.map_or(State::Failed, |e| e.0),
        exit_code: end.map(|e| e.1),
        time_ms: now,
        ..Report::new(node, id, attempt, kind)
    }
}

/// The commands of `effects` as (node, "start JOB" | "kill JOB" | "limit JOB SECS").
pub fn commands(effects: &Effects) -> Vec<(String, String)> {
    effects
        .sends
        .iter()
        .map(|(node, cmd)| {
            let what = match cmd {
                Command::Start(s) => format!("start {}", s.job_id),
                Command::Kill(k) => format!("kill {}", k.job_id),
                Command::Limit(l) => format!("limit {} {}", l.job_id, l.time_limit_secs),
                Command::Mig(m) => format!("mig {} {}", m.gpu, m.layout.join("+")),
            };
            (node.clone(), what)
        })
        .collect()
}

pub fn to(node: &str, what: &str) -> (String, String) {
    (node.to_string(), what.to_string())
}

/// `explain` of a pending job: each node with the reason the job does not go there.
pub fn explained_nodes(c: &Cluster, id: u64, now: i64) -> Vec<(String, String)> {
    let Ok(gpuctl_core::explain::Explain::Pass(input)) = c.explain(id, now) else {
        panic!("a pending job is explained from a pass")
    };
    let ex = gpuctl_sched::explain(&input.view, &input.queue, &input.cfg, now, id).unwrap();
    let out = gpuctl_core::explain::rendered(input.base, &ex, now);
    out.nodes.into_iter().map(|n| (n.node, n.reason)).collect()
}
