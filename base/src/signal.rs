//! The signals a job may name: before a preemption or its time limit
//! (`signal = "USR1@120"`, `sbatch --signal`) and in a cancel (`scancel -s`).

/// Signals a job may ask for before a preemption (`signal = "USR1@120"`).
pub const SIGNALS: &[&str] = &["TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "CONT", "URG"];

/// A job's `signal` ("USR1@120", "SIGUSR2", "TERM@30"): the signal's name without
/// "SIG" and the seconds before the kill (`None`: the kill grace). Empty: `Ok(None)`.
pub fn parse_signal_spec(s: &str) -> Result<Option<(String, Option<u64>)>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    let (name, secs) = match s.split_once('@') {
        Some((n, t)) => {
            let t: u64 = t
                .parse()
                .map_err(|_| format!("signal {s:?}: the part after @ is seconds (USR1@120)"))?;
            if t > 3600 {
                return Err(format!(
                    "signal {s:?}: at most 3600 seconds before the kill"
                ));
            }
            (n, Some(t))
        }
        None => (s, None),
    };
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    if !SIGNALS.contains(&bare) {
        return Err(format!(
            "signal {name:?} is not one a job may ask for ({})",
            SIGNALS.join(", ")
        ));
    }
    Ok(Some((bare.to_string(), secs)))
}

/// The signal name of a `KillJob` ("" = TERM) as `parse_signal_spec` checks it.
pub fn parse_signal(s: &str) -> Result<Option<String>, String> {
    Ok(parse_signal_spec(s)?.map(|(n, _)| n))
}
