//! A MIG layout change the controller asks (`SetMigLayout`, `gpud --mig dynamic`):
//! refused on a static node and on a GPU a job here holds (the controller asks only
//! for GPUs that hold none; this is the node's own check). Done off the runtime
//! (NVML blocks for seconds); then the agent attaches again with its new inventory.
//! A failure leaves the GPU as it was and drains the node with the reason, until the
//! agent is restarted.

use std::sync::Arc;

use gpuctl_proto as pb;

use super::Agent;

impl Agent {
    /// Whether a job instance here holds GPU `uuid` or one of its MIG instances.
    fn gpu_in_use(&self, uuid: &str) -> bool {
        let gpus = self.gpus.lock().unwrap_or_else(|p| p.into_inner());
        let Some(g) = gpus.iter().find(|g| g.uuid == uuid) else {
            return false;
        };
        let mine = |u: &str| u == g.uuid || g.mig.iter().any(|m| m.uuid == u);
        (self.watched.lock().unwrap_or_else(|p| p.into_inner()))
            .values()
            .any(|(w, _)| w.slots.iter().any(|s| mine(&s.uuid)))
    }
}

/// Handles `SetMigLayout` (see the module's doc).
pub(super) fn set_layout(agent: &Arc<Agent>, m: pb::SetMigLayout) {
    let shown = if m.profiles.is_empty() {
        "whole".to_string()
    } else {
        m.profiles.join("+")
    };
    if !agent.mig_dynamic {
        tracing::error!(gpu = %m.gpu, layout = %shown, "refusing a MIG layout change: this node's layouts are static (gpud --mig dynamic lets the controller change them)");
        return;
    }
    if agent.gpu_in_use(&m.gpu) {
        tracing::error!(gpu = %m.gpu, layout = %shown, "refusing a MIG layout change of a GPU a job holds");
        return;
    }
    let a = agent.clone();
    tokio::spawn(async move {
        tracing::info!(gpu = %m.gpu, layout = %shown, "changing the GPU's MIG layout");
        let backend = a.backend.clone();
        let (gpu, profiles) = (m.gpu.clone(), m.profiles.clone());
        let done = tokio::task::spawn_blocking(move || {
            backend.set_mig_layout(&gpu, &profiles)?;
            backend.discover()
        })
        .await
        .unwrap_or_else(|e| Err(crate::gpu::GpuError::Nvml(format!("panicked: {e}"))));
        match done {
            Ok(gpus) => {
                tracing::info!(gpu = %m.gpu, layout = %shown, "MIG layout changed; attaching with the new inventory");
                *a.gpus.lock().unwrap_or_else(|p| p.into_inner()) = gpus;
                a.gpus_changed.notify_one();
            }
            Err(e) => {
                let why = format!("MIG layout change of GPU {} to {shown} failed: {e}", m.gpu);
                tracing::error!("{why}; the node is drained until this agent is restarted");
                *a.launch_fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
            }
        }
    });
}
