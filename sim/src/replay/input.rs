//! The replay's input: the cluster (a short form or a nodes CSV) and the jobs (gpuctl's
//! jobs CSV or the Alibaba pods CSV).

use std::path::Path;

use anyhow::{Context as _, bail};
use serde::Deserialize;

use gpuctl_core::node::{Gpu, MigInstance};
use gpuctl_sched::{Eligibility, GpuRequest, Millis, NodeView, Request, SlotView};

/// One job to replay.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TraceJob {
    pub id: u64,
    pub submit: Millis,
    pub duration: Millis,
    pub time_limit: Millis,
    pub priority: i32,
    pub request: Request,
    /// GPUs in milli over all nodes (for utilisation).
    pub gpu_milli: u64,
    /// Who submits it (the trace's user or virtual cluster; `sim` when it has none),
    /// the account it charges (the user's when not given), and its QoS.
    pub user: String,
    pub account: String,
    pub qos: String,
    /// Its partition (empty: the config's default).
    pub partition: String,
    /// Requeued (not ended) when preempted, and its checkpoint signal ("USR1@60").
    pub requeue: bool,
    pub signal: String,
    /// Of the opportunistic class (runs in the idle of GPUs others hold).
    pub opportunistic: bool,
}

#[derive(Debug, Deserialize)]
struct JobRow {
    submit_time: f64,
    duration: f64,
    num_gpus: u32,
    #[serde(default)]
    gpu_milli: Option<u32>,
    #[serde(default)]
    cpus: Option<u32>,
    #[serde(default)]
    memory_mib: Option<u64>,
    #[serde(default)]
    time_limit: Option<f64>,
    #[serde(default)]
    priority: Option<i32>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    account: Option<String>,
    #[serde(default)]
    qos: Option<String>,
    #[serde(default)]
    partition: Option<String>,
    #[serde(default)]
    nodes: Option<u32>,
    #[serde(default)]
    requeue: Option<bool>,
    #[serde(default)]
    signal: Option<String>,
}

/// `64x8xA100-80GB` -> 64 nodes of 8 GPUs (128 CPUs, 1 TiB each).
pub fn parse_cluster(spec: &str) -> anyhow::Result<Vec<NodeView>> {
    let p = Path::new(spec);
    if p.exists() {
        return Ok(crate::trace::read_nodes(p)?
            .into_iter()
            .filter(|n| !n.slots.is_empty())
            .collect());
    }
    let parts: Vec<&str> = spec.splitn(3, 'x').collect();
    let [n, g, model] = parts[..] else {
        bail!("--cluster {spec:?} is neither a file nor NODESxGPUSxMODEL (e.g. 64x8xA100-80GB)");
    };
    let n: usize = n
        .parse()
        .with_context(|| format!("bad node count in {spec:?}"))?;
    let g: u32 = g
        .parse()
        .with_context(|| format!("bad GPU count in {spec:?}"))?;
    let mem = model
        .rsplit_once('-')
        .and_then(|(_, m)| m.strip_suffix("GB"))
        .and_then(|m| m.parse::<u64>().ok())
        .unwrap_or(80)
        * 1024;
    Ok((0..n)
        .map(|i| NodeView {
            name: format!("node{i:04}"),
            eligibility: Eligibility::Up,
            slots: (0..g)
                .map(|k| SlotView {
                    uuid: format!("node{i:04}-gpu{k}"),
                    gpu_index: k,
                    model: model.to_string(),
                    memory_mib: mem,
                    mig_profile: None,
                })
                .collect(),
            cpu_milli: 128_000,
            memory_bytes: 1 << 40,
            partitions: Vec::new(),
            features: Vec::new(),
        })
        .collect())
}

/// Reads jobs (gpuctl's CSV or the Alibaba pods CSV), scaled by `load_factor`, with time
/// limits `overestimate` x duration unless given. `gpus_per_node` turns big jobs into gangs.
pub fn read_jobs(
    path: &Path,
    load_factor: f64,
    overestimate: f64,
    gpus_per_node: u32,
) -> anyhow::Result<Vec<TraceJob>> {
    let mut rdr =
        csv::Reader::from_path(path).with_context(|| format!("cannot read {}", path.display()))?;
    let headers = rdr.headers()?.clone();
    let ms = |s: f64| (s * 1000.0).round() as Millis;
    let mut jobs = Vec::new();
    let has = |name: &str| headers.iter().any(|h| h == name);
    if has("num_gpu") && has("gpu_milli") && !has("creation_time") && !has("submit_time") {
        bail!(
            "{}: an Alibaba pod list without times (no creation_time, deletion_time, \
             scheduled_time): the inflation experiment's input (`gpuctld simulate inflation \
             --pods`), not a time replay's; replay a pod list with times (e.g. \
             openb_pod_list_default.csv) or a jobs CSV (docs/simulator.md)",
            path.display()
        );
    }
    if has("creation_time") {
        let pods = crate::trace::read_pods(path)?;
        let start = pods
            .iter()
            .filter_map(|p| p.creation_time)
            .min()
            .unwrap_or(0);
        for p in pods {
            let (Some(c), Some(d)) = (p.creation_time, p.duration_s()) else {
                continue;
            };
            let submit = ms((c - start) as f64 / load_factor);
            let duration = ms(d as f64);
            jobs.push(TraceJob {
                id: jobs.len() as u64 + 1,
                submit,
                duration,
                time_limit: ((duration as f64) * overestimate) as Millis,
                priority: 0,
                request: p.request(),
                gpu_milli: p.gpu_milli_total(),
                user: "sim".into(),
                account: "sim".into(),
                ..TraceJob::default()
            });
        }
    } else {
        for (i, row) in rdr.deserialize::<JobRow>().enumerate() {
            let r = row.with_context(|| format!("{} line {}", path.display(), i + 2))?;
            if r.duration <= 0.0 || r.submit_time < 0.0 {
                bail!(
                    "{} line {}: submit_time >= 0 and duration > 0 please",
                    path.display(),
                    i + 2
                );
            }
            let per_node = gpus_per_node.max(1);
            let (gpu, nodes, milli) = match (r.num_gpus, r.gpu_milli) {
                (0, _) => (GpuRequest::None, 1, 0),
                (1, Some(m)) if m < 1000 => (
                    GpuRequest::Share {
                        compute_milli: Some(m.max(1)),
                        memory_mib: None,
                    },
                    1,
                    u64::from(m),
                ),
                (n, _) if n > per_node || r.nodes.is_some_and(|k| k > 1) => {
                    let k = r.nodes.unwrap_or(n.div_ceil(per_node)).max(1);
                    (
                        GpuRequest::Whole {
                            count: n.div_ceil(k),
                        },
                        k,
                        u64::from(n.div_ceil(k) * k) * 1000,
                    )
                }
                (n, _) => (GpuRequest::Whole { count: n }, 1, u64::from(n) * 1000),
            };
            let duration = ms(r.duration);
            jobs.push(TraceJob {
                id: jobs.len() as u64 + 1,
                submit: ms(r.submit_time / load_factor),
                duration,
                time_limit: r
                    .time_limit
                    .map_or(((duration as f64) * overestimate) as Millis, ms)
                    .max(duration),
                priority: r.priority.unwrap_or(0),
                request: Request {
                    gpu,
                    models: Vec::new(),
                    cpu_milli: r.cpus.unwrap_or(1) * 1000,
                    memory_bytes: r.memory_mib.unwrap_or(0) << 20,
                    nodes,
                    ..Request::default()
                },
                gpu_milli: milli,
                account: r
                    .account
                    .clone()
                    .or_else(|| r.user.clone())
                    .unwrap_or_else(|| "sim".into()),
                user: r.user.clone().unwrap_or_else(|| "sim".into()),
                qos: r.qos.clone().unwrap_or_default(),
                partition: r.partition.clone().unwrap_or_default(),
                requeue: r.requeue.unwrap_or(false),
                signal: r.signal.clone().unwrap_or_default(),
                opportunistic: false,
            });
        }
    }
    jobs.sort_by_key(|j| (j.submit, j.id));
    Ok(jobs)
}

/// A node's GPUs as its agent reports them (MIG instances under their GPU).
pub(super) fn gpus_of(n: &NodeView) -> Vec<Gpu> {
    let mut out: Vec<Gpu> = Vec::new();
    for s in &n.slots {
        let mig = s.mig_profile.as_ref().map(|p| MigInstance {
            uuid: s.uuid.clone(),
            profile: p.clone(),
            memory_mib: s.memory_mib,
        });
        match (out.last_mut(), mig) {
            (Some(g), Some(m)) if g.index == s.gpu_index && !g.mig.is_empty() => g.mig.push(m),
            (_, mig) => out.push(Gpu {
                index: s.gpu_index,
                uuid: if mig.is_some() {
                    format!("{}-gpu", s.uuid)
                } else {
                    s.uuid.clone()
                },
                model: s.model.clone(),
                memory_mib: s.memory_mib,
                mig: mig.into_iter().collect(),
                ..Gpu::default()
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod list without times (the inflation experiment's `multigpu*` files) is
    /// refused as what it is, not with csv's "missing field `submit_time`".
    #[test]
    fn a_pod_list_without_times_is_refused_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pods.csv");
        std::fs::write(
            &path,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nopenb-pod-0000,12000,16384,1,1000\n",
        )
        .unwrap();
        let e = read_jobs(&path, 1.0, 2.0, 8).unwrap_err().to_string();
        assert!(e.contains("pod list without times"), "{e}");
        assert!(e.contains("simulate inflation"), "{e}");
        // With times it is read.
        std::fs::write(
            &path,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
             openb-pod-0000,12000,16384,1,1000,,LS,Running,100,700,100\n",
        )
        .unwrap();
        assert_eq!(read_jobs(&path, 1.0, 2.0, 8).unwrap().len(), 1);
    }
}
