//! A table of quotas as a legacy node reads it: whole amounts.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

/// user -> resource -> whole amount.
#[derive(Debug, Default, Serialize)]
#[serde(transparent)]
pub(super) struct WholeTable {
    pub(super) users: BTreeMap<String, BTreeMap<String, u64>>,
}

impl WholeTable {
    /// Its JSON.
    pub(super) fn to_json(&self) -> Arc<str> {
        serde_json::to_string(self).unwrap_or_default().into()
    }

    /// Leaves out the users with the largest amounts until its JSON takes
    /// at most `max_bytes`; how many were left out.
    pub(super) fn cut_to(&mut self, max_bytes: usize) -> usize {
        let entry = |user: &String, amounts: &BTreeMap<String, u64>| {
            json_len(user) + 1 + serde_json::to_string(amounts).map_or(0, |j| j.len())
        };
        let mut users: Vec<(String, u64, usize)> = self
            .users
            .iter()
            .map(|(u, a)| {
                (
                    u.clone(),
                    a.values().copied().max().unwrap_or(0),
                    entry(u, a),
                )
            })
            .collect();
        let mut bytes =
            2 + users.iter().map(|u| u.2).sum::<usize>() + users.len().saturating_sub(1);
        users.sort_by_key(|u| std::cmp::Reverse(u.1));
        let mut left_out = 0;
        for (user, _, len) in users {
            if bytes <= max_bytes {
                break;
            }
            self.users.remove(&user);
            // The entry and the comma beside it (none beside the last).
            bytes -= len + usize::from(!self.users.is_empty());
            left_out += 1;
        }
        left_out
    }
}

/// Length of `s` as a JSON string.
pub(super) fn json_len(s: &str) -> usize {
    serde_json::to_string(s).map_or(s.len() + 2, |j| j.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_table_leaves_out_the_largest_amounts_first() {
        let mut table = WholeTable::default();
        for (user, amount) in [("a", 5), ("b", 500), ("c", 50)] {
            table
                .users
                .insert(user.into(), [("requests".to_owned(), amount)].into());
        }
        let whole = table.to_json().len();
        assert_eq!(table.cut_to(whole), 0);
        assert_eq!(table.cut_to(whole - 1), 1);
        assert!(table.users.contains_key("a") && !table.users.contains_key("b"));
        assert!(table.to_json().len() < whole);
        assert_eq!(table.cut_to(2), 2);
        assert_eq!(&*table.to_json(), "{}");
    }
}
