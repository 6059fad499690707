//! The library's own node stream (`throttle.v1.Central/Stream`):
//!
//! - `stream`: a node stream's task, and the gRPC service;
//! - `standby`: a new stream at a central that does not lead, kept until
//!   a leader it can reach is known;
//! - `auth`: a stream's credentials, checked before it is read.

mod auth;
mod standby;
mod stream;

pub(crate) use stream::CentralService;
