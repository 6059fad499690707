//! Field numbers of `throttle/v1/throttle.proto`, for code that reads or
//! writes its messages field by field: one constant `MESSAGE_FIELD` per
//! field, generated from the proto's descriptors by `build.rs`, so a field
//! added to the proto is numbered in one place.
//!
//! A few names below stand for a number that several messages share; the
//! assertions beside them fail the build if the proto ever makes them
//! differ.

include!(concat!(env!("OUT_DIR"), "/fields.rs"));

/// A map entry's key (every protobuf map entry is a message with the key
/// in field 1 and the value in field 2).
pub const ENTRY_KEY: u32 = 1;
/// A map entry's value.
pub const ENTRY_VALUE: u32 = 2;

/// The one map of `ServiceQuota`, `UserQuotas`, `ResourceQuotas`, `Usage`
/// and `Amounts`.
pub const MAP_FIELD: u32 = SERVICE_QUOTA_SLOTS;
const _: () = assert!(
    USER_QUOTAS_USERS == MAP_FIELD
        && RESOURCE_QUOTAS_RESOURCES == MAP_FIELD
        && USAGE_USERS == MAP_FIELD
        && AMOUNTS_RESOURCES == MAP_FIELD
);

/// `PackedQuota.service` and `PackedUsage.service`.
pub const PACKED_SERVICE: u32 = PACKED_QUOTA_SERVICE;
/// `PackedQuota.slot`.
pub const PACKED_SLOT: u32 = PACKED_QUOTA_SLOT;
/// `PackedQuota.resources` and `PackedUsage.resources`.
pub const PACKED_RESOURCES: u32 = PACKED_QUOTA_RESOURCES;
/// `PackedQuota.users` and `PackedUsage.users`.
pub const PACKED_USERS: u32 = PACKED_QUOTA_USERS;
/// `PackedQuota.amounts` and `PackedUsage.amounts`.
pub const PACKED_AMOUNTS: u32 = PACKED_QUOTA_AMOUNTS;
const _: () = assert!(
    PACKED_USAGE_SERVICE == PACKED_SERVICE
        && PACKED_USAGE_RESOURCES == PACKED_RESOURCES
        && PACKED_USAGE_USERS == PACKED_USERS
        && PACKED_USAGE_AMOUNTS == PACKED_AMOUNTS
);
