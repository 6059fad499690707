//! Hierarchical quotas as a limits file declares them: a service's
//! capacity (what all its users take together) and its applications
//! (groups of users with a guaranteed rate, a burst ceiling and a
//! priority). The [`Hierarchical`](crate::policy::Hierarchical) policy
//! splits the capacity by them each slot.

use std::collections::BTreeMap;

use serde::Serialize;

/// The name of the policy that shares a capacity.
pub const HIERARCHICAL: &str = "hierarchical";

/// The priority of users in no application: below every application's.
pub const NO_APP_PRIORITY: u32 = u32::MAX;

/// The highest (least urgent) priority an application may be given.
pub const MAX_PRIORITY: u32 = 1_000;

/// The burst duration of an application that does not say, in seconds.
pub const DEFAULT_APP_BURST_SECONDS: f64 = 60.0;

/// One service's capacity and applications.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Hierarchy {
    /// Resource -> what all users together may take per second.
    pub capacity: BTreeMap<String, f64>,
    /// The applications, in the order the file lists them.
    pub apps: Vec<App>,
}

/// An application: users that share a guarantee and a ceiling.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct App {
    /// Its name, unique in the service.
    pub name: String,
    /// Its users: names, or prefixes ending in `*` (`"video-*"`).
    pub users: Vec<String>,
    /// 0 is served first.
    pub priority: u32,
    /// Resource -> the rate per second it is given first, capacity
    /// allowing.
    pub guaranteed: BTreeMap<String, f64>,
    /// Resource -> the most per second it may reach while the capacity
    /// has room and its burst allowance lasts; at least `guaranteed`.
    pub burst: BTreeMap<String, f64>,
    /// How long it may run above its guarantee before it is held to it;
    /// running below earns the time back, second for second.
    pub burst_seconds: f64,
}

impl App {
    /// The guaranteed rate of `resource` (0 if none).
    pub fn guaranteed(&self, resource: &str) -> f64 {
        self.guaranteed.get(resource).copied().unwrap_or(0.0)
    }

    /// The burst ceiling of `resource`: its `burst`, else its guarantee.
    pub fn ceiling(&self, resource: &str) -> f64 {
        let burst = self.burst.get(resource).copied().unwrap_or(0.0);
        burst.max(self.guaranteed(resource))
    }
}

impl Hierarchy {
    /// The index in [`Hierarchy::apps`] of the application `user` is in:
    /// the one naming it, else the one with the longest prefix it
    /// matches; `None` for a user in no application.
    pub fn app_of(&self, user: &str) -> Option<usize> {
        let mut best: Option<(usize, usize)> = None;
        for (i, app) in self.apps.iter().enumerate() {
            for pattern in &app.users {
                match pattern.strip_suffix('*') {
                    None if pattern == user => return Some(i),
                    Some(prefix)
                        if user.starts_with(prefix)
                            && best.is_none_or(|(len, _)| prefix.len() > len) =>
                    {
                        best = Some((prefix.len(), i));
                    }
                    _ => {}
                }
            }
        }
        best.map(|(_, i)| i)
    }
}
