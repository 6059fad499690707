//! Block lists: `[[block]]` entries refuse a user on every node, whatever
//! their quota, until the entry goes or its `until` passes.
//!
//! ```toml
//! [[block]]
//! service = "front"
//! users = ["mallory", "trudy"]          # or user = "mallory"
//! until = 2026-12-01T00:00:00Z          # optional: blocked until then
//! reason = "scraping"                   # optional: for the operators
//! ```

use std::collections::BTreeMap;

use serde::Serialize;

/// One user's block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Block {
    /// When it ends (Unix ms), if it does.
    pub until_ms: Option<i64>,
    /// Why, as the file says.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl Block {
    /// Whether the block holds at `now_ms`.
    pub fn holds_at(&self, now_ms: i64) -> bool {
        self.until_ms.is_none_or(|until| now_ms < until)
    }
}

/// Service -> user -> block.
pub type Blocks = BTreeMap<String, BTreeMap<String, Block>>;

/// The users of each service blocked at `now_ms`, sorted.
pub fn blocked_at(blocks: &Blocks, now_ms: i64) -> BTreeMap<String, Vec<String>> {
    blocks
        .iter()
        .map(|(service, users)| {
            let now: Vec<String> = users
                .iter()
                .filter(|(_, b)| b.holds_at(now_ms))
                .map(|(u, _)| u.clone())
                .collect();
            (service.clone(), now)
        })
        .collect()
}

/// The Unix time in ms of a TOML offset date-time (or a string of one,
/// RFC 3339), or why it is not one.
pub(super) fn unix_ms(v: &toml::Value) -> Result<i64, String> {
    let dt = match v {
        toml::Value::Datetime(dt) => *dt,
        toml::Value::String(s) => s
            .parse::<toml::value::Datetime>()
            .map_err(|e| format!("until {s:?}: {e}"))?,
        other => return Err(format!("until must be a date and time, not {other}")),
    };
    let (Some(date), Some(time), Some(offset)) = (dt.date, dt.time, dt.offset) else {
        return Err(format!(
            "until {dt} needs a date, a time and an offset, e.g. 2026-12-01T00:00:00Z"
        ));
    };
    let offset_minutes = match offset {
        toml::value::Offset::Z => 0,
        toml::value::Offset::Custom { minutes } => i64::from(minutes),
    };
    let days = days_from_civil(i64::from(date.year), date.month.into(), date.day.into());
    let seconds = days * 86_400
        + i64::from(time.hour) * 3_600
        + i64::from(time.minute) * 60
        + i64::from(time.second)
        - offset_minutes * 60;
    Ok(seconds * 1000 + i64::from(time.nanosecond / 1_000_000))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the usual
/// era-based count: 400-year eras of 146,097 days).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_unix_times() {
        let at = |s: &str| unix_ms(&toml::Value::String(s.into()));
        assert_eq!(at("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(at("2000-03-01T00:00:00Z"), Ok(951_868_800_000));
        assert_eq!(at("2026-12-01T00:00:00Z"), Ok(1_796_083_200_000));
        assert_eq!(at("2026-12-01T01:00:00+01:00"), Ok(1_796_083_200_000));
        assert_eq!(at("1969-12-31T23:59:59.5Z"), Ok(-500));
        assert!(
            at("2026-12-01")
                .unwrap_err()
                .contains("needs a date, a time and an offset")
        );
        assert!(at("soon").is_err());
    }

    #[test]
    fn a_block_holds_until_its_end() {
        let b = Block {
            until_ms: Some(1_000),
            reason: String::new(),
        };
        assert!(b.holds_at(999));
        assert!(!b.holds_at(1_000));
        let forever = Block {
            until_ms: None,
            reason: "abuse".into(),
        };
        assert!(forever.holds_at(i64::MAX));
    }
}
