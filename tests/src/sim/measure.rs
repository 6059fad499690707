//! What a run measured of the first user: windows, worst slot,
//! utilization, re-convergence after shifts.

use super::{Outcome, Scenario};

pub(super) fn measure(
    scenario: &Scenario,
    admitted: &[i64],
    offered: &[i64],
    others_refused: u64,
    deepest: f64,
) -> Outcome {
    let limit = scenario.users[0].limit;
    let from = scenario.warm_up as usize;
    let steady = &admitted[from.min(admitted.len())..];
    let windows: Vec<f64> = steady
        .windows(10)
        .map(|w| w.iter().sum::<i64>() as f64 / (10.0 * limit))
        .collect();
    let capped: f64 = offered[from.min(offered.len())..]
        .iter()
        .map(|&o| (o as f64).min(limit))
        .sum();
    let reconverge = scenario
        .shifts
        .iter()
        .map(|&shift| {
            let s = (shift / 1000) as usize;
            (s..admitted.len())
                .find(|&k| ((admitted[k] as f64 / limit) - 1.0).abs() <= 0.05)
                .map_or(i64::MAX, |k| (k - s) as i64)
        })
        .max()
        .unwrap_or(0);
    Outcome {
        window_min: windows.iter().copied().fold(f64::INFINITY, f64::min),
        window_max: windows.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        worst_slot: steady.iter().map(|&a| a as f64 / limit).fold(0.0, f64::max),
        utilization: if capped > 0.0 {
            steady.iter().sum::<i64>() as f64 / capped
        } else {
            1.0
        },
        others_refused,
        reconverge_slots: reconverge,
        deepest_debt: if deepest.is_finite() { deepest } else { 0.0 },
        outage: None,
    }
}
