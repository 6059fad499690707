//! Per node, the users of its last report: a shortcut for filing.

use super::ids::KeyId;

/// The users a node reported last for a service, in its report's order,
/// with their keys.
///
/// A node's next report mostly names the same users in the same order, so
/// filing it walks this list beside the report instead of looking each
/// user up in the service's map: at a million keys that lookup is three
/// cache misses per user (the map's control bytes, its bucket, the name),
/// and this list is read in order.
#[derive(Debug, Default)]
pub(crate) struct NodeUsers {
    /// Per user, where its name ends in `names` and its keys in `ids`: 8
    /// bytes a user, 2 per entry.
    pub(crate) ends: Vec<(u32, u32)>,
    pub(crate) names: Vec<u8>,
    pub(crate) ids: Vec<KeyId>,
    /// [`ServiceState::reused`] when the list was made.
    pub(crate) reused: u64,
}

impl NodeUsers {
    pub(crate) fn clear(&mut self, reused: u64) {
        self.ends.clear();
        self.names.clear();
        self.ids.clear();
        self.reused = reused;
    }

    /// Lists `user` with its keys, unless the list would pass 4 GiB of
    /// names or 2^32 keys (a report cannot: its size is bounded far below),
    /// when the user is left to the service's map.
    pub(crate) fn push(&mut self, user: &str, ids: &[KeyId]) {
        let ends = (
            u32::try_from(self.names.len() + user.len()),
            u32::try_from(self.ids.len() + ids.len()),
        );
        if let (Ok(name_end), Ok(ids_end)) = ends {
            self.names.extend_from_slice(user.as_bytes());
            self.ids.extend_from_slice(ids);
            self.ends.push((name_end, ids_end));
        }
    }

    /// The keys listed for `user`, looking from `*at` on (both lists are in
    /// the order of the names' bytes, as reports are); moves `*at` past it.
    pub(crate) fn find(&self, at: &mut usize, user: &str) -> Option<&[KeyId]> {
        while let Some(&(name_end, ids_end)) = self.ends.get(*at) {
            let (name_start, ids_start) = match at.checked_sub(1) {
                Some(i) => self.ends[i],
                None => (0, 0),
            };
            let name = &self.names[name_start as usize..name_end as usize];
            match name.cmp(user.as_bytes()) {
                std::cmp::Ordering::Less => *at += 1,
                std::cmp::Ordering::Equal => {
                    *at += 1;
                    return Some(&self.ids[ids_start as usize..ids_end as usize]);
                }
                std::cmp::Ordering::Greater => return None,
            }
        }
        None
    }
}
