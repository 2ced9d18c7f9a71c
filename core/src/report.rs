//! `gpuctl report`: where the GPU-hours of a time window went. Allocated against used
//! (utilisation-weighted, against each job's share), allocated GPUs that idled,
//! GPU memory asked for and not used, how well time limits matched run times, the
//! top wasters, and the load by weekday and hour (where time windows belong). Pure:
//! job records in, figures out; every job's run is clipped to the window.

use std::collections::BTreeMap;

use crate::record::Job;
use serde::Serialize;

/// A slot whose mean utilisation (against its share) is under this percent idled.
pub const IDLE_PCT: f64 = 5.0;

const HOUR_MS: f64 = 3_600_000.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    User,
    Account,
    Partition,
}

impl std::str::FromStr for By {
    type Err = String;
    fn from_str(s: &str) -> Result<By, String> {
        match s {
            "user" => Ok(By::User),
            "account" => Ok(By::Account),
            "partition" => Ok(By::Partition),
            other => Err(format!("{other:?}: report by user, account or partition")),
        }
    }
}

/// Figures of one group (or of everything).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Figures {
    pub jobs: u64,
    /// GPU-hours held (a share counts its fraction) by guaranteed jobs.
    pub gpu_hours_allocated: f64,
    /// GPU-hours opportunistic jobs ran in borrowed GPUs (idle that others held, or
    /// GPUs nobody held): not counted as allocated, their use counted as used.
    pub gpu_hours_borrowed: f64,
    /// Of them, with utilisation samples.
    pub gpu_hours_measured: f64,
    /// Measured GPU-hours times the utilisation against the share.
    pub gpu_hours_used: f64,
    /// `used / measured`, percent (`None` without measured hours).
    pub gpu_efficiency_pct: Option<f64>,
    /// Measured GPU-hours of slots whose mean utilisation was under `IDLE_PCT`.
    pub gpu_hours_idle: f64,
    /// GPU memory held and never used (held minus the slot's peak), GiB-hours.
    pub gpu_memory_unused_gib_hours: f64,
    /// Ended jobs with a time limit: the mean of run time over the limit, percent.
    pub time_limit_used_pct: Option<f64>,
    /// Of them, how many used under half their limit.
    pub time_limit_over_2x: u64,
    /// Energy the GPUs drew for the jobs (the agents' power samples, each GPU's
    /// shared by its jobs), kWh, clipped to the window in proportion.
    pub energy_kwh: f64,
    /// `energy_kwh` over the GPU-hours used (busy): what a unit of work cost.
    pub kwh_per_busy_gpu_hour: Option<f64>,
    #[serde(skip)]
    limit_ratio_sum: f64,
    #[serde(skip)]
    limit_jobs: u64,
}

impl Figures {
    fn add(&mut self, other: &Figures) {
        self.jobs += other.jobs;
        self.gpu_hours_allocated += other.gpu_hours_allocated;
        self.gpu_hours_borrowed += other.gpu_hours_borrowed;
        self.gpu_hours_measured += other.gpu_hours_measured;
        self.gpu_hours_used += other.gpu_hours_used;
        self.gpu_hours_idle += other.gpu_hours_idle;
        self.gpu_memory_unused_gib_hours += other.gpu_memory_unused_gib_hours;
        self.limit_ratio_sum += other.limit_ratio_sum;
        self.limit_jobs += other.limit_jobs;
        self.time_limit_over_2x += other.time_limit_over_2x;
        self.energy_kwh += other.energy_kwh;
    }

    fn finish(&mut self) {
        self.gpu_efficiency_pct = (self.gpu_hours_measured > 0.0)
            .then(|| self.gpu_hours_used * 100.0 / self.gpu_hours_measured);
        self.time_limit_used_pct =
            (self.limit_jobs > 0).then(|| self.limit_ratio_sum * 100.0 / self.limit_jobs as f64);
        self.kwh_per_busy_gpu_hour = (self.gpu_hours_used > 0.0 && self.energy_kwh > 0.0)
            .then(|| self.energy_kwh / self.gpu_hours_used);
    }

    /// Allocated GPU-hours not turned into work (measured ones only).
    pub fn gpu_hours_wasted(&self) -> f64 {
        self.gpu_hours_measured - self.gpu_hours_used
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupRow {
    pub name: String,
    #[serde(flatten)]
    pub figures: Figures,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub since_ms: i64,
    pub until_ms: i64,
    pub by: String,
    pub total: Figures,
    /// Every group, most GPU-hours allocated first.
    pub groups: Vec<GroupRow>,
    /// The ten groups that wasted most GPU-hours (measured, unused), most first.
    pub top_wasters: Vec<GroupRow>,
    /// GPU-hours allocated by weekday (0 = Monday) and hour of day, UTC: `[day][hour]`.
    pub demand_gpu_hours: Vec<Vec<f64>>,
    /// The cluster's utilisation and allocation over the window, given its GPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterFigures>,
    /// Energy while each time window (`[windows]`) was open (`with_windows`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<WindowEnergy>,
}

/// What the GPUs drew for jobs while one time window was open.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowEnergy {
    pub name: String,
    /// Its hours open within the report's window.
    pub hours_open: f64,
    pub energy_kwh: f64,
    /// GPU-hours used (busy) while it was open, and the energy per one.
    pub gpu_hours_used: f64,
    pub kwh_per_busy_gpu_hour: Option<f64>,
}

/// How much of [a, b) the `spans` cover (ms).
fn covered(a: i64, b: i64, spans: &[(i64, i64)]) -> i64 {
    spans
        .iter()
        .map(|&(s, e)| (e.min(b) - s.max(a)).max(0))
        .sum()
}

/// Energy and busy GPU-hours of `jobs` while each window was open (`openings`: its
/// spans within [since, until)), each job's spread evenly over its run (its samples
/// are summed per job, not kept per time).
pub fn window_energy(
    jobs: &[Job],
    openings: &[(String, Vec<(i64, i64)>)],
    since: i64,
    until: i64,
    now: i64,
) -> Vec<WindowEnergy> {
    openings
        .iter()
        .map(|(name, spans)| {
            let (mut kwh, mut used) = (0.0, 0.0);
            for j in jobs.iter().filter(|j| j.start_time_ms > 0) {
                let end = if j.end_time_ms > 0 {
                    j.end_time_ms
                } else {
                    now
                };
                let run = (end - j.start_time_ms).max(1) as f64;
                let inside = covered(j.start_time_ms.max(since), end.min(until), spans) as f64;
                if inside <= 0.0 {
                    continue;
                }
                for alloc in &j.allocations {
                    for s in &alloc.slots {
                        let measured = (j.usage.iter().flat_map(|u| &u.slots))
                            .find(|u| u.node == alloc.node && u.uuid == s.uuid && u.samples > 0);
                        if let Some(u) = measured {
                            let share = f64::from(crate::usage::share_of(s)) / 1000.0;
                            let util = u.util_sum / u.samples as f64;
                            kwh += u.energy_j * inside / run / 3.6e6;
                            used += share * inside / HOUR_MS * util / 100.0;
                        }
                    }
                }
            }
            let open = covered(since, until, spans) as f64 / HOUR_MS;
            WindowEnergy {
                name: name.clone(),
                hours_open: open,
                energy_kwh: kwh,
                gpu_hours_used: used,
                kwh_per_busy_gpu_hour: (used > 0.0 && kwh > 0.0).then(|| kwh / used),
            }
        })
        .collect()
}

/// Utilisation and allocation over a window, defined as the simulator and the
/// controller's gauges define them (docs/utilisation.md): GPU time busy, and GPU time
/// allocated, over the GPU time there was (the GPUs counted now, times the window).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterFigures {
    pub gpus: u64,
    pub gpu_hours_available: f64,
    /// Busy GPU-hours (measured) over those available, 0-1.
    pub utilization: f64,
    /// Allocated GPU-hours over those available, 0-1.
    pub allocation: f64,
    /// Of the allocated GPU-hours, the part with utilisation samples, 0-1: what the
    /// utilisation rests on.
    pub measured: f64,
}

impl Report {
    /// The report with the cluster's figures, for `gpus` GPUs over its window.
    pub fn with_capacity(mut self, gpus: u64) -> Report {
        let hours = (self.until_ms - self.since_ms).max(0) as f64 / HOUR_MS;
        let available = gpus as f64 * hours;
        let t = &self.total;
        let ratio = |x: f64| {
            if available > 0.0 {
                (x / available).min(1.0)
            } else {
                0.0
            }
        };
        self.cluster = Some(ClusterFigures {
            gpus,
            gpu_hours_available: available,
            utilization: ratio(t.gpu_hours_used),
            allocation: ratio(t.gpu_hours_allocated),
            measured: if t.gpu_hours_allocated + t.gpu_hours_borrowed > 0.0 {
                t.gpu_hours_measured / (t.gpu_hours_allocated + t.gpu_hours_borrowed)
            } else {
                0.0
            },
        });
        self
    }
}

fn group_of(j: &Job, by: By) -> String {
    let s = &j.spec;
    let name = match by {
        By::User => s.user.as_str(),
        By::Account => s.account.as_str(),
        By::Partition => s.partition.as_str(),
    };
    if name.is_empty() {
        "-".into()
    } else {
        name.to_string()
    }
}

/// One job's figures over [since, until].
fn job_figures(
    j: &Job,
    since: i64,
    until: i64,
    now: i64,
    demand: &mut [Vec<f64>],
) -> Option<Figures> {
    if j.start_time_ms <= 0 {
        return None;
    }
    let end = if j.end_time_ms > 0 {
        j.end_time_ms
    } else {
        now
    };
    let (a, b) = (j.start_time_ms.max(since), end.min(until));
    if b <= a {
        return None;
    }
    let hours = (b - a) as f64 / HOUR_MS;
    // The part of the whole run inside the window (its energy is over the whole run).
    let inside = (b - a) as f64 / (end - j.start_time_ms).max(1) as f64;
    let mut f = Figures {
        jobs: 1,
        ..Figures::default()
    };
    let usage = j.usage.as_ref();
    let mut gpus = 0.0;
    for alloc in &j.allocations {
        for s in &alloc.slots {
            let share = f64::from(crate::usage::share_of(s)) / 1000.0;
            gpus += share;
            if j.spec.opportunistic {
                f.gpu_hours_borrowed += share * hours;
            } else {
                f.gpu_hours_allocated += share * hours;
            }
            let measured = usage
                .into_iter()
                .flat_map(|u| &u.slots)
                .find(|u| u.node == alloc.node && u.uuid == s.uuid && u.samples > 0);
            if let Some(u) = measured {
                let util = u.util_sum / u.samples as f64;
                f.gpu_hours_measured += share * hours;
                f.gpu_hours_used += share * hours * util / 100.0;
                if util < IDLE_PCT {
                    f.gpu_hours_idle += share * hours;
                }
                f.energy_kwh += u.energy_j * inside / 3.6e6;
                let unused_mib = s.memory_mib.saturating_sub(u.mem_peak_mib);
                f.gpu_memory_unused_gib_hours += unused_mib as f64 / 1024.0 * hours;
            }
        }
    }
    if j.end_time_ms > 0 && j.time_limit_secs > 0 {
        let ratio = (j.end_time_ms - j.start_time_ms) as f64 / (j.time_limit_secs as f64 * 1000.0);
        f.limit_ratio_sum += ratio;
        f.limit_jobs += 1;
        if ratio < 0.5 {
            f.time_limit_over_2x += 1;
        }
    }
    spread_demand(demand, a, b, gpus);
    Some(f)
}

/// Adds `gpus` held over [a, b) to the weekday x hour cells it covers (UTC).
fn spread_demand(demand: &mut [Vec<f64>], a: i64, b: i64, gpus: f64) {
    let mut t = a;
    while t < b {
        let hour_start = t - t.rem_euclid(HOUR_MS as i64);
        let next = (hour_start + HOUR_MS as i64).min(b);
        // 1970-01-01 was a Thursday (weekday 3 with Monday = 0).
        let days = t.div_euclid(86_400_000);
        let day = (days + 3).rem_euclid(7) as usize;
        let hour = (t.rem_euclid(86_400_000) / HOUR_MS as i64) as usize;
        demand[day][hour] += gpus * (next - t) as f64 / HOUR_MS;
        t = next;
    }
}

/// The report over `jobs` for [since, until] at `now`.
pub fn report(jobs: &[Job], since: i64, until: i64, now: i64, by: By) -> Report {
    let mut demand = vec![vec![0.0; 24]; 7];
    let mut total = Figures::default();
    let mut groups: BTreeMap<String, Figures> = BTreeMap::new();
    for j in jobs {
        if let Some(f) = job_figures(j, since, until, now, &mut demand) {
            total.add(&f);
            groups.entry(group_of(j, by)).or_default().add(&f);
        }
    }
    total.finish();
    let mut rows: Vec<GroupRow> = groups
        .into_iter()
        .map(|(name, mut figures)| {
            figures.finish();
            GroupRow { name, figures }
        })
        .collect();
    rows.sort_by(|x, y| {
        y.figures
            .gpu_hours_allocated
            .total_cmp(&x.figures.gpu_hours_allocated)
            .then_with(|| x.name.cmp(&y.name))
    });
    let mut top = rows.clone();
    top.retain(|r| r.figures.gpu_hours_wasted() > 0.0);
    top.sort_by(|x, y| {
        y.figures
            .gpu_hours_wasted()
            .total_cmp(&x.figures.gpu_hours_wasted())
            .then_with(|| x.name.cmp(&y.name))
    });
    top.truncate(10);
    Report {
        since_ms: since,
        until_ms: until,
        by: match by {
            By::User => "user",
            By::Account => "account",
            By::Partition => "partition",
        }
        .into(),
        total,
        groups: rows,
        top_wasters: top,
        demand_gpu_hours: demand,
        cluster: None,
        windows: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
