//! Answers to read-only questions about the policy in force (`gpuctl windows`,
//! `gpuctl share`), decided here so that core's tests see what users see. Pure: the
//! state and `now` in, the answer out.

use crate::state::Cluster;
use gpuctl_sched as sched;

use crate::view::{JobPriority, Share, ShareRow, WindowRow, Windows};

impl Cluster {
    /// The configured windows at `now` (the config's test clock offset applied): open or
    /// not, when that changes next, their floors (a partition's as `partition:NAME`),
    /// QoS priorities and preemption, and whether preemption is allowed now.
    pub fn windows_answer(&self, now: i64) -> Windows {
        let at = now.saturating_add(self.config.clock_offset_ms);
        let tz = &self.config.tz;
        let windows = self
            .config
            .windows
            .iter()
            .map(|(name, w)| {
                let span = w.span(at, tz);
                let open = span.is_some_and(|(from, _)| from <= at);
                WindowRow {
                    name: name.clone(),
                    open,
                    next_change_ms: span.map_or(0, |(from, until)| if open { until } else { from }),
                    days: w.days.clone(),
                    start: w.start.clone(),
                    end: w.end.clone(),
                    floor: w
                        .floor
                        .clone()
                        .into_iter()
                        .chain(
                            w.partition_floor
                                .iter()
                                .map(|(p, f)| (format!("partition:{p}"), *f)),
                        )
                        .collect(),
                    qos_priority: w.qos_priority.clone().into_iter().collect(),
                    preemption: match w.preemption {
                        Some(true) => "on".into(),
                        Some(false) => "off".into(),
                        None => String::new(),
                    },
                }
            })
            .collect();
        Windows {
            timezone: self.config.timezone.clone(),
            windows,
            preemption_allowed: self.preemption_allowed(now),
            now_ms: at,
        }
    }

    /// The pending jobs a pass would consider at `now`, highest priority first, with
    /// each one's factors (at most `max` of them).
    pub fn priorities(&self, now: i64, max: usize) -> Vec<JobPriority> {
        let (view, queue, cfg) = self.pass_input_readonly(now);
        let norm = sched::size_norm(&view);
        sched::priority::rank(&queue, &cfg.weights, now, norm)
            .into_iter()
            .take(max)
            .map(|(j, _)| {
                let b = sched::priority::breakdown(j, &cfg.weights, now, norm);
                JobPriority {
                    job_id: j.id,
                    user: self
                        .jobs
                        .job(j.id)
                        .map(|j| &j.spec)
                        .map(|s| s.user.clone())
                        .unwrap_or_default(),
                    total: b.total,
                    factors: b
                        .factors
                        .iter()
                        .map(|(f, v)| (f.name().to_string(), *v))
                        .collect(),
                }
            })
            .collect()
    }

    /// Fair share per account and user: shares, usage in GPU-hours, the factor.
    pub fn share_answer(&self) -> Share {
        let rows = self
            .fair_share_table()
            .rows
            .into_iter()
            .map(|r| ShareRow {
                account: r.account,
                user: r.user,
                norm_shares: r.norm_shares,
                account_shares: r.account_shares,
                usage_gpu_hours: r.usage / 3600.0,
                effective_usage: r.effective_usage,
                fair_share: f64::from(r.factor_milli) / 1000.0,
            })
            .collect();
        Share {
            rows,
            half_life: humantime::format_duration(self.config.fairshare.half_life).to_string(),
        }
    }
}
