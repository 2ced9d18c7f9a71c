//! Reading cluster traces: the Alibaba GPU trace (cluster-trace-gpu-v2023, "openb") node
//! and pod CSVs, and gpuctl's own job CSV for replays. Used by the simulator, the
//! benchmarks and tests; the daemon does not read traces.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use gpuctl_sched::{Eligibility, GpuRequest, NodeView, Request, SlotView};

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Not retryable: the file is missing or unreadable.
    #[error("cannot read trace {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: csv::Error,
    },
    /// Not retryable: a row does not parse.
    #[error("{path}: {source}")]
    Row {
        path: String,
        #[source]
        source: csv::Error,
    },
    /// Not retryable: a value is out of range or inconsistent.
    #[error("{path} line {line}: {why}")]
    Bad {
        path: String,
        line: u64,
        why: String,
    },
}

/// The folder of the Alibaba trace, `$GPUCTL_TRACE_DIR`, if given (the trace is not in
/// the repository: `cargo bench` names its usual place itself).
pub fn default_dir() -> Option<PathBuf> {
    std::env::var_os("GPUCTL_TRACE_DIR").map(PathBuf::from)
}

#[derive(Debug, Clone, Deserialize)]
struct NodeRow {
    sn: String,
    cpu_milli: u32,
    memory_mib: u64,
    gpu: u32,
    model: Option<String>,
}

/// Nodes of an `openb_node_list_*.csv`. GPU memory is not in the trace: each GPU gets
/// the memory its model name implies (V100M16 = 16 GiB, ...) or 32 GiB.
pub fn read_nodes(path: &Path) -> Result<Vec<NodeView>, TraceError> {
    let shown = path.display().to_string();
    let mut rdr = csv::Reader::from_path(path).map_err(|source| TraceError::Read {
        path: shown.clone(),
        source,
    })?;
    let mut nodes = Vec::new();
    for row in rdr.deserialize::<NodeRow>() {
        let r = row.map_err(|source| TraceError::Row {
            path: shown.clone(),
            source,
        })?;
        let model = r.model.unwrap_or_default();
        let mem = gpu_memory_mib(&model);
        nodes.push(NodeView {
            slots: (0..r.gpu)
                .map(|i| SlotView {
                    uuid: format!("{}-gpu{i}", r.sn),
                    gpu_index: i,
                    model: model.clone(),
                    memory_mib: mem,
                    mig_profile: None,
                })
                .collect(),
            name: r.sn,
            eligibility: Eligibility::Up,
            cpu_milli: r.cpu_milli,
            memory_bytes: r.memory_mib << 20,
            partitions: Vec::new(),
            features: Vec::new(),
        });
    }
    Ok(nodes)
}

fn gpu_memory_mib(model: &str) -> u64 {
    match model {
        "V100M16" | "T4" | "P100" => 16 * 1024,
        "A10" => 24 * 1024,
        _ => 32 * 1024,
    }
}

/// One pod (task) of an `openb_pod_list_*.csv`. The multigpu files have only the first
/// five columns.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Pod {
    pub name: String,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub num_gpu: u32,
    pub gpu_milli: u32,
    #[serde(default)]
    pub gpu_spec: Option<String>,
    #[serde(default)]
    pub qos: Option<String>,
    #[serde(default)]
    pub creation_time: Option<i64>,
    #[serde(default)]
    pub deletion_time: Option<i64>,
    #[serde(default)]
    pub scheduled_time: Option<i64>,
}

impl Pod {
    /// The scheduler request: whole GPUs, a share (gpu_milli < 1000 on one GPU), or none.
    pub fn request(&self) -> Request {
        let gpu = match (self.num_gpu, self.gpu_milli) {
            (0, _) => GpuRequest::None,
            (1, m) if m < 1000 => GpuRequest::Share {
                compute_milli: Some(m.max(1)),
                memory_mib: Some(0),
            },
            (n, _) => GpuRequest::Whole { count: n },
        };
        Request {
            gpu,
            models: self
                .gpu_spec
                .as_deref()
                .filter(|s| !s.is_empty())
                .map(|s| s.split('|').map(str::to_string).collect())
                .unwrap_or_default(),
            cpu_milli: self.cpu_milli,
            memory_bytes: self.memory_mib << 20,
            nodes: 1,
            ..Request::default()
        }
    }

    /// GPU request in milli-GPUs.
    pub fn gpu_milli_total(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }

    /// How long the pod ran in the trace, when known.
    pub fn duration_s(&self) -> Option<i64> {
        match (self.scheduled_time, self.deletion_time) {
            (Some(s), Some(d)) if d > s => Some(d - s),
            _ => None,
        }
    }
}

/// FGD's typical workload from a pod list: the most popular task shapes covering 95% of
/// the tasks (FGD_EVAL.md), weighted as `Workload::from_counts` does.
pub fn workload(pods: &[Pod]) -> gpuctl_sched::packing::Workload {
    let reqs: Vec<_> = pods.iter().map(Pod::request).collect();
    gpuctl_sched::packing::Workload::from_requests(&reqs)
}

pub fn read_pods(path: &Path) -> Result<Vec<Pod>, TraceError> {
    let shown = path.display().to_string();
    let mut rdr = csv::Reader::from_path(path).map_err(|source| TraceError::Read {
        path: shown.clone(),
        source,
    })?;
    let mut pods = Vec::new();
    for (i, row) in rdr.deserialize::<Pod>().enumerate() {
        let p = row.map_err(|source| TraceError::Row {
            path: shown.clone(),
            source,
        })?;
        if p.gpu_milli > 1000 || (p.num_gpu > 1 && p.gpu_milli != 1000 && p.gpu_milli != 0) {
            return Err(TraceError::Bad {
                path: shown,
                line: i as u64 + 2,
                why: format!("gpu_milli {} with num_gpu {}", p.gpu_milli, p.num_gpu),
            });
        }
        pods.push(p);
    }
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_pod_layouts_and_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("full.csv");
        std::fs::write(
            &full,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
             p0,12000,16384,1,1000,,LS,Running,0,100,10\n\
             p1,6000,12288,1,460,T4|P100,BE,Running,5,,\n",
        )
        .unwrap();
        let pods = read_pods(&full).unwrap();
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0].duration_s(), Some(90));
        assert_eq!(pods[1].duration_s(), None);
        let r = pods[1].request();
        assert_eq!(r.models, vec!["T4", "P100"]);
        assert!(matches!(
            r.gpu,
            GpuRequest::Share {
                compute_milli: Some(460),
                ..
            }
        ));
        let short = dir.path().join("short.csv");
        std::fs::write(
            &short,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,8,1000\n",
        )
        .unwrap();
        let pods = read_pods(&short).unwrap();
        assert_eq!(pods[0].request().gpu, GpuRequest::Whole { count: 8 });
        assert_eq!(pods[0].gpu_milli_total(), 8000);

        let nodes = dir.path().join("nodes.csv");
        std::fs::write(
            &nodes,
            "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nc0,32000,1000,0,\n",
        )
        .unwrap();
        let n = read_nodes(&nodes).unwrap();
        assert_eq!(n[0].slots.len(), 2);
        assert_eq!(n[0].slots[0].memory_mib, 16384);
        assert!(n[1].slots.is_empty());
        let bad = dir.path().join("bad.csv");
        std::fs::write(
            &bad,
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,2,500\n",
        )
        .unwrap();
        assert!(read_pods(&bad).unwrap_err().to_string().contains("line 2"));
    }
}
