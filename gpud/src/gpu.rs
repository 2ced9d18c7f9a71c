//! GPUs behind one trait: `Nvml` for real nodes, `FakeGpus` for machines without GPUs.

use std::collections::HashMap;

use gpuctl_proto as pb;

mod fake;
mod mig_nvml;
pub use fake::{Curve, FAKE_MEMORY_ENV, FakeGpus, FakeMetrics};

/// What the agent knows about one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    /// The device node's minor: the GPU is `/dev/nvidia<minor>` (195:minor).
    pub minor: u32,
    pub uuid: String,
    pub model: String,
    pub memory_mib: u64,
    pub pci_bus_id: String,
    /// MIG instances when the GPU is in MIG mode (empty otherwise).
    pub mig: Vec<MigInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigInfo {
    pub uuid: String,
    /// e.g. "3g.40gb".
    pub profile: String,
    pub memory_mib: u64,
    /// NVML's GPU instance id (dcgm-exporter's `GPU_I_ID`).
    pub gi_id: u32,
}

impl GpuInfo {
    /// GPU 0, an A100-80GB with this UUID (the unit tests' GPU).
    #[cfg(test)]
    pub(crate) fn a100_for_tests(uuid: &str) -> GpuInfo {
        GpuInfo {
            index: 0,
            minor: 0,
            uuid: uuid.into(),
            model: "A100-80GB".into(),
            memory_mib: 81920,
            pci_bus_id: String::new(),
            mig: Vec::new(),
        }
    }

    pub fn to_pb(&self) -> pb::Gpu {
        pb::Gpu {
            uuid: self.uuid.clone(),
            model: self.model.clone(),
            memory_mib: self.memory_mib,
            index: self.index,
            pci_bus_id: self.pci_bus_id.clone(),
            mig: self
                .mig
                .iter()
                .map(|m| pb::MigInstance {
                    uuid: m.uuid.clone(),
                    profile: m.profile.clone(),
                    memory_mib: m.memory_mib,
                    allocated_to: 0,
                })
                .collect(),
            ..pb::Gpu::default()
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// Not retryable: no driver on this machine.
    #[error(
        "cannot load NVML (libnvidia-ml.so): {0}. Is the NVIDIA driver installed? To run without GPUs, pass --fake-gpus 4xA100-80GB"
    )]
    NvmlUnavailable(String),
    /// Possibly retryable: the driver answered with an error.
    #[error("NVML query failed: {0}")]
    Nvml(String),
    /// Not retryable: a bad --fake-gpus value.
    #[error(
        "bad --fake-gpus spec {spec:?}: {why} (write e.g. 4xA100-80GB, 2xA100-80GB,1xT4-16GB or 2xA100-80GB:mig=3g.40gb+2g.20gb+2g.20gb)"
    )]
    FakeSpec { spec: String, why: String },
}

/// One sample of one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuSample {
    pub uuid: String,
    pub util_pct: u32,
    pub mem_util_pct: u32,
    pub mem_used_mib: u64,
    pub temp_c: u32,
    /// HBM temperature, where the GPU reports it (dcgm's DCGM_FI_DEV_MEMORY_TEMP).
    pub mem_temp_c: Option<u32>,
    pub fan_pct: Option<u32>,
    pub power_w: f64,
    pub power_limit_w: f64,
    pub ecc_uncorrected: Option<u64>,
    /// Processes using the GPU (or one of its MIG instances) and their memory.
    pub processes: Vec<ProcessUse>,
    /// The latest critical XID error and when it happened (Unix ms).
    pub xid: Option<(u32, i64)>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    /// Energy used since the driver loaded (mJ).
    pub energy_mj: Option<u64>,
    pub pcie_replays: Option<u64>,
    pub enc_util_pct: Option<u32>,
    pub dec_util_pct: Option<u32>,
    pub remapped_rows: Option<RemappedRows>,
    /// Each MIG instance's own memory use (GPUs in MIG mode).
    pub mig: Vec<MigSample>,
}

/// Row remapping (Ampere and later): rows remapped for correctable and uncorrectable
/// errors, whether a remapping waits for a GPU reset, and whether one failed (the GPU
/// needs service).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemappedRows {
    pub correctable: u64,
    pub uncorrectable: u64,
    pub pending: bool,
    pub failed: bool,
}

/// One MIG instance's sample.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigSample {
    pub uuid: String,
    pub mem_used_mib: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessUse {
    pub pid: u32,
    pub mem_used_mib: u64,
    /// Its share of the GPU's time (percent), where the driver samples it per
    /// process (NVML's process utilisation over the last seconds).
    pub util_pct: Option<u32>,
}

/// Where the agent's GPUs come from.
pub trait GpuBackend: Send + Sync {
    /// "nvml" or "fake"; shown in `gpuctl nodes --json`.
    fn kind(&self) -> &'static str;
    fn discover(&self) -> Result<Vec<GpuInfo>, GpuError>;
    /// Current metrics of every GPU, `secs` seconds after the agent started.
    fn sample(&self, secs: f64) -> Result<Vec<GpuSample>, GpuError>;
    /// A GPU's power limit range (NVML's default limit and constraints); `None` where
    /// the driver gives none (its limit is then left alone).
    fn power_range(&self, uuid: &str) -> Option<PowerRange>;
    /// Sets a GPU's power management limit (within `power_range`; root on NVML).
    fn set_power_limit(&self, uuid: &str, watts: u32) -> Result<(), GpuError>;
    /// Reconfigures a GPU that holds no job to the MIG `layout` (profiles; empty: the
    /// whole GPU, MIG off). On error the GPU is as it was.
    fn set_mig_layout(&self, uuid: &str, layout: &[String]) -> Result<(), GpuError>;
}

/// A GPU's power limits, in watts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PowerRange {
    pub default_w: u32,
    pub min_w: u32,
    pub max_w: u32,
}

/// Real GPUs through NVML.
pub struct Nvml {
    nvml: nvml_wrapper::Nvml,
    /// The same library through nvml-wrapper-sys, for the calls nvml-wrapper 0.11 does
    /// not wrap (MIG handles, GPU instance ids, remapped rows); each symbol is checked
    /// before use, so an older driver without one only loses that figure.
    sys: Option<nvml_wrapper_sys::bindings::NvmlLib>,
    /// The latest critical XID per GPU UUID and when (Unix ms), from `watch_xids`.
    xids: std::sync::Arc<std::sync::Mutex<HashMap<String, (u32, i64)>>>,
}

/// Waits for NVML's critical XID events on every GPU (a thread of its own: the wait
/// blocks) and records the latest per GPU. Where events are not supported it says so
/// once and ends.
fn watch_xids(xids: std::sync::Arc<std::sync::Mutex<HashMap<String, (u32, i64)>>>) {
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enums::event::XidError;
    use nvml_wrapper::error::NvmlError;
    let Ok(nvml) = nvml_wrapper::Nvml::init() else {
        return;
    };
    let Ok(mut set) = nvml.create_event_set() else {
        tracing::warn!("NVML events unavailable: XID errors will not be seen");
        return;
    };
    let count = nvml.device_count().unwrap_or(0);
    let mut watched = 0;
    for i in 0..count {
        let Ok(d) = nvml.device_by_index(i) else {
            continue;
        };
        let supported = d
            .supported_event_types()
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
        if !supported {
            tracing::warn!(gpu = i, "this GPU reports no XID events");
            continue;
        }
        match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                watched += 1;
            }
            Err(e) => {
                // The set went with the failed call.
                tracing::warn!(gpu = i, "no XID events: {}", e.error);
                return;
            }
        }
    }
    if watched == 0 {
        return;
    }
    loop {
        match set.wait(5_000) {
            Ok(ev) => {
                let (Some(XidError::Value(code)), Ok(uuid)) = (ev.event_data, ev.device.uuid())
                else {
                    continue;
                };
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                tracing::error!(gpu = %uuid, xid = code, "critical XID error");
                xids.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(uuid, (code as u32, now));
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::warn!("waiting for NVML events failed: {e}; XID errors will not be seen");
                return;
            }
        }
    }
}

impl Nvml {
    pub fn init() -> Result<Nvml, GpuError> {
        let nvml =
            nvml_wrapper::Nvml::init().map_err(|e| GpuError::NvmlUnavailable(e.to_string()))?;
        let xids = std::sync::Arc::default();
        let watched = std::sync::Arc::clone(&xids);
        let _ = std::thread::Builder::new()
            .name("nvml-xid".into())
            .spawn(move || watch_xids(watched));
        // SAFETY: loads the library NVML already has loaded (dlopen refcounts it).
        let sys = unsafe { nvml_wrapper_sys::bindings::NvmlLib::new("libnvidia-ml.so.1") }
            .map_err(|e| tracing::warn!("MIG instances and remapped rows unavailable: {e}"))
            .ok();
        Ok(Nvml { nvml, sys, xids })
    }
}

impl Nvml {
    /// The MIG instances' device handles of a GPU in MIG mode (none otherwise), each
    /// with its GPU instance id. nvml-wrapper 0.11 does not wrap the MIG handle calls:
    /// they go through nvml-wrapper-sys on the same library, and each handle is then
    /// used through the safe `Device`.
    fn mig_devices<'n>(
        &'n self,
        d: &nvml_wrapper::Device<'n>,
    ) -> Result<Vec<(nvml_wrapper::Device<'n>, u32)>, GpuError> {
        use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_enum_NVML_SUCCESS};
        match d.mig_mode() {
            Ok(m) if m.current == 1 => {}
            // Not MIG-capable, or MIG disabled.
            _ => return Ok(Vec::new()),
        }
        let Some(lib) = self.sys.as_ref().filter(|l| {
            l.nvmlDeviceGetMaxMigDeviceCount.is_ok()
                && l.nvmlDeviceGetMigDeviceHandleByIndex.is_ok()
        }) else {
            return Err(GpuError::Nvml(
                "a GPU is in MIG mode but this NVML has no MIG device calls".into(),
            ));
        };
        // SAFETY: the handle is only passed to NVML calls below.
        let handle = unsafe { d.handle() };
        let mut max = 0u32;
        // SAFETY: a valid device handle and an out-pointer to a local; the symbol exists.
        let rc = unsafe { lib.nvmlDeviceGetMaxMigDeviceCount(handle, &mut max) };
        if rc != nvmlReturn_enum_NVML_SUCCESS {
            return Err(GpuError::Nvml(format!(
                "nvmlDeviceGetMaxMigDeviceCount returned NVML error {rc}"
            )));
        }
        let mut out = Vec::new();
        for i in 0..max {
            let mut mig: nvmlDevice_t = std::ptr::null_mut();
            // SAFETY: as above.
            let rc = unsafe { lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, i, &mut mig) };
            if rc != nvmlReturn_enum_NVML_SUCCESS {
                // Empty index: no instance was created there.
                continue;
            }
            let mut gi = 0u32;
            if lib.nvmlDeviceGetGpuInstanceId.is_ok() {
                // SAFETY: a MIG device handle NVML just gave, an out-pointer to a local.
                unsafe { lib.nvmlDeviceGetGpuInstanceId(mig, &mut gi) };
            }
            // SAFETY: the handle is NVML's and lives as long as the library.
            out.push((unsafe { nvml_wrapper::Device::new(mig, &self.nvml) }, gi));
        }
        Ok(out)
    }

    /// MIG instances of a GPU in MIG mode (empty otherwise).
    fn mig_instances(&self, d: &nvml_wrapper::Device<'_>) -> Result<Vec<MigInfo>, GpuError> {
        let en = |x: nvml_wrapper::error::NvmlError| GpuError::Nvml(x.to_string());
        self.mig_devices(d)?
            .into_iter()
            .map(|(md, gi_id)| {
                Ok(MigInfo {
                    uuid: md.uuid().map_err(en)?,
                    profile: mig_profile_of(&md.name().map_err(en)?),
                    memory_mib: md.memory_info().map_err(en)?.total / (1024 * 1024),
                    gi_id,
                })
            })
            .collect()
    }

    /// Remapped rows, where the GPU and the library have them.
    fn remapped_rows(&self, d: &nvml_wrapper::Device<'_>) -> Option<RemappedRows> {
        let lib = self
            .sys
            .as_ref()
            .filter(|l| l.nvmlDeviceGetRemappedRows.is_ok())?;
        let (mut corr, mut unc, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
        // SAFETY: a valid device handle and out-pointers to locals; the symbol exists.
        let rc = unsafe {
            lib.nvmlDeviceGetRemappedRows(
                d.handle(),
                &mut corr,
                &mut unc,
                &mut pending,
                &mut failed,
            )
        };
        (rc == nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS).then_some(RemappedRows {
            correctable: u64::from(corr),
            uncorrectable: u64::from(unc),
            pending: pending != 0,
            failed: failed != 0,
        })
    }
}

/// The memory (HBM) temperature through NVML's field values (`NVML_FI_DEV_MEMORY_TEMP`),
/// where the GPU has a sensor there (data-center GPUs do).
fn memory_temp(d: &nvml_wrapper::Device<'_>) -> Option<u32> {
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    let id = FieldId(nvml_wrapper_sys::bindings::field_id::NVML_FI_DEV_MEMORY_TEMP);
    let v = d
        .field_values_for(&[id])
        .ok()?
        .into_iter()
        .next()?
        .ok()?
        .value
        .ok()?;
    match v {
        SampleValue::U32(t) => Some(t),
        SampleValue::U64(t) => u32::try_from(t).ok(),
        SampleValue::I64(t) => u32::try_from(t).ok(),
        SampleValue::F64(t) => Some(t as u32),
    }
    .filter(|&t| t > 0)
}

/// "NVIDIA A100-SXM4-40GB MIG 3g.20gb" -> "3g.20gb".
fn mig_profile_of(name: &str) -> String {
    name.rsplit_once("MIG ")
        .map_or(name, |(_, p)| p)
        .trim()
        .to_string()
}

impl GpuBackend for Nvml {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn discover(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let e = |e: nvml_wrapper::error::NvmlError| GpuError::Nvml(e.to_string());
        let count = self.nvml.device_count().map_err(e)?;
        let mut gpus = Vec::new();
        for index in 0..count {
            let d = self.nvml.device_by_index(index).map_err(e)?;
            gpus.push(GpuInfo {
                index,
                minor: d.minor_number().unwrap_or(index),
                uuid: d.uuid().map_err(e)?,
                model: d.name().map_err(e)?,
                memory_mib: d.memory_info().map_err(e)?.total / (1024 * 1024),
                pci_bus_id: d.pci_info().map_err(e)?.bus_id,
                mig: self.mig_instances(&d)?,
            });
        }
        Ok(gpus)
    }

    fn power_range(&self, uuid: &str) -> Option<PowerRange> {
        let d = self.nvml.device_by_uuid(uuid).ok()?;
        let default = d.power_management_limit_default().ok()?;
        let c = d.power_management_limit_constraints().ok()?;
        Some(PowerRange {
            default_w: default / 1000,
            min_w: c.min_limit / 1000,
            max_w: c.max_limit / 1000,
        })
    }

    fn set_power_limit(&self, uuid: &str, watts: u32) -> Result<(), GpuError> {
        let e = |e: nvml_wrapper::error::NvmlError| GpuError::Nvml(e.to_string());
        let mut d = self.nvml.device_by_uuid(uuid).map_err(e)?;
        d.set_power_management_limit(watts.saturating_mul(1000))
            .map_err(e)
    }

    fn set_mig_layout(&self, uuid: &str, layout: &[String]) -> Result<(), GpuError> {
        crate::gpu::mig_nvml::set_layout(self, uuid, layout)
    }

    fn sample(&self, _secs: f64) -> Result<Vec<GpuSample>, GpuError> {
        use nvml_wrapper::enum_wrappers::device::{
            Clock, EccCounter, MemoryError, TemperatureSensor,
        };
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let e = |e: nvml_wrapper::error::NvmlError| GpuError::Nvml(e.to_string());
        let count = self.nvml.device_count().map_err(e)?;
        let mut out = Vec::new();
        for index in 0..count {
            let d = self.nvml.device_by_index(index).map_err(e)?;
            let util = d.utilization_rates().ok();
            let mem = d.memory_info().map_err(e)?;
            // Compute and graphics processes; on MIG GPUs NVML lists them on the parent.
            let mut processes: Vec<ProcessUse> = d
                .running_compute_processes()
                .unwrap_or_default()
                .into_iter()
                .chain(d.running_graphics_processes().unwrap_or_default())
                .map(|p| ProcessUse {
                    pid: p.pid,
                    mem_used_mib: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => b / (1024 * 1024),
                        UsedGpuMemory::Unavailable => 0,
                    },
                    util_pct: None,
                })
                .collect();
            processes.sort_by_key(|p| p.pid);
            processes.dedup_by_key(|p| p.pid);
            process_utilization(&d, &mut processes);
            out.push(GpuSample {
                uuid: d.uuid().map_err(e)?,
                util_pct: util.as_ref().map_or(0, |u| u.gpu),
                mem_util_pct: util.as_ref().map_or(0, |u| u.memory),
                mem_used_mib: mem.used / (1024 * 1024),
                temp_c: d.temperature(TemperatureSensor::Gpu).unwrap_or(0),
                mem_temp_c: memory_temp(&d),
                fan_pct: d.fan_speed(0).ok(),
                power_w: d.power_usage().map_or(0.0, |mw| f64::from(mw) / 1000.0),
                power_limit_w: d
                    .enforced_power_limit()
                    .map_or(0.0, |mw| f64::from(mw) / 1000.0),
                ecc_uncorrected: d
                    .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                    .ok(),
                xid: self
                    .xids
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&d.uuid().map_err(e)?)
                    .copied(),
                processes,
                sm_clock_mhz: d.clock_info(Clock::SM).ok(),
                mem_clock_mhz: d.clock_info(Clock::Memory).ok(),
                energy_mj: d.total_energy_consumption().ok(),
                pcie_replays: d.pcie_replay_counter().ok().map(u64::from),
                enc_util_pct: d.encoder_utilization().ok().map(|u| u.utilization),
                dec_util_pct: d.decoder_utilization().ok().map(|u| u.utilization),
                remapped_rows: self.remapped_rows(&d),
                // A MIG instance has its own memory; NVML has no SM activity per
                // instance (that is DCGM's profiling), so utilisation stays the GPU's.
                mig: self
                    .mig_devices(&d)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|(md, _)| {
                        Some(MigSample {
                            uuid: md.uuid().ok()?,
                            mem_used_mib: md.memory_info().ok()?.used / (1024 * 1024),
                        })
                    })
                    .collect(),
            });
        }
        Ok(out)
    }
}

/// Each process's SM share over the driver's last samples (about the last second or
/// few; the newest sample of each pid), where the driver keeps them: what tells a
/// GPU's holder's use from its borrowers' (`gpuctl_core::opportunistic`).
fn process_utilization(d: &nvml_wrapper::Device<'_>, processes: &mut [ProcessUse]) {
    let Ok(samples) = d.process_utilization_stats(None) else {
        return;
    };
    for p in processes.iter_mut() {
        p.util_pct = samples
            .iter()
            .filter(|s| s.pid == p.pid)
            .max_by_key(|s| s.timestamp)
            .map(|s| s.sm_util.min(100));
    }
}
