//! Which nodes may open a stream: access keys with their secrets, and the
//! node ids each may use (see [`throttle_proto::auth`] for the signature).
//!
//! ```toml
//! [[key]]
//! access_key = "web"
//! secret_key = "a long random string"
//! node_ids = ["web-*"]     # optional: any node id when left out
//!
//! [[proxy]]                # an Envoy proxy: `authorization: Bearer <token>`
//! node_id = "envoy-1"
//! token = "another long random string"
//! ```
//!
//! # Examples
//!
//! ```
//! use throttle_central::keys::KeySet;
//! use throttle_proto::auth::{AuthError, Credentials};
//!
//! let keys = KeySet::from_toml(r#"
//! [[key]]
//! access_key = "web"
//! secret_key = "a secret of 16+ bytes"
//! node_ids = ["web-*"]
//! "#)?;
//! let now = 1_700_000_000_000;
//! let web = Credentials::new("web", "a secret of 16+ bytes");
//! assert_eq!(keys.authenticate(&web.sign("web-1", now), now), Ok(()));
//! assert_eq!(keys.authenticate(&web.sign("db-1", now), now), Err(AuthError::NodeNotAllowed));
//! # Ok::<(), throttle_central::keys::KeysError>(())
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use throttle_proto::MAX_NAME_LEN;
use throttle_proto::auth::{AuthError, MAX_ACCESS_KEY_LEN, Signed, Verifier};

use crate::watched::{FileFormat, Watched, line_of, parse_toml};

/// How far a signature's timestamp may be from the central's clock: a
/// captured signature is good for this long at most.
pub const SKEW_MS: i64 = 60_000;

/// One access key's secret and the node ids it may use.
#[derive(Clone)]
struct NodeKey {
    secret_key: String,
    /// Patterns where `*` stands for any run of characters; empty: any.
    node_ids: Vec<String>,
}

impl NodeKey {
    fn allows(&self, node_id: &str) -> bool {
        self.node_ids.is_empty() || self.node_ids.iter().any(|p| matches(p, node_id))
    }
}

/// The access keys a central accepts, and the proxies' tokens.
#[derive(Clone, Default)]
pub struct KeySet {
    keys: BTreeMap<String, NodeKey>,
    /// Node id -> its bearer token.
    proxies: BTreeMap<String, String>,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("access_keys", &self.keys.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Why a keys file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    /// Not valid TOML of the expected shape.
    #[error("invalid node keys at line {line}: {message}")]
    Syntax {
        /// 1-based line of the error.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A key entry is not usable.
    #[error("invalid node key at line {line}: {message}")]
    Entry {
        /// 1-based line of the entry.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The file has no keys: every node would be refused.
    #[error("the node keys file lists no keys")]
    Empty,
    /// The file could not be read.
    #[error("cannot read node keys file {path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    key: Vec<toml::Spanned<Entry>>,
    #[serde(default)]
    proxy: Vec<toml::Spanned<ProxyEntry>>,
}

/// A proxy's token: Envoy cannot sign, so it shows a static bearer token
/// for its node id.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProxyEntry {
    node_id: String,
    token: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    access_key: String,
    secret_key: String,
    #[serde(default)]
    node_ids: Vec<String>,
}

impl KeySet {
    /// Parses the TOML form (see the [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`KeysError`], naming the line: bad TOML, unknown fields, an empty
    /// or overlong access key, a secret under 16 bytes, a duplicate access
    /// key, an empty or overlong node id pattern; [`KeysError::Empty`] for
    /// a file without keys.
    pub fn from_toml(text: &str) -> Result<Self, KeysError> {
        let file: File =
            parse_toml(text).map_err(|(line, message)| KeysError::Syntax { line, message })?;
        let mut keys = BTreeMap::new();
        for spanned in file.key {
            let line = line_of(text, spanned.span().start);
            let e = spanned.into_inner();
            let bad = |message: &str| KeysError::Entry {
                line,
                message: message.to_owned(),
            };
            if e.access_key.is_empty() || e.access_key.len() > MAX_ACCESS_KEY_LEN {
                return Err(bad("access_key must be 1 to 256 bytes"));
            }
            if e.secret_key.len() < 16 {
                return Err(bad("secret_key must be at least 16 bytes"));
            }
            if e.node_ids
                .iter()
                .any(|p| p.is_empty() || p.len() > MAX_NAME_LEN)
            {
                return Err(bad("node_ids patterns must be 1 to 256 bytes"));
            }
            let key = NodeKey {
                secret_key: e.secret_key,
                node_ids: e.node_ids,
            };
            if keys.insert(e.access_key, key).is_some() {
                return Err(bad("duplicate access_key"));
            }
        }
        let proxies = proxies_of(text, file.proxy)?;
        if keys.is_empty() && proxies.is_empty() {
            return Err(KeysError::Empty);
        }
        Ok(Self { keys, proxies })
    }

    /// Whether `token` is the one of proxy `node_id`.
    ///
    /// # Errors
    ///
    /// [`AuthError::UnknownKey`] for a node id without a token,
    /// [`AuthError::BadSignature`] for another token.
    pub fn authenticate_proxy(&self, node_id: &str, token: &str) -> Result<(), AuthError> {
        let known = self.proxies.get(node_id).ok_or(AuthError::UnknownKey)?;
        if same_bytes(known.as_bytes(), token.as_bytes()) {
            Ok(())
        } else {
            Err(AuthError::BadSignature)
        }
    }

    /// Number of access keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when no key is accepted.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether `signed` proves a key of this set for its node id at
    /// `now_ms`.
    ///
    /// # Errors
    ///
    /// The [`AuthError`] saying why not.
    pub fn authenticate(&self, signed: &Signed, now_ms: i64) -> Result<(), AuthError> {
        let key = self
            .keys
            .get(&signed.access_key)
            .ok_or(AuthError::UnknownKey)?;
        Verifier::new(SKEW_MS).verify(&key.secret_key, signed, now_ms)?;
        if key.allows(&signed.node_id) {
            Ok(())
        } else {
            Err(AuthError::NodeNotAllowed)
        }
    }

    /// The secret key of `access_key`, for a signature computed otherwise
    /// (the legacy nodes' presigned URLs).
    pub fn secret_of(&self, access_key: &str) -> Option<&str> {
        self.keys.get(access_key).map(|k| k.secret_key.as_str())
    }

    /// Whether `access_key` may be used by `node_id`.
    pub fn allows(&self, access_key: &str, node_id: &str) -> bool {
        self.keys.get(access_key).is_some_and(|k| k.allows(node_id))
    }
}

/// Whether `a` and `b` are equal, in a time that does not depend on where
/// they differ (secrets, signatures).
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |d, (x, y)| d | (x ^ y)) == 0
}

/// The `[[proxy]]` entries: node id -> token.
fn proxies_of(
    text: &str,
    entries: Vec<toml::Spanned<ProxyEntry>>,
) -> Result<BTreeMap<String, String>, KeysError> {
    let mut proxies = BTreeMap::new();
    for spanned in entries {
        let line = line_of(text, spanned.span().start);
        let e = spanned.into_inner();
        let bad = |message: &str| KeysError::Entry {
            line,
            message: message.to_owned(),
        };
        if e.node_id.is_empty() || e.node_id.len() > MAX_NAME_LEN {
            return Err(bad("node_id must be 1 to 256 bytes"));
        }
        if e.token.len() < 16 {
            return Err(bad("token must be at least 16 bytes"));
        }
        if proxies.insert(e.node_id, e.token).is_some() {
            return Err(bad("duplicate proxy node_id"));
        }
    }
    Ok(proxies)
}

impl FileFormat for KeySet {
    type Error = KeysError;

    fn parse(_: &Path, text: &str) -> Result<Self, KeysError> {
        KeySet::from_toml(text)
    }

    fn unreadable(path: &Path, error: &std::io::Error) -> KeysError {
        KeysError::Read {
            path: path.to_owned(),
            message: error.to_string(),
        }
    }
}

/// Node keys read from a TOML file ([`KeySet`]), reloaded when it
/// changes: a broken edit keeps the keys in force and is reported.
#[derive(Debug)]
pub struct NodeKeys {
    file: Watched<KeySet>,
}

impl NodeKeys {
    /// Loads `path`.
    ///
    /// # Errors
    ///
    /// The [`KeysError`] of the first load.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, KeysError> {
        Ok(Self {
            file: Watched::open(path, KeySet::default())?,
        })
    }

    /// The file this reads.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Reads the file again once it reads the same twice in a row (see
    /// `Watched::poll`); returns whether the keys changed.
    ///
    /// # Errors
    ///
    /// The [`KeysError`] of a broken file, once per edit.
    pub fn poll(&self) -> Result<bool, KeysError> {
        self.file.poll()
    }

    /// The keys in force.
    pub fn current(&self) -> Arc<KeySet> {
        self.file.current()
    }

    /// [`KeySet::authenticate`] with the keys in force.
    ///
    /// # Errors
    ///
    /// As [`KeySet::authenticate`].
    pub fn authenticate(&self, signed: &Signed, now_ms: i64) -> Result<(), AuthError> {
        self.file.current().authenticate(signed, now_ms)
    }

    /// Why the last reload failed, if it did.
    pub fn last_error(&self) -> Option<String> {
        self.file.last_error()
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of
/// characters (none included).
fn matches(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut i, mut j) = (0, 0);
    // The last `*` seen, and where in `name` its run ends so far.
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && p[i] == b'*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == n[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i.min(p.len())..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use throttle_proto::auth::Credentials;

    const T: i64 = 1_700_000_000_000;
    const KEYS: &str = r#"
[[key]]
access_key = "web"
secret_key = "0123456789abcdef"
node_ids = ["web-*", "canary"]

[[key]]
access_key = "any"
secret_key = "fedcba9876543210"
"#;

    #[test]
    fn keys_prove_their_node_ids_only() {
        let keys = KeySet::from_toml(KEYS).unwrap();
        let web = Credentials::new("web", "0123456789abcdef");
        assert_eq!(keys.authenticate(&web.sign("web-7", T), T), Ok(()));
        assert_eq!(keys.authenticate(&web.sign("canary", T), T), Ok(()));
        assert_eq!(
            keys.authenticate(&web.sign("db-1", T), T),
            Err(AuthError::NodeNotAllowed)
        );
        let any = Credentials::new("any", "fedcba9876543210");
        assert_eq!(keys.authenticate(&any.sign("db-1", T), T), Ok(()));
        let stranger = Credentials::new("nobody", "fedcba9876543210");
        assert_eq!(
            keys.authenticate(&stranger.sign("db-1", T), T),
            Err(AuthError::UnknownKey)
        );
        let wrong = Credentials::new("web", "not the secret!!");
        assert_eq!(
            keys.authenticate(&wrong.sign("web-1", T), T),
            Err(AuthError::BadSignature)
        );
        assert_eq!(
            keys.authenticate(&web.sign("web-1", T - SKEW_MS - 1), T),
            Err(AuthError::Expired)
        );
    }

    #[test]
    fn proxies_show_their_token() {
        let keys =
            KeySet::from_toml("[[proxy]]\nnode_id = \"envoy-1\"\ntoken = \"0123456789abcdef\"\n")
                .unwrap();
        assert_eq!(
            keys.authenticate_proxy("envoy-1", "0123456789abcdef"),
            Ok(())
        );
        let wrong = keys.authenticate_proxy("envoy-1", "0123456789abcdeF");
        assert_eq!(wrong, Err(AuthError::BadSignature));
        let unknown = keys.authenticate_proxy("envoy-2", "0123456789abcdef");
        assert_eq!(unknown, Err(AuthError::UnknownKey));
        let short = KeySet::from_toml("[[proxy]]\nnode_id = \"e\"\ntoken = \"short\"\n");
        assert!(short.unwrap_err().to_string().contains("16 bytes"));
    }

    #[test]
    fn the_legacy_guides_keys_file_is_read() {
        let guide = include_str!("../../docs/guides/legacy.md");
        let block = guide
            .split("```toml\n")
            .nth(1)
            .and_then(|b| b.split("```").next());
        let keys = KeySet::from_toml(block.expect("the guide's keys file")).expect("read");
        let secret = keys.secret_of("AKIDLUANODES");
        assert_eq!(secret, Some("the secret_key of the nginx configuration"));
        assert!(keys.allows("AKIDLUANODES", "nginx-7"));
        assert!(!keys.allows("AKIDLUANODES", "db-1") && !keys.allows("other", "nginx-7"));
    }

    #[test]
    fn bad_files_name_the_line() {
        let short = "[[key]]\naccess_key = \"k\"\nsecret_key = \"short\"\n";
        assert!(matches!(
            KeySet::from_toml(short),
            Err(KeysError::Entry { line: 1, .. })
        ));
        let dup =
            format!("{KEYS}\n[[key]]\naccess_key = \"web\"\nsecret_key = \"0123456789abcdef\"\n");
        let e = KeySet::from_toml(&dup).unwrap_err();
        assert!(e.to_string().contains("duplicate"), "{e}");
        assert_eq!(KeySet::from_toml("# none\n").unwrap_err(), KeysError::Empty);
        assert!(matches!(
            KeySet::from_toml("[[key]]\naccess_key = 1\n"),
            Err(KeysError::Syntax { line: 2, .. })
        ));
    }

    #[test]
    fn patterns_match_runs_of_any_length() {
        for (p, n, want) in [
            ("web-*", "web-1", true),
            ("web-*", "web-", true),
            ("web-*", "api-1", false),
            ("*", "", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("*-eu", "web-1-eu", true),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(matches(p, n), want, "{p} ~ {n}");
        }
    }

    proptest! {
        /// A keys file from outside, whatever it holds, parses or is
        /// refused: never a panic.
        #[test]
        fn arbitrary_text_is_parsed_or_refused(text in "\\PC{0,300}") {
            if let Err(e) = KeySet::from_toml(&text) {
                prop_assert!(!e.to_string().is_empty());
            }
        }

        /// A pattern without `*` matches only itself; `*` matches
        /// everything.
        #[test]
        fn patterns_agree_with_the_obvious_cases(name in "[a-z0-9-]{0,12}", other in "[a-z0-9-]{0,12}") {
            prop_assert!(matches("*", &name));
            prop_assert_eq!(matches(&name, &other), name == other);
            let prefix = format!("{name}*");
            let longer = format!("{name}{other}");
            prop_assert!(matches(&prefix, &longer));
        }
    }
}
