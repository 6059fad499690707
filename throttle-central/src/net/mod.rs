//! How connections reach the central's two servers: how many may be open,
//! how long a node connection may stay without a stream, and TLS.
//!
//! - `limits`: [`ConnectionLimits`], the settings;
//! - `node_io`: node connections, each holding a place under the cap and
//!   closed if no stream opens on it in time;
//! - `tls`: certificates and keys read from PEM files, for both servers;
//! - `http`: an HTTP server's accept loop (TLS, header and idle
//!   timeouts, the cap), which the example apps serve with too;
//! - `activity`, `watched_io`, `counted`: what one HTTP connection is
//!   doing, as its bytes and its requests tell, for those timeouts.

mod activity;
mod counted;
mod http;
mod limits;
mod node_io;
mod tls;
mod watched_io;

pub use http::serve_http;
pub use limits::ConnectionLimits;
pub(crate) use node_io::{NodeConnInfo, node_incoming};
pub use tls::{ServerTls, TlsError};
