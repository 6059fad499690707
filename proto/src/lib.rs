//! Wire protocol v1 of throttle.
//!
//! App nodes and the central node talk over one gRPC bidirectional stream,
//! [`v1::central_client::CentralClient::exchange`]: the node sends a
//! [`v1::Hello`] and then one [`v1::Report`] per slot; the central node answers
//! [`v1::Welcome`], then a [`v1::Quota`] for every report and whenever it has
//! assigned new quotas.
//!
//! A node whose Hello [accepts](v1::Hello::accepts) [`PACKED_QUOTAS`] gets
//! each (service, slot) of its quotas as a [`v1::PackedQuota`] rather than
//! a [`v1::Quota::services`] entry: the same content in a third of the
//! bytes ([`v1::Quota::unpack`] turns it back). One that accepts
//! [`QUOTA_REFS`] is answered with [`v1::QuotaRef`]s to tables its stream
//! already delivered, where the answer would repeat them.
//!
//! Besides the generated code this crate holds what both sides must agree on:
//!
//! - [`auth`]: how a node signs its stream with an access key and secret;
//! - [`legacy`]: the JSON documents of the legacy system and their lossless
//!   conversion to and from the protobuf messages.
//!
//! # Examples
//!
//! ```
//! use throttle_proto::v1::{node_message, Hello, NodeMessage};
//!
//! let hello = NodeMessage {
//!     kind: Some(node_message::Kind::Hello(Hello {
//!         node_id: "00163e0069ec".into(),
//!         slot_ms: 1000,
//!         services: vec!["front".into()],
//!         version: env!("CARGO_PKG_VERSION").into(),
//!         accepts: vec![throttle_proto::PACKED_QUOTAS.into()],
//!         resumes: false,
//!         report_every_ms: 0,
//!     })),
//! };
//! assert!(matches!(hello.kind, Some(node_message::Kind::Hello(_))));
//! ```

pub mod auth;
pub mod legacy;
pub mod wire;

/// Generated messages of package `throttle.v1`, and with the `grpc`
/// feature its client and server.
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/throttle.v1.rs"));
}

/// Longest service, user, resource or node name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 256;

/// The largest `f32` not above `x`: how quotas are kept in `f32`s, by the
/// central's grants and the nodes' quota rows, so that rounding never
/// grants more than was computed.
pub fn f32_at_most(x: f64) -> f32 {
    let f = x as f32;
    if f64::from(f) > x { f.next_down() } else { f }
}

/// `e` and its sources, outermost first, for the log lines of both sides:
/// tonic's own message is only "transport error", the cause ("Connection
/// refused") is further down.
pub fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// The crate version, sent in [`v1::Hello::version`].
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What a node puts in [`v1::Hello::accepts`] to be sent its quotas as
/// [`v1::PackedQuota`]s.
pub const PACKED_QUOTAS: &str = "packed-quotas";

/// What a node puts in [`v1::Hello::accepts`] to be answered with
/// [`v1::QuotaRef`]s to quotas its stream already delivered rather than
/// with those quotas again (the answer to a report repeats the push that
/// came before it).
pub const QUOTA_REFS: &str = "quota-refs";

/// What a central node puts in [`v1::Welcome::accepts`] when it reads
/// reports written as [`v1::PackedUsage`]s.
pub const PACKED_REPORTS: &str = "packed-reports";

/// The request metadata in which a node opening a stream names the
/// centrals it could not reach since it was last welcomed, separated by
/// commas. A standby whose leader is one of them does not send the node
/// there: it keeps the stream until it leads or knows another leader.
pub const UNREACHABLE_METADATA: &str = "throttle-unreachable";

/// Why a [`v1::PackedQuota`] does not decode to quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PackedError {
    /// A user's bits name a resource the table does not list.
    #[error("a user has a quota of resource {bit} of a table of {resources}")]
    NoSuchResource {
        /// The bit set.
        bit: usize,
        /// How many resources the table lists.
        resources: usize,
    },
    /// The amounts are more or fewer than the users' bits.
    #[error("{given} amounts for {wanted} quotas")]
    Amounts {
        /// Bits set over all users.
        wanted: usize,
        /// Amounts given.
        given: usize,
    },
}

/// A packed table's users, each with its amount per resource: the users in
/// `users` with their bits over `resources`, the amounts one after the
/// other in `amounts`, each as `amount` makes it; each user's amounts
/// as `wrap` makes them.
fn unpack_users<T: Copy, A, W>(
    resources: &[String],
    users: &[v1::PackedUser],
    amounts: &[T],
    amount: impl Fn(T) -> A,
    wrap: impl Fn(std::collections::BTreeMap<String, A>) -> W,
) -> Result<std::collections::BTreeMap<String, W>, PackedError> {
    let wanted = || users.iter().map(|u| Bits::new(&u.resources).count()).sum();
    let short = || PackedError::Amounts {
        wanted: wanted(),
        given: amounts.len(),
    };
    let mut next = amounts.iter();
    let mut out = std::collections::BTreeMap::new();
    for u in users {
        let mut of_user = std::collections::BTreeMap::new();
        for bit in Bits::new(&u.resources) {
            let name = resources.get(bit).ok_or(PackedError::NoSuchResource {
                bit,
                resources: resources.len(),
            })?;
            of_user.insert(name.clone(), amount(*next.next().ok_or_else(short)?));
        }
        out.insert(u.user.clone(), wrap(of_user));
    }
    if next.next().is_some() {
        return Err(short());
    }
    Ok(out)
}

/// Moves each table of `packed` into the maps with `insert`, in order; at
/// the first one that `convert` refuses, puts it and those after it back.
fn unpack_tables<T, U>(
    packed: &mut Vec<T>,
    convert: impl Fn(&T) -> Result<U, PackedError>,
    mut insert: impl FnMut(T, U),
) -> Result<(), PackedError> {
    let mut tables = std::mem::take(packed).into_iter();
    while let Some(table) = tables.next() {
        match convert(&table) {
            Ok(converted) => insert(table, converted),
            Err(e) => {
                *packed = std::iter::once(table).chain(tables).collect();
                return Err(e);
            }
        }
    }
    Ok(())
}

impl v1::PackedQuota {
    /// The table's users with their quotas, as a `services` entry holds
    /// them.
    ///
    /// # Errors
    ///
    /// [`PackedError`] if the bits and the amounts do not match.
    pub fn to_user_quotas(&self) -> Result<v1::UserQuotas, PackedError> {
        let users = unpack_users(
            &self.resources,
            &self.users,
            &self.amounts,
            f64::from,
            |resources| v1::ResourceQuotas { resources },
        )?;
        Ok(v1::UserQuotas { users })
    }
}

impl v1::PackedUsage {
    /// The table's users with their amounts, as a `consumption` or
    /// `rejection` entry holds them.
    ///
    /// # Errors
    ///
    /// [`PackedError`] if the bits and the amounts do not match.
    pub fn to_usage(&self) -> Result<v1::Usage, PackedError> {
        let users = unpack_users(
            &self.resources,
            &self.users,
            &self.amounts,
            |a| a,
            |resources| v1::Amounts { resources },
        )?;
        Ok(v1::Usage { users })
    }
}

impl v1::Report {
    /// Moves every [`v1::PackedUsage`] into `consumption` or `rejection`
    /// (replacing the service's entry there, if any), leaving `packed`
    /// empty: the form every reader of the maps understands.
    ///
    /// # Errors
    ///
    /// [`PackedError`] for a packed table whose bits and amounts do not
    /// match; the tables before it are moved, it and those after it are
    /// left in `packed`.
    pub fn unpack(&mut self) -> Result<(), PackedError> {
        let (consumption, rejection) = (&mut self.consumption, &mut self.rejection);
        unpack_tables(
            &mut self.packed,
            v1::PackedUsage::to_usage,
            |table, usage| {
                let kind = if table.rejection {
                    &mut *rejection
                } else {
                    &mut *consumption
                };
                kind.insert(table.service, usage);
            },
        )
    }
}

/// The indices of the bits set in a [`v1::PackedUser::resources`], lowest
/// first.
#[derive(Debug, Clone)]
pub struct Bits<'a> {
    bytes: std::slice::Iter<'a, u8>,
    /// The bits of the byte under way not yet given, and its first index.
    byte: u8,
    base: usize,
}

impl<'a> Bits<'a> {
    /// The bits of `bytes`: bit `i` is bit `i % 8` of byte `i / 8`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes: bytes.iter(),
            byte: 0,
            // The first byte read moves this to 0.
            base: usize::MAX - 7,
        }
    }
}

impl Iterator for Bits<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.byte == 0 {
            self.byte = *self.bytes.next()?;
            self.base = self.base.wrapping_add(8);
        }
        let bit = self.byte.trailing_zeros() as usize;
        self.byte &= self.byte - 1;
        Some(self.base + bit)
    }
}

impl v1::Quota {
    /// Moves every [`v1::PackedQuota`] into `services` (replacing the
    /// (service, slot) it names there, if any), leaving `packed` empty: the
    /// form every reader of `services` understands.
    ///
    /// # Errors
    ///
    /// [`PackedError`] for a packed table whose bits and amounts do not
    /// match; the tables before it are moved, it and those after it are
    /// left in `packed`.
    pub fn unpack(&mut self) -> Result<(), PackedError> {
        let services = &mut self.services;
        unpack_tables(
            &mut self.packed,
            v1::PackedQuota::to_user_quotas,
            |table, users| {
                services
                    .entry(table.service)
                    .or_default()
                    .slots
                    .insert(table.slot, users);
            },
        )
    }
}
