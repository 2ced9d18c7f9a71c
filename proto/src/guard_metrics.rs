//! The guarded listeners' counters as Prometheus families, for both daemons' registries:
//! `gpuctl_connections_open{listener}` and
//! `gpuctl_connections_refused_total{listener,reason}`.

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabel {
    listener: String,
    reason: String,
}

/// The listeners' connection counters, as metrics.
#[derive(Default)]
pub struct Connections {
    listeners: Mutex<Vec<Arc<crate::guard::Stats>>>,
    open: Family<ListenerLabel, Gauge>,
    refused: Family<RefusedLabel, Counter>,
}

impl Connections {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "gpuctl_connections_open",
            "Connections open on each listener",
            self.open.clone(),
        );
        r.register(
            "gpuctl_connections_refused",
            "Connections refused (caps, descriptor reserve) or closed (handshake, idle deadlines) on each listener",
            self.refused.clone(),
        );
    }

    pub fn update(&self) {
        use crate::guard::Refusal;
        for l in self
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            self.open
                .get_or_create(&ListenerLabel {
                    listener: l.name.to_string(),
                })
                .set(l.open() as i64);
            for why in Refusal::ALL {
                let c = self.refused.get_or_create(&RefusedLabel {
                    listener: l.name.to_string(),
                    reason: why.as_str().to_string(),
                });
                let seen = c.get();
                c.inc_by(l.refused(why).saturating_sub(seen));
            }
        }
    }
}

impl Connections {
    /// Exports `stats`' counters from now on.
    pub fn watch(&self, stats: Arc<crate::guard::Stats>) {
        self.listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(stats);
    }
}
