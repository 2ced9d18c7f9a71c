//! QoS policy in the controller: the caps a pass checks (what each owner holds now
//! under each capped QoS).

use gpuctl_sched::Request;
use gpuctl_sched::limits::{Caps, QosCaps, norm_milli};

use crate::jobs::{job_of, owner};
use crate::state::{Cluster, resources};

/// GPUs (a config number) in milli.
fn milli(gpus: Option<f64>) -> Option<u64> {
    gpus.map(|g| (g * 1000.0).round() as u64)
}

impl Cluster {
    /// The QoS caps of the config, with what running jobs hold under each.
    pub fn caps(&self) -> Caps {
        let mut caps = Caps::default();
        for (name, q) in &self.config.qos {
            let c = QosCaps {
                per_user_milli: milli(q.max_gpus_per_user),
                per_account_milli: milli(q.max_gpus_per_account),
            };
            if c != QosCaps::default() {
                caps.qos.insert(name.clone(), c);
            }
        }
        if caps.qos.is_empty() {
            return caps;
        }
        for s in self.jobs.active() {
            let j = job_of(s);
            if j.state() != gpuctl_proto::JobState::Running {
                continue;
            }
            let Some(spec) = j.spec.as_ref() else {
                continue;
            };
            let m = norm_milli(&Request::from(&resources(j)));
            caps.add(&spec.qos, owner(j), &spec.account, m);
        }
        caps
    }
}
