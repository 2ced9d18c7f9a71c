//! The agent's Prometheus endpoint (`gpud --metrics-listen ADDR`, `GET /metrics`), with
//! dcgm-exporter's default counters, names and labels, so that the DCGM dashboards
//! people already run (Grafana 12239) work on gpuctl nodes unchanged.
//!
//! A GPU's series are labelled `gpu`, `UUID`, `Hostname`, `modelName`; a MIG instance's
//! also `GPU_I_PROFILE` and `GPU_I_ID`, as dcgm-exporter does. Who holds a GPU is its
//! own series (`gpuctl_gpu_job_info{hpc_job,user,...}`, a MIG instance's job counted
//! for its GPU; `gpuctl_mig_job_info` per instance), so the GPU's series keep their
//! labels as jobs come and go. Every value is a gauge: dcgm-exporter's counters
//! (energy, PCIe replays) would get a `_total` suffix as OpenMetrics counters, and the
//! dashboards query them by their DCGM names.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::gpu::{GpuInfo, GpuSample};

/// A GPU, or one MIG instance of it: (`GPU_I_PROFILE`, `GPU_I_ID`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct GpuLabels {
    gpu: String,
    uuid: String,
    host: String,
    model: String,
    instance: Option<(String, String)>,
}

impl EncodeLabelSet for GpuLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let mut pairs = vec![
            ("gpu", self.gpu.as_str()),
            ("UUID", self.uuid.as_str()),
            ("Hostname", self.host.as_str()),
            ("modelName", self.model.as_str()),
        ];
        if let Some((profile, id)) = &self.instance {
            pairs.push(("GPU_I_PROFILE", profile));
            pairs.push(("GPU_I_ID", id));
        }
        pairs.encode(encoder)
    }
}

/// A job on a GPU (or on one MIG instance of it). `hpc_job` as dcgm-exporter names
/// it: a label `job` would collide with Prometheus's own (and become `exported_job`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct JobLabels {
    job: String,
    user: String,
    gpu: GpuLabels,
}

impl EncodeLabelSet for JobLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let mut pairs = vec![
            ("hpc_job", self.job.as_str()),
            ("user", self.user.as_str()),
            ("gpu", self.gpu.gpu.as_str()),
            ("UUID", self.gpu.uuid.as_str()),
            ("Hostname", self.gpu.host.as_str()),
        ];
        if let Some((profile, id)) = &self.gpu.instance {
            pairs.push(("GPU_I_PROFILE", profile));
            pairs.push(("GPU_I_ID", id));
        }
        pairs.encode(encoder)
    }
}

/// Who holds what: (job id, user) per GPU UUID (a job on a MIG instance is listed under
/// its GPU and under the instance's UUID).
pub type Holders = HashMap<String, Vec<(u64, String)>>;

type G = Family<GpuLabels, Gauge<f64, AtomicU64>>;
type J = Family<JobLabels, Gauge<f64, AtomicU64>>;

/// The DCGM fields exported: name and help (dcgm-exporter's default counters that
/// NVML gives; its profiling fields need DCGM itself).
const FIELDS: &[(&str, &str)] = &[
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    (
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "Power management limit (in W).",
    ),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "Total number of PCIe retries.",
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %)."),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
    ),
    ("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Uncorrectable (double-bit) volatile ECC errors.",
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors.",
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors.",
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed.",
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "Whether a row remapping waits for a GPU reset.",
    ),
];

/// The Prometheus registry with DCGM exporter names.
pub struct Exporter {
    registry: Registry,
    fields: HashMap<&'static str, G>,
    job_mem: J,
    job_info: J,
    mig_job_info: J,
    sample_seconds: Gauge<f64, AtomicU64>,
    /// The metrics listener's own connection counters.
    pub conns: gpuctl_proto::guard_metrics::Connections,
}

impl Default for Exporter {
    fn default() -> Self {
        Exporter::new()
    }
}

/// One GPU's (or instance's) values by field name; absent ones are not exported.
fn values(g: &GpuInfo, s: &GpuSample) -> Vec<(&'static str, f64)> {
    let f = |v: u32| Some(f64::from(v));
    let remap = s.remapped_rows;
    [
        ("DCGM_FI_DEV_SM_CLOCK", s.sm_clock_mhz.and_then(f)),
        ("DCGM_FI_DEV_MEM_CLOCK", s.mem_clock_mhz.and_then(f)),
        ("DCGM_FI_DEV_GPU_TEMP", f(s.temp_c)),
        ("DCGM_FI_DEV_MEMORY_TEMP", s.mem_temp_c.and_then(f)),
        ("DCGM_FI_DEV_POWER_USAGE", Some(s.power_w)),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT", Some(s.power_limit_w)),
        (
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            s.energy_mj.map(|v| v as f64),
        ),
        (
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            s.pcie_replays.map(|v| v as f64),
        ),
        ("DCGM_FI_DEV_GPU_UTIL", f(s.util_pct)),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", f(s.mem_util_pct)),
        ("DCGM_FI_DEV_ENC_UTIL", s.enc_util_pct.and_then(f)),
        ("DCGM_FI_DEV_DEC_UTIL", s.dec_util_pct.and_then(f)),
        ("DCGM_FI_DEV_XID_ERRORS", f(s.xid.map_or(0, |x| x.0))),
        ("DCGM_FI_DEV_FAN_SPEED", s.fan_pct.and_then(f)),
        (
            "DCGM_FI_DEV_FB_FREE",
            Some(g.memory_mib.saturating_sub(s.mem_used_mib) as f64),
        ),
        ("DCGM_FI_DEV_FB_USED", Some(s.mem_used_mib as f64)),
        (
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            s.ecc_uncorrected.map(|v| v as f64),
        ),
        (
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            remap.map(|r| r.uncorrectable as f64),
        ),
        (
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            remap.map(|r| r.correctable as f64),
        ),
        (
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            remap.map(|r| f64::from(u8::from(r.failed))),
        ),
        (
            "DCGM_FI_DEV_ROW_REMAP_PENDING",
            remap.map(|r| f64::from(u8::from(r.pending))),
        ),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k, v?)))
    .collect()
}

impl Exporter {
    pub fn new() -> Exporter {
        let mut registry = Registry::default();
        let mut fields = HashMap::new();
        for (name, help) in FIELDS {
            let f = G::default();
            registry.register(*name, help.trim_end_matches('.'), f.clone());
            fields.insert(*name, f);
        }
        let job_mem = J::default();
        registry.register(
            "gpuctl_job_gpu_memory_used_mib",
            "GPU memory used by a job's processes on one GPU (in MiB)",
            job_mem.clone(),
        );
        let job_info = J::default();
        registry.register(
            "gpuctl_gpu_job_info",
            "1 for each job holding a GPU (or a share or MIG instance of it); join it to the DCGM series on UUID, whose own labels stay the same as jobs come and go",
            job_info.clone(),
        );
        let mig_job_info = J::default();
        registry.register(
            "gpuctl_mig_job_info",
            "1 for each job on a MIG instance, labelled with the instance (GPU_I_PROFILE, GPU_I_ID); join it to the instance's DCGM series on UUID and GPU_I_ID",
            mig_job_info.clone(),
        );
        let sample_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "gpuctl_gpud_sample_duration_seconds",
            "How long the last GPU sample took",
            sample_seconds.clone(),
        );
        let conns = gpuctl_proto::guard_metrics::Connections::default();
        conns.register(&mut registry);
        Exporter {
            conns,
            registry,
            fields,
            job_mem,
            job_info,
            mig_job_info,
            sample_seconds,
        }
    }

    fn set(&self, field: &str, l: &GpuLabels, v: f64) {
        if let Some(f) = self.fields.get(field) {
            f.get_or_create(l).set(v);
        }
    }

    /// Replaces every series with the latest sample.
    pub fn update(
        &self,
        host: &str,
        gpus: &[GpuInfo],
        samples: &[GpuSample],
        usage: &HashMap<String, BTreeMap<u64, (u64, u32)>>,
        holders: &Holders,
        took: Duration,
    ) {
        for f in self.fields.values() {
            f.clear();
        }
        self.job_mem.clear();
        self.job_info.clear();
        self.mig_job_info.clear();
        for s in samples {
            let Some(g) = gpus.iter().find(|g| g.uuid == s.uuid) else {
                continue;
            };
            let l = GpuLabels {
                gpu: g.index.to_string(),
                uuid: g.uuid.clone(),
                host: host.to_string(),
                model: g.model.clone(),
                instance: None,
            };
            let job = |job: u64, user: &str, gpu: &GpuLabels| JobLabels {
                job: job.to_string(),
                user: user.to_string(),
                gpu: gpu.clone(),
            };
            let held = holders.get(&s.uuid).map_or(&[][..], Vec::as_slice);
            for (id, user) in held {
                self.job_info.get_or_create(&job(*id, user, &l)).set(1.0);
            }
            for (field, v) in values(g, s) {
                self.set(field, &l, v);
            }
            for (id, (mib, _)) in usage.get(&s.uuid).into_iter().flatten() {
                let user = held
                    .iter()
                    .find(|h| h.0 == *id)
                    .map_or("", |h| h.1.as_str());
                self.job_mem
                    .get_or_create(&job(*id, user, &l))
                    .set(*mib as f64);
            }
            // MIG instances: their own memory, and who holds each.
            for m in &g.mig {
                let il = GpuLabels {
                    instance: Some((m.profile.clone(), m.gi_id.to_string())),
                    ..l.clone()
                };
                if let Some(ms) = s.mig.iter().find(|x| x.uuid == m.uuid) {
                    self.set("DCGM_FI_DEV_FB_USED", &il, ms.mem_used_mib as f64);
                    let free = m.memory_mib.saturating_sub(ms.mem_used_mib);
                    self.set("DCGM_FI_DEV_FB_FREE", &il, free as f64);
                }
                for (id, user) in holders.get(&m.uuid).into_iter().flatten() {
                    self.mig_job_info
                        .get_or_create(&job(*id, user, &il))
                        .set(1.0);
                }
            }
        }
        self.sample_seconds.set(took.as_secs_f64());
    }

    /// The exposition text.
    pub fn encode(&self) -> String {
        self.conns.update();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Serves `GET /metrics` (OpenMetrics text) on `listener` until the process ends.
pub async fn serve(
    listener: gpuctl_proto::guard::Listener<tokio::net::TcpListener>,
    exporter: std::sync::Arc<Exporter>,
) {
    gpuctl_proto::process::serve_metrics(listener, move || exporter.encode()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{MigInfo, MigSample, ProcessUse, RemappedRows};

    #[test]
    fn exporter_uses_dcgm_names_and_labels() {
        let ex = Exporter::new();
        let gpus = [GpuInfo::a100_for_tests("GPU-a")];
        let s = GpuSample {
            uuid: "GPU-a".into(),
            processes: vec![ProcessUse {
                pid: 100,
                mem_used_mib: 1500,
                util_pct: None,
            }],
            util_pct: 87,
            temp_c: 71,
            mem_temp_c: Some(75),
            mem_used_mib: 1500,
            sm_clock_mhz: Some(1410),
            energy_mj: Some(123_456),
            xid: Some((79, 1)),
            remapped_rows: Some(RemappedRows {
                correctable: 2,
                failed: true,
                ..Default::default()
            }),
            ..GpuSample::default()
        };
        let usage: HashMap<String, BTreeMap<u64, (u64, u32)>> =
            [("GPU-a".to_string(), BTreeMap::from([(7, (1500, 1))]))].into();
        let holders: Holders = [("GPU-a".to_string(), vec![(7, "alice".to_string())])].into();
        ex.update(
            "n1",
            &gpus,
            &[s],
            &usage,
            &holders,
            Duration::from_millis(3),
        );
        let text = ex.encode();
        let gpu = "{gpu=\"0\",UUID=\"GPU-a\",Hostname=\"n1\",modelName=\"A100-80GB\"}";
        for line in [
            format!("DCGM_FI_DEV_GPU_UTIL{gpu} 87.0"),
            format!("DCGM_FI_DEV_GPU_TEMP{gpu} 71.0"),
            format!("DCGM_FI_DEV_MEMORY_TEMP{gpu} 75.0"),
            format!("DCGM_FI_DEV_SM_CLOCK{gpu} 1410.0"),
            format!("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu} 123456.0"),
            format!("DCGM_FI_DEV_XID_ERRORS{gpu} 79.0"),
            format!("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{gpu} 2.0"),
            format!("DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu} 1.0"),
            format!("DCGM_FI_DEV_FB_FREE{gpu} 80420.0"),
        ] {
            assert!(text.contains(&line), "{line} not in\n{text}");
        }
        // Not given by this GPU: not exported (no made-up zero).
        assert!(!text.contains("DCGM_FI_DEV_MEM_CLOCK{"), "{text}");
        assert!(
            text.contains(
                "gpuctl_job_gpu_memory_used_mib{hpc_job=\"7\",user=\"alice\",gpu=\"0\",UUID=\"GPU-a\",Hostname=\"n1\"} 1500.0"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "gpuctl_gpu_job_info{hpc_job=\"7\",user=\"alice\",gpu=\"0\",UUID=\"GPU-a\",Hostname=\"n1\"} 1.0"
            ),
            "{text}"
        );
        assert!(
            !text.contains("{job=") && !text.contains(",job="),
            "no label named job: {text}"
        );
        // DCGM's counters are gauges by name; the one counter is the listener's own.
        assert!(
            !text
                .lines()
                .any(|l| l.contains("_total") && !l.contains("gpuctl_connections_refused")),
            "{text}"
        );
        // One full stop at the end of each HELP (the encoder adds it).
        assert!(!text.contains("..\n"), "{text}");
    }

    #[test]
    fn mig_instances_get_their_own_series() {
        let ex = Exporter::new();
        let mut g = GpuInfo::a100_for_tests("GPU-m");
        g.mig = vec![
            MigInfo {
                uuid: "MIG-1".into(),
                profile: "3g.40gb".into(),
                memory_mib: 40960,
                gi_id: 1,
            },
            MigInfo {
                uuid: "MIG-2".into(),
                profile: "3g.40gb".into(),
                memory_mib: 40960,
                gi_id: 2,
            },
        ];
        let s = GpuSample {
            uuid: "GPU-m".into(),
            mem_used_mib: 5000,
            mig: vec![
                MigSample {
                    uuid: "MIG-1".into(),
                    mem_used_mib: 5000,
                },
                MigSample {
                    uuid: "MIG-2".into(),
                    mem_used_mib: 0,
                },
            ],
            ..GpuSample::default()
        };
        let holders: Holders = [
            ("GPU-m".to_string(), vec![(9, "bob".to_string())]),
            ("MIG-1".to_string(), vec![(9, "bob".to_string())]),
        ]
        .into();
        ex.update("n1", &[g], &[s], &HashMap::new(), &holders, Duration::ZERO);
        let text = ex.encode();
        let base = "gpu=\"0\",UUID=\"GPU-m\",Hostname=\"n1\",modelName=\"A100-80GB\"";
        for line in [
            format!("DCGM_FI_DEV_FB_USED{{{base}}} 5000.0"),
            format!(
                "DCGM_FI_DEV_FB_USED{{{base},GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"1\"}} 5000.0"
            ),
            format!(
                "DCGM_FI_DEV_FB_FREE{{{base},GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"2\"}} 40960.0"
            ),
            "gpuctl_mig_job_info{hpc_job=\"9\",user=\"bob\",gpu=\"0\",UUID=\"GPU-m\",Hostname=\"n1\",GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"1\"} 1.0".to_string(),
            // The GPU's own holder series counts the job once, without instance labels.
            "gpuctl_gpu_job_info{hpc_job=\"9\",user=\"bob\",gpu=\"0\",UUID=\"GPU-m\",Hostname=\"n1\"} 1.0".to_string(),
        ] {
            assert!(text.contains(&line), "{line} not in\n{text}");
        }
        assert!(!text.contains("GPU_I_ID=\"2\"} 1.0"), "{text}");
    }
}
