//! The rows of the usage store a page at a time: the query
//! ([`RowsQuery`]), a row ([`UsageRow`]) and where a page ends
//! ([`RowCursor`]).

use super::step::Step;

/// Rows of one service over `[from_s, to_s)`, in (start, user, resource)
/// order, a page at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowsQuery {
    /// The table read.
    pub step: Step,
    /// The service.
    pub service: String,
    /// Only this user's rows, if set.
    pub user: Option<String>,
    /// Only this resource's rows, if set.
    pub resource: Option<String>,
    /// The first start included (Unix seconds).
    pub from_s: i64,
    /// The first start left out.
    pub to_s: i64,
    /// Rows after this one only: the last row of the page before.
    pub after: Option<RowCursor>,
    /// Most rows answered.
    pub limit: usize,
}

/// One stored row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    /// The start of its minute, hour or day (Unix seconds, UTC).
    pub start_s: i64,
    /// The user.
    pub user: String,
    /// The resource.
    pub resource: String,
    /// Amount admitted.
    pub admitted: i64,
    /// Amount refused.
    pub refused: i64,
}

impl UsageRow {
    /// The cursor that asks for the rows after this one.
    pub fn cursor(&self) -> RowCursor {
        RowCursor {
            start_s: self.start_s,
            user: self.user.clone(),
            resource: self.resource.clone(),
        }
    }
}

/// Where a page of rows ends: its last row's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowCursor {
    /// The row's start (Unix seconds).
    pub start_s: i64,
    /// Its user.
    pub user: String,
    /// Its resource.
    pub resource: String,
}

impl RowCursor {
    /// The cursor as the API gives it: hex of its parts joined by NULs.
    pub fn encode(&self) -> String {
        let text = format!("{}\0{}\0{}", self.start_s, self.user, self.resource);
        text.bytes().map(|b| format!("{b:02x}")).collect()
    }

    /// A cursor [`RowCursor::encode`] gave, or `None`.
    pub fn decode(hex: &str) -> Option<Self> {
        if !hex.len().is_multiple_of(2) || hex.len() > 4 * 1024 {
            return None;
        }
        let bytes: Option<Vec<u8>> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect();
        let text = String::from_utf8(bytes?).ok()?;
        let mut parts = text.splitn(3, '\0');
        let start_s = parts.next()?.parse().ok()?;
        let user = parts.next()?.to_owned();
        let resource = parts.next()?.to_owned();
        Some(Self {
            start_s,
            user,
            resource,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_and_junk_is_refused() {
        let cursor = RowCursor {
            start_s: -60,
            user: "al ice/ü".into(),
            resource: "bytes".into(),
        };
        assert_eq!(RowCursor::decode(&cursor.encode()), Some(cursor));
        for junk in ["", "0", "zz", "2d3630", "ff00ff00"] {
            assert_eq!(RowCursor::decode(junk), None, "{junk:?}");
        }
    }
}
