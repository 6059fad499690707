//! How a node proves who it is: an access key and an HMAC-SHA256
//! signature in the stream's request metadata, checked before the central
//! reads anything the stream sends.
//!
//! A node holds an access key (public, names the key) and a secret key
//! (shared with the central only). Opening a stream, it sends four
//! metadata entries:
//!
//! | key | value |
//! |---|---|
//! | `x-throttle-access-key` | the access key |
//! | `x-throttle-node-id` | the node id its Hello will carry |
//! | `x-throttle-timestamp` | now, in Unix milliseconds |
//! | `x-throttle-signature` | lowercase hex of HMAC-SHA256(secret key, [`signed_text`]) |
//!
//! The signed text binds the access key, the node id and the timestamp, so
//! a signature is valid for one node id and, with the central's skew
//! window ([`Verifier::skew_ms`]), for a short time only: a captured header
//! cannot be replayed later, nor used for another node id. The stream's
//! Hello must then carry the signed node id.
//!
//! # Examples
//!
//! ```
//! use throttle_proto::auth::{Credentials, Verifier};
//!
//! let node = Credentials::new("web", "s3cret");
//! let signed = node.sign("web-1", 1_700_000_000_000);
//! let verifier = Verifier::new(60_000);
//! assert!(verifier.verify("s3cret", &signed, 1_700_000_010_000).is_ok());
//! assert!(verifier.verify("other", &signed, 1_700_000_010_000).is_err());
//! ```

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Metadata key of the access key.
pub const ACCESS_KEY: &str = "x-throttle-access-key";
/// Metadata key of the node id the signature is for.
pub const NODE_ID: &str = "x-throttle-node-id";
/// Metadata key of the signing time, in Unix milliseconds.
pub const TIMESTAMP: &str = "x-throttle-timestamp";
/// Metadata key of the signature.
pub const SIGNATURE: &str = "x-throttle-signature";

/// Longest access key accepted, in bytes.
pub const MAX_ACCESS_KEY_LEN: usize = 256;

/// What a node signs: the scheme's name, then the access key, the node id
/// and the timestamp, one per line.
pub fn signed_text(access_key: &str, node_id: &str, timestamp_ms: i64) -> String {
    format!("throttle-v1\n{access_key}\n{node_id}\n{timestamp_ms}")
}

/// An access key and its secret, held by a node.
#[derive(Clone)]
pub struct Credentials {
    access_key: String,
    secret_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// The four metadata values of one signed stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// [`ACCESS_KEY`].
    pub access_key: String,
    /// [`NODE_ID`].
    pub node_id: String,
    /// [`TIMESTAMP`].
    pub timestamp_ms: i64,
    /// [`SIGNATURE`], lowercase hex.
    pub signature: String,
}

impl Signed {
    /// The four metadata entries, as (key, value).
    pub fn entries(&self) -> [(&'static str, String); 4] {
        [
            (ACCESS_KEY, self.access_key.clone()),
            (NODE_ID, self.node_id.clone()),
            (TIMESTAMP, self.timestamp_ms.to_string()),
            (SIGNATURE, self.signature.clone()),
        ]
    }
}

impl Credentials {
    /// `access_key` with its `secret_key`.
    pub fn new(access_key: impl Into<String>, secret_key: impl Into<String>) -> Self {
        Self {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
        }
    }

    /// The access key.
    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    /// The metadata that proves this key for `node_id` at `timestamp_ms`.
    pub fn sign(&self, node_id: &str, timestamp_ms: i64) -> Signed {
        let text = signed_text(&self.access_key, node_id, timestamp_ms);
        Signed {
            access_key: self.access_key.clone(),
            node_id: node_id.to_owned(),
            timestamp_ms,
            signature: hex(&mac(&self.secret_key, &text).finalize().into_bytes()),
        }
    }
}

/// Why a signature was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// A metadata entry is missing or not what it should be.
    #[error("missing or malformed credentials")]
    Malformed,
    /// The access key is not known.
    #[error("unknown access key")]
    UnknownKey,
    /// The timestamp is outside the skew window.
    #[error("signature expired or from the future")]
    Expired,
    /// The signature does not match.
    #[error("wrong signature")]
    BadSignature,
    /// The key may not be used for this node id.
    #[error("node id not allowed for this access key")]
    NodeNotAllowed,
}

impl AuthError {
    /// Label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::UnknownKey => "unknown_key",
            Self::Expired => "expired",
            Self::BadSignature => "bad_signature",
            Self::NodeNotAllowed => "node_not_allowed",
        }
    }
}

/// Checks signatures, at the central.
#[derive(Debug, Clone, Copy)]
pub struct Verifier {
    skew_ms: i64,
}

impl Verifier {
    /// Accepts timestamps within `skew_ms` of the central's clock, either
    /// way.
    pub fn new(skew_ms: i64) -> Self {
        Self {
            skew_ms: skew_ms.max(0),
        }
    }

    /// How far a timestamp may be from the central's clock.
    pub fn skew_ms(&self) -> i64 {
        self.skew_ms
    }

    /// Whether `signed` was made with `secret_key` within the skew window
    /// of `now_ms`. The signature is compared in constant time.
    ///
    /// # Errors
    ///
    /// [`AuthError::Expired`] or [`AuthError::BadSignature`].
    pub fn verify(&self, secret_key: &str, signed: &Signed, now_ms: i64) -> Result<(), AuthError> {
        if signed.timestamp_ms.abs_diff(now_ms) > self.skew_ms.unsigned_abs() {
            return Err(AuthError::Expired);
        }
        let Some(signature) = unhex(&signed.signature) else {
            return Err(AuthError::BadSignature);
        };
        let text = signed_text(&signed.access_key, &signed.node_id, signed.timestamp_ms);
        mac(secret_key, &text)
            .verify_slice(&signature)
            .map_err(|_| AuthError::BadSignature)
    }
}

fn mac(secret_key: &str, text: &str) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret_key.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
    mac.update(text.as_bytes());
    mac
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 128 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T: i64 = 1_700_000_000_000;

    #[test]
    fn a_signature_holds_for_its_key_node_and_window_only() {
        let creds = Credentials::new("web", "s3cret");
        let v = Verifier::new(30_000);
        let signed = creds.sign("web-1", T);
        assert_eq!(signed.signature.len(), 64);
        assert_eq!(v.verify("s3cret", &signed, T + 30_000), Ok(()));
        assert_eq!(v.verify("s3cret", &signed, T - 30_000), Ok(()));
        assert_eq!(
            v.verify("s3cret", &signed, T + 30_001),
            Err(AuthError::Expired)
        );
        assert_eq!(v.verify("wrong", &signed, T), Err(AuthError::BadSignature));
        for tampered in [
            Signed {
                node_id: "web-2".into(),
                ..signed.clone()
            },
            Signed {
                access_key: "api".into(),
                ..signed.clone()
            },
            Signed {
                timestamp_ms: T + 1,
                ..signed.clone()
            },
            Signed {
                signature: "zz".into(),
                ..signed.clone()
            },
        ] {
            assert_eq!(
                v.verify("s3cret", &tampered, T),
                Err(AuthError::BadSignature)
            );
        }
    }

    proptest! {
        /// Any signature other than the right one is refused, and reading
        /// it never panics.
        #[test]
        fn arbitrary_signatures_are_refused(signature in "\\PC{0,140}") {
            let signed = Signed { signature, ..Credentials::new("k", "s").sign("n", T) };
            let right = Credentials::new("k", "s").sign("n", T).signature;
            let got = Verifier::new(1_000).verify("s", &signed, T);
            prop_assert_eq!(got.is_ok(), signed.signature == right);
        }
    }
}
