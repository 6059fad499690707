//! Amounts as a limits file writes them: a number, or a string of a number
//! and a byte unit (`"50MiB"`, `"1GB"`, `"512 KiB"`); a resource's amount
//! per period as a rate; the names the file gives.

use std::collections::BTreeMap;

use throttle_proto::MAX_NAME_LEN;

use super::MAX_RATE;
use super::period::Period;

/// A table of resource -> amount, as written.
pub(super) type Amounts = BTreeMap<String, toml::Value>;

/// Whether `name` may name a service, user or resource.
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME_LEN
}

/// A plain number (integer or float), or `None`.
pub(super) fn number(v: &toml::Value) -> Option<f64> {
    match v {
        toml::Value::Integer(i) => Some(*i as f64),
        toml::Value::Float(f) => Some(*f),
        _ => None,
    }
}

/// The rate per second of `v`, an amount of `resource` per `period`.
pub(super) fn rate(resource: &str, v: &toml::Value, period: Period) -> Result<f64, String> {
    if !valid_name(resource) {
        return Err(format!("resource names must be 1 to {MAX_NAME_LEN} bytes"));
    }
    let per = period.as_str();
    let amount = amount(v).map_err(|e| format!("per_{per} {resource:?}: {e}"))?;
    let rate = amount / period.seconds();
    if !(amount.is_finite() && (0.0..=MAX_RATE).contains(&rate)) {
        return Err(format!(
            "per_{per} {resource:?} must be an amount from 0 to {MAX_RATE:e} a second, not {v}"
        ));
    }
    Ok(rate)
}

/// The amount `v` stands for, or why it is not one.
pub(super) fn amount(v: &toml::Value) -> Result<f64, String> {
    match v {
        toml::Value::Integer(i) => Ok(*i as f64),
        toml::Value::Float(f) => Ok(*f),
        toml::Value::String(s) => with_unit(s),
        other => Err(format!("{other} is not an amount")),
    }
}

/// Multipliers of the byte units: decimal (kB, MB, GB, TB) and binary
/// (KiB, MiB, GiB, TiB), as `ls`, `df` and cloud consoles write them.
const UNITS: [(&str, f64); 10] = [
    ("", 1.0),
    ("B", 1.0),
    ("KB", 1e3),
    ("MB", 1e6),
    ("GB", 1e9),
    ("TB", 1e12),
    ("KIB", 1024.0),
    ("MIB", 1_048_576.0),
    ("GIB", 1_073_741_824.0),
    ("TIB", 1_099_511_627_776.0),
];

fn with_unit(text: &str) -> Result<f64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number with a unit such as \"50MiB\""))?;
    let unit = unit.trim().to_ascii_uppercase();
    let scale = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, scale)| *scale)
        .ok_or_else(|| {
            format!("unknown unit in {text:?}: one of B, kB, MB, GB, TB, KiB, MiB, GiB, TiB")
        })?;
    Ok(number * scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn of(text: &str) -> Result<f64, String> {
        amount(&toml::Value::String(text.into()))
    }

    #[test]
    fn units_are_decimal_or_binary() {
        assert_eq!(of("50MiB"), Ok(50.0 * 1_048_576.0));
        assert_eq!(of("1GB"), Ok(1e9));
        assert_eq!(of("512 KiB"), Ok(524_288.0));
        assert_eq!(of("1.5kB"), Ok(1500.0));
        assert_eq!(of("300"), Ok(300.0));
        assert_eq!(amount(&toml::Value::Integer(7)), Ok(7.0));
        assert!(of("5 parsecs").unwrap_err().contains("unknown unit"));
        assert!(of("MiB").is_err());
        assert!(amount(&toml::Value::Boolean(true)).is_err());
    }

    proptest! {
        #[test]
        fn any_text_is_an_amount_or_refused(text in "\\PC{0,20}") {
            let _ = of(&text);
        }
    }
}
