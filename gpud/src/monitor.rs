//! GPU monitoring on the node: samples every GPU, maps GPU processes to the jobs that
//! own them (by process group: each job leads its own), enforces GPU-memory shares,
//! and keeps the latest metrics for heartbeats and for the Prometheus endpoint (DCGM
//! exporter names, so existing Grafana dashboards work).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use gpuctl_proto as pb;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::gpu::{GpuInfo, GpuSample};

/// What the monitor needs to know of a running job.
#[derive(Debug, Clone)]
pub struct Watched {
    pub job_id: u64,
    pub attempt: u32,
    /// The job's process group (its leader's pid).
    pub pgid: i32,
    /// What it holds: GPU or MIG UUIDs and, for shares, the memory it may use.
    pub slots: Vec<pb::SlotUse>,
    /// Who submitted it (a metric label).
    pub user: String,
    /// Its cgroup (CPU time and peak memory for heartbeats).
    pub cgroup: Option<crate::cgroup::JobCgroup>,
}

/// A job using more GPU memory than its share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overuse {
    pub job_id: u64,
    pub gpu: String,
    pub used_mib: u64,
    pub share_mib: u64,
}

/// What one sample decided for enforcement.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdicts {
    /// Just went over: warn.
    pub warn: Vec<Overuse>,
    /// Over for longer than the grace: end the job.
    pub kill: Vec<Overuse>,
}

/// Per GPU (by UUID), memory per job id, from the sample's processes.
pub fn job_memory(
    samples: &[GpuSample],
    jobs: &[Watched],
    pgid: impl Fn(u32) -> Option<i32>,
) -> HashMap<String, BTreeMap<u64, (u64, u32)>> {
    let by_pgid: HashMap<i32, u64> = jobs.iter().map(|w| (w.pgid, w.job_id)).collect();
    let mut out: HashMap<String, BTreeMap<u64, (u64, u32)>> = HashMap::new();
    for s in samples {
        let per = out.entry(s.uuid.clone()).or_default();
        for p in &s.processes {
            if let Some(job) = pgid(p.pid).and_then(|g| by_pgid.get(&g)) {
                let e = per.entry(*job).or_default();
                e.0 += p.mem_used_mib;
                e.1 += 1;
            }
        }
    }
    out
}

/// Tracks how long each job has been over its share. Pure apart from the `now` given.
#[derive(Default)]
pub struct Enforcer {
    over_since: HashMap<(u64, String), Instant>,
}

impl Enforcer {
    /// `gpus` maps MIG UUIDs to their parent GPU (processes are seen on the parent).
    pub fn check(
        &mut self,
        gpus: &[GpuInfo],
        jobs: &[Watched],
        usage: &HashMap<String, BTreeMap<u64, (u64, u32)>>,
        grace: Duration,
        now: Instant,
    ) -> Verdicts {
        let parent: HashMap<&str, &str> = gpus
            .iter()
            .flat_map(|g| {
                std::iter::once((g.uuid.as_str(), g.uuid.as_str()))
                    .chain(g.mig.iter().map(|m| (m.uuid.as_str(), g.uuid.as_str())))
            })
            .collect();
        let mut v = Verdicts::default();
        let mut still_over = Vec::new();
        for w in jobs {
            for slot in w.slots.iter().filter(|s| s.memory_mib > 0) {
                let gpu = parent
                    .get(slot.uuid.as_str())
                    .copied()
                    .unwrap_or(&slot.uuid);
                let used = usage
                    .get(gpu)
                    .and_then(|m| m.get(&w.job_id))
                    .map_or(0, |x| x.0);
                if used <= slot.memory_mib {
                    continue;
                }
                let key = (w.job_id, gpu.to_string());
                let o = Overuse {
                    job_id: w.job_id,
                    gpu: gpu.to_string(),
                    used_mib: used,
                    share_mib: slot.memory_mib,
                };
                match self.over_since.get(&key) {
                    None => {
                        self.over_since.insert(key.clone(), now);
                        v.warn.push(o);
                    }
                    Some(since) if now.duration_since(*since) >= grace => v.kill.push(o),
                    Some(_) => {}
                }
                still_over.push(key);
            }
        }
        // Back under (or gone): forget.
        self.over_since.retain(|k, _| still_over.contains(k));
        v
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
#[allow(non_snake_case)] // DCGM exporter's label names
struct GpuLabels {
    gpu: String,
    UUID: String,
    Hostname: String,
    modelName: String,
}

/// A job on a GPU. `hpc_job` as dcgm-exporter names it: a label `job` would collide
/// with Prometheus's own (and become `exported_job`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
#[allow(non_snake_case)] // DCGM exporter's label names
struct JobLabels {
    hpc_job: String,
    user: String,
    gpu: String,
    UUID: String,
    Hostname: String,
}

/// Who holds a GPU: (job id, user) per GPU UUID (a MIG instance counts for its GPU).
pub type Holders = HashMap<String, Vec<(u64, String)>>;

type G = Family<GpuLabels, Gauge<f64, AtomicU64>>;

/// The Prometheus registry with DCGM exporter names.
pub struct Exporter {
    registry: Registry,
    util: G,
    mem_copy_util: G,
    fb_used: G,
    fb_free: G,
    temp: G,
    power: G,
    power_limit: G,
    fan: G,
    ecc_dbe: G,
    job_mem: Family<JobLabels, Gauge<f64, AtomicU64>>,
    job_info: Family<JobLabels, Gauge<f64, AtomicU64>>,
    sample_seconds: Gauge<f64, AtomicU64>,
}

impl Default for Exporter {
    fn default() -> Self {
        Exporter::new()
    }
}

impl Exporter {
    pub fn new() -> Exporter {
        let mut registry = Registry::default();
        let mut fam = |name: &str, help: &str| {
            let f = G::default();
            registry.register(name, help, f.clone());
            f
        };
        let util = fam("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).");
        let mem_copy_util = fam("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).");
        let fb_used = fam("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).");
        let fb_free = fam("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).");
        let temp = fam("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).");
        let power = fam("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).");
        let power_limit = fam(
            "DCGM_FI_DEV_POWER_MGMT_LIMIT",
            "Power management limit (in W).",
        );
        let fan = fam("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).");
        let ecc_dbe = fam(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "Uncorrectable (double-bit) volatile ECC errors.",
        );
        let job_mem = Family::<JobLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "gpuctl_job_gpu_memory_used_mib",
            "GPU memory used by a job's processes on one GPU (in MiB).",
            job_mem.clone(),
        );
        let job_info = Family::<JobLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "gpuctl_gpu_job_info",
            "1 for each job holding a GPU (or a share or MIG instance of it); join it to the DCGM series on UUID, whose own labels stay the same as jobs come and go.",
            job_info.clone(),
        );
        let sample_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "gpuctl_gpud_sample_duration_seconds",
            "How long the last GPU sample took.",
            sample_seconds.clone(),
        );
        Exporter {
            registry,
            util,
            mem_copy_util,
            fb_used,
            fb_free,
            temp,
            power,
            power_limit,
            fan,
            ecc_dbe,
            job_mem,
            job_info,
            sample_seconds,
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
        for f in [
            &self.util,
            &self.mem_copy_util,
            &self.fb_used,
            &self.fb_free,
            &self.temp,
            &self.power,
            &self.power_limit,
            &self.fan,
            &self.ecc_dbe,
        ] {
            f.clear();
        }
        self.job_mem.clear();
        self.job_info.clear();
        for s in samples {
            let Some(g) = gpus.iter().find(|g| g.uuid == s.uuid) else {
                continue;
            };
            let l = GpuLabels {
                gpu: g.index.to_string(),
                UUID: g.uuid.clone(),
                Hostname: host.to_string(),
                modelName: g.model.clone(),
            };
            let job_labels = |job: u64, user: &str| JobLabels {
                hpc_job: job.to_string(),
                user: user.to_string(),
                gpu: g.index.to_string(),
                UUID: s.uuid.clone(),
                Hostname: host.to_string(),
            };
            let held = holders.get(&s.uuid).map_or(&[][..], Vec::as_slice);
            for (job, user) in held {
                self.job_info
                    .get_or_create(&job_labels(*job, user))
                    .set(1.0);
            }
            let set = |f: &G, v: f64| {
                f.get_or_create(&l).set(v);
            };
            set(&self.util, f64::from(s.util_pct));
            set(&self.mem_copy_util, f64::from(s.mem_util_pct));
            set(&self.fb_used, s.mem_used_mib as f64);
            set(
                &self.fb_free,
                g.memory_mib.saturating_sub(s.mem_used_mib) as f64,
            );
            set(&self.temp, f64::from(s.temp_c));
            set(&self.power, s.power_w);
            set(&self.power_limit, s.power_limit_w);
            if let Some(f) = s.fan_pct {
                set(&self.fan, f64::from(f));
            }
            if let Some(e) = s.ecc_uncorrected {
                set(&self.ecc_dbe, e as f64);
            }
            for (job, (mib, _)) in usage.get(&s.uuid).into_iter().flatten() {
                let user = held
                    .iter()
                    .find(|h| h.0 == *job)
                    .map_or("", |h| h.1.as_str());
                self.job_mem
                    .get_or_create(&job_labels(*job, user))
                    .set(*mib as f64);
            }
        }
        self.sample_seconds.set(took.as_secs_f64());
    }

    /// The exposition text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// The latest sample, as heartbeats carry it.
pub fn to_pb(
    samples: &[GpuSample],
    usage: &HashMap<String, BTreeMap<u64, (u64, u32)>>,
    time_ms: i64,
) -> Vec<pb::GpuMetrics> {
    samples
        .iter()
        .map(|s| pb::GpuMetrics {
            uuid: s.uuid.clone(),
            util_pct: s.util_pct,
            mem_util_pct: s.mem_util_pct,
            mem_used_mib: s.mem_used_mib,
            temp_c: s.temp_c,
            fan_pct: s.fan_pct,
            power_w: s.power_w,
            power_limit_w: s.power_limit_w,
            ecc_uncorrected: s.ecc_uncorrected,
            last_xid: s.xid.map(|x| x.0),
            last_xid_ms: s.xid.map_or(0, |x| x.1),
            jobs: usage
                .get(&s.uuid)
                .into_iter()
                .flatten()
                .map(|(job, (mib, n))| pb::JobGpuUse {
                    job_id: *job,
                    mem_used_mib: *mib,
                    processes: *n,
                })
                .collect(),
            time_ms,
        })
        .collect()
}

/// Latest metrics shared between the sampler, heartbeats and the HTTP endpoint.
#[derive(Default)]
pub struct Latest {
    pub metrics: Mutex<Vec<pb::GpuMetrics>>,
}

/// Serves `GET /metrics` (OpenMetrics text) on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, exporter: std::sync::Arc<Exporter>) {
    use axum::http::header::CONTENT_TYPE;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let exporter = exporter.clone();
            async move {
                (
                    [(
                        CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    exporter.encode(),
                )
            }
        }),
    );
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!("metrics server failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::ProcessUse;

    fn gpu(uuid: &str) -> GpuInfo {
        GpuInfo {
            index: 0,
            uuid: uuid.into(),
            model: "A100-80GB".into(),
            memory_mib: 81920,
            pci_bus_id: String::new(),
            mig: Vec::new(),
        }
    }

    fn sample(uuid: &str, procs: &[(u32, u64)]) -> GpuSample {
        GpuSample {
            uuid: uuid.into(),
            processes: procs
                .iter()
                .map(|&(pid, mem_used_mib)| ProcessUse { pid, mem_used_mib })
                .collect(),
            ..GpuSample::default()
        }
    }

    fn watched(job: u64, pgid: i32, share_mib: u64) -> Watched {
        Watched {
            cgroup: None,
            user: String::new(),
            job_id: job,
            attempt: 1,
            pgid,
            slots: vec![pb::SlotUse {
                uuid: "GPU-a".into(),
                compute_milli: 250,
                memory_mib: share_mib,
            }],
        }
    }

    #[test]
    fn processes_map_to_jobs_by_process_group() {
        let s = [sample(
            "GPU-a",
            &[(100, 1000), (101, 500), (200, 300), (300, 7)],
        )];
        let jobs = [watched(1, 100, 2000), watched(2, 200, 2000)];
        let pg = |pid: u32| match pid {
            100 | 101 => Some(100),
            200 => Some(200),
            _ => Some(999),
        };
        let u = job_memory(&s, &jobs, pg);
        assert_eq!(u["GPU-a"][&1], (1500, 2));
        assert_eq!(u["GPU-a"][&2], (300, 1));
        assert_eq!(u["GPU-a"].len(), 2, "a process of no job counts for none");
    }

    #[test]
    fn over_share_warns_then_kills_after_grace_and_forgets_when_back_under() {
        let gpus = [gpu("GPU-a")];
        let jobs = [watched(1, 100, 1000)];
        let mut e = Enforcer::default();
        let t0 = Instant::now();
        let grace = Duration::from_secs(10);
        let over: HashMap<String, BTreeMap<u64, (u64, u32)>> =
            [("GPU-a".to_string(), BTreeMap::from([(1, (1500, 1))]))].into();
        let under: HashMap<String, BTreeMap<u64, (u64, u32)>> =
            [("GPU-a".to_string(), BTreeMap::from([(1, (900, 1))]))].into();
        let v = e.check(&gpus, &jobs, &over, grace, t0);
        assert_eq!(v.warn.len(), 1);
        assert_eq!(v.warn[0].used_mib, 1500);
        assert!(v.kill.is_empty());
        let v = e.check(&gpus, &jobs, &over, grace, t0 + Duration::from_secs(5));
        assert_eq!(v, Verdicts::default());
        // Back under resets the clock.
        e.check(&gpus, &jobs, &under, grace, t0 + Duration::from_secs(6));
        let v = e.check(&gpus, &jobs, &over, grace, t0 + Duration::from_secs(11));
        assert_eq!(v.warn.len(), 1, "a new episode warns again");
        let v = e.check(&gpus, &jobs, &over, grace, t0 + Duration::from_secs(21));
        assert_eq!(v.kill.len(), 1);
        assert_eq!(v.kill[0].share_mib, 1000);
    }

    #[test]
    fn exporter_uses_dcgm_names_and_labels() {
        let ex = Exporter::new();
        let gpus = [gpu("GPU-a")];
        let mut s = sample("GPU-a", &[(100, 1500)]);
        s.util_pct = 87;
        s.temp_c = 71;
        s.mem_used_mib = 1500;
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
        assert!(
            text.contains(
                "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-a\",Hostname=\"n1\",modelName=\"A100-80GB\"} 87.0"
            ),
            "{text}"
        );
        assert!(text.contains("DCGM_FI_DEV_GPU_TEMP{"), "{text}");
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
    }
}
