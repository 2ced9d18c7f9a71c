//! Time-of-day windows: named spans of local time by weekday (`[windows.NAME]`) that
//! change policy while they are active: a guaranteed GPU floor for accounts, QoS
//! priorities, and whether preemption is allowed.
//!
//! ```toml
//! timezone = "Europe/London"
//! [windows.business]
//! days = ["mon", "tue", "wed", "thu", "fri"]
//! start = "08:00"
//! end = "20:00"               # an end before the start runs past midnight
//! floor = { inference = 0.7 } # account -> share of all GPUs kept for it
//! qos_priority = { high = 20000 }
//! preemption = true
//! ```
//!
//! A floor keeps `fraction` of the cluster's GPUs for its account: while the window is
//! active, jobs of other accounts may hold at most the rest, except jobs of QoS levels
//! that others preempt (those may fill idle GPUs, and the floor's account preempts them
//! when it needs them, where the window allows preemption). A job that would still run
//! when the window opens starts only if the floor holds then too (`sched::limits`).
//! Pure: local time is computed from `now` and the configured time zone.

use std::collections::{BTreeMap, BTreeSet};

use crate::record::JobState;
use gpuctl_sched::floors::{Floor, FloorOwner, Floors};
use gpuctl_sched::limits::norm_milli;
use gpuctl_sched::preempt::Lender;
use jiff::civil::{Date, Weekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};
use serde::Deserialize;

/// One `[windows.NAME]` table.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// Weekdays it opens on: mon, tue, wed, thu, fri, sat, sun.
    pub days: Vec<String>,
    /// Local opening and closing times, "HH:MM".
    pub start: String,
    pub end: String,
    /// Account -> the fraction of all GPUs guaranteed to it while open (0..=1).
    #[serde(default)]
    pub floor: BTreeMap<String, f64>,
    /// Partition -> the fraction of all GPUs guaranteed to its jobs while open.
    #[serde(default)]
    pub partition_floor: BTreeMap<String, f64>,
    /// QoS -> its priority while open.
    #[serde(default)]
    pub qos_priority: BTreeMap<String, i64>,
    /// Whether preemption is allowed while open (default: as outside).
    #[serde(default)]
    pub preemption: Option<bool>,
    /// Each GPU's power limit while open: watts ("250W") or a share of its default
    /// limit ("70%"); never above the GPU's maximum (`crate::power`).
    #[serde(default)]
    pub gpu_power_limit: Option<String>,
    /// Node pattern -> its own power limit while open (over `gpu_power_limit`).
    #[serde(default)]
    pub gpu_power_limit_nodes: BTreeMap<String, String>,
}

/// A window's opening: from, until (Unix ms).
pub type Span = (i64, i64);

fn weekday(s: &str) -> Option<Weekday> {
    Some(match s.to_ascii_lowercase().as_str() {
        "mon" | "monday" => Weekday::Monday,
        "tue" | "tuesday" => Weekday::Tuesday,
        "wed" | "wednesday" => Weekday::Wednesday,
        "thu" | "thursday" => Weekday::Thursday,
        "fri" | "friday" => Weekday::Friday,
        "sat" | "saturday" => Weekday::Saturday,
        "sun" | "sunday" => Weekday::Sunday,
        _ => return None,
    })
}

/// "HH:MM" -> (hour, minute).
fn hm(s: &str) -> Option<(i8, i8)> {
    let (h, m) = s.split_once(':')?;
    let (h, m): (i8, i8) = (h.parse().ok()?, m.parse().ok()?);
    ((0..24).contains(&h) && (0..60).contains(&m) && m >= 0 && h >= 0).then_some((h, m))
}

impl Window {
    /// What is wrong with it, if anything (for the config loader).
    pub fn check(&self, name: &str) -> Result<(), String> {
        if self.days.is_empty() {
            return Err(format!("windows.{name}.days is empty"));
        }
        if let Some(d) = self.days.iter().find(|d| weekday(d).is_none()) {
            return Err(format!(
                "windows.{name}.days: {d:?} is not a weekday (mon, tue, wed, thu, fri, sat, sun)"
            ));
        }
        for (what, t) in [("start", &self.start), ("end", &self.end)] {
            if hm(t).is_none() {
                return Err(format!(
                    "windows.{name}.{what} = {t:?}: a time is \"HH:MM\""
                ));
            }
        }
        if self.start == self.end {
            return Err(format!("windows.{name}: start and end are the same"));
        }
        crate::power::check_window(
            name,
            self.gpu_power_limit.as_deref(),
            &self.gpu_power_limit_nodes,
        )?;
        for (what, floors) in [
            ("floor", &self.floor),
            ("partition_floor", &self.partition_floor),
        ] {
            if let Some((a, f)) = floors.iter().find(|(_, f)| !(0.0..=1.0).contains(*f)) {
                return Err(format!(
                    "windows.{name}.{what}.{a} = {f}: a fraction from 0 to 1"
                ));
            }
        }
        let sum = self.floor.values().sum::<f64>() + self.partition_floor.values().sum::<f64>();
        if sum > 1.0 + 1e-9 {
            return Err(format!(
                "windows.{name}: the floor and partition_floor fractions add up to more than 1"
            ));
        }
        Ok(())
    }

    fn opens_on(&self, day: Weekday) -> bool {
        self.days.iter().any(|d| weekday(d) == Some(day))
    }

    /// The opening on local `date` (if it opens that day).
    fn opening(&self, date: Date, tz: &TimeZone) -> Option<Span> {
        if !self.opens_on(date.weekday()) {
            return None;
        }
        let (sh, sm) = hm(&self.start)?;
        let (eh, em) = hm(&self.end)?;
        let from = date.at(sh, sm, 0, 0).to_zoned(tz.clone()).ok()?;
        let end_date = if (eh, em) > (sh, sm) {
            date
        } else {
            date.tomorrow().ok()?
        };
        let until = end_date.at(eh, em, 0, 0).to_zoned(tz.clone()).ok()?;
        Some((
            from.timestamp().as_millisecond(),
            until.timestamp().as_millisecond(),
        ))
    }

    /// Its openings that overlap [since, until), in order.
    pub fn openings(&self, since: i64, until: i64, tz: &TimeZone) -> Vec<Span> {
        let mut out = Vec::new();
        let mut t = since;
        while t < until {
            let Some((from, to)) = self.span(t, tz) else {
                break;
            };
            if from >= until {
                break;
            }
            out.push((from, to));
            t = to.max(t + 1);
        }
        out
    }

    /// The opening that holds `now`, or else the next one within eight days.
    pub fn span(&self, now: i64, tz: &TimeZone) -> Option<Span> {
        let today = local(now, tz)?.date();
        let mut day = today.yesterday().ok()?;
        for _ in 0..10 {
            if let Some((from, until)) = self.opening(day, tz)
                && until > now
            {
                return Some((from, until));
            }
            day = day.tomorrow().ok()?;
        }
        None
    }

    pub fn active(&self, now: i64, tz: &TimeZone) -> bool {
        self.span(now, tz).is_some_and(|(from, _)| from <= now)
    }
}

fn local(now: i64, tz: &TimeZone) -> Option<Zoned> {
    Some(Timestamp::from_millisecond(now).ok()?.to_zoned(tz.clone()))
}

/// The windows open at `now`, and the next time any opens or closes.
pub fn status(
    windows: &BTreeMap<String, Window>,
    now: i64,
    tz: &TimeZone,
) -> (Vec<String>, Option<i64>) {
    let mut active = Vec::new();
    let mut next: Option<i64> = None;
    for (name, w) in windows {
        if let Some((from, until)) = w.span(now, tz) {
            let change = if from <= now {
                active.push(name.clone());
                until
            } else {
                from
            };
            next = Some(next.map_or(change, |n| n.min(change)));
        }
    }
    (active, next)
}

/// A time zone by IANA name ("UTC" included).
pub fn zone(name: &str) -> Result<TimeZone, String> {
    if name.is_empty() || name.eq_ignore_ascii_case("utc") {
        return Ok(TimeZone::UTC);
    }
    TimeZone::get(name).map_err(|e| format!("timezone {name:?}: {e}"))
}

impl crate::state::Cluster {
    /// The windows open at `now` (on the windows' clock).
    pub fn open_windows(&self, now: i64) -> Vec<(&String, &Window)> {
        let at = now.saturating_add(self.config.clock_offset_ms);
        self.config
            .windows
            .iter()
            .filter(|(_, w)| w.active(at, &self.config.tz))
            .collect()
    }

    /// Whether preemption is allowed at `now`: an open window that says so decides,
    /// else `[preemption] enabled`.
    pub fn preemption_allowed(&self, now: i64) -> bool {
        let open = self.open_windows(now);
        if open.iter().any(|(_, w)| w.preemption == Some(false)) {
            return false;
        }
        open.iter().any(|(_, w)| w.preemption == Some(true)) || self.config.preemption.enabled
    }

    /// What open windows change in a pass's config: QoS priorities, and the floors of
    /// windows open now or opening within the longest time limit.
    pub(crate) fn apply_windows(&self, cfg: &mut gpuctl_sched::SchedConfig, now: i64) {
        if self.config.windows.is_empty() {
            return;
        }
        for (_, w) in self.open_windows(now) {
            for (q, p) in &w.qos_priority {
                cfg.weights.qos_levels.insert(q.clone(), *p);
            }
        }
        cfg.floors = self.floors(now, false, &BTreeSet::new());
    }

    /// The floors of every window open now or opening before the longest job could
    /// end, in the controller's time (the windows' clock minus its offset).
    /// `all`: reclaimable jobs count against floors too (to tell which of them
    /// borrow); `skip`: jobs left out.
    fn floors(&self, now: i64, all: bool, skip: &BTreeSet<u64>) -> Floors {
        let off = self.config.clock_offset_ms;
        let horizon =
            i64::try_from(self.config.limits.max_time_limit.as_millis()).unwrap_or(i64::MAX / 2);
        let total: u64 = self
            .fleet
            .nodes
            .values()
            .flat_map(|n| &n.gpus)
            .map(|_| 1000u64)
            .sum();
        let exempt = self.preemptible_qos();
        let mut running = self.running_views_by_job();
        running.retain(|r| !skip.contains(&r.id));
        let mut floors = Vec::new();
        for (name, w) in &self.config.windows {
            let Some((from, until)) = w.span(now.saturating_add(off), &self.config.tz) else {
                continue;
            };
            let (from, until) = (from - off, until - off);
            if from > now.saturating_add(horizon) {
                continue;
            }
            let lends = self.lends(w);
            for (owner, fraction) in owners(w) {
                let kept = (total as f64 * fraction).round() as u64;
                let owner_waits = lends && self.owner_waits(&owner, &running, kept);
                let others = running
                    .iter()
                    .filter(|r| !owner.owns(&r.account, &r.partition) && !exempt.contains(&r.qos))
                    // Borrowers count too while the owner waits: then nothing is lent,
                    // and what they hold leaves no room for another job of theirs.
                    .filter(|r| all || owner_waits || !(lends && r.reclaimable))
                    .map(|r| (r.end, r.milli))
                    .collect();
                floors.push(Floor {
                    window: name.clone(),
                    owner,
                    from_ms: from,
                    until_ms: until,
                    others_max_milli: total.saturating_sub(kept),
                    others,
                    lends,
                    owner_waits,
                });
            }
        }
        Floors {
            floors,
            exempt_qos: exempt,
        }
    }

    /// Whether a window's floors lend to reclaimable jobs: lending is on and its owner
    /// may take them back (preemption is allowed while it is open).
    fn lends(&self, w: &Window) -> bool {
        self.config.preemption.lend_floors && w.preemption.unwrap_or(self.config.preemption.enabled)
    }

    /// Whether a pending job of `owner` (not held) fits in what its floor `kept` leaves
    /// it beside its running jobs.
    fn owner_waits(&self, owner: &FloorOwner, running: &[RunningView], kept: u64) -> bool {
        use crate::state::resources;
        let room = kept.saturating_sub(held_by(owner, running));
        self.jobs.active().map(|s| &s.job).any(|j| {
            j.state == JobState::Pending
                && j.hold.is_empty()
                && owner.owns(
                    &j.spec.account,
                    self.config.partition_name(&j.spec.partition),
                )
                && norm_milli(&gpuctl_sched::Request::from(&resources(j))) <= room
        })
    }

    /// The floors open now that lend, each with what its owner may still take back:
    /// the floor less what the owner's running jobs hold.
    pub(crate) fn lenders(&self, now: i64) -> Vec<Lender> {
        let open = self.open_windows(now);
        if !open.iter().any(|(_, w)| self.lends(w)) {
            return Vec::new();
        }
        let total = self
            .fleet
            .nodes
            .values()
            .map(|n| n.gpus.len() as u64)
            .sum::<u64>()
            * 1000;
        let running = self.running_views_by_job();
        open.into_iter()
            .filter(|(_, w)| self.lends(w))
            .flat_map(|(_, w)| owners(w))
            .map(|(owner, fraction)| {
                let kept = (total as f64 * fraction).round() as u64;
                let room_milli = kept.saturating_sub(held_by(&owner, &running));
                Lender { owner, room_milli }
            })
            .collect()
    }

    /// The jobs among `started` (just started) that borrow a window's floor, each with
    /// what `queue` says of it.
    pub(crate) fn borrowing(&self, started: &[u64], now: i64) -> Vec<(u64, String)> {
        use crate::state::{limit_ms, resources};
        let mine: BTreeSet<u64> = started
            .iter()
            .filter_map(|&id| self.jobs.get(id).map(|s| &s.job))
            .filter(|j| crate::policy::reclaimable(&j.spec, &self.config))
            .map(|j| j.id)
            .collect();
        if mine.is_empty() || self.config.windows.is_empty() {
            return Vec::new();
        }
        // What others held before these starts, every job counted; then the starts in
        // order: a reclaimable one borrows when it goes past what others may hold.
        let skip: BTreeSet<u64> = started.iter().copied().collect();
        let mut floors = self.floors(now, true, &skip);
        let mut out = Vec::new();
        for &id in started {
            let Some(j) = self.jobs.get(id).map(|s| &s.job) else {
                continue;
            };
            let spec = &j.spec;
            let job = gpuctl_sched::PendingJob {
                id: j.id,
                qos: spec.qos.clone(),
                account: spec.account.clone(),
                partition: self.config.partition_name(&spec.partition).to_string(),
                request: gpuctl_sched::Request::from(&resources(j)),
                reclaimable: true,
                ..gpuctl_sched::PendingJob::default()
            };
            let d = limit_ms(j.time_limit_secs).max(1000);
            if mine.contains(&id)
                && let Some(f) = floors.borrows(&job, now, d)
            {
                out.push((id, borrowing_reason(f)));
            }
            floors.add(
                &gpuctl_sched::PendingJob {
                    reclaimable: false,
                    ..job
                },
                now,
                d,
            );
        }
        out
    }

    /// QoS levels another QoS preempts: their jobs may fill a floor's idle GPUs.
    pub fn preemptible_qos(&self) -> BTreeSet<String> {
        self.config
            .qos
            .values()
            .flat_map(|q| q.preempts.iter().cloned())
            .collect()
    }

    /// Running jobs as the floors see them.
    fn running_views_by_job(&self) -> Vec<RunningView> {
        use crate::state::{limit_ms, resources};
        self.jobs
            .active()
            .filter(|s| s.job.state == JobState::Running)
            .map(|s| {
                let j = &s.job;
                let spec = &j.spec;
                let account = spec.account.clone();
                let qos = spec.qos.clone();
                let partition = self.config.partition_name(&spec.partition).to_string();
                let mut end = j.start_time_ms.saturating_add(limit_ms(j.time_limit_secs));
                if s.vacate_by_ms > 0 {
                    end = end.min(s.vacate_by_ms);
                }
                let m = norm_milli(&gpuctl_sched::Request::from(&resources(j)));
                RunningView {
                    id: j.id,
                    account,
                    partition,
                    qos,
                    end,
                    milli: m,
                    reclaimable: crate::policy::reclaimable(spec, &self.config),
                }
            })
            .collect()
    }
}

/// A running job as the floors see it: whose, its QoS, its planned end, the
/// normalised GPU milli it holds, and whether it gives them back when asked.
struct RunningView {
    id: u64,
    account: String,
    partition: String,
    qos: String,
    end: i64,
    milli: u64,
    reclaimable: bool,
}

/// What `queue` and `explain` say of a running job that borrows `f`.
pub fn borrowing_reason(f: &Floor) -> String {
    format!(
        "Borrowing the {} floor (window {}), may be reclaimed",
        f.owner, f.window
    )
}

/// GPU milli a floor's owner holds in running jobs.
fn held_by(owner: &FloorOwner, running: &[RunningView]) -> u64 {
    running
        .iter()
        .filter(|r| owner.owns(&r.account, &r.partition))
        .map(|r| r.milli)
        .sum()
}

/// A window's floors by owner, with their fractions.
fn owners(w: &Window) -> impl Iterator<Item = (FloorOwner, f64)> + '_ {
    w.floor
        .iter()
        .map(|(a, f)| (FloorOwner::Account(a.clone()), *f))
        .chain(
            w.partition_floor
                .iter()
                .map(|(p, f)| (FloorOwner::Partition(p.clone()), *f)),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn business() -> Window {
        Window {
            days: ["mon", "tue", "wed", "thu", "fri"]
                .map(String::from)
                .to_vec(),
            start: "08:00".into(),
            end: "20:00".into(),
            floor: [("inference".to_string(), 0.7)].into(),
            partition_floor: BTreeMap::new(),
            qos_priority: BTreeMap::new(),
            preemption: None,
            gpu_power_limit: None,
            gpu_power_limit_nodes: BTreeMap::new(),
        }
    }

    fn ms(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_millisecond()
    }

    #[test]
    fn a_weeks_openings_and_a_window_cut_at_the_ends() {
        let utc = zone("UTC").unwrap();
        // Monday 2024-01-01 10:00 to the next Monday 10:00: Monday's opening cut, then
        // Tuesday to Friday, then the last Monday's first two hours.
        let o = business().openings(ms("2024-01-01T10:00:00Z"), ms("2024-01-08T10:00:00Z"), &utc);
        assert_eq!(o.len(), 6, "{o:?}");
        assert_eq!(
            o[0],
            (ms("2024-01-01T08:00:00Z"), ms("2024-01-01T20:00:00Z"))
        );
        assert_eq!(o[5].0, ms("2024-01-08T08:00:00Z"));
        assert!(
            business()
                .openings(ms("2024-01-06T00:00:00Z"), ms("2024-01-07T23:00:00Z"), &utc)
                .is_empty()
        );
    }

    #[test]
    fn business_hours_in_a_zone_with_daylight_saving() {
        let tz = zone("Europe/London").unwrap();
        let w = business();
        // Monday 2024-07-01, 09:00 BST = 08:00 UTC.
        assert!(w.active(ms("2024-07-01T08:00:00Z"), &tz));
        assert!(!w.active(ms("2024-07-01T06:59:00Z"), &tz));
        assert_eq!(
            w.span(ms("2024-07-01T06:00:00Z"), &tz),
            Some((ms("2024-07-01T07:00:00Z"), ms("2024-07-01T19:00:00Z")))
        );
        // Friday evening: the next opening is Monday.
        assert_eq!(
            w.span(ms("2024-07-05T20:00:00Z"), &tz).unwrap().0,
            ms("2024-07-08T07:00:00Z")
        );
        // In winter 08:00 local is 08:00 UTC.
        assert!(w.active(ms("2024-01-08T08:00:00Z"), &tz));
        assert!(!w.active(ms("2024-01-08T07:59:00Z"), &tz));
    }

    #[test]
    fn a_night_window_runs_past_midnight() {
        let tz = zone("UTC").unwrap();
        let night = Window {
            start: "20:00".into(),
            end: "08:00".into(),
            ..business()
        };
        // Friday 23:00 and Saturday 07:00 (opened on Friday) are in; Saturday 21:00 not.
        assert!(night.active(ms("2024-01-05T23:00:00Z"), &tz));
        assert!(night.active(ms("2024-01-06T07:00:00Z"), &tz));
        assert!(!night.active(ms("2024-01-06T21:00:00Z"), &tz));
        let (active, next) = status(
            &[("night".to_string(), night)].into(),
            ms("2024-01-05T23:00:00Z"),
            &tz,
        );
        assert_eq!(active, vec!["night".to_string()]);
        assert_eq!(next, Some(ms("2024-01-06T08:00:00Z")));
    }

    #[test]
    fn bad_windows_are_named() {
        let mut w = business();
        w.days.push("someday".into());
        assert!(w.check("b").unwrap_err().contains("someday"));
        let mut w = business();
        w.start = "25:00".into();
        assert!(w.check("b").unwrap_err().contains("HH:MM"));
        let mut w = business();
        w.floor.insert("x".into(), 0.5);
        assert!(w.check("b").unwrap_err().contains("more than 1"));
        assert!(zone("Mars/Olympus").is_err());
    }
}
