//! The legacy nodes (lua-resty-throttle in nginx) as nodes of this
//! central: their WebSocket, their presigned URLs and their JSON, on the
//! same ledger as every other node.
//!
//! A legacy node opens `wss://<central>/throttle?<presigned query>`, sends
//! at each second's start one text frame holding its report of the second
//! before (the JSON of [`throttle_proto::legacy`]) and waits at most 200 ms
//! for one text frame: its quotas. Here:
//!
//! - `endpoint`: the handshake, refused at once by a central that does not
//!   lead (503) and, with node keys, unless the URL is signed (403);
//! - `presigned`: the URL's AWS Signature V4 query, checked;
//! - `session`: one connection, each report filed by the ledger's task as a
//!   node stream's is, then answered;
//! - `quotas`: what the ledger granted the node, and the answer to its
//!   report (`answer`), its tables in whole amounts (`whole_table`), in one
//!   frame of at most 65,535 bytes.
//!
//! `docs/guides/legacy.md` tells an operator how to move a fleet over.

mod answer;
mod endpoint;
mod presigned;
mod quotas;
mod session;
mod whole_table;

pub(crate) use endpoint::Endpoint;
