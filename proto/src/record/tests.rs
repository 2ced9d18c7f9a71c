use std::collections::HashMap;

use gpuctl_core::record as core;
use proptest::prelude::*;
use prost::Message as _;

use super::*;

/// A job with every field set, the edge values among them (an optional 0, no GPUs
/// written as `gpus = 0`, a share of no memory).
fn full() -> core::Job {
    let slot = core::SlotUse {
        uuid: "GPU-1".into(),
        compute_milli: 500,
        memory_mib: 4096,
    };
    let used = core::SlotUsage {
        node: "n1".into(),
        uuid: "GPU-1".into(),
        share_milli: 500,
        memory_mib: 4096,
        samples: 12,
        util_sum: 3.5,
        util_max: 0.75,
        mem_peak_mib: 2048,
        mem_sum_mib: 100.25,
        energy_j: 1.5e6,
        last_sample_ms: 1_700_000_000_000,
    };
    core::Job {
        id: 42,
        spec: core::JobSpec {
            name: "train".into(),
            command: vec!["python".into(), "t.py".into()],
            script: "#!/bin/sh\n".into(),
            workdir: "/home/ana".into(),
            stdout: "out-%j".into(),
            stderr: "err-%j".into(),
            env: HashMap::from([("A".into(), "1".into()), ("B".into(), String::new())]),
            priority: -7,
            resources: core::Resources {
                gpu: Some(core::GpuPart::Share(core::GpuShare {
                    compute_milli: 250,
                    memory_mib: Some(0),
                })),
                cpus: 3,
                memory_bytes: 1 << 30,
                time_limit_secs: 3600,
                gpu_models: vec!["A100".into()],
                nodes: 2,
                cpu_milli: 2500,
                nodelist: vec!["gpu[01-04]".into()],
                exclude: vec!["gpu03".into()],
                constraint: "a&b".into(),
                tasks_per_node: 2,
                exclusive: true,
            },
            user: "ana".into(),
            uid: 1000,
            gid: 1000,
            qos: "high".into(),
            requeue: true,
            dependencies: vec![
                core::Dependency {
                    kind: core::DependencyKind::AfterOk,
                    job_id: 7,
                },
                core::Dependency {
                    kind: core::DependencyKind::Singleton,
                    job_id: 0,
                },
            ],
            account: "ml".into(),
            signal: "USR1@120".into(),
            array: "0-9%2".into(),
            array_job_id: 40,
            array_task_id: Some(0),
            begin_ms: 1_700_000_000_000,
            partition: "batch".into(),
            right_size: true,
            colocate: true,
            max_restarts: 3,
            interactive: true,
            opportunistic: true,
            comment: "sweep 3 of 8: lr=3e-4".into(),
            wckey: "proj".into(),
            mail_type: "BEGIN,END".into(),
            mail_user: "team@example.com".into(),
        },
        state: core::JobState::Running,
        node: "n1".into(),
        gpus: vec!["GPU-1".into()],
        reason: "why".into(),
        exit_code: Some(0),
        submit_time_ms: 1,
        start_time_ms: 2,
        end_time_ms: 3,
        time_limit_secs: 3600,
        allocations: vec![
            core::Allocation {
                node: "n1".into(),
                slots: vec![slot],
                cpu_milli: 2500,
                memory_bytes: 1 << 30,
                rank: 0,
                ended: true,
                state: Some(core::JobState::Failed),
                exit_code: Some(-1),
                reason: "oom".into(),
            },
            core::Allocation {
                node: "n2".into(),
                rank: 1,
                ..core::Allocation::default()
            },
        ],
        expected_start_ms: 4,
        attempt: 2,
        warnings: vec!["w".into()],
        hold: "user".into(),
        usage: Some(core::JobUsage {
            slots: vec![used],
            cpu_time_ms: 9,
            host_mem_peak_bytes: 10,
            host_reports: 1,
        }),
        launch_time_ms: 5,
        restarts: 1,
        steps: vec![core::Step {
            id: 0,
            name: "srun x".into(),
            start_ms: 6,
            end_ms: 0,
            exit_code: None,
            tasks: 4,
            nodes: vec!["n1".into(), "n2".into()],
        }],
    }
}

/// Every way a job's record goes: to protobuf and back, and encoded by hand and
/// decoded, gives the job again, in as many bytes as the hand encoder said.
fn round_trips(j: &core::Job) {
    let pb = Job::from(j);
    assert_eq!(core::Job::try_from(pb.clone()).as_ref(), Ok(j));
    assert_eq!(
        JobSpec::from(j.spec.clone()),
        JobSpec::from(&j.spec),
        "by value, by reference"
    );
    let mut hand = Vec::new();
    encode_job(j, &mut hand);
    assert_eq!(hand.len(), job_encoded_len(j), "the length it announced");
    assert_eq!(
        hand.len(),
        pb.encoded_len(),
        "prost's length of the same job"
    );
    let decoded = Job::decode(&hand[..]).unwrap();
    assert_eq!(
        decoded, pb,
        "hand-encoded bytes decode as the converted job"
    );
}

#[test]
fn a_full_job_round_trips_every_way() {
    let j = full();
    round_trips(&j);
    let mut j2 = j.clone();
    for g in [
        None,
        Some(core::GpuPart::Gpus(0)),
        Some(core::GpuPart::Gpus(8)),
        Some(core::GpuPart::Mig(core::MigInstances {
            profile: "3g.40gb".into(),
            count: 2,
        })),
        Some(core::GpuPart::Share(core::GpuShare {
            compute_milli: 0,
            memory_mib: None,
        })),
    ] {
        j2.spec.resources.gpu = g;
        j2.usage = None;
        round_trips(&j2);
    }
    round_trips(&core::Job::default());
}

#[test]
fn a_record_round_trips_and_keeps_its_notes() {
    let r = core::Record {
        job: full(),
        cancel_requested: true,
        start_confirmed: true,
        requeued_from: Some(core::Job {
            id: 42,
            state: core::JobState::Running,
            ..core::Job::default()
        }),
        request_id: "req".into(),
        requeue_requested: "admin".into(),
        preempted_by: 9,
        vacate_by_ms: 10,
    };
    let stored = StoredJob::from(&r);
    let back = StoredJob::decode(&stored.encode_to_vec()[..]).unwrap();
    assert_eq!(core::Record::try_from(back), Ok(r.clone()));
    // The store's own encoding decodes as the same record.
    let hand = encode_record(&r);
    assert_eq!(hand.len(), stored.encoded_len());
    let back = StoredJob::decode(&hand[..]).unwrap();
    assert_eq!(core::Record::try_from(back), Ok(r));
}

#[test]
fn records_that_are_not_jobs_are_refused() {
    assert_eq!(
        core::Record::try_from(StoredJob::default()),
        Err(BadRecord::NoJob)
    );
    let unspecified = StoredJob {
        job: Some(Job::default()),
        ..StoredJob::default()
    };
    assert_eq!(
        core::Record::try_from(unspecified),
        Err(BadRecord::State(UnknownState(0)))
    );
    let newer = Job {
        state: 99,
        ..Job::default()
    };
    assert_eq!(core::Job::try_from(newer), Err(UnknownState(99)));
}

#[test]
#[allow(deprecated)]
fn an_older_record_is_upgraded_on_the_way_in_and_said_so() {
    let mut s = StoredJob {
        job: Some(Job {
            id: 1,
            state: JobState::Pending as i32,
            spec: Some(JobSpec {
                resources: Some(Resources {
                    legacy_gpu_milli: 500,
                    ..Resources::default()
                }),
                ..JobSpec::default()
            }),
            ..Job::default()
        }),
        ..StoredJob::default()
    };
    assert!(legacy_fields(
        s.job
            .as_ref()
            .unwrap()
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
    ));
    assert!(upgrade_record(&mut s));
    assert!(!upgrade_record(&mut s), "once");
    let r = core::Record::try_from(s).unwrap();
    assert_eq!(
        r.job.spec.resources.gpu,
        Some(core::GpuPart::Share(core::GpuShare {
            compute_milli: 500,
            memory_mib: None
        }))
    );
}

#[test]
fn an_unspecified_dependency_waits_for_any_end() {
    let spec = JobSpec {
        dependencies: vec![Dependency { kind: 0, job_id: 3 }],
        ..JobSpec::default()
    };
    let s = core::JobSpec::from(spec);
    assert_eq!(s.dependencies[0].kind, core::DependencyKind::AfterAny);
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z0-9%é]{1,12}"]
}

fn step() -> impl Strategy<Value = core::Step> {
    (
        any::<u32>(),
        text(),
        any::<i64>(),
        any::<i64>(),
        any::<Option<i32>>(),
        any::<u32>(),
    )
        .prop_map(
            |(id, name, start_ms, end_ms, exit_code, tasks)| core::Step {
                id,
                name,
                start_ms,
                end_ms,
                exit_code,
                tasks,
                nodes: vec!["n1".into()],
            },
        )
}

fn allocation() -> impl Strategy<Value = core::Allocation> {
    let state = proptest::option::of(prop_oneof![
        Just(core::JobState::Completed),
        Just(core::JobState::Failed),
        Just(core::JobState::Timeout)
    ]);
    (
        text(),
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<bool>(),
        state,
        any::<Option<i32>>(),
    )
        .prop_map(
            |(node, cpu_milli, memory_bytes, rank, ended, state, exit_code)| core::Allocation {
                node,
                slots: vec![core::SlotUse {
                    uuid: "GPU-2".into(),
                    compute_milli: cpu_milli % 1001,
                    memory_mib: memory_bytes >> 20,
                }],
                cpu_milli,
                memory_bytes,
                rank,
                ended,
                state,
                exit_code,
                reason: String::new(),
            },
        )
}

fn gpu() -> impl Strategy<Value = Option<core::GpuPart>> {
    proptest::option::of(prop_oneof![
        any::<u32>().prop_map(core::GpuPart::Gpus),
        (any::<u32>(), any::<Option<u64>>()).prop_map(|(compute_milli, memory_mib)| {
            core::GpuPart::Share(core::GpuShare {
                compute_milli,
                memory_mib,
            })
        }),
        (text(), any::<u32>()).prop_map(|(profile, count)| {
            core::GpuPart::Mig(core::MigInstances { profile, count })
        }),
    ])
}

fn job() -> impl Strategy<Value = core::Job> {
    let state = prop_oneof![
        Just(core::JobState::Pending),
        Just(core::JobState::Running),
        Just(core::JobState::Cancelled),
        Just(core::JobState::NodeFail),
    ];
    let spec = (
        text(),
        gpu(),
        any::<i32>(),
        any::<Option<u32>>(),
        any::<i64>(),
        any::<bool>(),
    )
        .prop_map(
            |(name, gpu, priority, array_task_id, begin_ms, requeue)| core::JobSpec {
                name: name.clone(),
                env: HashMap::from([(name, "v".to_string())]),
                priority,
                resources: core::Resources {
                    gpu,
                    cpus: priority.unsigned_abs() % 64,
                    ..core::Resources::default()
                },
                array_task_id,
                begin_ms,
                requeue,
                ..core::JobSpec::default()
            },
        );
    let usage =
        proptest::option::of(
            (any::<f64>(), any::<u64>()).prop_map(|(util, n)| core::JobUsage {
                slots: vec![core::SlotUsage {
                    util_sum: util,
                    samples: n,
                    ..core::SlotUsage::default()
                }],
                cpu_time_ms: n,
                ..core::JobUsage::default()
            }),
        );
    let life = (
        any::<u64>(),
        state,
        text(),
        any::<Option<i32>>(),
        any::<i64>(),
        any::<u32>(),
    );
    let parts = (
        proptest::collection::vec(allocation(), 0..3),
        proptest::collection::vec(step(), 0..3),
        usage,
    );
    (life, spec, parts).prop_map(
        |((id, state, node, exit_code, t, attempt), spec, (allocations, steps, usage))| core::Job {
            id,
            spec,
            state,
            gpus: vec![node.clone()],
            node,
            exit_code,
            submit_time_ms: t,
            start_time_ms: t.wrapping_add(1),
            attempt,
            allocations,
            usage,
            steps,
            ..core::Job::default()
        },
    )
}

proptest! {
    #[test]
    fn any_job_round_trips_every_way(j in job()) {
        // NaN is not equal to itself: a usage sample is a number.
        prop_assume!(j.usage.as_ref().is_none_or(|u| u.slots.iter().all(|s| !s.util_sum.is_nan())));
        round_trips(&j);
    }
}

/// A value of each kind a field list names, none of them the kind's default.
macro_rules! sample {
    (string) => {
        "s".to_string()
    };
    (strings) => {
        vec!["a".to_string(), "é".to_string()]
    };
    (u32) => {
        7
    };
    (u64) => {
        1 << 40
    };
    (i32) => {
        -3
    };
    (i64) => {
        -(1 << 40)
    };
    (bool) => {
        true
    };
    (f64) => {
        0.5
    };
    (opt_u32) => {
        Some(0)
    };
    (opt_u64) => {
        Some(0)
    };
    (opt_i32) => {
        Some(-1)
    };
}

/// Sets every plain field core's list names for `$v`'s type.
macro_rules! fill {
    ($v:ident; $($f:ident: $k:ident,)*) => {
        $($v.$f = sample!($k);)*
    };
}

/// Every field of every list set (a field added to a list is set here by itself), so
/// that a wrong number or kind in a list shows as a job that does not come back.
#[test]
fn every_listed_field_round_trips_with_its_number() {
    let mut share = core::GpuShare::default();
    gpuctl_core::gpu_share_fields!(fill!(share));
    let mut mig = core::MigInstances::default();
    gpuctl_core::mig_fields!(fill!(mig));
    let mut resources = core::Resources::default();
    gpuctl_core::resources_fields!(fill!(resources));
    let mut dependency = core::Dependency::default();
    gpuctl_core::dependency_fields!(fill!(dependency));
    let mut spec = core::JobSpec::default();
    gpuctl_core::job_spec_fields!(fill!(spec));
    let mut slot = core::SlotUse::default();
    gpuctl_core::slot_use_fields!(fill!(slot));
    let mut allocation = core::Allocation::default();
    gpuctl_core::allocation_fields!(fill!(allocation));
    let mut step = core::Step::default();
    gpuctl_core::step_fields!(fill!(step));
    let mut used = core::SlotUsage::default();
    gpuctl_core::slot_usage_fields!(fill!(used));
    let mut usage = core::JobUsage::default();
    gpuctl_core::job_usage_fields!(fill!(usage));
    let mut job = core::Job::default();
    gpuctl_core::job_fields!(fill!(job));
    let mut record = core::Record::default();
    gpuctl_core::record_fields!(fill!(record));

    usage.slots = vec![used];
    allocation.slots = vec![slot];
    spec.dependencies = vec![dependency];
    for gpu in [core::GpuPart::Share(share), core::GpuPart::Mig(mig)] {
        let mut job = job.clone();
        job.spec = spec.clone();
        job.spec.resources = core::Resources {
            gpu: Some(gpu),
            ..resources.clone()
        };
        job.allocations = vec![allocation.clone()];
        job.steps = vec![step.clone()];
        job.usage = Some(usage.clone());
        round_trips(&job);
        let r = core::Record {
            job,
            ..record.clone()
        };
        let back = StoredJob::decode(&encode_record(&r)[..]).unwrap();
        assert_eq!(core::Record::try_from(back), Ok(r));
    }
}
