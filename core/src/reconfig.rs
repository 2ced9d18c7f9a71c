//! A new configuration taken while the controller runs (`gpuctl admin reconfigure`,
//! SIGHUP; Slurm's `scontrol reconfigure`): what changed, what applies at once, and
//! what only a restart applies (listeners and the store are set up at start).

use crate::config::Config;
use crate::state::Cluster;

/// Settings read once at start: a change to them is reported, not applied.
const AT_START: &[&str] = &[
    "limits.max_message_bytes",
    "limits.max_connections",
    "limits.max_connections_per_address",
    "limits.handshake_timeout",
    "limits.idle_timeout",
    "limits.reserved_fds",
    "sched_interval",
];

/// What a reconfigure did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconfigured {
    /// Settings (`section.key`, or a section) whose value changed and now apply.
    pub applied: Vec<String>,
    /// Settings that changed but apply only after a restart.
    pub needs_restart: Vec<String>,
}

/// The settings that differ between `a` and `b`: `key` for top-level values,
/// `section.key` inside tables, `section.name` for a table's entries (an account, a QoS).
pub fn differences(a: &Config, b: &Config) -> Vec<String> {
    let value = |c: &Config| toml::Value::try_from(c).expect("a config serialises to TOML");
    let (va, vb) = (value(a), value(b));
    let empty = toml::map::Map::new();
    let ta = va.as_table().unwrap_or(&empty);
    let tb = vb.as_table().unwrap_or(&empty);
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&String> = ta.keys().chain(tb.keys()).collect();
    for k in keys {
        match (ta.get(k), tb.get(k)) {
            (Some(toml::Value::Table(x)), Some(toml::Value::Table(y))) => {
                let inner: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                out.extend(
                    inner
                        .into_iter()
                        .filter(|i| x.get(*i) != y.get(*i))
                        .map(|i| format!("{k}.{i}")),
                );
            }
            (x, y) if x != y => out.push(k.clone()),
            _ => {}
        }
    }
    out
}

impl Cluster {
    /// Takes `new` as the configuration (checked by `Config::load` already): policy,
    /// accounts, QoS, partitions, windows and limits apply from the next request and
    /// pass; settings read at start are kept until a restart and reported. The clock
    /// offset of `--fake-time` is the running controller's, not the file's.
    pub(crate) fn reconfigure(&mut self, mut new: Config) -> Reconfigured {
        new.clock_offset_ms = self.config.clock_offset_ms;
        let mut out = Reconfigured::default();
        for d in differences(&self.config, &new) {
            if AT_START.contains(&d.as_str()) {
                out.needs_restart.push(d);
            } else {
                out.applied.push(d);
            }
        }
        // What is read at start keeps its running value.
        new.limits.max_message_bytes = self.config.limits.max_message_bytes;
        new.limits.max_connections = self.config.limits.max_connections;
        new.limits.max_connections_per_address = self.config.limits.max_connections_per_address;
        new.limits.handshake_timeout = self.config.limits.handshake_timeout;
        new.limits.idle_timeout = self.config.limits.idle_timeout;
        new.limits.reserved_fds = self.config.limits.reserved_fds;
        new.sched_interval = self.config.sched_interval;
        let fresh = Cluster::new(new.clone());
        self.sched_config.policy = fresh.sched_config.policy;
        self.sched_config.weights = fresh.sched_config.weights;
        self.sched_config.backfill = fresh.sched_config.backfill;
        self.sched_config.reservation_depth = fresh.sched_config.reservation_depth;
        self.sched_config.max_scored_nodes = fresh.sched_config.max_scored_nodes;
        self.config = new;
        // What a pass carries from the last (its queue) was computed under the old one.
        self.jobs.forget_touched();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, text).unwrap();
        Config::load(&p).unwrap()
    }

    #[test]
    fn a_new_config_applies_live_and_names_what_waits_for_a_restart() {
        let mut c = Cluster::new(config("default_time_limit = \"1h\"\n"));
        c.config.clock_offset_ms = 42;
        let new = config(
            "default_time_limit = \"2h\"\nsched_interval = \"7s\"\n[accounts.risk]\nusers = [\"bob\"]\n[limits]\nmax_connections = 10\n[scheduler]\nbackfill = false\n",
        );
        let r = c.reconfigure(new);
        assert_eq!(
            r.applied,
            ["accounts.risk", "default_time_limit", "scheduler.backfill"]
        );
        assert_eq!(
            r.needs_restart,
            ["limits.max_connections", "sched_interval"]
        );
        assert!(c.config.may_charge("bob", "risk", false));
        assert_eq!(c.config.default_time_limit.as_secs(), 7200);
        assert!(!c.sched_config.backfill);
        // Kept until a restart, and the running clock offset.
        assert_eq!(c.config.limits.max_connections, 16_384);
        assert_eq!(c.config.clock_offset_ms, 42);
        // The same config again changes nothing.
        let same = c.config.clone();
        assert_eq!(c.reconfigure(same), Reconfigured::default());
    }
}
