//! [`Levels`]: one request checked against a user's bucket, its service's
//! and the whole cluster's, as the legacy token-bucket library's levels.

use std::time::Duration;

use super::buckets::Buckets;
use super::level::Wait;
use super::memory::MemoryStore;
use super::shape::Shape;
use super::store::{Store, StoreError};

/// Which level refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The user's own bucket in its service.
    User,
    /// The service's bucket, shared by all its users in this process.
    Service,
    /// The cluster's bucket, shared by every service and every process
    /// on the store.
    Cluster,
}

/// A refusal and the level that gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LevelRefusal {
    /// The level that refused.
    pub scope: Scope,
    /// Why, or how long until it would not.
    pub wait: Wait,
}

/// The service the service level's buckets live under in memory, each
/// keyed by the service it limits: a name beginning with a NUL byte, so
/// that it is no service a caller names.
const SERVICE_LEVEL: &str = "\u{0}service";

/// A user's bucket and its service's in this process's memory, and the
/// cluster's bucket in a store shared by the fleet (Redis, or memory for
/// one process): a request takes from each level that is set, user first,
/// cluster last. Refused by one, it gives back what the levels before
/// took, so a refusal costs nothing. The block list (per service) is this
/// process's, in the memory store; a fleet-wide one is the shared store's
/// ([`Buckets::block`]).
///
/// ```
/// use throttle_layer::bucket::{Buckets, Levels, MemoryStore, Scope, Shape};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let cluster = Buckets::new(MemoryStore::new(), "cluster", Shape::per_second(100));
/// let levels = Levels::new(MemoryStore::new())
///     .user(Shape::per_second(5))
///     .service(Shape::per_second(8))
///     .cluster(cluster);
/// for _ in 0..5 {
///     levels.try_acquire("api", "alice", 1).await.unwrap();
/// }
/// let refused = levels.try_acquire("api", "alice", 1).await.unwrap_err();
/// assert_eq!(refused.scope, Scope::User);
/// for _ in 0..3 {
///     levels.try_acquire("api", "bob", 1).await.unwrap();
/// }
/// let refused = levels.try_acquire("api", "bob", 1).await.unwrap_err();
/// assert_eq!(refused.scope, Scope::Service);
/// // The service has nothing left for anyone now.
/// assert_eq!(levels.available("api", "bob").await.unwrap(), 0);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Levels<S = MemoryStore> {
    memory: MemoryStore,
    user: Option<Shape>,
    service: Option<Shape>,
    cluster: Option<Buckets<S>>,
}

impl Levels<MemoryStore> {
    /// No level yet; the user and service levels will live in `memory`.
    pub fn new(memory: MemoryStore) -> Self {
        Self {
            memory,
            user: None,
            service: None,
            cluster: None,
        }
    }
}

impl<S: Store> Levels<S> {
    /// Every user of every service gets a bucket of `shape`.
    pub fn user(mut self, shape: Shape) -> Self {
        self.user = Some(shape);
        self
    }

    /// Every service gets a bucket of `shape`, shared by its users.
    pub fn service(mut self, shape: Shape) -> Self {
        self.service = Some(shape);
        self
    }

    /// One bucket for all: `cluster`'s bucket under the key `"cluster"`.
    pub fn cluster<C: Store>(self, cluster: Buckets<C>) -> Levels<C> {
        Levels {
            memory: self.memory,
            user: self.user,
            service: self.service,
            cluster: Some(cluster),
        }
    }

    /// Takes `n` tokens of `user` in `service` from every level, or from
    /// none: the first level without them says why ([`LevelRefusal`]).
    pub async fn try_acquire(&self, service: &str, user: &str, n: u64) -> Result<(), LevelRefusal> {
        let refused = |scope| move |wait| LevelRefusal { scope, wait };
        match &self.user {
            // The user's bucket answers for its block mark too.
            Some(shape) => self
                .memory
                .take(service, user, shape, n)
                .map_err(refused(Scope::User))?,
            None if self.memory.blocked(service, user) => {
                return Err(refused(Scope::User)(Wait::Blocked));
            }
            None => {}
        }
        if let Some(shape) = &self.service {
            let taken = self.memory.take(SERVICE_LEVEL, service, shape, n);
            if let Err(wait) = taken {
                self.give_back(service, user, n, Scope::Service);
                return Err(refused(Scope::Service)(wait));
            }
        }
        if let Some(cluster) = &self.cluster
            && let Err(wait) = cluster.try_acquire("cluster", n).await
        {
            self.give_back(service, user, n, Scope::Cluster);
            return Err(refused(Scope::Cluster)(wait));
        }
        Ok(())
    }

    /// Takes `n` tokens from every level, waiting until they all hold
    /// them; fails at once where no wait is enough.
    pub async fn acquire(&self, service: &str, user: &str, n: u64) -> Result<(), LevelRefusal> {
        loop {
            match self.try_acquire(service, user, n).await {
                Err(LevelRefusal {
                    wait: Wait::For(wait),
                    ..
                }) => tokio::time::sleep(wait.max(Duration::from_micros(1))).await,
                done => return done,
            }
        }
    }

    /// The tokens `user` of `service` could take now: the least any
    /// level holds.
    pub async fn available(&self, service: &str, user: &str) -> Result<u64, StoreError> {
        let mut least = u64::MAX;
        if let Some(shape) = &self.user {
            least = least.min(self.memory.level(service, user, shape));
        }
        if let Some(shape) = &self.service {
            least = least.min(self.memory.level(SERVICE_LEVEL, service, shape));
        }
        if let Some(cluster) = &self.cluster {
            least = least.min(cluster.available("cluster").await?);
        }
        Ok(least)
    }

    /// Puts `user` on `service`'s block list in this process.
    pub fn block(&self, service: &str, user: &str) {
        self.memory.set_blocked(service, user, true);
    }

    /// Takes `user` off `service`'s block list in this process.
    pub fn unblock(&self, service: &str, user: &str) {
        self.memory.set_blocked(service, user, false);
    }

    /// Whether `user` is on `service`'s block list in this process.
    pub fn is_blocked(&self, service: &str, user: &str) -> bool {
        self.memory.blocked(service, user)
    }

    /// Gives back the tokens the levels before `refuser` took.
    fn give_back(&self, service: &str, user: &str, n: u64, refuser: Scope) {
        if let Some(shape) = &self.user {
            self.memory.give_back(service, user, shape, n);
        }
        if refuser == Scope::Cluster
            && let Some(shape) = &self.service
        {
            self.memory.give_back(SERVICE_LEVEL, service, shape, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use throttle_clock::ManualClock;

    use super::*;

    fn levels(clock: &Arc<ManualClock>) -> Levels<MemoryStore> {
        let memory = MemoryStore::with_clock(clock.clone());
        let cluster = Buckets::new(
            MemoryStore::with_clock(clock.clone()),
            "cluster",
            Shape::per_second(10),
        );
        Levels::new(memory)
            .user(Shape::per_second(4))
            .service(Shape::per_second(6))
            .cluster(cluster)
    }

    async fn admitted(l: &Levels, service: &str, user: &str, n: usize) -> usize {
        let mut ok = 0;
        for _ in 0..n {
            ok += usize::from(l.try_acquire(service, user, 1).await.is_ok());
        }
        ok
    }

    #[tokio::test]
    async fn each_level_binds_in_turn_and_a_refusal_costs_no_level_a_token() {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let l = levels(&clock);
        assert_eq!(admitted(&l, "api", "alice", 10).await, 4, "user: 4/s");
        assert_eq!(admitted(&l, "api", "bob", 10).await, 2, "service: 6/s");
        assert_eq!(l.available("api", "bob").await.unwrap(), 0);
        let refused = l.try_acquire("api", "bob", 1).await.unwrap_err();
        assert_eq!(refused.scope, Scope::Service);
        // bob's own bucket kept the 2 tokens the service refused.
        assert_eq!(l.memory.level("api", "bob", &Shape::per_second(4)), 2);
        assert_eq!(
            admitted(&l, "web", "carol", 10).await,
            4,
            "4 left in the cluster"
        );
        let refused = l.try_acquire("web", "dave", 1).await.unwrap_err();
        assert_eq!(refused.scope, Scope::Cluster);
        assert!(matches!(refused.wait, Wait::For(d) if d <= Duration::from_millis(100)));
        assert_eq!(
            l.memory.level(SERVICE_LEVEL, "web", &Shape::per_second(6)),
            2
        );
        clock.advance(Duration::from_secs(1));
        assert_eq!(admitted(&l, "web", "dave", 10).await, 4);
    }

    #[tokio::test]
    async fn a_blocked_user_is_refused_until_unblocked() {
        let clock = Arc::new(ManualClock::new(0));
        let l = levels(&clock);
        l.block("api", "mallory");
        assert!(l.is_blocked("api", "mallory"));
        let refused = l.try_acquire("api", "mallory", 1).await.unwrap_err();
        assert_eq!((refused.scope, refused.wait), (Scope::User, Wait::Blocked));
        assert!(
            l.try_acquire("web", "mallory", 1).await.is_ok(),
            "per service"
        );
        l.unblock("api", "mallory");
        assert!(l.try_acquire("api", "mallory", 1).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_waits_for_the_level_that_binds() {
        let l = Levels::new(MemoryStore::with_clock(Arc::new(crate::TokioClock::new())))
            .user(Shape::per_second(2));
        let start = tokio::time::Instant::now();
        for _ in 0..4 {
            l.acquire("api", "alice", 1).await.unwrap();
        }
        // Two at once, then one a fill tick (500 ms), ticks counted from
        // the epoch: the first comes within 500 ms.
        let waited = start.elapsed();
        assert!(waited > Duration::from_millis(500) && waited <= Duration::from_secs(1));
    }
}
