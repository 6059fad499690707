//! Editing one user's rule or block in the text of a limits file, keeping
//! every other line (comments included) as it was: what the admin API
//! writes.
//! Sans-IO: text in, text out; [`FileLimits`](super::FileLimits) writes it.

use serde_json::Value;
use toml_edit::{DocumentMut, Item};

use super::{LimitSet, LimitsError};

/// The keys a block's body may set.
const BLOCK_KEYS: [&str; 2] = ["until", "reason"];

/// What an edit is about: the entries of a table of the file, and the
/// keys its body may set.
#[derive(Clone, Copy)]
struct Kind {
    table: &'static str,
    keys: &'static [&'static str],
}

const RULE: Kind = Kind {
    table: "limit",
    keys: &RULE_KEYS,
};

const BLOCK: Kind = Kind {
    table: "block",
    keys: &BLOCK_KEYS,
};

/// The keys a rule's body may set (its service and user come from the
/// path).
const RULE_KEYS: [&str; 6] = [
    "per_second",
    "per_minute",
    "per_hour",
    "per_day",
    "burst_seconds",
    "max_debt_seconds",
];

/// Why an edit was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EditError {
    /// The body is not a rule: an unknown key, or a value of the wrong
    /// kind.
    #[error("{0}")]
    Body(String),
    /// The edited file would not load; nothing was written.
    #[error("{0}")]
    Invalid(#[from] LimitsError),
    /// The file in place is not TOML (an edit made by hand and broken):
    /// fix it first.
    #[error("the limits file does not parse: {0}")]
    File(String),
    /// The file could not be read or written.
    #[error("limits file: {0}")]
    Io(String),
    /// The limits kept in etcd could not be read or written.
    #[error("limits in etcd: {0}")]
    Etcd(String),
}

/// `text` with `user`'s own rule of `service` replaced by `rule` (a JSON
/// object shaped as a TOML rule: `per_second`, `per_minute`, `per_hour`,
/// `per_day`, `burst_seconds`, `max_debt_seconds`), or removed when
/// `rule` is `None`. A user named in a rule of several users is taken out
/// of its list. The result is checked as a whole.
///
/// # Errors
///
/// [`EditError`]; the text is then unchanged.
pub fn edit_rule(
    text: &str,
    service: &str,
    user: &str,
    rule: Option<&Value>,
) -> Result<String, EditError> {
    edit(RULE, text, service, user, rule)
}

/// `text` with `user`'s block in `service` replaced by `block` (a JSON
/// object with an optional `until`, RFC 3339, and `reason`), or lifted
/// when `block` is `None`; as [`edit_rule`] does for rules.
///
/// # Errors
///
/// [`EditError`]; the text is then unchanged.
pub fn edit_block(
    text: &str,
    service: &str,
    user: &str,
    block: Option<&Value>,
) -> Result<String, EditError> {
    edit(BLOCK, text, service, user, block)
}

fn edit(
    kind: Kind,
    text: &str,
    service: &str,
    user: &str,
    body: Option<&Value>,
) -> Result<String, EditError> {
    let mut doc: DocumentMut = text.parse().map_err(|e| EditError::File(format!("{e}")))?;
    remove_user(&mut doc, kind.table, service, user);
    let mut out = doc.to_string();
    if let Some(body) = body {
        if !out.is_empty() && !out.ends_with("\n\n") {
            out.push_str(if out.ends_with('\n') { "\n" } else { "\n\n" });
        }
        out.push_str(&entry(kind, service, user, body)?);
    }
    if out.is_empty() {
        // An empty file is a broken edit; no rules at all is a comment.
        out.push_str("# no limits\n");
    }
    LimitSet::from_toml(&out)?;
    Ok(out)
}

/// Takes `user` out of every entry of `table` of `service`: an entry of
/// theirs alone goes, a list of users loses their name (and goes once
/// empty).
fn remove_user(doc: &mut DocumentMut, table: &str, service: &str, user: &str) {
    let Some(Item::ArrayOfTables(rules)) = doc.get_mut(table) else {
        return;
    };
    let mut gone = Vec::new();
    for (i, rule) in rules.iter_mut().enumerate() {
        if rule.get("service").and_then(Item::as_str) != Some(service) {
            continue;
        }
        if rule.get("user").and_then(Item::as_str) == Some(user) {
            gone.push(i);
        } else if let Some(users) = rule.get_mut("users").and_then(Item::as_array_mut) {
            users.retain(|u| u.as_str() != Some(user));
            users.fmt();
            if users.is_empty() {
                gone.push(i);
            }
        }
    }
    // The comments above a rule that goes stay, above the next rule or
    // at the end: they may be about the file, not that rule.
    let mut orphaned = String::new();
    for i in gone.into_iter().rev() {
        let above = rules
            .get(i)
            .and_then(|t| t.decor().prefix())
            .and_then(|p| p.as_str())
            .unwrap_or_default()
            .to_owned();
        rules.remove(i);
        match rules.get_mut(i) {
            Some(next) => {
                let own = next
                    .decor()
                    .prefix()
                    .and_then(|p| p.as_str())
                    .unwrap_or_default();
                let joined = format!("{above}{own}");
                next.decor_mut().set_prefix(joined);
            }
            None => orphaned.insert_str(0, &above),
        }
    }
    let emptied = rules.is_empty();
    if emptied {
        doc.remove(table);
    }
    if !orphaned.trim().is_empty() {
        let trailing = doc.trailing().as_str().unwrap_or_default().to_owned();
        doc.set_trailing(format!("{orphaned}{trailing}"));
    }
}

/// The entry of `user` in `service` with the keys of `body`.
fn entry(kind: Kind, service: &str, user: &str, body: &Value) -> Result<String, EditError> {
    let Value::Object(fields) = body else {
        return Err(EditError::Body("the body is a JSON object".into()));
    };
    let mut out = format!(
        "[[{}]]\nservice = {}\nuser = {}\n",
        kind.table,
        quoted(service),
        quoted(user)
    );
    for (key, value) in fields {
        if !kind.keys.contains(&key.as_str()) {
            let known = kind.keys.join(", ");
            return Err(EditError::Body(format!(
                "unknown key {key:?}: one of {known}"
            )));
        }
        let value = match value {
            Value::Object(amounts) => {
                let items: Result<Vec<String>, EditError> = amounts
                    .iter()
                    .map(|(r, v)| Ok(format!("{} = {}", bare_or_quoted(r), scalar(key, v)?)))
                    .collect();
                format!("{{ {} }}", items?.join(", "))
            }
            v => scalar(key, v)?,
        };
        out.push_str(&format!("{key} = {value}\n"));
    }
    Ok(out)
}

/// `s` as a TOML key: bare where TOML allows it, else quoted.
fn bare_or_quoted(s: &str) -> String {
    let bare = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare { s.to_owned() } else { quoted(s) }
}

/// A TOML basic string of `s` (JSON's escapes are TOML's).
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A number or a string (an amount with a unit, "unbounded") as TOML.
fn scalar(key: &str, v: &Value) -> Result<String, EditError> {
    match v {
        Value::Number(n) => Ok(n.to_string()),
        Value::String(s) => Ok(quoted(s)),
        other => Err(EditError::Body(format!(
            "{key}: {other} is neither a number nor a string"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    use crate::limits::Period;

    const FILE: &str = r#"# Our limits.

[[limit]]
service = "front"
user = "*"
per_second = { requests = 100 }   # everyone

[[limit]]
service = "front"
users = ["alice", "bob"]
per_minute = { requests = 6000 }
"#;

    #[test]
    fn a_rule_is_replaced_and_the_rest_kept() {
        let rule = json!({"per_second": {"requests": 5}, "burst_seconds": 1});
        let out = edit_rule(FILE, "front", "alice", Some(&rule)).unwrap();
        assert!(out.starts_with("# Our limits."), "{out}");
        assert!(out.contains("# everyone"), "{out}");
        assert!(out.contains(r#"users = ["bob"]"#), "{out}");
        assert!(out.contains("per_second = { requests = 5 }"), "{out}");
        let set = LimitSet::from_toml(&out).unwrap();
        let alice = set.get("front", "alice").unwrap();
        assert_eq!(alice.per_second["requests"], 5.0);
        assert_eq!(alice.burst_seconds, 1.0);
        assert!(set.get("front", "bob").is_some());
        // Again: still one rule for alice.
        let again = edit_rule(&out, "front", "alice", Some(&rule)).unwrap();
        assert_eq!(LimitSet::from_toml(&again).unwrap().len(), 3);
    }

    /// A burst per period goes into the file as a table and comes back
    /// out of the rule the same.
    #[test]
    fn a_burst_per_period_round_trips() {
        let rule = json!({
            "per_second": {"requests": 5},
            "per_minute": {"requests": 100},
            "burst_seconds": {"second": 2, "minute": 30},
        });
        let out = edit_rule(FILE, "front", "carol", Some(&rule)).unwrap();
        let set = LimitSet::from_toml(&out).unwrap();
        let carol = set.get("front", "carol").unwrap();
        let minute = carol.allowance("requests", Period::Minute).unwrap();
        assert_eq!((carol.burst_seconds, minute.burst_seconds), (2.0, 30.0));
        let shown = serde_json::to_value(carol).unwrap();
        assert_eq!(
            shown["burst_seconds"],
            json!({"second": 2.0, "minute": 30.0})
        );
    }

    #[test]
    fn a_rule_is_removed_and_an_emptied_list_goes() {
        let out = edit_rule(FILE, "front", "alice", None).unwrap();
        let out = edit_rule(&out, "front", "bob", None).unwrap();
        let set = LimitSet::from_toml(&out).unwrap();
        assert_eq!(set.len(), 1, "only * is left: {out}");
        let none = edit_rule(&out, "front", "*", None).unwrap();
        assert!(LimitSet::from_toml(&none).unwrap().is_empty(), "{none}");
        assert!(none.contains("# Our limits."), "comments stay: {none}");
    }

    #[test]
    fn bad_bodies_are_refused_naming_the_field() {
        let unknown = edit_rule(FILE, "front", "carol", Some(&json!({"per_week": {}})));
        assert!(matches!(unknown, Err(EditError::Body(m)) if m.contains("per_week")));
        let bad = edit_rule(FILE, "front", "carol", Some(&json!({"per_day": {"r": -1}})));
        assert!(bad.unwrap_err().to_string().contains("per_day \"r\""));
        let not_object = edit_rule(FILE, "front", "carol", Some(&json!([1])));
        assert!(not_object.is_err());
        let units = edit_rule(
            FILE,
            "front",
            "carol",
            Some(&json!({"per_second": {"bytes": "5MiB"}})),
        );
        assert!(units.is_ok());
    }

    #[test]
    fn a_block_is_set_and_lifted() {
        let block = json!({"until": "2030-01-01T00:00:00Z", "reason": "scraping"});
        let out = edit_block(FILE, "front", "mallory", Some(&block)).unwrap();
        let set = LimitSet::from_toml(&out).unwrap();
        let blocks = crate::limits::LimitSource::blocks(&set);
        assert_eq!(blocks["front"]["mallory"].reason, "scraping");
        assert_eq!(set.len(), 3, "the rules stay");
        let lifted = edit_block(&out, "front", "mallory", None).unwrap();
        let set = LimitSet::from_toml(&lifted).unwrap();
        assert!(crate::limits::LimitSource::blocks(&set).is_empty());
        let bad = edit_block(FILE, "front", "m", Some(&json!({"until": "soon"})));
        assert!(bad.unwrap_err().to_string().contains("until"));
        let unknown = edit_block(FILE, "front", "m", Some(&json!({"per_second": {}})));
        assert!(matches!(unknown, Err(EditError::Body(_))));
    }

    proptest! {
        /// Whatever the names, an edit yields a file that loads with that
        /// user's rule, or is refused.
        #[test]
        fn any_names_round_trip(service in "\\PC{1,20}", user in "\\PC{1,20}") {
            let rule = json!({"per_second": {"requests": 7}});
            if let Ok(out) = edit_rule(FILE, &service, &user, Some(&rule)) {
                let set = LimitSet::from_toml(&out);
                prop_assert!(set.is_ok(), "{out}");
                let set = set.unwrap_or_default();
                prop_assert_eq!(set.get(&service, &user).map(|l| l.per_second["requests"]), Some(7.0));
            }
        }
    }
}
