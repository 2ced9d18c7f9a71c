//! `--exclusive`: a job that takes the whole of each node it runs on. Resolved once, at
//! submit, into an ordinary request for all of a node (its GPUs, CPUs and memory), so
//! that nothing else fits beside it and the scheduler needs no rule of its own. That
//! needs the nodes the job may use (its partition, node lists, constraint and GPU
//! models) to be alike; where they are not, or none is known yet, it is refused with why.

use crate::record::{GpuPart, Resources};
use gpuctl_sched as sched;

use crate::error::Refusal;
use crate::state::Cluster;

/// A node's shape: whole GPUs, milli-CPUs, memory bytes.
type Shape = (u32, u32, u64);

/// Rewrites an exclusive `res` into the whole of the nodes it may use.
pub(crate) fn resolve(
    c: &Cluster,
    res: &mut Resources,
    partition: Option<String>,
) -> Result<(), Refusal> {
    let mut req = sched::Request::from(&*res);
    req.partition = partition;
    let partitions = c.config.all_partitions();
    let models: Vec<String> = res.gpu_models.iter().map(|m| m.to_lowercase()).collect();
    let mut shapes: Vec<(Shape, String)> = Vec::new();
    for n in c.fleet.nodes.values() {
        let v = c.node_view(n, &partitions);
        let model_ok = |s: &sched::SlotView| {
            models.is_empty() || models.iter().any(|m| s.model.to_lowercase().contains(m))
        };
        if !v.admits(&req) || (!models.is_empty() && !v.slots.iter().any(model_ok)) {
            continue;
        }
        if v.slots.iter().any(sched::SlotView::is_mig) {
            return Err(Refusal::failed_precondition(format!(
                "--exclusive: node {} has MIG instances; exclusive jobs take whole GPUs (name other nodes with -w/-x or -C)",
                v.name
            )));
        }
        shapes.push(((v.slots.len() as u32, v.cpu_milli, v.memory_bytes), v.name));
    }
    let Some(((gpus, cpu_milli, memory), _)) = shapes.first().cloned() else {
        return Err(Refusal::failed_precondition(
            "--exclusive: no node the job may use is known yet, so its size is not either (submit once the nodes have attached)",
        ));
    };
    if let Some((other, name)) = shapes.iter().find(|(s, _)| *s != (gpus, cpu_milli, memory)) {
        return Err(Refusal::failed_precondition(format!(
            "--exclusive: the nodes the job may use differ in size ({} has {} GPUs, {} CPUs, {}; {} has {} GPUs, {} CPUs, {}): name alike ones with -w/-x, -C or a partition",
            shapes[0].1,
            gpus,
            f64::from(cpu_milli) / 1000.0,
            bytesize::ByteSize(memory),
            name,
            other.0,
            f64::from(other.1) / 1000.0,
            bytesize::ByteSize(other.2)
        )));
    }
    res.gpu = (gpus > 0).then_some(GpuPart::Gpus(gpus));
    res.cpus = cpu_milli.div_ceil(1000).max(1);
    res.cpu_milli = if cpu_milli % 1000 == 0 { 0 } else { cpu_milli };
    res.memory_bytes = memory;
    Ok(())
}
