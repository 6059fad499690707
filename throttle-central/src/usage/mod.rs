//! Usage accounting: what each user was admitted and refused, per
//! minute, hour and day, kept in a store that outlives the process.
//!
//! The leader's ledger hands every report it files to a [`UsageTap`]
//! (never waiting: a full queue is counted as lost; it copies the report,
//! nothing more); the writer's thread reads their entries, keeps them in
//! a bounded buffer and
//! writes them every quarter second, in batches, each batch in one
//! transaction. A report is written once, keyed by (node, data slot): the
//! store marks it in the same transaction that adds its amounts to its
//! minute, hour and day rows, so a report sent again (after a
//! reconnection, a failover or a restart) adds nothing.
//!
//! The files:
//!
//! - `step`: [`Step`], minute, hour, day;
//! - `filed`: [`FiledUsage`], one report's entries;
//! - `rollup`: what a batch adds to each row;
//! - `retention`: [`Retention`], how long each step is kept;
//! - `rows`: [`RowsQuery`], a page of rows, [`UsageRow`], a row, and
//!   [`RowCursor`], where a page ends;
//! - `top`: [`TopQuery`], the heaviest users, and [`TopRow`], their
//!   totals;
//! - `sql`: the SQL both backends run;
//! - `store`: [`UsageStore`], the backends' trait;
//! - `sqlite`, `postgres`: the backends;
//! - `pending`, `writer`, `tap`: the way from the ledger to the store;
//! - `config`: [`UsageConfig`], a store and its settings.

mod config;
mod error;
mod filed;
mod pending;
mod postgres;
mod retention;
mod rollup;
mod rows;
mod sql;
mod sqlite;
mod step;
mod store;
mod top;
mod writer;

pub use config::UsageConfig;
pub use error::UsageError;
pub use filed::{FiledUsage, UsageEntry};
pub use postgres::PostgresUsage;
pub use retention::Retention;
pub use rows::{RowCursor, RowsQuery, UsageRow};
pub use sqlite::SqliteUsage;
pub use step::Step;
pub use store::{UsageStore, Written};
pub use throttle_core::usage_tap::{QUEUE, UsageTap};
pub use top::{TopQuery, TopRow};
pub use writer::{BATCH_ENTRIES, DEFAULT_BUFFER};
