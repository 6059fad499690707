//! The simulator's hierarchical-quota scenarios: applications with
//! guaranteed rates, burst ceilings and priorities sharing one capacity
//! (the `[service.NAME] capacity` and `[[app]]` entries of a limits file).
//!
//! Each runs in [`sim`] as any scenario does; what is measured
//! is each application's and the capacity's admitted total per slot.

use std::ops::Range;

use throttle_central::limits::LimitSet;
use throttle_core::policy::Hierarchical;

use crate::sim::{self, Scenario, User, base};

/// The capacity of every scenario here, requests per second.
pub const CAPACITY: f64 = 1000.0;

/// One application of a scenario.
#[derive(Debug, Clone)]
pub struct AppSpec {
    /// Its name in the limits.
    pub name: &'static str,
    /// Its guaranteed rate.
    pub guaranteed: f64,
    /// Its users, as indices into the scenario's users.
    pub users: Range<usize>,
}

/// A scenario and the applications it measures.
#[derive(Debug)]
pub struct AppsScenario {
    /// The run.
    pub scenario: Scenario,
    /// The applications, by priority.
    pub apps: Vec<AppSpec>,
    /// When (ms since start) an application goes idle, if one does.
    pub idle_at: Option<i64>,
}

/// What a run measured, over 10-slot windows after the warm-up.
#[derive(Debug, Clone, PartialEq)]
pub struct AppsOutcome {
    /// Least and most admitted over every application, / capacity.
    pub total_min: f64,
    /// See `total_min`.
    pub total_max: f64,
    /// Per application: its least window, / its guarantee.
    pub app_min: Vec<f64>,
    /// Per application: what it was admitted per second, on average.
    pub app_mean: Vec<f64>,
    /// Slots after `idle_at` until the others use 98% of the capacity.
    pub lend_slots: Option<i64>,
    /// From 3 slots after `idle_at` on: admitted over every application
    /// / capacity.
    pub lent_utilization: Option<f64>,
    /// Slots from the start where the first application was admitted
    /// more than 5% above its guarantee.
    pub burst_slots: i64,
}

/// The applications of every scenario here, by priority.
pub const APP_NAMES: [&str; 3] = ["gold", "silver", "bronze"];

/// Three applications of service `front` sharing `capacity` requests/s:
/// [`APP_NAMES`] at priorities 0, 1, 2, each guaranteed 300/s with a burst
/// ceiling of 600/s and `burst_seconds` of burst, with users `gold-*`,
/// `silver-*`, `bronze-*`.
///
/// # Panics
///
/// Never for a positive capacity and burst (the text is fixed).
pub fn three_apps(capacity: f64, burst_seconds: f64) -> LimitSet {
    let mut text = format!("[service.front]\ncapacity = {{ requests = {capacity} }}\n");
    for (p, name) in APP_NAMES.iter().enumerate() {
        text += &format!(
            "[[app]]\nservice = \"front\"\nname = \"{name}\"\nusers = [\"{name}-*\"]\npriority = {p}\nguaranteed = {{ requests = 300 }}\nburst = {{ requests = 600 }}\nburst_seconds = {burst_seconds}\n"
        );
    }
    LimitSet::from_toml(&text).expect("the scenarios' limits parse")
}

/// Each application's three users, offering `demand(app, t)` requests a
/// second in all, spread unevenly over four nodes (each user on its own
/// mix).
fn users(demand: fn(usize, i64) -> f64) -> (Vec<User>, Vec<AppSpec>) {
    let mut users = Vec::new();
    let mut apps = Vec::new();
    for (a, name) in APP_NAMES.into_iter().enumerate() {
        let start = users.len();
        for (u, part) in [0.5, 0.3, 0.2].into_iter().enumerate() {
            users.push(User {
                name: format!("{name}-{u}"),
                limit: 300.0,
                demand: Box::new(move |t, n| {
                    let mix = [0.4, 0.3, 0.2, 0.1];
                    demand(a, t) * part * mix[(n + u + a) % 4]
                }),
            });
        }
        apps.push(AppSpec {
            name,
            guaranteed: 300.0,
            users: start..users.len(),
        });
    }
    (users, apps)
}

fn scenario(
    name: &'static str,
    seed: u64,
    limits: fn() -> LimitSet,
    demand: fn(usize, i64) -> f64,
) -> AppsScenario {
    let (users, apps) = users(demand);
    let mut scenario = base(name, seed, users, 4);
    scenario.limits = Some(limits());
    AppsScenario {
        scenario,
        apps,
        idle_at: None,
    }
}

/// The hierarchical scenarios, in order.
pub fn scenarios() -> Vec<AppsScenario> {
    let twice = |_: usize, _: i64| 600.0;
    let mut idle = scenario(
        "A3 silver idle from 30 s",
        103,
        || three_apps(CAPACITY, 1e6),
        |a, t| if a == 1 && t >= 30_000 { 0.0 } else { 600.0 },
    );
    idle.idle_at = Some(30_000);
    vec![
        scenario(
            "A1 guarantees fit, 2x demand",
            101,
            || three_apps(CAPACITY, 1e6),
            twice,
        ),
        scenario(
            "A2 guarantees past capacity",
            102,
            || three_apps(0.8 * CAPACITY, 1e6),
            twice,
        ),
        idle,
        scenario(
            "A4 bursts of 20 s",
            104,
            || three_apps(2.0 * CAPACITY, 20.0),
            twice,
        ),
    ]
}

/// The scenario named `prefix...`.
///
/// # Panics
///
/// When there is none: a typo in a test.
pub fn named(prefix: &str) -> AppsScenario {
    scenarios()
        .into_iter()
        .find(|s| s.scenario.name.starts_with(prefix))
        .unwrap_or_else(|| panic!("no scenario {prefix:?}"))
}

/// Runs `s` under the hierarchical policy.
pub fn run(s: &AppsScenario) -> AppsOutcome {
    let trace = sim::run_traced(&s.scenario, Box::new(|_| Box::new(Hierarchical::new())));
    let slots = trace.admitted.first().map_or(0, Vec::len);
    let per_app: Vec<Vec<i64>> = s
        .apps
        .iter()
        .map(|a| {
            (0..slots)
                .map(|k| trace.admitted[a.users.clone()].iter().map(|u| u[k]).sum())
                .collect()
        })
        .collect();
    let total: Vec<i64> = (0..slots)
        .map(|k| per_app.iter().map(|a| a[k]).sum())
        .collect();
    let capacity = s
        .scenario
        .limits
        .as_ref()
        .and_then(|l| l.hierarchy("front").map(|h| h.capacity["requests"]))
        .unwrap_or(CAPACITY);
    let from = s.scenario.warm_up as usize;
    let windows = |series: &[i64], per_slot: f64| -> Vec<f64> {
        series[from.min(series.len())..]
            .windows(10)
            .map(|w| w.iter().sum::<i64>() as f64 / (10.0 * per_slot))
            .collect()
    };
    let totals = windows(&total, capacity);
    let fold = |v: &[f64], f: fn(f64, f64) -> f64, init| v.iter().copied().fold(init, f);
    let lend_slots = s.idle_at.map(|at| {
        let k0 = (at / 1000) as usize;
        (k0..slots)
            .find(|&k| total[k] as f64 >= 0.98 * capacity)
            .map_or(i64::MAX, |k| (k - k0) as i64)
    });
    let lent_utilization = s.idle_at.map(|at| {
        let after = &total[(at / 1000 + 3) as usize..];
        after.iter().sum::<i64>() as f64 / (after.len() as f64 * capacity)
    });
    let first = &per_app[0];
    let burst_slots = first
        .iter()
        .skip(1)
        .take_while(|&&a| a as f64 > 1.05 * s.apps[0].guaranteed)
        .count() as i64;
    AppsOutcome {
        total_min: fold(&totals, f64::min, f64::INFINITY),
        total_max: fold(&totals, f64::max, f64::NEG_INFINITY),
        app_min: s
            .apps
            .iter()
            .zip(&per_app)
            .map(|(a, series)| fold(&windows(series, a.guaranteed), f64::min, f64::INFINITY))
            .collect(),
        app_mean: per_app
            .iter()
            .map(|series| {
                let steady = &series[from.min(series.len())..];
                steady.iter().sum::<i64>() as f64 / steady.len().max(1) as f64
            })
            .collect(),
        lend_slots,
        lent_utilization,
        burst_slots,
    }
}
