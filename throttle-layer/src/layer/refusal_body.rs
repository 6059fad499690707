//! The body of an HTTP refusal: a line of text that says what refused,
//! or a JSON object with the same message and its figures when the
//! request accepts JSON. A gRPC refusal has no body: its message is in
//! `grpc-message`.

use bytes::Bytes;
use http::HeaderValue;
use http::header::ACCEPT;
use serde_json::{Map, Value};

use crate::user::RequestHead;

/// Whether the request asks for JSON: an `Accept` naming
/// `application/json` or a `+json` type.
pub(crate) fn accepts_json(head: RequestHead<'_>) -> bool {
    head.headers.get_all(ACCEPT).iter().any(|v| {
        let v = v.as_bytes();
        contains(v, b"application/json") || contains(v, b"+json")
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// What a refusal's body says.
#[derive(Debug)]
pub(crate) struct Said<'a> {
    /// The text's opening words, e.g. `Too Many Requests`.
    pub(crate) title: &'static str,
    /// The JSON `error` code, e.g. `rate_limited`.
    pub(crate) error: &'static str,
    /// What refused, in words.
    pub(crate) message: &'a str,
    /// The figures, in the JSON form only.
    pub(crate) fields: Map<String, Value>,
}

impl Said<'_> {
    /// The body and its content type: JSON when `json`, else text.
    pub(crate) fn render(self, json: bool) -> (HeaderValue, Bytes) {
        if !json {
            let text = format!("{}: {}\n", self.title, self.message);
            let kind = HeaderValue::from_static("text/plain; charset=utf-8");
            return (kind, Bytes::from(text));
        }
        let mut object = Map::with_capacity(self.fields.len() + 2);
        object.insert("error".into(), self.error.into());
        object.insert("message".into(), self.message.into());
        object.extend(self.fields);
        // A map of strings and numbers always serializes.
        let mut body = serde_json::to_vec(&Value::Object(object)).unwrap_or_default();
        body.push(b'\n');
        (
            HeaderValue::from_static("application/json"),
            Bytes::from(body),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_with(accept: &str) -> bool {
        let req = http::Request::builder()
            .header(ACCEPT, accept)
            .body(())
            .unwrap();
        accepts_json(RequestHead::of(&req))
    }

    #[test]
    fn json_is_chosen_by_accept() {
        assert!(head_with("application/json"));
        assert!(head_with("text/html, application/json;q=0.9"));
        assert!(head_with("application/problem+json"));
        assert!(!head_with("text/plain"));
        assert!(!head_with("*/*"));
    }

    #[test]
    fn text_and_json_say_the_same() {
        let said = |fields| Said {
            title: "Too Many Requests",
            error: "rate_limited",
            message: "requests of \"front\" exhausted",
            fields,
        };
        let (kind, text) = said(Map::new()).render(false);
        assert_eq!(kind, "text/plain; charset=utf-8");
        assert_eq!(
            &text[..],
            b"Too Many Requests: requests of \"front\" exhausted\n"
        );
        let mut fields = Map::new();
        fields.insert("limit".into(), 10.into());
        let (kind, json) = said(fields).render(true);
        assert_eq!(kind, "application/json");
        let v: Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["error"], "rate_limited");
        assert_eq!(v["message"], "requests of \"front\" exhausted");
        assert_eq!(v["limit"], 10);
    }
}
