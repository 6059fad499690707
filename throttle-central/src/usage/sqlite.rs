//! The embedded backend: one SQLite file ([`SqliteUsage`]).

use std::path::Path;
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::types::Value;
use rusqlite::{Connection, OpenFlags, params, params_from_iter};

use super::error::UsageError;
use super::filed::FiledUsage;
use super::retention::Retention;
use super::rollup::Rollup;
use super::sql::{self, Param};
use super::step::Step;
use super::store::{UsageStore, Written};
use super::{RowsQuery, TopQuery, TopRow, UsageRow};

/// How long a connection waits for the file's lock before it gives up.
const BUSY: Duration = Duration::from_secs(5);

/// Usage kept in one SQLite file, in WAL mode: the writer's connection and
/// a reader's, so questions do not wait behind a write.
#[derive(Debug)]
pub struct SqliteUsage {
    write: Mutex<Connection>,
    read: Mutex<Connection>,
}

impl SqliteUsage {
    /// Opens (or creates) the file at `path` and its tables.
    ///
    /// # Errors
    ///
    /// When the file cannot be opened or is not a SQLite database.
    pub fn open(path: &Path) -> Result<Self, UsageError> {
        let write = Connection::open(path)?;
        write.busy_timeout(BUSY)?;
        write.pragma_update(None, "journal_mode", "WAL")?;
        write.pragma_update(None, "synchronous", "NORMAL")?;
        for statement in sql::schema() {
            write.execute(&statement, [])?;
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let read = Connection::open_with_flags(path, flags)?;
        read.busy_timeout(BUSY)?;
        Ok(Self {
            write: Mutex::new(write),
            read: Mutex::new(read),
        })
    }
}

fn values(params: Vec<Param>) -> impl Iterator<Item = Value> {
    params.into_iter().map(|p| match p {
        Param::Int(i) => Value::Integer(i),
        Param::Text(t) => Value::Text(t),
    })
}

impl UsageStore for SqliteUsage {
    fn write(&self, batch: &[FiledUsage]) -> Result<Written, UsageError> {
        let mut conn = self.write.lock();
        let tx = conn.transaction()?;
        let mut fresh = Vec::with_capacity(batch.len());
        {
            let mut mark = tx.prepare_cached(sql::MARK)?;
            for report in batch {
                if mark.execute(params![report.node, report.slot, report.start_s])? == 1 {
                    fresh.push(report);
                }
            }
        }
        let rollup = Rollup::of(fresh.iter().copied());
        for step in Step::ALL {
            let mut add = tx.prepare_cached(&sql::add(step))?;
            for r in rollup.rows(step) {
                let row = (
                    r.start, r.service, r.user, r.resource, r.admitted, r.refused,
                );
                add.execute(row)?;
            }
        }
        tx.commit()?;
        Ok(Written {
            reports: fresh.len(),
            repeated: batch.len() - fresh.len(),
            rows: rollup.len(),
        })
    }

    fn prune(&self, retention: &Retention, now_s: i64) -> Result<u64, UsageError> {
        let conn = self.write.lock();
        let mut deleted = 0;
        for step in Step::ALL {
            let cutoff = retention.cutoff(step, now_s);
            deleted += conn.execute(&sql::prune(step), [cutoff])? as u64;
        }
        deleted += conn.execute(sql::PRUNE_MARKS, [retention.marks_cutoff(now_s)])? as u64;
        Ok(deleted)
    }

    fn rows(&self, query: &RowsQuery) -> Result<Vec<UsageRow>, UsageError> {
        let (text, params) = sql::rows(query);
        let conn = self.read.lock();
        let mut statement = conn.prepare_cached(&text)?;
        let rows = statement.query_map(params_from_iter(values(params)), |r| {
            Ok(UsageRow {
                start_s: r.get(0)?,
                user: r.get(1)?,
                resource: r.get(2)?,
                admitted: r.get(3)?,
                refused: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn top(&self, query: &TopQuery) -> Result<Vec<TopRow>, UsageError> {
        let (text, params) = sql::top(query);
        let conn = self.read.lock();
        let mut statement = conn.prepare_cached(&text)?;
        let rows = statement.query_map(params_from_iter(values(params)), |r| {
            Ok(TopRow {
                user: r.get(0)?,
                admitted: r.get(1)?,
                refused: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn resources(&self, query: &TopQuery) -> Result<Vec<String>, UsageError> {
        let (text, params) = sql::resources(query);
        let conn = self.read.lock();
        let mut statement = conn.prepare_cached(&text)?;
        let rows = statement.query_map(params_from_iter(values(params)), |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
