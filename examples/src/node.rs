//! What both example nodes take on the command line for their reporter.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use throttle_clock::SlotLength;
use throttle_layer::reporter::ReporterBuilder;
use throttle_layer::{Reporter, SlotStore};

use crate::default_node_id;

/// The reporter's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ReporterArgs {
    /// Central node gRPC endpoint; repeat for several (the leader is found).
    #[arg(long = "central", default_value = "http://127.0.0.1:7075")]
    pub centrals: Vec<String>,
    /// Slot length in milliseconds; the central's `--slot-ms`.
    #[arg(long, env = "THROTTLE_SLOT_MS", default_value_t = 1000)]
    pub slot_ms: u32,
    /// Node id reported to the central node [default: host name and port].
    #[arg(long)]
    pub node_id: Option<String>,
    /// Spread a fleet's reports over this many milliseconds after the
    /// report delay, each node at its own point (0: all at once).
    #[arg(long, default_value_t = 0)]
    pub report_spread_ms: u64,
    /// Access key to sign the stream with, for a central that requires
    /// node keys (`throttle-central --node-keys`).
    #[arg(long, env = "THROTTLE_ACCESS_KEY", requires = "secret_key")]
    pub access_key: Option<String>,
    /// Secret key of `--access-key`.
    #[arg(
        long,
        env = "THROTTLE_SECRET_KEY",
        hide_env_values = true,
        requires = "access_key"
    )]
    pub secret_key: Option<String>,
    /// PEM CA certificate the central's certificate chains to: connect
    /// over TLS (every `--central` must then be `https://`).
    #[arg(long, env = "THROTTLE_CA")]
    pub ca: Option<PathBuf>,
    /// PEM client certificate, for a central that requires one (mutual
    /// TLS); needs `--key` and `--ca`.
    #[arg(long, env = "THROTTLE_CERT", requires_all = ["key", "ca"])]
    pub cert: Option<PathBuf>,
    /// PEM private key of `--cert`.
    #[arg(long, env = "THROTTLE_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
}

impl ReporterArgs {
    /// The node id: `--node-id`, or the host name and `port`.
    pub fn node_id(&self, port: u16) -> String {
        self.node_id
            .clone()
            .unwrap_or_else(|| default_node_id(port))
    }

    /// A store with slots of `--slot-ms`.
    ///
    /// # Errors
    ///
    /// A slot length that is not one.
    pub fn store(&self) -> anyhow::Result<SlotStore> {
        let slot = SlotLength::from_ms(self.slot_ms).context("invalid --slot-ms")?;
        Ok(SlotStore::builder().slot(slot).build())
    }

    /// A reporter of `store` as `node_id`, to every `--central`.
    ///
    /// # Errors
    ///
    /// A TLS file that cannot be read.
    pub fn builder(&self, store: &SlotStore, node_id: &str) -> anyhow::Result<ReporterBuilder> {
        // A twentieth of the slot: 50 ms at the default second.
        let delay = Duration::from_millis(u64::from(self.slot_ms / 20).max(1));
        let mut reporter = Reporter::builder(store, node_id)
            .report_delay(delay)
            .report_spread(Duration::from_millis(self.report_spread_ms));
        for c in &self.centrals {
            reporter = reporter.central(c.clone());
        }
        if let (Some(access), Some(secret)) = (&self.access_key, &self.secret_key) {
            reporter = reporter.credentials(access.clone(), secret.clone());
        }
        if let Some(tls) = self.tls()? {
            reporter = reporter.tls(tls);
        }
        Ok(reporter)
    }

    /// The TLS settings of `--ca`, `--cert` and `--key`, if any.
    fn tls(&self) -> anyhow::Result<Option<ClientTlsConfig>> {
        let read = |path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))
        };
        let Some(ca) = &self.ca else {
            return Ok(None);
        };
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        Ok(Some(tls))
    }
}
