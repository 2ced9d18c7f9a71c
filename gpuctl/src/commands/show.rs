//! `gpuctl show JOB`: one job, and for a running one its GPUs' current use. It asks the
//! controller for that job and the nodes it runs on only.

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure};
use crate::format::{self, JobJson};

/// A running job's use of one of its GPUs (fields in alphabetical order).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GpuUse {
    pub gpu: String,
    pub gpu_mem_used_mib: u64,
    pub job_mem_used_mib: u64,
    pub job_processes: u32,
    pub node: String,
    pub power_w: f64,
    pub temp_c: u32,
    pub util_pct: u32,
}

/// A job's current use of its GPUs, from the nodes' latest metrics.
pub fn gpu_use(job: u64, nodes: &[pb::Node]) -> Vec<GpuUse> {
    let mut out = Vec::new();
    for n in nodes {
        for g in &n.gpus {
            let Some(m) = &g.metrics else { continue };
            if !g.jobs.contains(&job) {
                continue;
            }
            let mine = m.jobs.iter().find(|u| u.job_id == job);
            out.push(GpuUse {
                gpu: g.uuid.clone(),
                gpu_mem_used_mib: m.mem_used_mib,
                job_mem_used_mib: mine.map_or(0, |u| u.mem_used_mib),
                job_processes: mine.map_or(0, |u| u.processes),
                node: n.name.clone(),
                power_w: m.power_w,
                temp_c: m.temp_c,
                util_pct: m.util_pct,
            });
        }
    }
    out
}

pub struct Show {
    job: pb::Job,
    gpu_use: Vec<GpuUse>,
}

impl Serialize for Show {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        JobJson::with_gpu_use(&self.job, &self.gpu_use).serialize(ser)
    }
}

impl View for Show {
    fn text(&self) -> String {
        let mut text = format::show_job(&self.job);
        for u in &self.gpu_use {
            text.push_str(&format!(
                "      GpuUse: {} {} util {}% job memory {} MiB ({} processes) temp {}C power {:.0}W\n",
                format::printable(&u.node),
                u.gpu,
                u.util_pct,
                u.job_mem_used_mib,
                u.job_processes,
                u.temp_c,
                u.power_w
            ));
        }
        text
    }
}

pub async fn run(client: &mut Client, job_id: u64) -> Result<Show, Failure> {
    let job = client
        .get_job(pb::GetJobRequest { job_id })
        .await?
        .into_inner();
    let mut names: Vec<String> = job
        .allocations
        .iter()
        .filter(|a| !a.ended)
        .map(|a| a.node.clone())
        .collect();
    names.dedup();
    let gpu_use = if job.state() == pb::JobState::Running && !names.is_empty() {
        let nodes = client
            .list_nodes(pb::ListNodesRequest { names })
            .await?
            .into_inner()
            .nodes;
        gpu_use(job_id, &nodes)
    } else {
        Vec::new()
    };
    Ok(Show { job, gpu_use })
}
