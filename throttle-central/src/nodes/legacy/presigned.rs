//! A legacy node's presigned URL: the query of its WebSocket handshake,
//! signed as an S3 presigned URL is (AWS Signature Version 4, query
//! authentication), and checked here against the node keys.
//!
//! The node signs `GET`, the path, the sorted query without
//! `X-Amz-Signature`, the headers of `X-Amz-SignedHeaders` (`host`, as it
//! sends it) and `UNSIGNED-PAYLOAD`, in the scope
//! `<yyyymmdd>/<region>/<service>/aws4_request` of its credential; the
//! signature is computed again here with `aws-sigv4` and compared.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PercentEncodingMode, SignableBody, SignableRequest, SignatureLocation, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;
use throttle_proto::auth::{AuthError, MAX_ACCESS_KEY_LEN};

use crate::keys::same_bytes;

/// How far the central's clock may be from the node's, either way.
pub(super) const SKEW_MS: i64 = 15_000;

/// The longest validity a URL may claim (`X-Amz-Expires`), in seconds:
/// seven days, as S3 allows. The legacy node asks for 60.
pub(super) const MAX_EXPIRES_S: u64 = 604_800;

const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// The signing parameters of a presigned URL's query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Presigned {
    access_key: String,
    region: String,
    service: String,
    signed_at: SystemTime,
    expires_s: u64,
    signed_headers: Vec<String>,
    signature: String,
    /// The query's other parameters, as sent (still percent-encoded).
    rest: Vec<String>,
}

impl Presigned {
    /// Reads the `X-Amz-*` parameters of `query` (as sent, without `?`).
    ///
    /// # Errors
    ///
    /// [`AuthError::Malformed`] when one is missing, repeated or not of
    /// the form a SigV4 presigned URL gives it.
    pub(super) fn parse(query: &str) -> Result<Self, AuthError> {
        let mut fields: [Option<String>; 6] = Default::default();
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, _) = pair.split_once('=').unwrap_or((pair, ""));
            let Some(i) = FIELDS.iter().position(|f| *f == name) else {
                rest.push(pair.to_owned());
                continue;
            };
            let value = form_urlencoded::parse(pair.as_bytes())
                .next()
                .map(|(_, v)| v);
            if fields[i]
                .replace(value.unwrap_or_default().into_owned())
                .is_some()
            {
                return Err(AuthError::Malformed);
            }
        }
        let [
            Some(algorithm),
            Some(credential),
            Some(date),
            Some(expires),
            Some(headers),
            Some(signature),
        ] = fields
        else {
            return Err(AuthError::Malformed);
        };
        if algorithm != ALGORITHM || signature.len() != 64 {
            return Err(AuthError::Malformed);
        }
        let scope: Vec<&str> = credential.split('/').collect();
        let [access_key, day, region, service, "aws4_request"] = scope[..] else {
            return Err(AuthError::Malformed);
        };
        let signed_at = amz_time(&date).ok_or(AuthError::Malformed)?;
        let expires_s: u64 = expires.parse().map_err(|_| AuthError::Malformed)?;
        let valid = !access_key.is_empty()
            && access_key.len() <= MAX_ACCESS_KEY_LEN
            && date.starts_with(day)
            && day.len() == 8
            && (1..=MAX_EXPIRES_S).contains(&expires_s);
        if !valid {
            return Err(AuthError::Malformed);
        }
        Ok(Self {
            access_key: access_key.to_owned(),
            region: region.to_owned(),
            service: service.to_owned(),
            signed_at,
            expires_s,
            signed_headers: headers.split(';').map(str::to_owned).collect(),
            signature,
            rest,
        })
    }

    /// The access key the URL names.
    pub(super) fn access_key(&self) -> &str {
        &self.access_key
    }

    /// Whether the URL is valid at `now_ms`: from [`SKEW_MS`] before it
    /// was signed to its expiry plus [`SKEW_MS`].
    pub(super) fn current(&self, now_ms: i64) -> bool {
        let signed_ms = self
            .signed_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let expires_ms = i64::try_from(self.expires_s * 1000).unwrap_or(i64::MAX);
        (signed_ms - SKEW_MS..=signed_ms + expires_ms + SKEW_MS).contains(&now_ms)
    }

    /// Checks the signature of a `GET` of `path` whose headers are given
    /// by `header` (the `host` header as the node sent it), with
    /// `secret_key`.
    ///
    /// # Errors
    ///
    /// [`AuthError::Malformed`] when a signed header is missing,
    /// [`AuthError::BadSignature`] when the signature differs.
    pub(super) fn verify<'a>(
        &self,
        secret_key: &str,
        path: &str,
        header: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<(), AuthError> {
        let headers = self
            .signed_headers
            .iter()
            .map(|name| header(name).map(|value| (name.as_str(), value)))
            .collect::<Option<Vec<_>>>()
            .ok_or(AuthError::Malformed)?;
        let uri = match self.rest.is_empty() {
            true => Cow::Borrowed(path),
            false => Cow::Owned(format!("{path}?{}", self.rest.join("&"))),
        };
        let expected = self
            .signature_of(secret_key, uri, headers)
            .ok_or(AuthError::Malformed)?;
        if same_bytes(expected.as_bytes(), self.signature.as_bytes()) {
            Ok(())
        } else {
            Err(AuthError::BadSignature)
        }
    }

    /// The signature `aws-sigv4` gives the request, as presigned.
    fn signature_of(
        &self,
        secret: &str,
        uri: Cow<'_, str>,
        headers: Vec<(&str, &str)>,
    ) -> Option<String> {
        let identity = Credentials::new(&self.access_key, secret, None, None, "node-keys").into();
        let mut settings = SigningSettings::default();
        settings.signature_location = SignatureLocation::QueryParams;
        settings.expires_in = Some(Duration::from_secs(self.expires_s));
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(&self.service)
            .time(self.signed_at)
            .settings(settings)
            .build()
            .ok()?;
        let body = SignableBody::UnsignedPayload;
        let request = SignableRequest::new("GET", uri, headers.into_iter(), body).ok()?;
        let output = sign(request, &params.into()).ok()?;
        Some(output.signature().to_owned())
    }
}

/// The query parameters of a presigned URL, in [`Presigned::parse`]'s
/// order.
const FIELDS: [&str; 6] = [
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
];

/// `yyyymmddThhmmssZ` as a time.
fn amz_time(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let digits = text.get(from..to)?;
        digits
            .bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| digits.parse().ok())?
    };
    let (y, m, d) = (num(0, 4)?, num(4, 6)?, num(6, 8)?);
    let (h, min, s) = (num(9, 11)?, num(11, 13)?, num(13, 15)?);
    let valid = (1..=12).contains(&m) && (1..=31).contains(&d) && h < 24 && min < 60 && s < 61;
    if !valid {
        return None;
    }
    let seconds = days_from_civil(y, m, d) * 86_400 + h * 3_600 + min * 60 + s;
    UNIX_EPOCH.checked_add(Duration::from_secs(u64::try_from(seconds).ok()?))
}

/// Days from 1970-01-01 to the proleptic Gregorian date `y-m-d`.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    // The example of AWS's documentation of presigned S3 URLs ("Query
    // string request authentication"), with its published signature.
    const AWS_EXAMPLE: &str = "X-Amz-Algorithm=AWS4-HMAC-SHA256\
        &X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request\
        &X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host\
        &X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404";
    const AWS_SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

    fn host(name: &str) -> Option<&'static str> {
        (name == "host").then_some("examplebucket.s3.amazonaws.com")
    }

    #[test]
    fn the_aws_example_verifies_and_a_changed_one_does_not() {
        let url = Presigned::parse(AWS_EXAMPLE).expect("parsed");
        assert_eq!(url.access_key(), "AKIAIOSFODNN7EXAMPLE");
        assert_eq!(url.verify(AWS_SECRET, "/test.txt", host), Ok(()));
        let wrong = url.verify("another secret", "/test.txt", host);
        assert_eq!(wrong, Err(AuthError::BadSignature));
        let other_path = url.verify(AWS_SECRET, "/throttle", host);
        assert_eq!(other_path, Err(AuthError::BadSignature));
        let no_host = url.verify(AWS_SECRET, "/test.txt", |_| None);
        assert_eq!(no_host, Err(AuthError::Malformed));
    }

    #[test]
    fn validity_runs_from_signing_to_expiry_within_the_skew() {
        let url = Presigned::parse(AWS_EXAMPLE).expect("parsed");
        let signed = 1_369_353_600_000; // 2013-05-24T00:00:00Z
        assert!(url.current(signed));
        assert!(url.current(signed - SKEW_MS));
        assert!(!url.current(signed - SKEW_MS - 1));
        assert!(url.current(signed + 86_400_000 + SKEW_MS));
        assert!(!url.current(signed + 86_400_000 + SKEW_MS + 1));
    }

    #[test]
    fn malformed_queries_are_refused() {
        let bad = [
            "",
            "X-Amz-Algorithm=AWS4-HMAC-SHA256",
            &AWS_EXAMPLE.replace("AWS4-HMAC-SHA256", "AWS4-HMAC-SHA1"),
            &AWS_EXAMPLE.replace("20130524T000000Z", "20130524T250000Z"),
            &AWS_EXAMPLE.replace("%2F20130524%2F", "%2F20130525%2F"),
            &AWS_EXAMPLE.replace("aws4_request", "aws5_request"),
            &AWS_EXAMPLE.replace("Expires=86400", "Expires=0"),
            &AWS_EXAMPLE.replace("Expires=86400", "Expires=-1"),
            &AWS_EXAMPLE.replace("Expires=86400", "Expires=604801"),
            &AWS_EXAMPLE.replace("=aeeed9", "=aeee"),
            &format!("{AWS_EXAMPLE}&X-Amz-Date=20130524T000000Z"),
        ];
        for query in bad {
            assert_eq!(
                Presigned::parse(query),
                Err(AuthError::Malformed),
                "{query}"
            );
        }
    }

    #[test]
    fn amz_dates_are_read() {
        let at = |t| amz_time(t).and_then(|t| t.duration_since(UNIX_EPOCH).ok());
        assert_eq!(at("19700101T000000Z"), Some(Duration::ZERO));
        assert_eq!(
            at("20130524T000000Z"),
            Some(Duration::from_secs(1_369_353_600))
        );
        assert_eq!(
            at("20240229T235959Z"),
            Some(Duration::from_secs(1_709_251_199))
        );
        assert_eq!(at("2024022T235959Z"), None);
        assert_eq!(at("2024+229T235959Z"), None);
    }
}
