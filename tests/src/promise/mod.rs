//! The promise of a limit, checked by a machine: cases of random rule
//! sets, loads and faults ([`generate`]), run in the simulator
//! ([`simulate`]) or against the real binaries, and an oracle
//! ([`oracle`]) that reads what each user was admitted per slot against
//! the bounds `docs/guides/central.md` ("What a limit promises") states.
//!
//! ```
//! use throttle_tests::promise;
//!
//! let case = promise::generate(7);
//! let (_, verdict) = promise::simulate::run(&case);
//! assert!(verdict.held(), "{case}\n{:?}", verdict.misses);
//! ```

mod binaries;
pub mod buckets;
pub mod case;
mod generate;
pub mod live;
pub mod oracle;
pub mod simulate;
mod world;

pub use buckets::{IdealBucket, buckets};
pub use case::{Case, Fault, Load, Resource, Rule, Span, Who};
pub use generate::{Draw, generate};
pub use oracle::{Miss, Side, Verdict, check, check_after};
