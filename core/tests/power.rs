//! Power caps by time window: which cap a node's heartbeat answer carries while a
//! window is open, per-node overrides, and none once it closes (in the windows' own
//! time zone, which a replica's copy of the configuration keeps).

mod common;

use common::*;
use gpuctl_core::Config;
use gpuctl_core::event::Heartbeat;
use gpuctl_core::operations::Operations as _;
use gpuctl_core::power::PowerCap;

const NIGHT: &str = r#"
timezone = "America/New_York"
[windows.night]
days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
start = "22:00"
end = "06:00"
gpu_power_limit = "60%"
gpu_power_limit_nodes = { "inf[1-2]" = "100%" }
[windows.weekend]
days = ["sat", "sun"]
start = "00:00"
end = "23:59"
gpu_power_limit = "250W"
"#;

fn config(text: &str) -> Config {
    let c = Config::from_toml(text).expect("config");
    c.check_partitions().unwrap();
    c
}

/// Unix ms of a New York wall-clock time.
fn ny(s: &str) -> i64 {
    let t: jiff::civil::DateTime = s.parse().unwrap();
    t.to_zoned(jiff::tz::TimeZone::get("America/New_York").unwrap())
        .unwrap()
        .timestamp()
        .as_millisecond()
}

#[test]
fn a_window_caps_its_nodes_while_open_and_lifts_when_it_closes() {
    let c = gpuctl_core::Cluster::new(config(NIGHT));
    // Wednesday 2026-12-09, New York time.
    assert_eq!(c.power_caps("train1", ny("2026-12-09T21:59")), vec![]);
    assert_eq!(
        c.power_caps("train1", ny("2026-12-09T22:00")),
        vec![PowerCap::ShareMilli(600)]
    );
    assert_eq!(
        c.power_caps("inf2", ny("2026-12-09T23:30")),
        vec![PowerCap::ShareMilli(1000)],
        "a node pattern's own cap"
    );
    assert_eq!(
        c.power_caps("train1", ny("2026-12-10T05:59")),
        vec![PowerCap::ShareMilli(600)]
    );
    assert_eq!(c.power_caps("train1", ny("2026-12-10T06:00")), vec![]);
    // Saturday night: both windows cap; the agent takes the lowest of the two.
    assert_eq!(
        c.power_caps("train1", ny("2026-12-12T23:00")),
        vec![PowerCap::Watts(250), PowerCap::ShareMilli(600)]
    );
    assert_eq!(
        c.power_caps("train1", ny("2026-12-12T12:00")),
        vec![PowerCap::Watts(250)]
    );
}

#[test]
fn the_heartbeat_answer_carries_the_caps_and_a_replica_keeps_the_zone() {
    let cfg = config(NIGHT);
    // A replica's configuration comes through TOML (a reconfigure, a snapshot).
    let again = Config::from_toml(&cfg.to_toml()).unwrap();
    assert_eq!(again.tz, cfg.tz, "the time zone is resolved again");
    let mut c = gpuctl_core::Cluster::new(again);
    let night = ny("2026-12-09T23:00");
    attach(&mut c, "train1", night);
    let hb = Heartbeat {
        node: "train1".into(),
        running: Vec::new(),
        metrics: Vec::new(),
        commands_handled: 0,
        reporting: Vec::new(),
        health_error: String::new(),
    };
    let (answer, _) = c.heartbeat(&hb, night);
    assert_eq!(answer.power_caps, vec![PowerCap::ShareMilli(600)]);
    let (answer, _) = c.heartbeat(&hb, ny("2026-12-10T09:00"));
    assert!(answer.power_caps.is_empty(), "lifted by day");
}

#[test]
fn bad_power_settings_are_refused_at_load() {
    for (bad, says) in [
        ("gpu_power_limit = \"150%\"", "gpu_power_limit"),
        ("gpu_power_limit = \"0W\"", "gpu_power_limit"),
        (
            "gpu_power_limit_nodes = { \"n[1-\" = \"50%\" }",
            "gpu_power_limit_nodes",
        ),
        (
            "gpu_power_limit_nodes = { \"n1\" = \"lots\" }",
            "gpu_power_limit_nodes",
        ),
    ] {
        let text =
            format!("[windows.w]\ndays = [\"mon\"]\nstart = \"01:00\"\nend = \"02:00\"\n{bad}\n");
        let cfg = Config::from_toml(&text).unwrap();
        let e = cfg.windows["w"].check("w").unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
    }
}
