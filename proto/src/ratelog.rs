//! Rate-limited logging for what an attacker can make happen at will (refused
//! connections, unauthenticated calls): the first occurrence in a period is logged at
//! once, later ones in the same period are counted and reported together by the next
//! line, so a flood writes a line per period instead of one per request.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct RateLog {
    period: Duration,
    /// When the last line was written and how many occurrences since (not logged yet).
    state: Mutex<(Option<Instant>, u64)>,
}

impl RateLog {
    pub const fn new(period: Duration) -> RateLog {
        RateLog {
            period,
            state: Mutex::new((None, 0)),
        }
    }

    /// Counts one occurrence; calls `log(count, period_secs)` when a line is due, with
    /// the occurrences it covers (this one and those held back since the last line).
    pub fn note(&self, log: impl FnOnce(u64, u64)) {
        self.note_at(Instant::now(), log);
    }

    pub fn note_at(&self, now: Instant, log: impl FnOnce(u64, u64)) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.1 += 1;
        if s.0
            .is_none_or(|last| now.duration_since(last) >= self.period)
        {
            let n = std::mem::take(&mut s.1);
            s.0 = Some(now);
            drop(s);
            log(n, self.period.as_secs());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_makes_one_line_per_period_with_its_count() {
        let r = RateLog::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let mut lines = Vec::new();
        for i in 0..100_000u64 {
            // 100,000 occurrences over 25 s.
            let t = t0 + Duration::from_micros(i * 250);
            r.note_at(t, |n, _| lines.push(n));
        }
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(lines[0], 1);
        assert_eq!(lines.iter().sum::<u64>(), 100_000 - 19_999, "{lines:?}");
    }
}
