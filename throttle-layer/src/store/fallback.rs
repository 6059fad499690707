//! What a node decides while it has no quota for the current slot.

use std::fmt;
use std::str::FromStr;

/// What to do while there is no quota for the current slot, e.g. while the
/// central node is unreachable or a new one is taking over.
///
/// The default, [`Fallback::LastKnownThenAllow`] over 60 slots, keeps a
/// user at the share the central gave this node last, for as long as the
/// node keeps reports to send the central when it is back (60 slots),
/// then fails open as the legacy system did. In the simulator, a central
/// killed and back from its checkpoint, or a standby taking over after the
/// leader died, keeps a user's every slot near the limit with this
/// default, where [`Fallback::Allow`] admits the user's whole demand
/// meanwhile and the debt then refuses them for seconds
/// (`docs/accuracy.md`, "Outages").
///
/// Whatever the fallback, a user the central gave a budget (a minute, an
/// hour or a day nearly spent, or a per-second bucket's stored burst
/// being spent) is admitted, without a quota, no more than this node's
/// share of it and of its refill since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Let everything through (fail-open, the legacy behaviour).
    Allow,
    /// Refuse everything (fail-closed).
    Deny,
    /// Apply the newest quota of the last `slots` slots, then allow.
    LastKnownThenAllow(u32),
    /// Apply the newest quota of the last `slots` slots, then deny.
    LastKnownThenDeny(u32),
}

impl Default for Fallback {
    fn default() -> Self {
        Self::LastKnownThenAllow(60)
    }
}

/// A fallback that does not parse ([`Fallback::from_str`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown fallback {0:?}: write allow, deny, last-known-then-allow:SLOTS or last-known-then-deny:SLOTS"
)]
pub struct FallbackParseError(String);

impl FromStr for Fallback {
    type Err = FallbackParseError;

    /// `allow`, `deny`, `last-known-then-allow:N`, `last-known-then-deny:N`
    /// (as [`Fallback`]'s `Display` writes them).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let error = || FallbackParseError(s.to_owned());
        let (name, slots) = match s.split_once(':') {
            Some((name, n)) => (name, Some(n.parse::<u32>().map_err(|_| error())?)),
            None => (s, None),
        };
        match (name, slots) {
            ("allow", None) => Ok(Self::Allow),
            ("deny", None) => Ok(Self::Deny),
            ("last-known-then-allow", Some(n)) => Ok(Self::LastKnownThenAllow(n)),
            ("last-known-then-deny", Some(n)) => Ok(Self::LastKnownThenDeny(n)),
            _ => Err(error()),
        }
    }
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Allow => f.write_str("allow"),
            Self::Deny => f.write_str("deny"),
            Self::LastKnownThenAllow(n) => write!(f, "last-known-then-allow:{n}"),
            Self::LastKnownThenDeny(n) => write!(f, "last-known-then-deny:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Fallback;

    #[test]
    fn every_fallback_reads_back_what_it_writes() {
        for f in [
            Fallback::Allow,
            Fallback::Deny,
            Fallback::LastKnownThenAllow(60),
            Fallback::LastKnownThenDeny(3),
        ] {
            assert_eq!(f.to_string().parse::<Fallback>(), Ok(f));
        }
    }

    #[test]
    fn a_bad_fallback_says_what_to_write() {
        for bad in ["", "open", "allow:3", "last-known-then-allow", "deny:x"] {
            let e = bad.parse::<Fallback>().unwrap_err().to_string();
            assert!(e.contains("last-known-then-allow:SLOTS"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_default_keeps_the_last_quota_for_a_minute_of_slots() {
        assert_eq!(Fallback::default(), Fallback::LastKnownThenAllow(60));
    }
}
