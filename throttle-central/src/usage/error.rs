//! What can go wrong with the usage store ([`UsageError`]).

/// A usage store that could not be opened, written or read.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// `--usage` names no store this central knows.
    #[error("usage store {0:?}: expected sqlite:PATH or postgres://...")]
    BadUrl(String),
    /// SQLite said no.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The TLS settings of the store cannot be used.
    #[error("usage store TLS: {0}")]
    Tls(String),
    /// PostgreSQL said no, or could not be reached.
    #[error("postgres: {0}")]
    Postgres(#[from] postgres::Error),
}
