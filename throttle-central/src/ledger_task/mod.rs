//! The async shell around the [`Assigner`](crate::assigner::Assigner): the
//! ledger's task and its timers.
//!
//! One task owns the assigner and its ledger and receives commands on a
//! channel ([`command`](self)); node streams (`crate::nodes`) and timers
//! only move data to and from it, so no stream ever waits on a lock held by
//! another. Each node stream is a task of its own: a node that sends
//! garbage loses its stream, nobody else notices.
//!
//! - `actor`: the ledger's task;
//! - `blocks`: block lists carried to the nodes;
//! - `sent`: limits carried to the nodes (the default quota, allowances);
//! - `ahead`: answers rendered ahead of filing;
//! - `received`: a report as it reaches the ledger's task;
//! - `command`: what the ledger's task is asked;
//! - `keeper`: the leader's checkpoints, restored and written;
//! - `link`: a node served through another protocol (legacy, RLQS),
//!   registered and filed as a stream is;
//! - `monitor`: monitor questions ([`Subject`]) and their typed answers;
//! - `timers`: the mid-slot tick and the limits file's reloads.
//!
//! [`Central`](crate::Central) wires them together, with the HTTP side
//! (`crate::http`), which depends on this module and never the reverse.

mod actor;
mod ahead;
mod blocks;
mod command;
mod keeper;
mod link;
mod monitor;
mod received;
mod sent;
mod timers;

pub(crate) use actor::{Actor, TOP_KEPT};
pub(crate) use ahead::AnswerAhead;
pub(crate) use command::{Command, Outgoing, ask, ask_top};
pub(crate) use keeper::{Keeper, restored};
pub(crate) use link::{Heard, Link, NotFiled};
pub use monitor::{Connection, Connections, MonitorView, Subject};
pub(crate) use received::Received;
pub(crate) use timers::{follow_etcd, reloader, ticker};
