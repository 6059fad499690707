//! A service's users: a lock-free map whose nodes hold each user's
//! state inline, in one of a few size classes.

use compact_str::CompactString;

use super::resource::{MAX_RESOURCES, ResourceId};
use super::user::{Cell, UserState};

/// The per-user lock. A spin lock rather than `parking_lot`'s: its unlock is
/// a plain release store where a parking mutex needs a compare-and-swap, one
/// atomic read-modify-write less on every decision. Critical sections are a
/// few dozen instructions and two requests contend only for the same user;
/// a waiter yields its time slice rather than burn it, so a preempted holder
/// is not starved.
pub(super) type UserLock<T> = spin::mutex::SpinMutex<T, spin::relax::Yield>;

pub(super) type UserGuard<'g> = spin::mutex::SpinMutexGuard<'g, UserState>;

/// A tracked user: the map's value, stored with the user's name (the key,
/// inline up to 24 bytes) in the map's own node. One allocation per user:
/// the lookup, the key compare, the lock and the cells read adjacent lines.
pub(super) type Entry<const N: usize> = UserLock<UserState<[Cell; N]>>;

pub(super) type UserMap<const N: usize> =
    papaya::HashMap<CompactString, Entry<N>, foldhash::fast::RandomState>;

/// A user's name as the maps' query: hashed as its key is (as a `str`), and
/// compared inline, 8 bytes at a time. Comparing as `str` calls `memcmp`,
/// which for a name of a few dozen bytes is most of the comparison's cost
/// (the `admit` benchmarks in `docs/performance.md`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Name<'a>(pub(super) &'a str);

impl std::hash::Hash for Name<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl papaya::Equivalent<CompactString> for Name<'_> {
    #[inline]
    fn equivalent(&self, key: &CompactString) -> bool {
        same_bytes(self.0.as_bytes(), key.as_bytes())
    }
}

#[inline]
pub(super) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let ((a8, a_rest), (b8, b_rest)) = (a.as_chunks::<8>(), b.as_chunks::<8>());
    a8.iter()
        .zip(b8)
        .all(|(x, y)| u64::from_ne_bytes(*x) == u64::from_ne_bytes(*y))
        && a_rest.iter().zip(b_rest).all(|(x, y)| x == y)
}

/// A guard of any class's map: the type does not depend on the class.
pub(super) type Guard<'m> = papaya::LocalGuard<'m>;

/// A service's users, in a map whose nodes hold `N` cells each: the
/// smallest class that holds the resources registered when the map is
/// made, at the service's first user. A user of a service that later
/// counts more resources moves its cells to a [`Spill`].
pub(super) enum Users {
    C1(UserMap<1>),
    C2(UserMap<2>),
    C3(UserMap<3>),
    C4(UserMap<4>),
    C6(UserMap<6>),
    C8(UserMap<8>),
    C12(UserMap<12>),
    C16(UserMap<MAX_RESOURCES>),
}

/// Runs `$body` with `$map` bound to the map of whichever class `$users` is.
macro_rules! with_users {
    ($users:expr, $map:ident => $body:expr) => {
        match $users {
            Users::C1($map) => $body,
            Users::C2($map) => $body,
            Users::C3($map) => $body,
            Users::C4($map) => $body,
            Users::C6($map) => $body,
            Users::C8($map) => $body,
            Users::C12($map) => $body,
            Users::C16($map) => $body,
        }
    };
}
pub(super) use with_users;

impl Users {
    pub(super) fn for_resources(n: usize) -> Self {
        fn map<const N: usize>() -> UserMap<N> {
            UserMap::with_hasher(foldhash::fast::RandomState::default())
        }
        match n {
            0..=1 => Self::C1(map()),
            2 => Self::C2(map()),
            3 => Self::C3(map()),
            4 => Self::C4(map()),
            5..=6 => Self::C6(map()),
            7..=8 => Self::C8(map()),
            9..=12 => Self::C12(map()),
            _ => Self::C16(map()),
        }
    }

    pub(super) fn len(&self) -> usize {
        with_users!(self, m => m.len())
    }

    /// Cells inline in each user's node.
    #[cfg(any(test, feature = "sim"))]
    pub(super) fn class(&self) -> usize {
        fn of<const N: usize>(_: &UserMap<N>) -> usize {
            N
        }
        with_users!(self, m => of(m))
    }
}

/// What `user` was admitted of `resource` in `slot`, if `users` knows
/// them: what a budget told during the slot has not counted.
pub(super) fn used_in(users: &Users, user: &str, resource: ResourceId, slot: i64) -> i64 {
    with_users!(users, map => {
        let guard = map.guard();
        map.get(&Name(user), &guard).map_or(0, |entry| {
            let state: &UserLock<UserState> = entry;
            let st = state.lock();
            let cell = st.cells().get(resource.index());
            cell.filter(|_| st.slot == slot).map_or(0, |c| c.used)
        })
    })
}
