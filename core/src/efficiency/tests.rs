use super::*;
use crate::record::*;
use crate::usage::fold_sample;

/// A job that ran 20 minutes of its 8 hours on one whole 80 GiB GPU, 8 CPUs and 64 GiB
/// asked, with the samples given (utilisation %, its GPU memory MiB), 10 s apart.
fn job(samples: &[(u32, u64)], cpu_time_ms: u64, host_peak: u64) -> Job {
    let slot = SlotUse {
        uuid: "GPU-0".into(),
        compute_milli: 1000,
        memory_mib: 81920,
    };
    let mut usage = JobUsage {
        cpu_time_ms,
        host_mem_peak_bytes: host_peak,
        host_reports: 1,
        ..Default::default()
    };
    for (k, &(util, mem)) in samples.iter().enumerate() {
        let m = crate::node::GpuMetrics {
            uuid: "GPU-0".into(),
            util_pct: util,
            power_w: 300.0,
            time_ms: 1_000_000 + 10_000 * k as i64,
            ..Default::default()
        };
        fold_sample(&mut usage, "n1", &slot, 1000, (mem, None), &m);
    }
    Job {
        id: 42,
        state: JobState::Completed,
        start_time_ms: 1_000_000,
        end_time_ms: 1_000_000 + 20 * 60_000,
        time_limit_secs: 8 * 3600,
        spec: JobSpec {
            resources: Resources {
                gpu: Some(GpuPart::Gpus(1)),
                cpus: 8,
                memory_bytes: 64 << 30,
                ..Default::default()
            },
            ..Default::default()
        },
        allocations: vec![Allocation {
            node: "n1".into(),
            slots: vec![slot],
            ..Default::default()
        }],
        usage: Some(usage),
        ..Default::default()
    }
}

#[test]
fn an_oversized_job_gets_every_line_computed_by_hand() {
    // Utilisation 8, 12, 10, 10: mean 10%. GPU memory peak 6000 MiB. 1.5 CPUs busy over
    // 1,200 s = 1,800,000 ms of CPU time. Host memory peak 10 GiB.
    let j = job(
        &[(8, 5000), (12, 6000), (10, 4000), (10, 4000)],
        1_800_000,
        10 << 30,
    );
    let e = report(&j, 0);
    assert_eq!(e.elapsed_secs, 1200);
    assert_eq!(e.gpu_util_mean, Some(10.0));
    assert_eq!(e.gpu_util_max, Some(12.0));
    assert_eq!(e.gpu_memory_peak_mib, 6000);
    // (5000 + 6000 + 4000 + 4000) / 4.
    assert_eq!(e.gpu_memory_mean_mib, Some(4750.0));
    assert_eq!(e.slots.len(), 1);
    assert_eq!(e.slots[0].util_mean, Some(10.0));
    assert_eq!(e.cpus_used_mean, Some(1.5));
    // Three gaps of 10 s at 300 W.
    assert_eq!(e.gpu_energy_j, 9000.0);
    // Share: max(10% x 1.25, 6000 x 1.25 / 81920) = 0.125 -> 0.15. Time: 1,200 s x 1.25
    // = 25 min. CPUs: ceil(1.5 x 1.25) = 2. Memory: 10 GiB x 1.25 = 12.5 -> 13 GiB.
    let lines: Vec<&str> = e
        .advice
        .iter()
        .map(|a| a.split("  #").next().unwrap_or(""))
        .collect();
    assert_eq!(
        lines,
        [
            "gpus = 0.15",
            "time_limit = \"25m\"",
            "cpus = 2",
            "memory = \"13GiB\""
        ],
        "{:#?}",
        e.advice
    );
    assert!(
        e.advice[0].contains("busy 10% on average"),
        "{}",
        e.advice[0]
    );
}

#[test]
fn a_job_that_used_what_it_asked_gets_no_advice() {
    // 90% busy, 70 GiB of GPU memory, 7 CPUs busy over 20 minutes, 60 GiB of host memory;
    // ran 20 minutes of a 30-minute limit.
    let mut j = job(
        &[(90, 70_000), (95, 71_000), (85, 69_000)],
        7 * 1_200_000,
        60 << 30,
    );
    j.time_limit_secs = 1800;
    let e = report(&j, 0);
    assert!(e.advice.is_empty(), "{:?}", e.advice);
    assert_eq!(e.rows.len(), 6);
}

#[test]
fn too_few_samples_say_nothing_of_the_gpu() {
    let j = job(&[(1, 10)], 0, 0);
    let e = report(&j, 0);
    assert!(
        e.advice.iter().all(|a| !a.starts_with("gpus")),
        "{:?}",
        e.advice
    );
    assert_eq!(e.gpu_samples, 1);
}

#[test]
fn an_idle_gpu_of_several_is_named() {
    let mut j = job(&[], 0, 0);
    let slots: Vec<SlotUse> = (0..4)
        .map(|i| SlotUse {
            uuid: format!("GPU-{i}"),
            compute_milli: 1000,
            memory_mib: 81920,
        })
        .collect();
    let mut usage = JobUsage::default();
    for k in 0..3 {
        for (i, s) in slots.iter().enumerate() {
            let busy = i < 3;
            let m = crate::node::GpuMetrics {
                uuid: s.uuid.clone(),
                util_pct: if busy { 80 } else { 0 },
                time_ms: 1_000_000 + 10_000 * k,
                ..Default::default()
            };
            let mem = if busy { 40_000 } else { 0 };
            fold_sample(&mut usage, "n1", s, 1000, (mem, None), &m);
        }
    }
    j.usage = Some(usage);
    j.allocations[0].slots = slots;
    j.spec.resources.gpu = Some(GpuPart::Gpus(4));
    let e = report(&j, 0);
    assert!(
        e.advice
            .iter()
            .any(|a| a.starts_with("gpus = 3  # 1 of its 4")),
        "{:?}",
        e.advice
    );
}

/// Steps' spans are merged where they overlap: an allocation of 100 s whose steps ran
/// 0-10 s, 5-20 s and 50-60 s was busy 30% of its time; a step with no recorded end
/// ran until the job's end.
#[test]
fn steps_busy_is_the_union_of_their_spans() {
    let st = |id: u32, a: i64, b: i64| Step {
        id,
        name: format!("s{id}"),
        start_ms: a,
        end_ms: b,
        exit_code: (b > 0).then_some(0),
        tasks: 1,
        nodes: vec!["n1".into()],
    };
    let steps = [
        st(0, 1_000, 11_000),
        st(1, 6_000, 21_000),
        st(2, 51_000, 61_000),
    ];
    let (f, busy) = step_figures(&steps, 1_000, 101_000);
    assert_eq!(
        f.iter().map(|s| s.elapsed_secs).collect::<Vec<_>>(),
        [10, 15, 10]
    );
    assert!((busy.unwrap() - 0.30).abs() < 1e-9, "{busy:?}");
    let (f, busy) = step_figures(&[st(0, 91_000, 0)], 1_000, 101_000);
    assert_eq!((f[0].elapsed_secs, f[0].exit_code), (10, None));
    assert!((busy.unwrap() - 0.10).abs() < 1e-9);
    assert_eq!(step_figures(&[], 0, 10).1, None);
}

/// A job that held 3 GPUs at 0% with no memory for 15 samples is told so, not that it
/// used about what it asked for.
#[test]
fn gpus_that_all_did_nothing_are_named() {
    let mut j = job(&[], 0, 0);
    let slots: Vec<SlotUse> = (0..3)
        .map(|i| SlotUse {
            uuid: format!("GPU-{i}"),
            compute_milli: 1000,
            memory_mib: 81920,
        })
        .collect();
    let mut usage = JobUsage::default();
    for k in 0..15 {
        for s in &slots {
            let m = crate::node::GpuMetrics {
                uuid: s.uuid.clone(),
                util_pct: 0,
                time_ms: 1_000_000 + 10_000 * k,
                ..Default::default()
            };
            fold_sample(&mut usage, "n1", s, 1000, (0, None), &m);
        }
    }
    j.usage = Some(usage);
    j.allocations[0].slots = slots;
    j.spec.resources.gpu = Some(GpuPart::Gpus(3));
    let e = report(&j, 0);
    assert!(
        e.advice
            .iter()
            .any(|a| a.starts_with("gpus = 0  # none of its 3")),
        "{:?}",
        e.advice
    );
}
