//! Entries of a report left out, and why: counted per reason, with the
//! names of the first few, so a report of a million bad entries costs a
//! count, not a million strings (nor a million log lines).

/// Why one entry of a report was left out (the rest is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// An empty or overlong service, user or resource name.
    BadName,
    /// An amount below zero.
    NegativeAmount,
    /// A rejection count above `u32::MAX` (4.3 G requests refused in one
    /// slot, by one node, for one user): no node refuses that many.
    TooManyRejections,
    /// An amount above [`LedgerConfig::max_amount`](super::LedgerConfig::max_amount).
    AmountTooLarge,
    /// A new service past [`LedgerConfig::max_services`](super::LedgerConfig::max_services).
    TooManyServices,
    /// A new (user, resource) past [`LedgerConfig::max_keys`](super::LedgerConfig::max_keys).
    TooManyKeys,
}

impl DropReason {
    /// Label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadName => "bad_name",
            Self::NegativeAmount => "negative_amount",
            Self::TooManyRejections => "too_many_rejections",
            Self::AmountTooLarge => "amount_too_large",
            Self::TooManyServices => "too_many_services",
            Self::TooManyKeys => "too_many_keys",
        }
    }

    /// Every reason, in the order of [`Dropped::counts`].
    pub const ALL: [DropReason; 6] = [
        Self::BadName,
        Self::NegativeAmount,
        Self::TooManyRejections,
        Self::AmountTooLarge,
        Self::TooManyServices,
        Self::TooManyKeys,
    ];
}

/// Entries whose names [`Dropped`] keeps.
pub const DROPPED_EXAMPLES: usize = 8;

/// Entries of a report left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dropped {
    counts: [u64; 6],
    examples: Vec<(DropReason, String)>,
}

impl Dropped {
    /// Counts an entry left out; `name` names it (service, or
    /// service/user/resource), built only for the first few.
    pub fn push(&mut self, reason: DropReason, name: impl FnOnce() -> String) {
        self.counts[reason as usize] += 1;
        if self.examples.len() < DROPPED_EXAMPLES {
            self.examples.push((reason, name()));
        }
    }

    /// Entries left out for `reason`.
    pub fn count(&self, reason: DropReason) -> u64 {
        self.counts[reason as usize]
    }

    /// Entries left out in all.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The reasons with entries left out, and how many.
    pub fn counts(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL
            .into_iter()
            .zip(self.counts)
            .filter(|(_, n)| *n > 0)
    }

    /// The first [`DROPPED_EXAMPLES`] entries left out, in the report's
    /// order, with why.
    pub fn examples(&self) -> &[(DropReason, String)] {
        &self.examples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_entry_and_names_the_first_few() {
        let mut d = Dropped::default();
        let mut built = 0;
        for i in 0..100 {
            d.push(DropReason::BadName, || {
                built += 1;
                format!("s/u{i}/r")
            });
        }
        d.push(DropReason::TooManyKeys, || "s/x/r".into());
        assert_eq!(d.total(), 101);
        assert_eq!(d.count(DropReason::BadName), 100);
        assert_eq!(built, DROPPED_EXAMPLES, "names built for the examples only");
        assert_eq!(d.examples()[0], (DropReason::BadName, "s/u0/r".into()));
        let counts: Vec<_> = d.counts().collect();
        assert_eq!(
            counts,
            [(DropReason::BadName, 100), (DropReason::TooManyKeys, 1)]
        );
    }

    #[test]
    fn the_reasons_are_listed_in_their_order() {
        for (i, r) in DropReason::ALL.into_iter().enumerate() {
            assert_eq!(r as usize, i);
        }
    }
}
