//! GPU power caps by time window (`[windows.NAME] gpu_power_limit = "250W"` or
//! `"70%"` of each GPU's default limit, with `gpu_power_limit_nodes` overriding it for
//! node patterns). While a window that caps is open, every heartbeat's answer carries
//! the caps that apply to the node (`Cluster::power_caps`); the agent sets each GPU's
//! power management limit to the lowest of them, never outside the GPU's own range,
//! and back to the GPU's default once no cap applies (and at its start). Pure: which
//! windows are open is computed from `now`.

use gpuctl_sched::hostlist::{check_hostlist, hostlist_match};

use crate::state::Cluster;

/// One cap: watts, or a share of the GPU's default limit (in thousandths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PowerCap {
    Watts(u32),
    ShareMilli(u32),
}

/// The most watts a cap names (no GPU draws more; a typo like 25000 is refused).
const MAX_WATTS: u32 = 5_000;

impl PowerCap {
    /// `"250W"`, `"250"` (watts) or `"70%"` (of the default limit: 1% to 100%).
    pub fn parse(s: &str) -> Result<PowerCap, String> {
        let t = s.trim();
        let bad = || {
            format!(
                "power limit {s:?}: watts (\"250W\", 1 to {MAX_WATTS}) or a share of the GPU's default limit (\"70%\", 1% to 100%)"
            )
        };
        if let Some(p) = t.strip_suffix('%') {
            let pct: f64 = p.trim().parse().map_err(|_| bad())?;
            if !(1.0..=100.0).contains(&pct) {
                return Err(bad());
            }
            return Ok(PowerCap::ShareMilli((pct * 10.0).round() as u32));
        }
        let w = t.strip_suffix(['W', 'w']).unwrap_or(t).trim();
        match w.parse::<u32>() {
            Ok(w) if (1..=MAX_WATTS).contains(&w) => Ok(PowerCap::Watts(w)),
            _ => Err(bad()),
        }
    }

    /// The limit in watts on a GPU whose default limit is `default_w`.
    pub fn watts(self, default_w: f64) -> f64 {
        match self {
            PowerCap::Watts(w) => f64::from(w),
            PowerCap::ShareMilli(m) => default_w * f64::from(m) / 1000.0,
        }
    }
}

/// Checks a window's power settings (for the config loader).
pub fn check_window(
    name: &str,
    all: Option<&str>,
    nodes: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    if let Some(c) = all {
        PowerCap::parse(c).map_err(|e| format!("windows.{name}.gpu_power_limit: {e}"))?;
    }
    for (pattern, c) in nodes {
        check_hostlist(pattern)
            .map_err(|e| format!("windows.{name}.gpu_power_limit_nodes.{pattern:?}: {e}"))?;
        PowerCap::parse(c)
            .map_err(|e| format!("windows.{name}.gpu_power_limit_nodes.{pattern:?}: {e}"))?;
    }
    Ok(())
}

impl Cluster {
    /// The power caps for `node`'s GPUs at `now`: one per open window that caps
    /// (its first node pattern that matches `node`, else its cap for all). The agent
    /// applies the lowest; none: each GPU's default.
    pub fn power_caps(&self, node: &str, now: i64) -> Vec<PowerCap> {
        // Every heartbeat asks: no window evaluated where none caps power.
        let capping = (self.config.windows.values())
            .any(|w| w.gpu_power_limit.is_some() || !w.gpu_power_limit_nodes.is_empty());
        if !capping {
            return Vec::new();
        }
        let mut caps: Vec<PowerCap> = self
            .open_windows(now)
            .into_iter()
            .filter_map(|(_, w)| {
                let own = (w.gpu_power_limit_nodes.iter())
                    .find(|(p, _)| hostlist_match(p, node))
                    .map(|(_, c)| c);
                own.or(w.gpu_power_limit.as_ref())
            })
            .filter_map(|c| PowerCap::parse(c).ok())
            .collect();
        caps.sort_by_key(|c| match c {
            PowerCap::Watts(w) => (0, *w),
            PowerCap::ShareMilli(m) => (1, *m),
        });
        caps.dedup();
        caps
    }
}

#[cfg(test)]
mod tests {
    use super::PowerCap;

    #[test]
    fn caps_read_as_watts_or_shares() {
        assert_eq!(PowerCap::parse("250W"), Ok(PowerCap::Watts(250)));
        assert_eq!(PowerCap::parse(" 300 "), Ok(PowerCap::Watts(300)));
        assert_eq!(PowerCap::parse("70%"), Ok(PowerCap::ShareMilli(700)));
        assert_eq!(PowerCap::parse("62.5%"), Ok(PowerCap::ShareMilli(625)));
        for bad in ["0W", "25000", "0%", "150%", "-5%", "fast", "", "250 kW"] {
            assert!(PowerCap::parse(bad).is_err(), "{bad}");
        }
        assert!((PowerCap::ShareMilli(700).watts(400.0) - 280.0).abs() < 1e-9);
        assert!((PowerCap::Watts(250).watts(700.0) - 250.0).abs() < 1e-9);
    }
}
