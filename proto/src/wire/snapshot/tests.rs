use gpuctl_core::event::{Heartbeat, Register, Report, ReportKind, Running};
use gpuctl_core::log::{Applied, Change, Entry, JobAction};
use gpuctl_core::node::{Gpu, GpuMetrics, JobGpuUse};
use gpuctl_core::ops::Admission;
use gpuctl_core::record::{GpuPart, JobSpec, Resources, Step};
use gpuctl_core::{Actor, Cluster, Config};
use prost::Message as _;

use super::*;

const T0: i64 = 1_700_000_000_000;

/// Applies an entry that must not be refused.
fn ok(c: &mut Cluster, e: Entry) -> gpuctl_core::Effects {
    let (answer, effects) = c.apply(e);
    answer.expect("applied");
    effects
}

/// A cluster with something in every part of a snapshot: jobs pending, running (with
/// usage, host figures, steps and idle tracks from a heartbeat), ended (a run not yet
/// charged) and held, two attached nodes with GPU samples, a drained one.
fn busy() -> Cluster {
    let mut c = Cluster::new(Config::default());
    let at = |t: i64, change| Entry::new(T0 + t, change);
    for n in ["n1", "n2"] {
        let register = Register {
            node: n.into(),
            gpus: (0..2)
                .map(|i| Gpu {
                    index: i,
                    uuid: format!("GPU-{n}-{i}"),
                    model: "A100-80GB".into(),
                    memory_mib: 81920,
                    ..Gpu::default()
                })
                .collect(),
            cpus: 16,
            memory_bytes: 64 << 30,
            nonce: n.as_bytes().to_vec(),
            agent_id: format!("agent-{n}"),
            ..Register::default()
        };
        let (r, _) = c.apply(at(
            0,
            Change::Attach {
                register,
                peer: None,
            },
        ));
        assert!(matches!(r, Ok(Applied::Attached(_))));
    }
    let ana = Actor {
        user: "ana".into(),
        admin: false,
    };
    for _ in 0..4 {
        let spec = JobSpec {
            user: "ana".into(),
            name: "train".into(),
            command: vec!["train".into()],
            workdir: "/home/ana".into(),
            resources: Resources {
                gpu: Some(GpuPart::Gpus(1)),
                cpus: 1,
                time_limit_secs: 3600,
                ..Resources::default()
            },
            ..JobSpec::default()
        };
        let r = match c.admit(&ana, spec, "", T0) {
            Ok(Admission::New(r)) => r,
            other => panic!("{:?}", other.map(|_| ())),
        };
        ok(&mut c, at(0, Change::Submit(vec![*r])));
    }
    let Ok(Applied::Prepared(waiting)) = c.apply(at(1, Change::Prepare)).0 else {
        panic!("a pass's start")
    };
    let plan = gpuctl_sched::schedule(
        &c.view(),
        &c.queue(&waiting),
        &c.pass_config(T0 + 1),
        T0 + 1,
    );
    let mut started = Vec::new();
    for e in gpuctl_core::log::plan_entries(&plan, 10, T0 + 1) {
        let (_, effects) = c.apply(e);
        for (node, cmd) in effects.sends {
            if let gpuctl_core::command::Command::Start(s) = cmd {
                started.push((node, s.job_id, s.attempt));
            }
        }
    }
    assert!(started.len() >= 3, "{started:?}");
    let reports = (started.iter())
        .map(|(n, j, a)| Report::new(n, *j, *a, ReportKind::Started))
        .collect();
    ok(&mut c, at(2, Change::Reports(reports)));
    let (n, job, attempt) = started[0].clone();
    let mut running = Running::new(job, attempt);
    running.cpu_time_ms = Some(1234);
    running.steps = vec![Step {
        id: 0,
        name: "python".into(),
        start_ms: T0 + 2,
        tasks: 1,
        nodes: vec![n.clone()],
        ..Step::default()
    }];
    let heartbeat = Heartbeat {
        node: n.clone(),
        running: vec![running],
        metrics: vec![GpuMetrics {
            uuid: format!("GPU-{n}-0"),
            util_pct: 77,
            time_ms: T0 + 3,
            jobs: vec![JobGpuUse {
                job_id: job,
                mem_used_mib: 2048,
                processes: 1,
                util_pct: None,
            }],
            ..GpuMetrics::default()
        }],
        ..Heartbeat::default()
    };
    let not_run = Vec::new();
    ok(&mut c, at(3, Change::Heartbeat { heartbeat, not_run }));
    let (n, job, attempt) = started[1].clone();
    let mut end = Report::new(&n, job, attempt, ReportKind::Ended);
    end.state = gpuctl_sched::job::JobState::Completed;
    end.exit_code = Some(0);
    ok(&mut c, at(4, Change::Reports(vec![end])));
    let (_, job, _) = started[2];
    let action = JobAction::Requeue;
    ok(
        &mut c,
        at(
            5,
            Change::Job {
                actor: ana,
                id: job,
                action,
            },
        ),
    );
    let drain = Change::Drain {
        node: "n2".into(),
        reason: Some("maintenance".into()),
    };
    ok(&mut c, at(6, drain));
    c
}

#[test]
fn a_snapshot_reads_back_as_the_cluster_it_was_taken_of() {
    let c = busy();
    let live = c.records().live;
    assert!(!live.usage.is_empty() && !live.host.is_empty() && !live.steps.is_empty());
    assert!(!live.idle.is_empty() && !live.metrics.is_empty() && !live.ended_runs.is_empty());
    let bytes = snapshot_pb(&c, T0 + 6).encode_to_vec();
    let back = cluster(st::Snapshot::decode(bytes.as_slice()).unwrap()).unwrap();
    assert_eq!(
        format!("{:?}", back.records()),
        format!("{:?}", c.records())
    );
    assert_eq!(back.config().to_toml(), c.config().to_toml());
    back.check().unwrap();
}

#[test]
fn a_snapshot_with_a_bad_configuration_is_refused() {
    let s = st::Snapshot {
        config: "kill_grase = 1".into(),
        ..st::Snapshot::default()
    };
    let Err(e) = cluster(s) else {
        panic!("a bad configuration was taken")
    };
    assert!(e.to_string().contains("configuration"), "{e}");
}
