//! GPUs behind one trait: `Nvml` for real nodes, `FakeGpus` for machines without GPUs.

use gpuctl_proto as pb;

/// What the agent knows about one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
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
}

impl GpuInfo {
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

/// Where the agent's GPUs come from.
pub trait GpuBackend: Send + Sync {
    /// "nvml" or "fake"; shown in `gpuctl nodes --json`.
    fn kind(&self) -> &'static str;
    fn discover(&self) -> Result<Vec<GpuInfo>, GpuError>;
}

/// Fake GPUs with stable UUIDs derived from the node name and index.
pub struct FakeGpus {
    gpus: Vec<GpuInfo>,
}

impl FakeGpus {
    /// Parses `4xA100-80GB`, `2xA100-80GB,1xT4-16GB`, or with a MIG layout per GPU
    /// `2xA100-80GB:mig=3g.40gb+2g.20gb+2g.20gb`.
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
                        let gb = p
                            .split_once("g.")
                            .and_then(|(_, m)| m.strip_suffix("gb"))
                            .and_then(|m| m.parse::<u64>().ok())
                            .ok_or_else(|| {
                                err(&format!("MIG profile {p:?} is not like 3g.40gb"))
                            })?;
                        Ok((p.to_string(), gb * 1024))
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
                        })
                        .collect(),
                });
            }
        }
        if gpus.is_empty() || gpus.len() > 64 {
            return Err(err("between 1 and 64 GPUs"));
        }
        Ok(FakeGpus { gpus })
    }
}

impl GpuBackend for FakeGpus {
    fn kind(&self) -> &'static str {
        "fake"
    }

    fn discover(&self) -> Result<Vec<GpuInfo>, GpuError> {
        Ok(self.gpus.clone())
    }
}

/// Real GPUs through NVML.
pub struct Nvml {
    nvml: nvml_wrapper::Nvml,
}

impl Nvml {
    pub fn init() -> Result<Nvml, GpuError> {
        let nvml =
            nvml_wrapper::Nvml::init().map_err(|e| GpuError::NvmlUnavailable(e.to_string()))?;
        Ok(Nvml { nvml })
    }
}

impl Nvml {
    /// MIG instances of a GPU in MIG mode. nvml-wrapper 0.11 does not wrap the MIG
    /// handle calls, so they go through nvml-wrapper-sys on the same (already loaded)
    /// library, and each instance handle is then used through the safe `Device`.
    fn mig_instances(&self, d: &nvml_wrapper::Device<'_>) -> Result<Vec<MigInfo>, GpuError> {
        use nvml_wrapper_sys::bindings::{NvmlLib, nvmlDevice_t, nvmlReturn_enum_NVML_SUCCESS};
        match d.mig_mode() {
            Ok(m) if m.current == 1 => {}
            // Not MIG-capable, or MIG disabled.
            _ => return Ok(Vec::new()),
        }
        let e =
            |what: &str, code: u32| GpuError::Nvml(format!("{what} returned NVML error {code}"));
        // SAFETY: loads the library NVML already has loaded (dlopen refcounts it), and
        // calls two NVML functions with a valid device handle and out-pointers to locals.
        unsafe {
            let lib = NvmlLib::new("libnvidia-ml.so.1")
                .map_err(|x| GpuError::NvmlUnavailable(x.to_string()))?;
            let handle = d.handle();
            let mut max = 0u32;
            let rc = lib.nvmlDeviceGetMaxMigDeviceCount(handle, &mut max);
            if rc != nvmlReturn_enum_NVML_SUCCESS {
                return Err(e("nvmlDeviceGetMaxMigDeviceCount", rc));
            }
            let mut out = Vec::new();
            for i in 0..max {
                let mut mig: nvmlDevice_t = std::ptr::null_mut();
                if lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, i, &mut mig)
                    != nvmlReturn_enum_NVML_SUCCESS
                {
                    // Empty index: no instance was created there.
                    continue;
                }
                let md = nvml_wrapper::Device::new(mig, &self.nvml);
                let en = |x: nvml_wrapper::error::NvmlError| GpuError::Nvml(x.to_string());
                let name = md.name().map_err(en)?;
                out.push(MigInfo {
                    uuid: md.uuid().map_err(en)?,
                    profile: mig_profile_of(&name),
                    memory_mib: md.memory_info().map_err(en)?.total / (1024 * 1024),
                });
            }
            Ok(out)
        }
    }
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
                uuid: d.uuid().map_err(e)?,
                model: d.name().map_err(e)?,
                memory_mib: d.memory_info().map_err(e)?.total / (1024 * 1024),
                pci_bus_id: d.pci_info().map_err(e)?.bus_id,
                mig: self.mig_instances(&d)?,
            });
        }
        Ok(gpus)
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
