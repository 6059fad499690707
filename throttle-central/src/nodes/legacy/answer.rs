//! One answer to a legacy node's report, kept within the frame it reads.

use std::sync::Arc;

use super::whole_table::{WholeTable, json_len};

/// The largest frame, and so answer, a legacy node reads (and sends):
/// lua-resty-websocket's default.
pub(super) const MAX_FRAME_BYTES: usize = 65_535;

/// A slot and the JSON of its table.
type Slot = (i64, Arc<str>);

/// The answer to one report: per service (by name), per slot, the JSON of
/// a [`WholeTable`], and its length as it grows.
#[derive(Debug)]
pub(super) struct Answer {
    services: Vec<(String, Vec<Slot>)>,
    bytes: usize,
    max_bytes: usize,
    /// Users left out of a table that did not fit.
    pub(super) left_out: usize,
}

impl Answer {
    /// An answer naming `services` (sorted, without repeats), to be at
    /// most `max_bytes` long.
    pub(super) fn new(services: &[&str], max_bytes: usize) -> Self {
        // `{"svc":{},...}`: braces, names, colons and commas.
        let names: usize = services.iter().map(|s| json_len(s) + 3).sum();
        Self {
            services: services
                .iter()
                .map(|s| ((*s).to_owned(), Vec::new()))
                .collect(),
            bytes: 2 + names + services.len().saturating_sub(1),
            max_bytes,
            left_out: 0,
        }
    }

    /// Adds slot `k` with each service's table (`tables`, in the order of
    /// [`Answer::new`]'s services) if it fits; the first slot added is cut
    /// to fit, from the tables `whole` gives. False when `k` does not fit.
    pub(super) fn add(
        &mut self,
        k: i64,
        tables: Vec<Arc<str>>,
        whole: impl FnOnce() -> Vec<WholeTable>,
    ) -> bool {
        let first = self
            .services
            .first()
            .is_none_or(|(_, slots)| slots.is_empty());
        // `"k":` and, after a first slot, a comma.
        let key = k.to_string().len() + 3 + usize::from(!first);
        let len: usize = tables.iter().map(|t| key + t.len()).sum();
        if self.bytes + len <= self.max_bytes {
            self.push(k, tables, len);
            return true;
        }
        if !first {
            return false;
        }
        let mut room = self
            .max_bytes
            .saturating_sub(self.bytes + key * tables.len());
        let mut cut = Vec::with_capacity(tables.len());
        let count = self.services.len();
        for (i, mut table) in whole().into_iter().enumerate() {
            self.left_out += table.cut_to(room / (count - i).max(1));
            let json = table.to_json();
            room = room.saturating_sub(json.len());
            cut.push(json);
        }
        let len = cut.iter().map(|t| key + t.len()).sum();
        self.push(k, cut, len);
        true
    }

    fn push(&mut self, k: i64, tables: Vec<Arc<str>>, len: usize) {
        for ((_, slots), table) in self.services.iter_mut().zip(tables) {
            slots.push((k, table));
        }
        self.bytes += len;
    }

    /// Its length in bytes.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.bytes
    }

    /// Slots it holds, per service.
    #[cfg(test)]
    pub(super) fn slots(&self) -> usize {
        self.services.first().map_or(0, |(_, slots)| slots.len())
    }

    /// The JSON a legacy node reads: `{service: {"slot": table}}`.
    pub(super) fn to_json(&self) -> String {
        let mut json = String::with_capacity(self.bytes);
        json.push('{');
        for (i, (service, slots)) in self.services.iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push_str(&serde_json::to_string(service).unwrap_or_default());
            json.push_str(":{");
            for (j, (k, table)) in slots.iter().enumerate() {
                if j > 0 {
                    json.push(',');
                }
                json.push_str(&format!("\"{k}\":"));
                json.push_str(table);
            }
            json.push('}');
        }
        json.push('}');
        json
    }
}
