//! What the hierarchical policy shows the monitor (`/v1/monitor/apps`).

use serde::Serialize;

/// One service's capacity split, as of its latest assign. Rates are per
/// second.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AppsStatus {
    /// The slot assigned.
    pub slot: i64,
    /// One per resource of the capacity.
    pub resources: Vec<ResourceStatus>,
}

/// One resource's capacity and how it was split.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ResourceStatus {
    /// The resource.
    pub resource: String,
    /// What all users together may take.
    pub capacity: f64,
    /// What was granted, over every application.
    pub granted: f64,
    /// What was consumed in each node's latest report, over every user.
    pub consumed: f64,
    /// Per application, in the file's order; users in no application
    /// last, as one row named `*`.
    pub apps: Vec<AppStatus>,
}

/// One application's part of a resource's capacity.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AppStatus {
    /// Its name (`*` for users in no application).
    pub name: String,
    /// 0 is served first.
    pub priority: u32,
    /// Its guaranteed rate.
    pub guaranteed: f64,
    /// Its burst ceiling.
    pub burst: f64,
    /// What its users would use (consumption and refusals, each user's
    /// capped by their own limits).
    pub demand: f64,
    /// What it was granted, headroom included.
    pub granted: f64,
    /// What its users consumed in each node's latest report.
    pub consumed: f64,
    /// Seconds it may still run above its guarantee.
    pub burst_seconds_left: f64,
    /// Users seen lately.
    pub users: usize,
}
