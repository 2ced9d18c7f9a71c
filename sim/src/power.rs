//! What a GPU power cap costs a training job, and what it saves (issue 58), from a
//! published measurement: Perseus (Chung et al., "Reducing Energy Bloat in Large Model
//! Training", SOSP 2024), whose artifact holds the time and energy of one training
//! iteration of five models (BERT-huge, BLOOM-3B, GPT-3 XL, T5-3B, Wide-ResNet-101),
//! four-stage pipelines on A100 GPUs, at GPU power limits from 300 W (the GPUs'
//! maximum there) down to 175 W (`ml-energy/zeus`, `sosp24_data/zeus/csv/A100/
//! zeus_global.csv`, the rows of its Zeus baseline, which sets one limit for all
//! stages). `MEASURED` keeps them; a cap's effect is the five models' mean ratio to
//! the uncapped run, interpolated linearly in the cap's share of the maximum limit.
//!
//! A job keeps the GPU busy only part of its time (`crate::usage`): the cap stretches
//! its busy part, not its idle part. For a job of busy share `d` under a cap whose
//! measured time ratio is `m` and energy ratio `e`: its work runs at `1 / (d m + 1 -
//! d)` of its speed, and while busy the GPU draws `e / m` of what it draws uncapped.
//! A GPU's power is the fake backend's A100 curve (`gpud::gpu::fake`: 60 W idle, 400 W
//! fully busy).
//!
//! Pure: figures in, figures out.

/// One measured cap: its limit (W) and, per model, the iteration's time (s) and energy
/// (J) at that limit. The first row is the uncapped run (the maximum limit).
pub const MEASURED: [(f64, [(f64, f64); 5]); 6] = [
    (
        300.0,
        [
            (6.3548, 6819.0),
            (61.545, 68580.0),
            (60.095, 66955.0),
            (9.2383, 10181.0),
            (11.676, 12836.0),
        ],
    ),
    (
        275.0,
        [
            (6.5457, 6516.6),
            (63.342, 65368.0),
            (62.024, 63685.0),
            (9.4885, 9660.4),
            (12.123, 12279.0),
        ],
    ),
    (
        250.0,
        [
            (6.8674, 6298.7),
            (66.173, 62578.0),
            (65.022, 61065.0),
            (9.8546, 9219.8),
            (13.004, 12009.0),
        ],
    ),
    (
        225.0,
        [
            (7.5728, 6309.0),
            (72.490, 61975.0),
            (73.329, 61897.0),
            (10.747, 9106.2),
            (14.693, 12247.0),
        ],
    ),
    (
        200.0,
        [
            (8.9626, 6662.0),
            (85.021, 64570.0),
            (87.919, 66011.0),
            (12.549, 9475.1),
            (16.900, 12665.0),
        ],
    ),
    (
        175.0,
        [
            (11.077, 7259.4),
            (104.32, 69595.0),
            (106.30, 70646.0),
            (15.467, 10286.0),
            (20.897, 13782.0),
        ],
    ),
];

/// The A100's draw idle and fully busy, as the fake backend models it (W).
pub const IDLE_W: f64 = 60.0;
pub const BUSY_W: f64 = 400.0;

/// The measured mean ratios at each cap: (share of the maximum limit, time ratio,
/// energy ratio), from the uncapped row down.
fn ratios() -> [(f64, f64, f64); 6] {
    let base = MEASURED[0];
    MEASURED.map(|(w, runs)| {
        let (mut t, mut e) = (0.0, 0.0);
        for (k, (time, energy)) in runs.iter().enumerate() {
            t += time / base.1[k].0;
            e += energy / base.1[k].1;
        }
        (w / base.0, t / 5.0, e / 5.0)
    })
}

/// What a cap at `share` of the maximum limit does to fully busy training: (time ratio,
/// energy ratio) against the uncapped run. At or above the maximum: none. Below the
/// lowest cap measured: the lowest one's (the measurement says nothing lower).
pub fn cap_effect(share: f64) -> (f64, f64) {
    let r = ratios();
    if share >= 1.0 {
        return (1.0, 1.0);
    }
    for w in r.windows(2) {
        let (hi, lo) = (w[0], w[1]);
        if share >= lo.0 {
            let f = (share - lo.0) / (hi.0 - lo.0);
            return (lo.1 + f * (hi.1 - lo.1), lo.2 + f * (hi.2 - lo.2));
        }
    }
    let last = r[r.len() - 1];
    (last.1, last.2)
}

/// The speed of work of busy share `demand` under a cap of time ratio `m` (1: none).
pub fn rate(demand: f64, m: f64) -> f64 {
    if m == 1.0 {
        // Exactly: an uncapped replay is the same with or without this model.
        return 1.0;
    }
    let d = demand.clamp(0.0, 1.0);
    1.0 / (d * m + 1.0 - d)
}

/// What a job of busy share `demand` adds to its GPU's draw over idle under a cap of
/// ratios `(m, e)` (W per GPU it holds whole).
pub fn active_w(demand: f64, (m, e): (f64, f64)) -> f64 {
    let d = demand.clamp(0.0, 1.0);
    // The share of wall time its GPU is busy: its busy part stretched by the cap.
    let busy = d * m / (d * m + 1.0 - d);
    busy * (BUSY_W * e / m - IDLE_W)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The measurement's own figures: the five models' mean iteration time and energy
    /// against the uncapped run at each limit (Perseus' artifact, A100, 300 W max).
    #[test]
    fn reproduces_the_measured_means() {
        let at = |w: f64| cap_effect(w / 300.0);
        let close = |a: f64, b: f64| (a - b).abs() < 0.002;
        let (t, e) = at(275.0);
        assert!(close(t, 1.031) && close(e, 0.953), "{t} {e}");
        let (t, e) = at(250.0);
        assert!(close(t, 1.084) && close(e, 0.918), "{t} {e}");
        let (t, e) = at(225.0);
        assert!(close(t, 1.202) && close(e, 0.920), "{t} {e}");
        let (t, e) = at(200.0);
        assert!(close(t, 1.412) && close(e, 0.965), "{t} {e}");
        let (t, e) = at(175.0);
        assert!(close(t, 1.734) && close(e, 1.044), "{t} {e}");
        // Energy is least near 250 W (-8.2%, for 8.4% more time): below that the
        // run's length costs more than the cap saves.
        assert_eq!(at(300.0), (1.0, 1.0));
        assert_eq!(cap_effect(1.2), (1.0, 1.0));
        assert_eq!(cap_effect(0.1), at(175.0));
    }

    #[test]
    fn interpolates_between_measured_caps() {
        let (t, _) = cap_effect(262.5 / 300.0);
        let (a, _) = cap_effect(275.0 / 300.0);
        let (b, _) = cap_effect(250.0 / 300.0);
        assert!((t - (a + b) / 2.0).abs() < 1e-9);
    }

    #[test]
    fn a_cap_stretches_only_the_busy_part() {
        let m = cap_effect(250.0 / 300.0).0;
        // Fully busy: the measured slowdown; idle: none; half busy: half of it.
        assert!((1.0 / rate(1.0, m) - m).abs() < 1e-9);
        assert_eq!(rate(0.0, m), 1.0);
        assert!((1.0 / rate(0.5, m) - (1.0 + (m - 1.0) / 2.0)).abs() < 1e-9);
        // Uncapped, a fully busy GPU draws 400 W (340 over idle); capped, less.
        assert!((active_w(1.0, (1.0, 1.0)) - 340.0).abs() < 1e-9);
        let capped = active_w(1.0, cap_effect(250.0 / 300.0));
        assert!(capped < 340.0 && capped > 250.0, "{capped}");
    }
}
