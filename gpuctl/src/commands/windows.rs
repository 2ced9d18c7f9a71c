//! `gpuctl windows`: the time-of-day windows, which are open, and when each changes.

use gpuctl_proto as pb;
use serde::Serialize;

use super::View;
use crate::cli::{Client, Failure};
use crate::format;

#[derive(Serialize)]
pub struct WindowRow {
    name: String,
    open: bool,
    next_change: Option<String>,
    days: Vec<String>,
    start: String,
    end: String,
    floor: std::collections::BTreeMap<String, f64>,
    qos_priority: std::collections::BTreeMap<String, i64>,
    preemption: Option<String>,
}

#[derive(Serialize)]
pub struct Windows {
    timezone: String,
    now: Option<String>,
    preemption_allowed: bool,
    windows: Vec<WindowRow>,
}

impl View for Windows {
    fn text(&self) -> String {
        let rows = self
            .windows
            .iter()
            .map(|w| {
                vec![
                    w.name.clone(),
                    if w.open { "OPEN" } else { "closed" }.to_string(),
                    format!("{} {}-{}", w.days.join(","), w.start, w.end),
                    w.floor
                        .iter()
                        .map(|(a, f)| format!("{a}>={:.0}%", f * 100.0))
                        .collect::<Vec<_>>()
                        .join(","),
                    w.next_change.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        let mut out = format::table(&["WINDOW", "STATE", "WHEN", "FLOOR", "NEXT_CHANGE"], rows);
        out.push_str(&format!(
            "time zone {}; now {}; preemption {}\n",
            self.timezone,
            self.now.as_deref().unwrap_or("-"),
            if self.preemption_allowed {
                "allowed"
            } else {
                "off"
            }
        ));
        out
    }
}

pub async fn run(client: &mut Client) -> Result<Windows, Failure> {
    let r = client.windows(pb::WindowsRequest {}).await?.into_inner();
    Ok(Windows {
        timezone: r.timezone,
        now: format::time_string(r.now_ms),
        preemption_allowed: r.preemption_allowed,
        windows: r
            .windows
            .into_iter()
            .map(|w| WindowRow {
                name: w.name,
                open: w.open,
                next_change: format::time_string(w.next_change_ms),
                days: w.days,
                start: w.start,
                end: w.end,
                floor: w.floor.into_iter().collect(),
                qos_priority: w.qos_priority.into_iter().collect(),
                preemption: (!w.preemption.is_empty()).then_some(w.preemption),
            })
            .collect(),
    })
}
