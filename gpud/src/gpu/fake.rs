//! The fake GPU backend, for machines without GPUs: GPUs from a spec or a file, with
//! stable UUIDs, MIG layouts and scripted metric curves.

use std::collections::HashMap;

use super::{
    GpuBackend, GpuError, GpuInfo, GpuSample, MigInfo, MigSample, ProcessUse, RemappedRows,
};

/// A metric over time: (seconds since the agent started, value) points, linear in
/// between, the last value held after the last point.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(transparent)]
pub struct Curve(pub Vec<(f64, f64)>);

impl Curve {
    pub fn at(&self, t: f64) -> Option<f64> {
        let pts = &self.0;
        let first = pts.first()?;
        if t <= first.0 {
            return Some(first.1);
        }
        for w in pts.windows(2) {
            let ((t0, v0), (t1, v1)) = (w[0], w[1]);
            if t <= t1 {
                let f = if t1 > t0 { (t - t0) / (t1 - t0) } else { 1.0 };
                return Some(v0 + (v1 - v0) * f);
            }
        }
        pts.last().map(|p| p.1)
    }
}

/// Scripted metrics of fake GPUs (from `--fake-gpus-file`); unset ones are derived
/// from the GPU's processes.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FakeMetrics {
    pub utilization: Curve,
    pub temperature: Curve,
    pub power: Curve,
    pub fan: Curve,
    pub memory_used_mib: Curve,
    pub ecc_uncorrected: Curve,
    /// XID errors: (seconds since the agent started, XID), e.g. `[[30, 79]]`.
    pub xid: Vec<(f64, u32)>,
    pub sm_clock_mhz: Curve,
    pub mem_clock_mhz: Curve,
    /// Cumulative counts: scripted as curves that only rise.
    pub pcie_replays: Curve,
    pub encoder: Curve,
    pub decoder: Curve,
    pub remapped_rows_correctable: Curve,
    pub remapped_rows_uncorrectable: Curve,
    /// Non-zero from when a row remapping failed.
    pub row_remap_failure: Curve,
}

/// Fake GPUs with stable UUIDs derived from the node name and index.
pub struct FakeGpus {
    gpus: Vec<GpuInfo>,
    metrics: Vec<FakeMetrics>,
    /// `--fake-gpus-file`: read again at every discovery, so a test can change the
    /// inventory under a running agent.
    file: Option<(std::path::PathBuf, String)>,
    /// When the agent started (Unix ms): scripted XIDs happen at fixed times after it.
    started_ms: i64,
    /// Energy per GPU UUID: (seconds of the last sample, mJ so far), the power
    /// integrated over the samples.
    energy: std::sync::Mutex<HashMap<String, (f64, f64)>>,
    /// Power limits set (watts) by GPU UUID; the default where none was.
    limits: std::sync::Mutex<HashMap<String, u32>>,
    /// MIG layouts set by `set_mig_layout`, by GPU UUID (over the spec's), and how many
    /// reconfigurations there were (each gives its instances new UUIDs, as MIG does).
    layouts: std::sync::Mutex<(HashMap<String, Vec<crate::gpu::MigInfo>>, u32)>,
}

/// A fake GPU's power range, by model: the data sheets' default limits (A100 SXM
/// 400 W, H100/H200 SXM 700 W, A30 165 W, L4 72 W, T4 70 W, V100 SXM2 300 W) and
/// the lowest limit `nvidia-smi -q -d POWER` reports for them.
pub fn fake_power_range(model: &str) -> crate::gpu::PowerRange {
    let m = model.to_ascii_uppercase();
    let (default_w, min_w) = if m.starts_with("H100") || m.starts_with("H200") {
        (700, 200)
    } else if m.starts_with("A30") {
        (165, 100)
    } else if m.starts_with("L4") {
        (72, 40)
    } else if m.starts_with("T4") {
        (70, 60)
    } else if m.starts_with("V100") {
        (300, 150)
    } else {
        (400, 100)
    };
    crate::gpu::PowerRange {
        default_w,
        min_w,
        max_w: default_w,
    }
}

/// `--fake-gpus-file`: GPUs, MIG layouts and scripted metric curves.
///
/// ```toml
/// [[gpus]]
/// count = 2
/// model = "A100-80GB"
/// mig = ["3g.40gb", "2g.20gb"]      # optional
/// [gpus.metrics]
/// temperature = [[0, 40], [60, 85]]  # [seconds, value]: rising over a minute
/// utilization = [[0, 100]]
/// ```
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FakeFile {
    gpus: Vec<FakeGroup>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FakeGroup {
    #[serde(default = "one")]
    count: u32,
    model: String,
    #[serde(default)]
    mig: Vec<String>,
    #[serde(default)]
    metrics: FakeMetrics,
}

fn one() -> u32 {
    1
}

/// The env variable a process sets to "use" GPU memory on fake GPUs (MiB), so that
/// tests can play a process going over its share. It counts once per process group,
/// on the GPUs the process may open: in a confined job, the job's GPUs (of those its
/// `CUDA_VISIBLE_DEVICES` names, when it names any), as CUDA can open no other;
/// outside one, the GPUs its `CUDA_VISIBLE_DEVICES` names.
pub const FAKE_MEMORY_ENV: &str = "GPUCTL_FAKE_GPU_MEMORY_MIB";

/// The env variable a process sets to "keep busy" its fake GPUs (percent of the GPU's
/// time), counted as its memory is: the per-process utilisation the driver would
/// sample, and the GPU's unscripted utilisation (their sum, at most 100).
pub const FAKE_BUSY_ENV: &str = "GPUCTL_FAKE_GPU_BUSY";

/// A process that declares fake GPU use: (pid, MiB, busy percent, devices).
type FakeProcess = (u32, u64, Option<u32>, Vec<String>);

/// Processes that declare fake GPU memory or busy time: (pid, MiB, busy %,
/// CUDA_VISIBLE_DEVICES entries).
fn fake_processes() -> Vec<FakeProcess> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let mut mib = None;
        let mut busy = None;
        let mut devices: Option<Vec<String>> = None;
        for kv in env.split(|b| *b == 0) {
            let kv = String::from_utf8_lossy(kv);
            if let Some(v) = kv
                .strip_prefix(FAKE_MEMORY_ENV)
                .and_then(|r| r.strip_prefix('='))
            {
                mib = v.trim().parse::<u64>().ok();
            } else if let Some(v) = kv
                .strip_prefix(FAKE_BUSY_ENV)
                .and_then(|r| r.strip_prefix('='))
            {
                busy = v.trim().parse::<u32>().ok().map(|b| b.min(100));
            } else if let Some(v) = kv.strip_prefix("CUDA_VISIBLE_DEVICES=") {
                devices = Some(v.split(',').map(str::to_string).collect());
            }
        }
        if mib.is_some() || busy.is_some() {
            let m = mib.unwrap_or(0);
            let devices = match (crate::devices::granted_to(pid), devices) {
                (Some(granted), Some(named)) => {
                    named.into_iter().filter(|d| granted.contains(d)).collect()
                }
                (Some(granted), None) => granted,
                (None, named) => named.unwrap_or_default(),
            };
            let pgid = crate::procfs::pgid_of(pid).unwrap_or(pid as i32);
            out.push((pgid, pid, m, busy, devices));
        }
    }
    // A job's processes inherit the variable: it counts once per process group (at
    // the group's lowest pid), as the memory of the whole group.
    out.sort_by_key(|p| (p.0, p.1));
    out.dedup_by_key(|p| p.0);
    out.into_iter()
        .map(|(_, pid, m, b, d)| (pid, m, b, d))
        .collect()
}

impl FakeGpus {
    /// Parses `4xA100-80GB`, `2xA100-80GB,1xT4-16GB`, or with a MIG layout per GPU
    /// `2xA100-80GB:mig=3g.40gb+2g.20gb+2g.20gb`. UUIDs derive from `node` (the agent
    /// passes its name and identity), stable across restarts.
    pub fn parse(spec: &str, node: &str) -> Result<FakeGpus, GpuError> {
        let err = |why: &str| GpuError::FakeSpec {
            spec: spec.to_string(),
            why: why.to_string(),
        };
        let mut gpus = Vec::new();
        for item in spec.split(',').map(str::trim) {
            let (item, mig) = match item.split_once(':') {
                Some((gpu, opt)) => {
                    let layout = opt.strip_prefix("mig=").ok_or_else(|| {
                        err(&format!("{opt:?}: the only option is mig=PROFILE+PROFILE"))
                    })?;
                    (gpu, Some(layout))
                }
                None => (item, None),
            };
            let (count, model) = item
                .split_once('x')
                .ok_or_else(|| err(&format!("{item:?} is not COUNTxMODEL-MEMORY")))?;
            let count: u32 = count
                .parse()
                .map_err(|_| err(&format!("{count:?} is not a count")))?;
            let mem = model
                .rsplit_once('-')
                .and_then(|(_, m)| m.strip_suffix("GB"))
                .and_then(|m| m.parse::<u64>().ok())
                .filter(|&m| m > 0)
                .ok_or_else(|| err(&format!("{model:?} does not end in -<N>GB")))?;
            let profiles: Vec<(String, u64)> = match mig {
                None => Vec::new(),
                Some(layout) => layout
                    .split('+')
                    .map(|p| {
                        let mib = gpuctl_sched::mig::profile_memory_mib(p).ok_or_else(|| {
                            err(&format!("MIG profile {p:?} is not like 3g.40gb"))
                        })?;
                        Ok((p.to_string(), mib))
                    })
                    .collect::<Result<_, GpuError>>()?,
            };
            if profiles.iter().map(|p| p.1).sum::<u64>() > mem * 1024 {
                return Err(err(&format!(
                    "MIG layout {mig:?} needs more memory than {model} has"
                )));
            }
            for _ in 0..count {
                let index = gpus.len() as u32;
                let stable = |what: &str| {
                    uuid::Uuid::new_v5(
                        &uuid::Uuid::NAMESPACE_OID,
                        format!("gpuctl-fake/{node}/{index}/{model}{what}").as_bytes(),
                    )
                };
                gpus.push(GpuInfo {
                    index,
                    // As NVML numbers them on real nodes: fake GPU i is /dev/nvidia<i>.
                    minor: index,
                    uuid: format!("GPU-{}", stable("")),
                    model: model.to_string(),
                    memory_mib: mem * 1024,
                    pci_bus_id: format!("00000000:{:02X}:00.0", index + 1),
                    mig: profiles
                        .iter()
                        .enumerate()
                        .map(|(k, (p, m))| MigInfo {
                            uuid: format!("MIG-{}", stable(&format!("/mig{k}/{p}"))),
                            profile: p.clone(),
                            memory_mib: *m,
                            // Numbered in layout order (NVML numbers them by placement).
                            gi_id: k as u32 + 1,
                        })
                        .collect(),
                });
            }
        }
        if gpus.is_empty() || gpus.len() > 64 {
            return Err(err("between 1 and 64 GPUs"));
        }
        let metrics = vec![FakeMetrics::default(); gpus.len()];
        let started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        Ok(FakeGpus {
            gpus,
            metrics,
            file: None,
            started_ms,
            energy: std::sync::Mutex::default(),
            limits: std::sync::Mutex::default(),
            layouts: std::sync::Mutex::default(),
        })
    }

    /// Reads a `--fake-gpus-file` (see [`FakeFile`]).
    pub fn from_file(path: &std::path::Path, node: &str) -> Result<FakeGpus, GpuError> {
        let shown = path.display().to_string();
        let err = |why: String| GpuError::FakeSpec {
            spec: shown.clone(),
            why,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let file: FakeFile = toml::from_str(&text).map_err(|e| err(e.to_string()))?;
        let mut spec = Vec::new();
        let mut metrics = Vec::new();
        for g in &file.gpus {
            let mut item = format!("{}x{}", g.count, g.model);
            if !g.mig.is_empty() {
                item.push_str(&format!(":mig={}", g.mig.join("+")));
            }
            spec.push(item);
            metrics.extend(std::iter::repeat_n(g.metrics.clone(), g.count as usize));
        }
        let mut f = FakeGpus::parse(&spec.join(","), node).map_err(|e| err(e.to_string()))?;
        f.metrics = metrics;
        f.file = Some((path.to_path_buf(), node.to_string()));
        Ok(f)
    }
}

impl GpuBackend for FakeGpus {
    fn kind(&self) -> &'static str {
        "fake"
    }

    fn discover(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let gpus = match &self.file {
            Some((path, node)) => FakeGpus::from_file(path, node)?.gpus,
            None => self.gpus.clone(),
        };
        Ok(self.with_layouts(gpus))
    }

    fn set_mig_layout(&self, uuid: &str, layout: &[String]) -> Result<(), GpuError> {
        let g = (self.gpus.iter().find(|g| g.uuid == uuid))
            .ok_or_else(|| GpuError::Nvml(format!("no GPU {uuid}")))?;
        let mut new = Vec::new();
        if !layout.is_empty() {
            // The driver's rules: the model offers MIG, the profiles are its own, and
            // they have places that do not overlap.
            let rules = gpuctl_sched::mig::model_of(&g.model).ok_or_else(|| {
                GpuError::Nvml(format!("{} offers no MIG (Not Supported)", g.model))
            })?;
            let names: Vec<&str> = layout.iter().map(String::as_str).collect();
            rules.place(&names).map_err(GpuError::Nvml)?;
            new = names
                .iter()
                .map(|p| {
                    (
                        p.to_string(),
                        gpuctl_sched::mig::profile_memory_mib(p).unwrap_or(0),
                    )
                })
                .collect();
        }
        // A reconfiguration takes time (instances are destroyed and created).
        std::thread::sleep(std::time::Duration::from_millis(
            200 + 100 * layout.len() as u64,
        ));
        let mut l = self.layouts.lock().unwrap_or_else(|p| p.into_inner());
        l.1 += 1;
        let round = l.1;
        let instances = (new.into_iter().enumerate())
            .map(|(i, (profile, memory_mib))| crate::gpu::MigInfo {
                uuid: format!(
                    "MIG-{}",
                    uuid::Uuid::new_v5(
                        &uuid::Uuid::NAMESPACE_OID,
                        format!("gpuctl-fake-mig/{uuid}/{round}/{i}").as_bytes(),
                    )
                ),
                profile,
                memory_mib,
                gi_id: i as u32 + 1,
            })
            .collect();
        l.0.insert(uuid.to_string(), instances);
        Ok(())
    }

    fn power_range(&self, uuid: &str) -> Option<crate::gpu::PowerRange> {
        let g = self.gpus.iter().find(|g| g.uuid == uuid)?;
        Some(fake_power_range(&g.model))
    }

    fn set_power_limit(&self, uuid: &str, watts: u32) -> Result<(), GpuError> {
        let range = self
            .power_range(uuid)
            .ok_or_else(|| GpuError::Nvml(format!("no GPU {uuid}")))?;
        if !(range.min_w..=range.max_w).contains(&watts) {
            // As NVML answers a limit outside the constraints.
            return Err(GpuError::Nvml(format!(
                "Invalid Argument: {watts} W is outside {}-{} W",
                range.min_w, range.max_w
            )));
        }
        (self.limits.lock().unwrap_or_else(|p| p.into_inner())).insert(uuid.to_string(), watts);
        Ok(())
    }

    fn sample(&self, secs: f64) -> Result<Vec<GpuSample>, GpuError> {
        let procs = fake_processes();
        // With a file, its current content (GPUs and curves) is what is sampled.
        let reloaded = match &self.file {
            Some((path, node)) => Some(FakeGpus::from_file(path, node)?),
            None => None,
        };
        let me = reloaded.as_ref().unwrap_or(self);
        let gpus = self.with_layouts(me.gpus.clone());
        Ok(gpus
            .iter()
            .zip(&me.metrics)
            .map(|(g, m)| self.sample_one(g, m, &procs, secs))
            .collect())
    }
}

impl FakeGpus {
    /// `gpus` with the MIG layouts set since the agent started.
    fn with_layouts(&self, mut gpus: Vec<GpuInfo>) -> Vec<GpuInfo> {
        let l = self.layouts.lock().unwrap_or_else(|p| p.into_inner());
        for g in &mut gpus {
            if let Some(m) = l.0.get(&g.uuid) {
                g.mig.clone_from(m);
            }
        }
        gpus
    }

    fn sample_one(
        &self,
        g: &GpuInfo,
        m: &FakeMetrics,
        procs: &[FakeProcess],
        secs: f64,
    ) -> GpuSample {
        let mine = |dev: &String| *dev == g.uuid || g.mig.iter().any(|x| x.uuid == *dev);
        let processes: Vec<ProcessUse> = procs
            .iter()
            .filter(|(_, _, _, devs)| devs.iter().any(mine))
            .map(|&(pid, mib, busy, _)| ProcessUse {
                pid,
                mem_used_mib: mib,
                util_pct: busy,
            })
            .collect();
        // Unscripted: what its processes say they keep busy (100 for one that says
        // nothing), at most the whole GPU.
        let busy: u32 = processes.iter().map(|p| p.util_pct.unwrap_or(100)).sum();
        let busy = f64::from(busy.min(100));
        let util = m.utilization.at(secs).unwrap_or(busy).clamp(0.0, 100.0);
        let used = m.memory_used_mib.at(secs).map_or_else(
            || processes.iter().map(|p| p.mem_used_mib).sum::<u64>(),
            |v| v.max(0.0) as u64,
        );
        let range = fake_power_range(&g.model);
        let limit = (self.limits.lock().unwrap_or_else(|p| p.into_inner()))
            .get(&g.uuid)
            .copied()
            .unwrap_or(range.default_w);
        let limit = f64::from(limit);
        // What the work would draw (the A100's curve, scaled to the model's default
        // limit), held to the limit; under a cap the SM clock drops in proportion.
        let demand = m
            .power
            .at(secs)
            .unwrap_or((60.0 + util * 3.4) * f64::from(range.default_w) / 400.0);
        let power_w = demand.min(limit);
        let throttle = if demand > limit { limit / demand } else { 1.0 };
        let count = |c: &Curve| c.at(secs).unwrap_or(0.0).max(0.0) as u64;
        GpuSample {
            uuid: g.uuid.clone(),
            util_pct: util as u32,
            mem_util_pct: (util * 0.6) as u32,
            mem_used_mib: used.min(g.memory_mib),
            temp_c: m.temperature.at(secs).unwrap_or(35.0 + util * 0.4) as u32,
            // HBM runs a few degrees above the core under load.
            mem_temp_c: Some(m.temperature.at(secs).unwrap_or(35.0 + util * 0.4) as u32 + 4),
            fan_pct: Some(m.fan.at(secs).unwrap_or(30.0 + util * 0.5) as u32),
            power_w,
            power_limit_w: limit,
            ecc_uncorrected: Some(count(&m.ecc_uncorrected)),
            processes,
            xid: m
                .xid
                .iter()
                .filter(|(t, _)| *t <= secs)
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .map(|&(t, code)| (code, self.started_ms + (t * 1000.0) as i64)),
            // An A100's range: 210 MHz idle to 1410 MHz busy; HBM2e at 1593 MHz.
            sm_clock_mhz: Some(
                m.sm_clock_mhz
                    .at(secs)
                    .unwrap_or((210.0 + util * 12.0) * throttle) as u32,
            ),
            mem_clock_mhz: Some(m.mem_clock_mhz.at(secs).unwrap_or(1593.0) as u32),
            energy_mj: Some(self.energy_mj(&g.uuid, secs, power_w)),
            pcie_replays: Some(count(&m.pcie_replays)),
            enc_util_pct: Some(m.encoder.at(secs).unwrap_or(0.0).clamp(0.0, 100.0) as u32),
            dec_util_pct: Some(m.decoder.at(secs).unwrap_or(0.0).clamp(0.0, 100.0) as u32),
            remapped_rows: Some(RemappedRows {
                correctable: count(&m.remapped_rows_correctable),
                uncorrectable: count(&m.remapped_rows_uncorrectable),
                pending: false,
                failed: count(&m.row_remap_failure) > 0,
            }),
            mig: g
                .mig
                .iter()
                .map(|x| MigSample {
                    uuid: x.uuid.clone(),
                    mem_used_mib: procs
                        .iter()
                        .filter(|(_, _, _, devs)| devs.contains(&x.uuid))
                        .map(|p| p.1)
                        .sum::<u64>()
                        .min(x.memory_mib),
                })
                .collect(),
        }
    }

    /// The GPU's energy counter: its power integrated from one sample to the next.
    fn energy_mj(&self, uuid: &str, secs: f64, power_w: f64) -> u64 {
        let mut e = self.energy.lock().unwrap_or_else(|p| p.into_inner());
        let (last, total) = e.entry(uuid.to_string()).or_insert((secs, 0.0));
        *total += power_w * (secs - *last).max(0.0) * 1000.0;
        *last = secs;
        *total as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_spec_parses_lists() {
        let f = FakeGpus::parse("2xA100-80GB,1xT4-16GB", "n1").unwrap();
        let g = f.discover().unwrap();
        assert_eq!(g.len(), 3);
        assert_eq!((g[0].model.as_str(), g[0].memory_mib), ("A100-80GB", 81920));
        assert_eq!(
            (g[2].model.as_str(), g[2].memory_mib, g[2].index),
            ("T4-16GB", 16384, 2)
        );
        assert!(
            g.iter()
                .all(|x| x.uuid.starts_with("GPU-") && x.uuid.len() == 40)
        );
    }

    #[test]
    fn fake_uuids_are_stable_and_distinct() {
        let a = FakeGpus::parse("4xA100-80GB", "n1")
            .unwrap()
            .discover()
            .unwrap();
        let b = FakeGpus::parse("4xA100-80GB", "n1")
            .unwrap()
            .discover()
            .unwrap();
        let c = FakeGpus::parse("4xA100-80GB", "n2")
            .unwrap()
            .discover()
            .unwrap();
        assert_eq!(a, b);
        assert_ne!(a[0].uuid, c[0].uuid);
        let mut u: Vec<_> = a.iter().map(|g| &g.uuid).collect();
        u.dedup();
        assert_eq!(u.len(), 4);
    }

    #[test]
    fn curves_interpolate_and_hold() {
        let c = Curve(vec![(0.0, 40.0), (60.0, 85.0)]);
        assert_eq!(c.at(-1.0), Some(40.0));
        assert_eq!(c.at(30.0), Some(62.5));
        assert_eq!(c.at(600.0), Some(85.0));
        assert_eq!(Curve::default().at(1.0), None);
    }

    #[test]
    fn fake_file_with_mig_and_scripted_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("gpus.toml");
        std::fs::write(
            &p,
            "[[gpus]]\ncount = 2\nmodel = \"A100-80GB\"\n[gpus.metrics]\ntemperature = [[0, 40], [60, 85]]\npower = [[0, 100]]\n\n[[gpus]]\nmodel = \"A100-80GB\"\nmig = [\"3g.40gb\", \"2g.20gb\"]\n",
        )
        .unwrap();
        let f = FakeGpus::from_file(&p, "n1").unwrap();
        let g = f.discover().unwrap();
        assert_eq!(g.len(), 3);
        assert_eq!(g[2].mig.len(), 2);
        let s = f.sample(30.0).unwrap();
        assert_eq!(s[0].temp_c, 62);
        assert_eq!(s[1].power_w, 100.0);
        // Unscripted: derived from the (absent) processes.
        assert_eq!(s[2].util_pct, 0);
        assert_eq!(s[2].temp_c, 35);
        std::fs::write(&p, "[[gpus]]\nmodel = \"A100\"\n").unwrap();
        let e = FakeGpus::from_file(&p, "n1").err().unwrap().to_string();
        assert!(e.contains("gpus.toml") && e.contains("-<N>GB"), "{e}");
    }

    #[test]
    fn bad_fake_specs_explain() {
        for bad in [
            "",
            "A100",
            "xA100-80GB",
            "2xA100",
            "2xA100-0GB",
            "100xA100-80GB",
        ] {
            let e = FakeGpus::parse(bad, "n").err().unwrap().to_string();
            assert!(e.contains("bad --fake-gpus spec"), "{bad}: {e}");
        }
    }
}
