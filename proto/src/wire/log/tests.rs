use gpuctl_core::event::Running;
use gpuctl_core::node::{Gpu, GpuMetrics, JobGpuUse, MigInstance};
use gpuctl_core::record::{Job, JobSpec, Record, Step};
use gpuctl_core::view::TaskRef;
use gpuctl_sched::job::JobState as State;
use prost::Message as _;

use super::*;

fn step() -> Step {
    Step {
        id: 3,
        name: "python train.py".into(),
        start_ms: 10,
        end_ms: 20,
        exit_code: Some(2),
        tasks: 4,
        nodes: vec!["n1".into(), "n2".into()],
    }
}

fn running() -> Running {
    Running {
        job_id: 7,
        attempt: 2,
        cpu_time_ms: Some(1500),
        mem_peak_bytes: Some(1 << 30),
        steps: vec![step()],
    }
}

/// A report with every field set.
fn report(kind: ReportKind) -> Report {
    Report {
        node: "n1".into(),
        job_id: 7,
        attempt: 2,
        kind,
        state: State::Timeout,
        exit_code: Some(-9),
        reason: "time limit".into(),
        time_ms: 1_700_000_000_123,
        cpu_time_ms: Some(99),
        mem_peak_bytes: Some(4096),
        steps: vec![step()],
        node_fault: true,
    }
}

/// An attach with every field set.
fn register() -> Register {
    Register {
        node: "n1".into(),
        gpus: vec![Gpu {
            uuid: "GPU-1".into(),
            model: "A100-80GB".into(),
            memory_mib: 81920,
            index: 1,
            pci_bus_id: "0000:17:00.0".into(),
            mig: vec![MigInstance {
                uuid: "MIG-1".into(),
                profile: "3g.40gb".into(),
                memory_mib: 40960,
            }],
        }],
        cpus: 64,
        memory_bytes: 512 << 30,
        gpu_backend: "nvml".into(),
        running: vec![running()],
        unacked_reports: vec![report(ReportKind::Ended)],
        nonce: vec![1, 2, 3],
        agent_id: "agent-n1".into(),
        address: "10.0.0.1".into(),
        allow_root_jobs: true,
        features: vec!["ib".into()],
        previous_session: vec![9, 8, 7],
        mig_dynamic: true,
    }
}

/// A heartbeat with every field set.
fn heartbeat() -> Heartbeat {
    Heartbeat {
        node: "n1".into(),
        running: vec![running()],
        metrics: vec![GpuMetrics {
            uuid: "GPU-1".into(),
            util_pct: 87,
            mem_util_pct: 40,
            mem_used_mib: 30000,
            temp_c: 61,
            fan_pct: Some(30),
            power_w: 250.5,
            power_limit_w: 400.0,
            ecc_uncorrected: Some(0),
            jobs: vec![JobGpuUse {
                job_id: 7,
                mem_used_mib: 29000,
                processes: 2,
                util_pct: Some(40),
            }],
            time_ms: 1_700_000_000_000,
            last_xid: Some(79),
            last_xid_ms: 1_699_999_999_000,
            row_remap_failure: true,
        }],
        commands_handled: 12,
        reporting: vec![Running::new(8, 1)],
        health_error: "ecc errors".into(),
    }
}

fn actor() -> Actor {
    Actor {
        user: "ana".into(),
        admin: true,
    }
}

/// One entry of each kind, each field set.
fn every_change() -> Vec<Change> {
    let record = Record {
        job: Job {
            id: 42,
            spec: JobSpec {
                user: "ana".into(),
                command: vec!["true".into()],
                ..JobSpec::default()
            },
            submit_time_ms: 5,
            ..Job::default()
        },
        request_id: "req-1".into(),
        ..Record::default()
    };
    let alloc = sched::Alloc {
        node: "n1".into(),
        slots: vec![sched::SlotUse {
            uuid: "GPU-1".into(),
            compute_milli: 500,
            memory_mib: 4096,
        }],
        cpu_milli: 1500,
        memory_bytes: 1 << 30,
    };
    let mut config = Config {
        admins: vec!["ops".into()],
        ..Config::default()
    };
    config.kill_grace = std::time::Duration::from_secs(7);
    vec![
        Change::Submit(vec![record.clone(), record]),
        Change::Cancel {
            actor: actor(),
            ids: vec![1, 2],
            tasks: vec![TaskRef {
                array_job_id: 40,
                task_id: 3,
            }],
        },
        Change::Job {
            actor: actor(),
            id: 9,
            action: JobAction::Hold,
        },
        Change::Job {
            actor: actor(),
            id: 9,
            action: JobAction::Release,
        },
        Change::Job {
            actor: actor(),
            id: 9,
            action: JobAction::Requeue,
        },
        Change::Job {
            actor: actor(),
            id: 9,
            action: JobAction::ReleaseAllocation(Some(3)),
        },
        Change::Job {
            actor: actor(),
            id: 9,
            action: JobAction::ReleaseAllocation(None),
        },
        Change::Update {
            actor: actor(),
            id: 9,
            update: gpuctl_core::update::JobUpdate {
                time_limit_secs: Some(0),
                partition: Some("batch".into()),
                name: None,
                comment: Some(String::new()),
                priority: Some(-100),
            },
        },
        Change::Update {
            actor: actor(),
            id: 9,
            update: gpuctl_core::update::JobUpdate {
                name: Some("renamed".into()),
                ..Default::default()
            },
        },
        Change::Drain {
            node: "n1".into(),
            reason: Some("maintenance".into()),
        },
        Change::Drain {
            node: "n1".into(),
            reason: None,
        },
        Change::Attach {
            register: register(),
            peer: Some("10.0.0.1:4567".parse().unwrap()),
        },
        Change::Attach {
            register: register(),
            peer: None,
        },
        Change::Disconnected {
            node: "n1".into(),
            generation: 17,
        },
        Change::Heartbeat {
            heartbeat: heartbeat(),
            not_run: vec![(7, 1), (9, 3)],
        },
        Change::Reports(vec![
            report(ReportKind::Started),
            report(ReportKind::Ended),
            report(ReportKind::Warning),
        ]),
        Change::CheckNodes {
            silent: vec!["n1".into(), "n3".into()],
        },
        Change::FailNode {
            node: "n2".into(),
            why: "node revoked".into(),
        },
        Change::Prepare,
        Change::Pass,
        Change::Starts(vec![sched::Start {
            job: 42,
            allocs: vec![alloc.clone(), alloc],
        }]),
        Change::Waiting(vec![Wait {
            job: 43,
            reason: "Priority".into(),
            expected_start_ms: 1_700_000_100_000,
        }]),
        Change::Preempt(vec![43, 44]),
        Change::Reconfigure(Box::new(config)),
    ]
}

#[test]
fn every_kind_of_entry_reads_back_as_it_was_written() {
    for (i, change) in every_change().into_iter().enumerate() {
        let e = Entry::new(1_700_000_000_000 + i as i64, change);
        let bytes = entry_pb(&e).encode_to_vec();
        let back = entry(st::LogEntry::decode(bytes.as_slice()).unwrap()).unwrap();
        assert_eq!(format!("{back:?}"), format!("{e:?}"));
    }
}

#[test]
fn an_entry_of_no_known_kind_is_refused_with_its_time() {
    let e = st::LogEntry {
        at: 5,
        change: None,
    };
    let err = entry(e).unwrap_err();
    assert_eq!(err.at, 5);
    assert!(err.to_string().contains("no change"), "{err}");
    let e = st::LogEntry {
        at: 6,
        change: Some(Pb::Job(st::LogJobAction::default())),
    };
    assert!(entry(e).unwrap_err().to_string().contains("no known kind"));
    let e = st::LogEntry {
        at: 7,
        change: Some(Pb::Reconfigure("kill_grase = 3".into())),
    };
    assert!(
        entry(e)
            .unwrap_err()
            .to_string()
            .contains("a configuration")
    );
}
