//! A service's limits as the central node sent them ([`v1::Limits`]): the
//! quota of a user the slot's table has no row for (a user new to this
//! node), what all such users may take together ([`Newcomers`]), and
//! what each user is configured for, which refusals and rate-limit
//! headers name.
//!
//! Read when a user enters a slot without a row (for the default quota)
//! and when a refusal is built, never by an allowed request with a row;
//! replaced whole when the central sends a new one.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use throttle_proto::v1;

use super::newcomers::Newcomers;
use super::resource::{MAX_RESOURCES, ResourceId};
use super::user::whole_units;

/// A configured limit: `amount` of a resource per `window_seconds`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Allowance {
    /// The period the amount is for, in seconds (1, 60, 3,600, 86,400).
    pub(crate) window_seconds: u32,
    /// What the user may consume in a window.
    pub(crate) amount: f64,
}

/// A window's name as the limits file writes it (`second`, `minute`,
/// `hour`, `day`), or `N s`.
pub(crate) fn period_name(window_seconds: u32) -> Cow<'static, str> {
    match window_seconds {
        1 => "second".into(),
        60 => "minute".into(),
        3_600 => "hour".into(),
        86_400 => "day".into(),
        n => format!("{n} s").into(),
    }
}

/// A user's allowances, by resource name, shortest window first.
pub(crate) type Allowances = Vec<(Arc<str>, Allowance)>;

/// One service's limits on this node.
#[derive(Debug, Default)]
pub(crate) struct ServiceLimits {
    /// The quota row of a user without a row or a rule of their own.
    default_row: Option<Row>,
    every: Allowances,
    users: HashMap<Box<str>, UserLimits, foldhash::fast::RandomState>,
    /// What the users without a row may take together.
    newcomers: Newcomers,
}

/// Per resource id, the whole units a user without a row may take in a
/// slot: NaN where it sets none.
type Row = [f32; MAX_RESOURCES];

/// The default row of a user no rule limits, where newcomers are held
/// together: it limits them only through [`Newcomers`].
const NOT_LIMITED: Row = [f32::NAN; MAX_RESOURCES];

/// A user with a rule of their own.
#[derive(Debug)]
struct UserLimits {
    allowances: Allowances,
    default_row: Option<Box<Row>>,
}

impl ServiceLimits {
    /// The limits of `msg`, the default quotas' resources named by `id`
    /// (which registers them; `None` for one the service cannot count).
    pub(super) fn from_message(
        msg: v1::Limits,
        mut id: impl FnMut(&str) -> Option<ResourceId>,
    ) -> Self {
        let default_row = row(&msg.default_quota, &mut id);
        let newcomers = Newcomers::new(row(&msg.newcomers, &mut id).unwrap_or(NOT_LIMITED));
        let users = msg.users.into_iter().map(|u| {
            let limits = UserLimits {
                default_row: row(&u.default_quota, &mut id).map(Box::new),
                allowances: allowances(u.allowances),
            };
            (u.user.into_boxed_str(), limits)
        });
        Self {
            default_row,
            every: allowances(msg.every),
            users: users.collect(),
            newcomers,
        }
    }

    /// Whether some user without a row is held to a default quota, or
    /// all of them together.
    pub(super) fn has_default(&self) -> bool {
        self.default_row.is_some()
            || self.users.values().any(|u| u.default_row.is_some())
            || self.newcomers.is_limited()
    }

    /// The quota row of `user`, for a slot whose table has no row for
    /// them: their own rule's share, else the `*` rule's; a row of no
    /// quota when neither limits them but newcomers are held together;
    /// else `None`.
    #[inline]
    pub(super) fn default_row(&self, user: &str) -> Option<&Row> {
        let row = match self.users.get(user) {
            Some(u) => u.default_row.as_deref(),
            None => self.default_row.as_ref(),
        };
        row.or_else(|| self.newcomers.is_limited().then_some(&NOT_LIMITED))
    }

    /// What the users without a row may take together.
    pub(super) fn newcomers(&self) -> &Newcomers {
        &self.newcomers
    }

    /// Whether the limits say nothing of anyone.
    pub(crate) fn is_empty(&self) -> bool {
        self.default_row.is_none()
            && self.every.is_empty()
            && self.users.is_empty()
            && !self.newcomers.is_limited()
    }

    /// What limits `user`: their own allowances, else those of every user
    /// (empty when neither is known).
    pub(crate) fn of(&self, user: &str) -> &[(Arc<str>, Allowance)] {
        self.users.get(user).map_or(&self.every, |u| &u.allowances)
    }

    /// The allowance of `user`'s `resource` with the shortest window: the
    /// one headers describe.
    pub(crate) fn shortest(&self, user: &str, resource: &str) -> Option<Allowance> {
        self.of(user)
            .iter()
            .find(|(r, _)| &**r == resource)
            .map(|(_, a)| *a)
    }

    /// The allowance of `user`'s `resource` over `window_seconds`.
    pub(crate) fn over(
        &self,
        user: &str,
        resource: &str,
        window_seconds: u32,
    ) -> Option<Allowance> {
        self.of(user)
            .iter()
            .find(|(r, a)| &**r == resource && a.window_seconds == window_seconds)
            .map(|(_, a)| *a)
    }
}

/// A service's keys bound now by a longer period than their shortest
/// ([`v1::Bound`]): user -> (resource, window in seconds).
#[derive(Debug, Default)]
pub(crate) struct Bound {
    keys: HashMap<Box<str>, BoundResources, foldhash::fast::RandomState>,
}

/// A user's bound resources, each with its window in seconds.
type BoundResources = Vec<(Box<str>, u32)>;

impl Bound {
    /// The keys of `msg`.
    pub(super) fn from_message(msg: v1::Bound) -> Self {
        let mut keys: HashMap<Box<str>, BoundResources, _> = HashMap::default();
        for k in msg.keys {
            let entry = keys.entry(k.user.into_boxed_str()).or_default();
            entry.push((k.resource.into_boxed_str(), k.window_seconds));
        }
        Self { keys }
    }

    /// The window binding `user`'s `resource`, if a longer one does.
    pub(crate) fn window(&self, user: &str, resource: &str) -> Option<u32> {
        let list = self.keys.get(user)?;
        list.iter().find(|(r, _)| &**r == resource).map(|(_, w)| *w)
    }

    /// Whether no key is bound by a longer period.
    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// The row of `quotas`, `None` if it limits nothing this service counts.
fn row(
    quotas: &std::collections::BTreeMap<String, f64>,
    id: &mut impl FnMut(&str) -> Option<ResourceId>,
) -> Option<Row> {
    let mut row = [f32::NAN; MAX_RESOURCES];
    for (resource, &quota) in quotas {
        if let Some(i) = id(resource) {
            row[i.index()] = whole_units(quota);
        }
    }
    row.iter().any(|q| !q.is_nan()).then_some(row)
}

/// `list` by resource, shortest window first; amounts that are not finite
/// and positive, and windows of 0, are left out.
fn allowances(list: Vec<v1::Allowance>) -> Allowances {
    let mut out: Allowances = list
        .into_iter()
        .filter(|a| a.window_seconds > 0 && a.amount.is_finite() && a.amount >= 0.0)
        .map(|a| {
            let allowance = Allowance {
                window_seconds: a.window_seconds,
                amount: a.amount,
            };
            (Arc::from(a.resource), allowance)
        })
        .collect();
    out.sort_by(|(r, a), (s, b)| r.cmp(s).then(a.window_seconds.cmp(&b.window_seconds)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowance(resource: &str, window_seconds: u32, amount: f64) -> v1::Allowance {
        v1::Allowance {
            resource: resource.into(),
            window_seconds,
            amount,
        }
    }

    #[test]
    fn a_user_without_a_rule_of_their_own_has_every_users() {
        let msg = v1::Limits {
            service: "front".into(),
            default_quota: [("requests".to_string(), 33.7), ("bytes".to_string(), 5.0)].into(),
            every: vec![
                allowance("requests", 60, 6000.0),
                allowance("requests", 1, 100.0),
            ],
            users: vec![v1::UserLimits {
                user: "alice".into(),
                allowances: vec![allowance("requests", 1, 1000.0), allowance("x", 0, 1.0)],
                default_quota: [("requests".to_string(), 333.4)].into(),
            }],
            users_truncated: false,
            newcomers: Default::default(),
        };
        let names = ["requests"];
        let limits = ServiceLimits::from_message(msg, |r| {
            names
                .iter()
                .position(|n| *n == r)
                .map(|i| ResourceId(i as u8))
        });
        let row = limits.default_row("bob").expect("a default");
        assert_eq!(row[0], 33.0, "whole units");
        assert!(row[1].is_nan(), "bytes is not counted here");
        assert_eq!(
            limits.default_row("alice").map(|r| r[0]),
            Some(333.0),
            "her own"
        );
        assert_eq!(
            limits.shortest("bob", "requests").map(|a| a.amount),
            Some(100.0)
        );
        assert_eq!(period_name(limits.of("bob")[1].1.window_seconds), "minute");
        assert_eq!(
            limits.shortest("alice", "requests").map(|a| a.amount),
            Some(1000.0)
        );
        assert_eq!(limits.of("alice").len(), 1, "a window of 0 is left out");
        assert!(ServiceLimits::default().default_row("bob").is_none());
    }
}
