//! Dynamic MIG in the replay (issue 58), hand-computed: one A100 of a dynamic node,
//! three small shares and a whole-GPU job. The controller lays the GPU out for the
//! shares (the simulated agent takes 200 ms and 100 ms an instance, as the fake
//! backend does, and attaches again with the new instances); the whole job waits for
//! them to end and for the layout's `min_layout_age` (2 minutes), then the GPU goes
//! back to whole and it runs.

use gpuctl_core::Config;
use gpuctl_sched::packing::Policy;
use gpuctl_sched::{GpuRequest, Request};
use gpuctl_sim::replay::agents::Usage;
use gpuctl_sim::replay::mig::{as_mig, static_layout};
use gpuctl_sim::replay::{self, TraceJob, parse_cluster};

fn job(id: u64, submit_s: i64, dur_s: i64, gpu: GpuRequest, milli: u64) -> TraceJob {
    TraceJob {
        id,
        submit: submit_s * 1000,
        duration: dur_s * 1000,
        time_limit: 2 * dur_s * 1000,
        request: Request {
            gpu,
            cpu_milli: 1000,
            ..Request::default()
        },
        gpu_milli: milli,
        ..TraceJob::default()
    }
}

fn share(id: u64, submit_s: i64, dur_s: i64, milli: u32) -> TraceJob {
    let gpu = GpuRequest::Share {
        compute_milli: Some(milli),
        memory_mib: None,
    };
    job(id, submit_s, dur_s, gpu, u64::from(milli))
}

/// Each job's wait (s), in submit order.
fn waits(out: &replay::Outcome) -> Vec<f64> {
    let mut jobs: Vec<(i64, f64)> = out.jobs.iter().map(|j| (j.submit, j.wait_s)).collect();
    jobs.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    jobs.into_iter().map(|j| j.1).collect()
}

#[test]
fn a_dynamic_gpu_is_laid_out_for_the_shares_and_goes_back_to_whole() {
    let nodes = parse_cluster("1x1xA100-80GB").unwrap();
    let mut jobs = vec![
        share(1, 0, 100, 100),
        share(2, 0, 100, 100),
        share(3, 0, 100, 100),
        job(4, 10, 100, GpuRequest::Whole { count: 1 }, 1000),
    ];
    assert_eq!(as_mig(&mut jobs, "A100-80GB").unwrap(), 3);
    let base = Config::default();
    let config = replay::config_for("backfill", Policy::FirstFit, None, &jobs, &base).unwrap();
    let usage = Usage {
        mig_dynamic: true,
        ..Usage::default()
    };
    let out = replay::replay_with(&nodes, &jobs, &config, &base, "backfill", 0, usage);
    assert_eq!(out.summary.jobs, 4, "every job can run on a dynamic node");
    let w = waits(&out);
    // The shares: one change to seven 1g.10gb (the three asked, filled with more of
    // them), 200 ms + 7 x 100 ms, then a pass.
    for s in &w[..3] {
        assert!((0.9..=1.0).contains(s), "{w:?}");
    }
    // The whole job (submitted at 10 s): the shares end at 100.9 s; the GPU, whose
    // change was asked at 0 s, may change again 120 s later (a pass is due then:
    // `next_wake_ms`), and is whole 200 ms after that (an empty layout): it starts at
    // 120.2 s.
    assert!((w[3] - 110.2).abs() < 0.05, "{w:?}");
    // Static, the same GPU cut by hand into 4g.40gb + 3g.40gb: no 1g instance, so
    // the shares cannot run there, nor the whole job.
    let mut cut = nodes.clone();
    static_layout(&mut cut);
    let out = replay::replay(&cut, &jobs, &config, &base, "backfill", 0);
    assert_eq!(out.summary.jobs, 0, "{:?}", out.summary);
}
