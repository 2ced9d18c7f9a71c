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
}

impl GpuInfo {
    pub fn to_pb(&self) -> pb::Gpu {
        pb::Gpu {
            uuid: self.uuid.clone(),
            model: self.model.clone(),
            memory_mib: self.memory_mib,
            index: self.index,
            pci_bus_id: self.pci_bus_id.clone(),
            allocated_to: 0,
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
        "bad --fake-gpus spec {spec:?}: {why} (write e.g. 4xA100-80GB or 2xA100-80GB,1xT4-16GB)"
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
    /// Parses `4xA100-80GB` or `2xA100-80GB,1xT4-16GB`.
    pub fn parse(spec: &str, node: &str) -> Result<FakeGpus, GpuError> {
        let err = |why: &str| GpuError::FakeSpec {
            spec: spec.to_string(),
            why: why.to_string(),
        };
        let mut gpus = Vec::new();
        for item in spec.split(',').map(str::trim) {
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
            for _ in 0..count {
                let index = gpus.len() as u32;
                let id = uuid::Uuid::new_v5(
                    &uuid::Uuid::NAMESPACE_OID,
                    format!("gpuctl-fake/{node}/{index}/{model}").as_bytes(),
                );
                gpus.push(GpuInfo {
                    index,
                    uuid: format!("GPU-{id}"),
                    model: model.to_string(),
                    memory_mib: mem * 1024,
                    pci_bus_id: format!("00000000:{:02X}:00.0", index + 1),
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
