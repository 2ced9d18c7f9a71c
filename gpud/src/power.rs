//! GPU power limits by the controller's time windows: each heartbeat's answer carries
//! the caps of the windows open for this node (`HeartbeatResponse.power_caps`); each
//! GPU's power management limit becomes the lowest of them (a share is of the GPU's
//! default limit), never outside the range the GPU allows, and its default again when
//! none applies. At the agent's start every GPU goes back to its default (a cap from
//! before a crash does not outlive its window). Only a GPU whose limit changes is
//! touched; a GPU whose driver gives no range is left alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gpuctl_proto as pb;

use crate::gpu::{GpuBackend, PowerRange};

pub struct Power {
    backend: Arc<dyn GpuBackend>,
    /// The caps last applied (`None`: none yet, so the first call applies).
    caps: Mutex<Option<Vec<pb::PowerCap>>>,
    /// What each GPU was set to (watts).
    set: Mutex<HashMap<String, u32>>,
}

/// The limit a GPU of `range` gets under `caps` (watts).
pub fn target(range: &PowerRange, caps: &[pb::PowerCap]) -> u32 {
    use pb::power_cap::Cap;
    let lowest = (caps.iter().filter_map(|c| c.cap))
        .map(|c| match c {
            Cap::Watts(w) => f64::from(w),
            Cap::ShareMilli(m) => f64::from(range.default_w) * f64::from(m) / 1000.0,
        })
        .fold(f64::from(range.default_w), f64::min);
    (lowest.round() as u32).clamp(range.min_w, range.max_w)
}

impl Power {
    pub fn new(backend: Arc<dyn GpuBackend>) -> Power {
        Power {
            backend,
            caps: Mutex::new(None),
            set: Mutex::default(),
        }
    }

    /// Whether `caps` differ from those last applied (then `apply` is due).
    pub fn changed(&self, caps: &[pb::PowerCap]) -> bool {
        self.caps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_deref()
            != Some(caps)
    }

    /// Sets the limits `caps` give on `gpus` (UUIDs). Blocking (NVML): run it off the
    /// runtime's threads.
    pub fn apply(&self, gpus: &[String], caps: &[pb::PowerCap]) {
        *self.caps.lock().unwrap_or_else(|p| p.into_inner()) = Some(caps.to_vec());
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        for uuid in gpus {
            let Some(range) = self.backend.power_range(uuid) else {
                continue;
            };
            let want = target(&range, caps);
            if set.get(uuid) == Some(&want) {
                continue;
            }
            match self.backend.set_power_limit(uuid, want) {
                Ok(()) => {
                    tracing::info!(gpu = %uuid, watts = want, default = range.default_w, "GPU power limit set");
                    set.insert(uuid.clone(), want);
                }
                Err(e) => {
                    tracing::warn!(gpu = %uuid, watts = want, "cannot set the GPU's power limit: {e}");
                    // Tried: not again until the caps change.
                    set.insert(uuid.clone(), want);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::power_cap::Cap;

    fn cap(c: Cap) -> pb::PowerCap {
        pb::PowerCap { cap: Some(c) }
    }

    #[test]
    fn the_lowest_cap_within_the_gpus_range() {
        let a100 = PowerRange {
            default_w: 400,
            min_w: 100,
            max_w: 400,
        };
        assert_eq!(target(&a100, &[]), 400, "no cap: the default");
        assert_eq!(target(&a100, &[cap(Cap::ShareMilli(600))]), 240);
        assert_eq!(
            target(&a100, &[cap(Cap::ShareMilli(600)), cap(Cap::Watts(250))]),
            240
        );
        assert_eq!(
            target(&a100, &[cap(Cap::Watts(50))]),
            100,
            "not under its minimum"
        );
        assert_eq!(
            target(&a100, &[cap(Cap::Watts(900))]),
            400,
            "never above its maximum"
        );
    }

    #[test]
    fn the_fake_gpus_follow_and_only_changes_are_applied() {
        let fake = Arc::new(crate::gpu::FakeGpus::parse("2xA100-80GB", "n1").unwrap());
        let uuids: Vec<String> = fake
            .discover()
            .unwrap()
            .into_iter()
            .map(|g| g.uuid)
            .collect();
        let p = Power::new(fake.clone());
        let caps = [cap(Cap::ShareMilli(500))];
        assert!(p.changed(&caps));
        p.apply(&uuids, &caps);
        assert!(!p.changed(&caps));
        let s = fake.sample(1.0).unwrap();
        assert!(
            s.iter().all(|g| (g.power_limit_w - 200.0).abs() < 1e-9),
            "{s:?}"
        );
        assert!(s.iter().all(|g| g.power_w <= 200.0));
        p.apply(&uuids, &[]);
        let s = fake.sample(2.0).unwrap();
        assert!(s.iter().all(|g| (g.power_limit_w - 400.0).abs() < 1e-9));
    }
}
