//! The shared backend: one PostgreSQL database ([`PostgresUsage`]) that
//! every central of an election writes to, the leader alone at a time.

use std::collections::BTreeSet;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use postgres::types::ToSql;
use postgres::{Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use super::error::UsageError;
use super::filed::FiledUsage;
use super::retention::Retention;
use super::rollup::Rollup;
use super::sql::{self, Param, dollars};
use super::step::Step;
use super::store::{UsageStore, Written};
use super::{RowsQuery, TopQuery, TopRow, UsageRow};

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Usage kept in PostgreSQL. A connection for the writer and one for
/// questions, each opened again at its next use after it failed, so the
/// store comes back on its own after the database does.
pub struct PostgresUsage {
    config: Config,
    /// With `sslmode=require` (or `prefer`): TLS, the server's
    /// certificate checked against `sslrootcert` or the system's roots.
    tls: Option<MakeRustlsConnect>,
    write: Mutex<Option<Client>>,
    read: Mutex<Option<Client>>,
    /// Whether the tables are known to exist.
    schema: AtomicBool,
}

/// The advisory lock the centrals take to create the tables one at a
/// time: PostgreSQL's `CREATE TABLE IF NOT EXISTS` fails when two run at
/// once.
const SCHEMA_LOCK: i64 = 0x7468_726f_7474;

impl Drop for PostgresUsage {
    /// A client closes by blocking on its own runtime, which an async
    /// task may not do: the clients are closed on a thread of their own.
    fn drop(&mut self) {
        let clients = (self.write.get_mut().take(), self.read.get_mut().take());
        if clients.0.is_some() || clients.1.is_some() {
            let _ = std::thread::Builder::new()
                .name("usage-close".into())
                .spawn(move || drop(clients));
        }
    }
}

impl std::fmt::Debug for PostgresUsage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresUsage").finish_non_exhaustive()
    }
}

/// Marks a batch at once: the (node, slot) pairs answered are the new ones.
const MARK_ALL: &str = "INSERT INTO usage_filed (node, slot, start) \
    SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bigint[]) \
    ON CONFLICT DO NOTHING RETURNING node, slot";

/// Adds a batch's rows to `step`'s table at once.
fn add_all(step: Step) -> String {
    let t = step.table();
    format!(
        "INSERT INTO {t} (start, service, user_name, resource, admitted, refused) \
         SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[]) \
         ON CONFLICT (service, user_name, resource, start) DO UPDATE SET \
         admitted = {t}.admitted + excluded.admitted, refused = {t}.refused + excluded.refused"
    )
}

impl PostgresUsage {
    /// The store at `url` (`postgres://user@host:port/db`). It connects
    /// once now and creates the tables when missing; a database that is
    /// down is only logged: the writer connects when it is back, and
    /// reports wait in its buffer meanwhile. It blocks: call it off async
    /// tasks.
    ///
    /// # Errors
    ///
    /// When the URL does not parse, or its TLS roots cannot be read.
    pub fn open(url: &str) -> Result<Self, UsageError> {
        let (url, root_file) = take_param(url, "sslrootcert");
        let mut config = Config::from_str(&url)?;
        config.connect_timeout(CONNECT_TIMEOUT);
        let wants_tls = ["sslmode=require", "sslmode=prefer"]
            .iter()
            .any(|m| url.contains(m));
        let tls = match wants_tls {
            true => Some(MakeRustlsConnect::new(client_tls(root_file.as_deref())?)),
            false => None,
        };
        let store = Self {
            config,
            tls,
            write: Mutex::new(None),
            read: Mutex::new(None),
            schema: AtomicBool::new(false),
        };
        if let Err(e) = store.with(&store.write, |_| Ok(())) {
            tracing::warn!(error = %e, "usage store not reachable yet: connecting when it is");
        }
        Ok(store)
    }

    /// A new connection, the tables created first if not known to exist.
    fn connect(&self) -> Result<Client, postgres::Error> {
        let mut client = match &self.tls {
            Some(tls) => self.config.connect(tls.clone())?,
            None => self.config.connect(NoTls)?,
        };
        if !self.schema.load(Ordering::Acquire) {
            let mut tx = client.transaction()?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])?;
            // The tables are made in one transaction, their last index
            // last: when it exists, they all do, and the statements (which
            // lock the tables even when they exist) are not run again,
            // not to wait on writers.
            let last = tx.query_one(
                "SELECT to_regclass('usage_filed_by_start') IS NOT NULL",
                &[],
            )?;
            if !last.try_get::<_, bool>(0)? {
                for statement in sql::schema() {
                    tx.batch_execute(&statement)?;
                }
            }
            tx.commit()?;
            self.schema.store(true, Ordering::Release);
        }
        Ok(client)
    }

    /// Runs `f` on the connection in `slot`, opened first if it is not;
    /// a connection that failed is dropped, to be opened again next time.
    fn with<T>(
        &self,
        slot: &Mutex<Option<Client>>,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, UsageError> {
        let mut slot = slot.lock();
        let client = match &mut *slot {
            Some(c) if !c.is_closed() => c,
            _ => slot.insert(self.connect()?),
        };
        let out = f(client);
        if out.is_err() {
            *slot = None;
        }
        Ok(out?)
    }

    fn query(&self, text: &str, params: Vec<Param>) -> Result<Vec<postgres::Row>, UsageError> {
        let boxed: Vec<Box<dyn ToSql + Sync>> = params
            .into_iter()
            .map(|p| -> Box<dyn ToSql + Sync> {
                match p {
                    Param::Int(i) => Box::new(i),
                    Param::Text(t) => Box::new(t),
                }
            })
            .collect();
        let refs: Vec<&(dyn ToSql + Sync)> = boxed.iter().map(|b| &**b).collect();
        self.with(&self.read, |c| c.query(&dollars(text), &refs))
    }
}

/// `url` without its `name=VALUE` query parameter, and the value: libpq's
/// `sslrootcert`, which the URL parser does not take.
fn take_param(url: &str, name: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut value = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(
            |pair| match pair.strip_prefix(name).and_then(|v| v.strip_prefix('=')) {
                Some(v) => {
                    value = Some(v.to_owned());
                    false
                }
                None => true,
            },
        )
        .collect();
    let url = match kept.is_empty() {
        true => base.to_owned(),
        false => format!("{base}?{}", kept.join("&")),
    };
    (url, value)
}

/// TLS for the connection: the certificates of `root_file` (PEM) as
/// roots, else the system's.
fn client_tls(root_file: Option<&str>) -> Result<ClientConfig, UsageError> {
    let mut roots = RootCertStore::empty();
    match root_file {
        Some(path) => {
            let bad = |e: String| UsageError::Tls(format!("sslrootcert {path}: {e}"));
            let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| bad(e.to_string()))?;
                roots.add(cert).map_err(|e| bad(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(bad("no certificate in it".into()));
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = std::sync::Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| UsageError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// The columns of `rollup`'s rows in `step`, as arrays.
type Columns = (
    Vec<i64>,
    Vec<String>,
    Vec<String>,
    Vec<String>,
    Vec<i64>,
    Vec<i64>,
);

fn columns(rollup: &Rollup<'_>, step: Step) -> Columns {
    let mut c = Columns::default();
    for r in rollup.rows(step) {
        c.0.push(r.start);
        c.1.push(r.service.to_owned());
        c.2.push(r.user.to_owned());
        c.3.push(r.resource.to_owned());
        c.4.push(r.admitted);
        c.5.push(r.refused);
    }
    c
}

fn write_batch(c: &mut Client, batch: &[FiledUsage]) -> Result<Written, postgres::Error> {
    let mut tx = c.transaction()?;
    let nodes: Vec<&str> = batch.iter().map(|r| r.node.as_str()).collect();
    let slots: Vec<i64> = batch.iter().map(|r| r.slot).collect();
    let starts: Vec<i64> = batch.iter().map(|r| r.start_s).collect();
    let marked: BTreeSet<(String, i64)> = tx
        .query(MARK_ALL, &[&nodes, &slots, &starts])?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<_, postgres::Error>>()?;
    // A report twice in the batch is marked once: the first is written.
    let mut taken = BTreeSet::new();
    let fresh: Vec<&FiledUsage> = batch
        .iter()
        .filter(|r| {
            let key = (r.node.clone(), r.slot);
            marked.contains(&key) && taken.insert(key)
        })
        .collect();
    let rollup = Rollup::of(fresh.iter().copied());
    for step in Step::ALL {
        let (s, svc, u, res, a, r) = columns(&rollup, step);
        if !s.is_empty() {
            tx.execute(&add_all(step), &[&s, &svc, &u, &res, &a, &r])?;
        }
    }
    tx.commit()?;
    Ok(Written {
        reports: fresh.len(),
        repeated: batch.len() - fresh.len(),
        rows: rollup.len(),
    })
}

impl UsageStore for PostgresUsage {
    fn write(&self, batch: &[FiledUsage]) -> Result<Written, UsageError> {
        self.with(&self.write, |c| write_batch(c, batch))
    }

    fn prune(&self, retention: &Retention, now_s: i64) -> Result<u64, UsageError> {
        self.with(&self.write, |c| {
            let mut deleted = 0;
            for step in Step::ALL {
                let cutoff = retention.cutoff(step, now_s);
                deleted += c.execute(&dollars(&sql::prune(step)), &[&cutoff])?;
            }
            let marks = retention.marks_cutoff(now_s);
            deleted += c.execute(&dollars(sql::PRUNE_MARKS), &[&marks])?;
            Ok(deleted)
        })
    }

    fn rows(&self, query: &RowsQuery) -> Result<Vec<UsageRow>, UsageError> {
        let (text, params) = sql::rows(query);
        let rows = self.query(&text, params)?;
        let row = |r: &postgres::Row| {
            Ok(UsageRow {
                start_s: r.try_get(0)?,
                user: r.try_get(1)?,
                resource: r.try_get(2)?,
                admitted: r.try_get(3)?,
                refused: r.try_get(4)?,
            })
        };
        rows.iter().map(row).collect()
    }

    fn top(&self, query: &TopQuery) -> Result<Vec<TopRow>, UsageError> {
        let (text, params) = sql::top(query);
        let rows = self.query(&text, params)?;
        let row = |r: &postgres::Row| {
            Ok(TopRow {
                user: r.try_get(0)?,
                admitted: r.try_get(1)?,
                refused: r.try_get(2)?,
            })
        };
        rows.iter().map(row).collect()
    }

    fn resources(&self, query: &TopQuery) -> Result<Vec<String>, UsageError> {
        let (text, params) = sql::resources(query);
        let rows = self.query(&text, params)?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslrootcert_is_taken_out_of_the_url() {
        let (url, root) = take_param(
            "postgres://u@h/db?sslmode=require&sslrootcert=/ca.pem",
            "sslrootcert",
        );
        assert_eq!(url, "postgres://u@h/db?sslmode=require");
        assert_eq!(root.as_deref(), Some("/ca.pem"));
        let (url, root) = take_param("postgres://u@h/db?sslrootcert=/ca.pem", "sslrootcert");
        assert_eq!(
            (url.as_str(), root.as_deref()),
            ("postgres://u@h/db", Some("/ca.pem"))
        );
        let (url, root) = take_param("postgres://u@h/db", "sslrootcert");
        assert_eq!((url.as_str(), root), ("postgres://u@h/db", None));
    }
}
