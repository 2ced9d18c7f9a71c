//! `--exclusive`: resolved at submit into the whole of the alike nodes a job may use.

mod common;

use common::*;
use gpuctl_core::ops::Admission;
use gpuctl_core::record::{GpuPart, JobSpec};

fn exclusive(gpus: u32) -> JobSpec {
    let mut s = spec(gpus, false);
    s.resources.exclusive = true;
    s
}

fn refusal(c: &gpuctl_core::Cluster, spec: JobSpec) -> String {
    match c.admit(&alice(), spec, "", T0) {
        Err(r) => r.to_string(),
        Ok(_) => panic!("admitted"),
    }
}

#[test]
fn an_exclusive_job_asks_for_the_whole_of_alike_nodes() {
    let mut c = cluster();
    assert!(refusal(&c, exclusive(1)).contains("no node the job may use is known yet"));
    attach(&mut c, "n1", T0);
    attach(&mut c, "n2", T0);
    let id = submit_spec(&mut c, exclusive(1), T0);
    let r = c.jobs().job(id).unwrap().spec.resources.clone();
    assert_eq!(r.gpu, Some(GpuPart::Gpus(2)));
    assert_eq!((r.cpus, r.cpu_milli, r.memory_bytes), (16, 0, 64 << 30));

    // A node of another size, offering a feature the others do not.
    attach_shaped(&mut c, "n3", (4, 32, 128 << 30), &[], &["big"], T0);
    let e = refusal(&c, exclusive(1));
    assert!(
        e.contains("differ in size") && e.contains("n3 has 4 GPUs, 32 CPUs"),
        "{e}"
    );
    // Kept to the big node by its feature: the whole of it.
    let mut s = exclusive(0);
    s.resources.constraint = "big".into();
    match c.admit(&alice(), s, "", T0).expect("admitted") {
        Admission::New(stored) => {
            let r = stored.job.spec.resources;
            assert_eq!(r.gpu, Some(GpuPart::Gpus(4)));
            assert_eq!(r.cpus, 32);
        }
        _ => panic!("one job"),
    }
}
