//! GPU device isolation, as Slurm's `ConstrainDevices`: a job's cgroup lets it open only
//! its own GPUs' device nodes. Setting `CUDA_VISIBLE_DEVICES` is a hint to CUDA, not a
//! boundary: without this, a job that names another GPU runs on it.
//!
//! The rule (pure, [`DeviceRules`]): every device stays open to the job except
//! - NVIDIA GPU nodes (character major 195, minors below 254) other than its GPUs'
//!   (`nvidiactl` 195:255 and `nvidia-modeset` 195:254, which every CUDA process opens,
//!   stay allowed; `nvidia-uvm` has its own major and stays allowed);
//! - MIG capability nodes (`/dev/nvidia-caps/nvidia-capN`, the `nvidia-caps` major)
//!   other than its GPU instances' access files (and their compute instances').
//!
//! It is enforced by a `BPF_PROG_TYPE_CGROUP_DEVICE` program attached to the job's
//! cgroup2 directory (pure v2 and hybrid hosts), or, where a job has none, by the v1
//! `devices` controller (deny entries in `devices.deny`); `JobCgroup::constrain_devices`
//! picks.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::Path;
use std::sync::Mutex;

use crate::gpu::GpuInfo;

/// The NVIDIA driver's character major: GPU *i* is `/dev/nvidia<minor>`, 195:minor.
pub const NVIDIA_MAJOR: u32 = 195;
/// Minors from here up are control nodes (254 `nvidia-modeset`, 255 `nvidiactl`).
pub const FIRST_CONTROL_MINOR: u32 = 254;
/// Compute instances per GPU instance and GPU instances per GPU in the driver's
/// `mig-minors` numbering (config 1, monitor 2, then `gpuG/giI/access` and its eight
/// `ciC/access` per GPU instance).
const CIS_PER_GI: u32 = 8;
const GIS_PER_GPU: u32 = 15;
/// The major the fake backend's MIG capability nodes use (no driver registers one).
pub const FAKE_CAPS_MAJOR: u32 = 511;

/// MIG capability minors: the `nvidia-caps` major and `gpuG/giI/access` -> minor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caps {
    pub major: u32,
    minors: HashMap<String, u32>,
}

impl Caps {
    /// The driver's table (`/proc/devices` and `/proc/driver/nvidia-caps/mig-minors`),
    /// where the driver is loaded.
    pub fn from_driver() -> Option<Caps> {
        let devices = std::fs::read_to_string("/proc/devices").ok()?;
        let minors = std::fs::read_to_string("/proc/driver/nvidia-caps/mig-minors").ok()?;
        Caps::parse(&devices, &minors)
    }

    /// Parses the two files' text.
    pub fn parse(devices: &str, mig_minors: &str) -> Option<Caps> {
        let major = devices
            .lines()
            .take_while(|l| !l.starts_with("Block"))
            .find_map(|l| {
                let (n, name) = l.trim().split_once(' ')?;
                (name.trim() == "nvidia-caps").then(|| n.parse().ok())?
            })?;
        let minors = mig_minors
            .lines()
            .filter_map(|l| {
                let (name, m) = l.trim().split_once(' ')?;
                Some((name.to_string(), m.trim().parse().ok()?))
            })
            .collect();
        Some(Caps { major, minors })
    }

    /// The driver's numbering without the driver (fake GPUs), under [`FAKE_CAPS_MAJOR`].
    pub fn numbered(gpus: u32) -> Caps {
        let mut minors = HashMap::new();
        minors.insert("config".into(), 1);
        minors.insert("monitor".into(), 2);
        for g in 0..gpus {
            for gi in 0..GIS_PER_GPU {
                let base = 3 + (g * GIS_PER_GPU + gi) * (CIS_PER_GI + 1);
                minors.insert(format!("gpu{g}/gi{gi}/access"), base);
                for ci in 0..CIS_PER_GI {
                    minors.insert(format!("gpu{g}/gi{gi}/ci{ci}/access"), base + 1 + ci);
                }
            }
        }
        Caps {
            major: FAKE_CAPS_MAJOR,
            minors,
        }
    }

    /// config, monitor, and every instance's access minors on a node with `gpus`.
    fn in_use(&self, gpus: &[GpuInfo]) -> BTreeSet<u32> {
        let global = ["config", "monitor"]
            .iter()
            .filter_map(|k| self.minors.get(*k).copied());
        let instances = gpus
            .iter()
            .flat_map(|g| g.mig.iter().flat_map(|m| self.instance(g.minor, m.gi_id)));
        global.chain(instances).collect()
    }

    /// The access minors of GPU instance `gi` of the GPU with device minor `gpu`, and of
    /// its compute instances.
    fn instance(&self, gpu: u32, gi: u32) -> impl Iterator<Item = u32> + '_ {
        let gi_key = format!("gpu{gpu}/gi{gi}/access");
        let cis = (0..CIS_PER_GI).map(move |ci| format!("gpu{gpu}/gi{gi}/ci{ci}/access"));
        std::iter::once(gi_key)
            .chain(cis)
            .filter_map(|k| self.minors.get(&k).copied())
    }
}

/// What a job's cgroup allows among GPU device nodes. Everything else stays allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRules {
    /// The slots' UUIDs (GPUs or MIG instances) the rules were made for.
    pub uuids: Vec<String>,
    /// GPU minors (major 195) the job may open.
    pub gpu_minors: BTreeSet<u32>,
    /// MIG capability major and the minors the job may open there.
    pub caps: Option<(u32, BTreeSet<u32>)>,
    /// The capability minors that can open anything here: config, monitor, and the
    /// access files of the node's GPU instances and their compute instances (v1 can
    /// only deny them one by one; the program denies the whole major).
    caps_known: BTreeSet<u32>,
}

impl DeviceRules {
    /// The rules for a job given the slots `uuids` (GPU or MIG UUIDs) on a node with
    /// `gpus`. A MIG slot opens its parent GPU's node and its own capability files.
    pub fn for_slots<'a>(
        gpus: &[GpuInfo],
        uuids: impl IntoIterator<Item = &'a str>,
        caps: Option<&Caps>,
    ) -> DeviceRules {
        let mut gpu_minors = BTreeSet::new();
        let mut cap_minors = BTreeSet::new();
        let uuids: Vec<String> = uuids.into_iter().map(str::to_string).collect();
        for uuid in &uuids {
            for g in gpus {
                if g.uuid == *uuid {
                    gpu_minors.insert(g.minor);
                }
                if let Some(m) = g.mig.iter().find(|m| m.uuid == *uuid) {
                    gpu_minors.insert(g.minor);
                    if let Some(c) = caps {
                        cap_minors.extend(c.instance(g.minor, m.gi_id));
                    }
                }
            }
        }
        DeviceRules {
            uuids,
            gpu_minors,
            caps: caps.map(|c| (c.major, cap_minors)),
            caps_known: caps.map_or_else(BTreeSet::new, |c| c.in_use(gpus)),
        }
    }

    /// Whether the job may open character device `major:minor`.
    pub fn allows(&self, major: u32, minor: u32) -> bool {
        if major == NVIDIA_MAJOR {
            return minor >= FIRST_CONTROL_MINOR || self.gpu_minors.contains(&minor);
        }
        match &self.caps {
            Some((m, allowed)) if *m == major => allowed.contains(&minor),
            _ => true,
        }
    }

    /// The v1 `devices.deny` entries: every GPU minor but the job's, and every
    /// capability minor the driver numbers but the job's. (A cgroup that allows by
    /// default holds denies as exceptions; an allow cannot carve a hole in a wider
    /// deny, so each is listed.)
    pub fn v1_entries(&self) -> Vec<String> {
        let mut deny: Vec<String> = (0..FIRST_CONTROL_MINOR)
            .filter(|m| !self.gpu_minors.contains(m))
            .map(|m| format!("c {NVIDIA_MAJOR}:{m} rwm"))
            .collect();
        if let Some((major, minors)) = &self.caps {
            deny.extend(
                self.caps_known
                    .iter()
                    .filter(|m| !minors.contains(m))
                    .map(|m| format!("c {major}:{m} rwm")),
            );
        }
        deny
    }

    /// Applies the rules with the v1 devices controller at `dir` (the job's cgroup, which
    /// starts allowing everything as its parent does).
    pub fn apply_v1(&self, dir: &Path) -> io::Result<()> {
        use std::io::Write as _;
        let path = dir.join("devices.deny");
        let mut f = std::fs::OpenOptions::new().write(true).open(&path)?;
        for line in self.v1_entries() {
            // One entry per write(2): the kernel parses each write as one rule.
            f.write_all(line.as_bytes()).map_err(|e| {
                io::Error::new(e.kind(), format!("{}: {line}: {e}", path.display()))
            })?;
        }
        Ok(())
    }

    /// Applies the rules on cgroup2: loads the device program and attaches it to `dir`
    /// (it stays attached for the cgroup's life; others attached above still run).
    pub fn apply_bpf(&self, dir: &Path) -> io::Result<()> {
        crate::devices_bpf::attach(&self.program(), dir)
    }

    /// The eBPF program for these rules (see `devices_bpf` for the encoding).
    pub fn program(&self) -> Vec<crate::devices_bpf::Insn> {
        crate::devices_bpf::program(
            NVIDIA_MAJOR,
            FIRST_CONTROL_MINOR,
            &self.gpu_minors,
            self.caps.as_ref().map(|(m, s)| (*m, s)),
        )
    }
}

/// Which GPUs each confined job may open (its cgroup's name below a hierarchy's root,
/// `<parent>/<leaf>` -> GPU/MIG UUIDs). The fake
/// backend counts a job's GPU memory on these, not on the variable the job sets.
static GRANTED: Mutex<Vec<(String, Vec<String>)>> = Mutex::new(Vec::new());

/// Records that the job in cgroup `name` (`<parent>/<leaf>`) may open only `uuids`.
pub fn grant(name: &str, uuids: Vec<String>) {
    let mut g = GRANTED.lock().unwrap_or_else(|p| p.into_inner());
    g.retain(|(l, _)| l != name);
    g.push((name.to_string(), uuids));
}

/// Forgets the job in cgroup `name` (its cgroup is gone).
pub fn revoke(name: &str) {
    GRANTED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(l, _)| l != name);
}

/// The GPUs the process `pid` may open, when it is in a confined job's cgroup.
pub fn granted_to(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let g = GRANTED.lock().unwrap_or_else(|p| p.into_inner());
    text.lines().find_map(|l| {
        let path = l.splitn(3, ':').nth(2)?.strip_prefix('/')?;
        g.iter()
            .find(|(name, _)| {
                path.strip_prefix(name.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            })
            .map(|(_, u)| u.clone())
    })
}

#[cfg(test)]
mod tests;
