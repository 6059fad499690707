//! How quotas are written for a node: as [`v1::Quota`] messages, or
//! encoded straight from the grants, packed or not, with refs.
//!
//! The ledger hands out grants ([`Ledger::grants`]); this is the wire side
//! of them. [`Rendering`] writes one node's quota, and keeps per (service,
//! node) a `Skeleton` of the users last encoded, so that the next quota,
//! which mostly names the same keys, is copied and patched rather than
//! encoded again.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;
use throttle_proto::v1;
use throttle_proto::wire::QuotaEncoder;

use crate::ledger::{KeyId, Ledger, Map, NodeId, ServiceState};
use crate::policy::{NodeGrants, same_keys};

/// A [`v1::QuotaRef`]: (service, slot, from slot).
pub type QuotaRef<'a> = (&'a str, i64, i64);

/// The form in which an [`Assigner`](super::Assigner) hands out quotas.
pub trait QuotaFormat {
    /// One node's quota.
    type Quota: fmt::Debug + Clone;

    /// The quota of the node of `to` for each `(service, slot)`, and
    /// `refs` to tables sent before, answering the report of
    /// `report_slot` if given.
    fn render<'a>(
        to: Rendering<'_>,
        services: impl IntoIterator<Item = (&'a str, i64)>,
        refs: &[QuotaRef<'_>],
        report_slot: Option<i64>,
    ) -> Self::Quota;
}

/// Quotas as [`v1::Quota`] messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct Messages;

impl QuotaFormat for Messages {
    type Quota = v1::Quota;

    fn render<'a>(
        to: Rendering<'_>,
        services: impl IntoIterator<Item = (&'a str, i64)>,
        refs: &[QuotaRef<'_>],
        report_slot: Option<i64>,
    ) -> v1::Quota {
        let mut quota = quota_for(to.ledger, to.node, services);
        quota.report_slot = report_slot;
        quota.refs = refs
            .iter()
            .map(|&(service, slot, from_slot)| v1::QuotaRef {
                service: service.to_owned(),
                slot,
                from_slot,
            })
            .collect();
        quota
    }
}

/// Quotas as encoded [`v1::CentralMessage`]s, written straight from the
/// grants ([`Rendering::encode`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Encoded;

impl QuotaFormat for Encoded {
    type Quota = Bytes;

    fn render<'a>(
        to: Rendering<'_>,
        services: impl IntoIterator<Item = (&'a str, i64)>,
        refs: &[QuotaRef<'_>],
        report_slot: Option<i64>,
    ) -> Bytes {
        to.encode(services, refs, report_slot)
    }
}

/// The quota of `node` for each `(service, slot)`: `{slot: {}}` for a
/// service with nothing for this node.
pub fn quota_for<'a>(
    ledger: &Ledger,
    node: NodeId,
    services: impl IntoIterator<Item = (&'a str, i64)>,
) -> v1::Quota {
    let mut quota = v1::Quota::default();
    for (name, slot) in services {
        let users = ledger
            .grants(node, name, slot)
            .map(|(state, grants)| to_user_quotas(state, grants));
        let slots = [(slot, users.unwrap_or_default())].into();
        quota
            .services
            .insert(name.to_owned(), v1::ServiceQuota { slots });
    }
    quota
}

/// Per service and node, the users last encoded (a `Skeleton` each).
///
/// Encoding takes `&self` (answers are rendered from a shared assigner),
/// and the assigner is used from one thread at a time: a `RefCell`.
#[derive(Debug, Default)]
pub struct Skeletons {
    by_service: RefCell<BTreeMap<Box<str>, Map<NodeId, Skeleton>>>,
}

impl Skeletons {
    /// Drops the skeletons of nodes that no longer report a service (they
    /// get no grants to encode), and of services the ledger let go.
    pub fn forget(&mut self, ledger: &Ledger) {
        self.by_service.get_mut().retain(|service, nodes| {
            let Some(state) = ledger.service_state(service) else {
                return false;
            };
            nodes.retain(|n, _| state.last_report.contains_key(n));
            true
        });
    }

    /// The keys of `node`'s skeleton of `service`, if it has one.
    pub fn keys_of(&self, service: &str, node: NodeId) -> Option<Arc<[KeyId]>> {
        let by_service = self.by_service.borrow();
        Some(by_service.get(service)?.get(&node)?.keys.clone())
    }
}

/// One node's users of a service as last encoded, with the keys they were
/// encoded from and where each grant's amount is.
///
/// A node's grants name the same keys in the same order from one assign
/// to the next while its users stay, so its next quota's users are this
/// block with other amounts: copied and patched, rather than encoded
/// again, which reads every key's names (a cache miss per grant at a
/// million keys), sorts the grants by user and writes every name.
#[derive(Debug, Default)]
struct Skeleton {
    /// The grants' keys, in the grants' order: one list with the book's
    /// assignments and the [`QuotaHistory`](crate::policy::QuotaHistory)'s slots of the node while its
    /// keys stay ([`Assignment`](crate::policy::Assignment)).
    keys: Arc<[KeyId]>,
    /// [`ServiceState::reused`] then: a key's names change only when its
    /// id is reused.
    reused: u64,
    /// The encoded users: a slice of the last message they were encoded
    /// into, which is held anyway while it waits to be sent, and after
    /// the mid-slot assign until the node's next report (the answer
    /// rendered ahead), rather than a copy of its own.
    block: Bytes,
    /// Whether `block` is of a packed table.
    packed: bool,
    /// Per grant, where its amount is in `block` (classic) or among the
    /// table's amounts (packed): see [`QuotaEncoder::user_noting`].
    amounts_at: Vec<u32>,
}

/// One node's quota being rendered: from the ledger's grants, with the
/// skeletons of its users, packed or not.
#[derive(Debug, Clone, Copy)]
pub struct Rendering<'r> {
    /// Where the grants are.
    pub ledger: &'r Ledger,
    /// The users last encoded.
    pub skeletons: &'r Skeletons,
    /// The node.
    pub node: NodeId,
    /// Whether its tables are written as [`v1::PackedQuota`]s.
    pub packed: bool,
}

impl Rendering<'_> {
    /// The same quota as [`quota_for`], answering the report of
    /// `report_slot` if given, as the encoded [`v1::CentralMessage`]:
    /// written straight from the grants, with no message built, and packed
    /// if [`Rendering::packed`].
    pub fn encode<'a>(
        &self,
        services: impl IntoIterator<Item = (&'a str, i64)>,
        refs: &[QuotaRef<'_>],
        report_slot: Option<i64>,
    ) -> Bytes {
        let mut out = QuotaEncoder::new();
        let mut order = Vec::new();
        // Per service begun, in order: the service whose skeleton of this
        // node takes its users block from the message.
        let mut kept: SmallVec<[Option<&str>; 4]> = SmallVec::new();
        for (name, slot) in services {
            if self.packed {
                out.begin_packed(name, slot);
            } else {
                out.begin(name, slot);
            }
            let encoded = match self.ledger.grants(self.node, name, slot) {
                Some((state, grants)) => {
                    self.encode_users(&mut out, name, state, grants, &mut order)
                }
                None => false,
            };
            kept.push(encoded.then_some(name));
        }
        for &(service, slot, from) in refs {
            out.refer(service, slot, from);
        }
        let (message, blocks) = out.finish_with_users(report_slot);
        let mut by_service = self.skeletons.by_service.borrow_mut();
        for (name, block) in kept.into_iter().zip(blocks) {
            if let Some(name) = name
                && let Some(skeleton) = by_service.get_mut(name).and_then(|s| s.get_mut(&self.node))
            {
                skeleton.block = message.slice(block);
            }
        }
        message
    }

    /// Encodes `grants` as the users of the (service, slot) `out` has just
    /// begun: from the node's [`Skeleton`] when it has the same keys in the
    /// same form, else anew, making the skeleton. Returns whether the node
    /// has a skeleton of these users, whose block the caller then points
    /// at the users in the finished message.
    fn encode_users(
        &self,
        out: &mut QuotaEncoder,
        service: &str,
        state: &ServiceState,
        grants: NodeGrants<'_>,
        order: &mut Vec<(usize, u32)>,
    ) -> bool {
        let mut by_service = self.skeletons.by_service.borrow_mut();
        if !by_service.contains_key(service) {
            by_service.insert(service.into(), Map::default());
        }
        let Some(nodes) = by_service.get_mut(service) else {
            return false;
        };
        let skeleton = nodes.entry(self.node).or_default();
        if skeleton.reused == state.reused()
            && skeleton.packed == self.packed
            && same_keys(&skeleton.keys, grants)
        {
            let amounts = skeleton.amounts_at.iter().zip(grants.iter());
            if out.append_users(
                &skeleton.block,
                amounts.map(|(&at, g)| (at as usize, g.amount())),
            ) {
                return true;
            }
        }
        encode_grants(out, state, grants, order, &mut skeleton.amounts_at);
        skeleton.block = Bytes::new();
        skeleton.keys = Arc::default();
        skeleton.packed = self.packed;
        if u32::try_from(out.table_len()).is_err() {
            // Offsets past 4 GiB were not noted: copy nothing from it.
            return false;
        }
        skeleton.keys = grants.shared_keys().unwrap_or_else(|| grants.keys().into());
        skeleton.reused = state.reused();
        true
    }
}

/// Sorts `order` so that each user's grants form one run: (the user's name
/// address, index in `grants`). A user's keys share its name's allocation,
/// so this gathers them without comparing names. Protobuf map entries must
/// not repeat a user.
fn gather_by_user(state: &ServiceState, grants: NodeGrants<'_>, order: &mut Vec<(usize, u32)>) {
    order.clear();
    order.extend(
        grants
            .keys()
            .iter()
            .enumerate()
            .map(|(i, &k)| (state.key(k).user().as_ptr() as usize, i as u32)),
    );
    order.sort_unstable();
}

/// One user's run of `order`: its name and its (resource, amount) pairs.
fn user_run<'a>(
    state: &'a ServiceState,
    grants: NodeGrants<'a>,
    run: &'a [(usize, u32)],
) -> (&'a str, impl Iterator<Item = (&'a str, f64)> + Clone) {
    let user = state.key(grants.keys()[run[0].1 as usize]).user();
    let resources = run.iter().map(move |&(_, i)| {
        let i = i as usize;
        (
            state.key(grants.keys()[i]).resource(),
            f64::from(grants.amounts()[i]),
        )
    });
    (user, resources)
}

/// Writes one node's grants into `out` as the users of the (service, slot)
/// just begun there, noting in `amounts_at[i]` where the amount of
/// `grants[i]` is in that table (see [`QuotaEncoder::user_noting`]), as a
/// `u32`: the skeleton that keeps them holds one per grant, and a gRPC
/// message cannot pass 4 GiB (an offset that would is noted as
/// `u32::MAX`; the ledger keeps no skeleton of users that long). `order`
/// is scratch space.
pub fn encode_grants(
    out: &mut QuotaEncoder,
    state: &ServiceState,
    grants: NodeGrants<'_>,
    order: &mut Vec<(usize, u32)>,
    amounts_at: &mut Vec<u32>,
) {
    gather_by_user(state, grants, order);
    amounts_at.clear();
    amounts_at.resize(grants.len(), 0);
    let mut noted = Vec::new();
    for run in order.chunk_by(|a, b| a.0 == b.0) {
        let (user, resources) = user_run(state, grants, run);
        noted.clear();
        out.user_noting(user, resources, &mut noted);
        for (&(_, i), &at) in run.iter().zip(&noted) {
            amounts_at[i as usize] = u32::try_from(at).unwrap_or(u32::MAX);
        }
    }
}

/// The protobuf form of one node's grants. The users' map is built from
/// one sorted list rather than one insertion per grant.
pub fn to_user_quotas(state: &ServiceState, grants: NodeGrants<'_>) -> v1::UserQuotas {
    let mut order = Vec::with_capacity(grants.len());
    gather_by_user(state, grants, &mut order);
    let users: Vec<(String, v1::ResourceQuotas)> = order
        .chunk_by(|a, b| a.0 == b.0)
        .map(|run| {
            let (user, resources) = user_run(state, grants, run);
            let resources = resources.map(|(r, a)| (r.to_owned(), a)).collect();
            (user.to_owned(), v1::ResourceQuotas { resources })
        })
        .collect();
    v1::UserQuotas {
        users: users.into_iter().collect(),
    }
}
