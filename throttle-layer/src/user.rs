//! Who a request is for: [`UserKey`].
//!
//! The key is read from the request head without allocating for the common
//! sources: a header, the peer address (axum `ConnectInfo`, tonic
//! `TcpConnectInfo`), `X-Forwarded-For` behind trusted proxies, or a request
//! extension set by an authentication layer. A closure over the
//! [`RequestHead`] covers everything else.
//!
//! # Examples
//!
//! ```
//! use throttle_layer::UserKey;
//!
//! let by_header = UserKey::header("x-user");
//! let by_ip = UserKey::peer_ip();
//! let behind_lb = UserKey::forwarded_for(["10.0.0.0/8", "::1"]).unwrap();
//! let by_path = UserKey::from_fn(|parts| parts.uri.path().split('/').nth(1).map(str::to_owned));
//! # let _ = (by_header, by_ip, behind_lb, by_path);
//! ```

use std::fmt::{self, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;

type ExtensionFn = for<'a> fn(&'a http::Extensions) -> Option<&'a str>;
type HeadFn = Arc<dyn Fn(&RequestHead<'_>) -> Option<String> + Send + Sync>;

/// A request's head, borrowed from the request: what [`UserKey::from_fn`]
/// reads. The fields are those of [`http::request::Parts`]; the layer builds
/// it without taking the request apart.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a http::Method,
    /// The URI.
    pub uri: &'a http::Uri,
    /// The HTTP version.
    pub version: http::Version,
    /// The headers.
    pub headers: &'a http::HeaderMap,
    /// The extensions set by layers before this one.
    pub extensions: &'a http::Extensions,
}

impl<'a> RequestHead<'a> {
    /// The head of `request`.
    pub fn of<B>(request: &'a http::Request<B>) -> Self {
        Self {
            method: request.method(),
            uri: request.uri(),
            version: request.version(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    /// The head in `parts`.
    pub fn from_parts(parts: &'a Parts) -> Self {
        Self {
            method: &parts.method,
            uri: &parts.uri,
            version: parts.version,
            headers: &parts.headers,
            extensions: &parts.extensions,
        }
    }
}

/// How the layer finds the user of a request; see the [module docs](self).
#[derive(Clone)]
pub struct UserKey {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Header(HeaderName),
    PeerIp,
    ForwardedFor(Arc<[IpNet]>),
    Extension(ExtensionFn),
    Fn(HeadFn),
}

impl fmt::Debug for UserKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Header(h) => f.debug_tuple("Header").field(h).finish(),
            Kind::PeerIp => f.write_str("PeerIp"),
            Kind::ForwardedFor(t) => f.debug_tuple("ForwardedFor").field(t).finish(),
            Kind::Extension(_) => f.write_str("Extension"),
            Kind::Fn(_) => f.write_str("Fn"),
        }
    }
}

/// What to do with a request whose user cannot be found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MissingUser {
    /// Pass it through without throttling or counting (the default).
    #[default]
    Skip,
    /// Throttle and count it as this user.
    As(String),
}

/// A trusted proxy address or network was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid trusted proxy {0:?}: expected an IP address or CIDR network such as 10.0.0.0/8")]
pub struct InvalidProxy(pub String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    fn parse(s: &str) -> Result<Self, InvalidProxy> {
        let bad = || InvalidProxy(s.to_owned());
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p.parse::<u8>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return Err(bad());
        }
        Ok(Self { addr, prefix })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let ip = match (self.addr, ip) {
            (IpAddr::V4(_), IpAddr::V6(v6)) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            _ => ip,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// An IP address written out without a heap allocation.
#[derive(Debug)]
pub(crate) struct IpText {
    buf: [u8; 48],
    len: usize,
}

impl IpText {
    fn new(ip: IpAddr) -> Self {
        let mut t = Self {
            buf: [0; 48],
            len: 0,
        };
        // IPv4-mapped IPv6 peers count as their IPv4 address.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let _ = write!(t, "{ip}");
        t
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl fmt::Write for IpText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        self.buf
            .get_mut(self.len..end)
            .ok_or(fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

fn extension<T: AsRef<str> + Send + Sync + 'static>(ext: &http::Extensions) -> Option<&str> {
    ext.get::<T>().map(AsRef::as_ref)
}

/// The peer address of the connection, from axum or tonic.
pub(crate) fn peer_addr(ext: &http::Extensions) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(ci) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(ci.0);
    }
    #[cfg(feature = "tonic")]
    if let Some(ci) = ext.get::<tonic::transport::server::TcpConnectInfo>() {
        return ci.remote_addr();
    }
    ext.get::<SocketAddr>().copied()
}

impl UserKey {
    /// The value of header `name`; a missing, empty or non-UTF-8 value is no
    /// user.
    ///
    /// # Panics
    ///
    /// When `name` is not a valid header name: a programming error, caught
    /// the first time the layer is built.
    pub fn header(name: &str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes())
            .unwrap_or_else(|_| panic!("UserKey::header: invalid header name {name:?}"));
        Self {
            kind: Kind::Header(name),
        }
    }

    /// The peer IP address, from axum's `ConnectInfo<SocketAddr>`, tonic's
    /// `TcpConnectInfo`, or a `SocketAddr` extension.
    pub fn peer_ip() -> Self {
        Self { kind: Kind::PeerIp }
    }

    /// The client address from `X-Forwarded-For`, trusted only when the peer
    /// is one of `trusted` proxies: the rightmost address that is not itself a
    /// trusted proxy. From any other peer the header is ignored and the peer
    /// address is the user.
    ///
    /// # Errors
    ///
    /// [`InvalidProxy`] for an entry that is not an IP address or CIDR network.
    pub fn forwarded_for<I, S>(trusted: I) -> Result<Self, InvalidProxy>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets = trusted
            .into_iter()
            .map(|s| IpNet::parse(s.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            kind: Kind::ForwardedFor(nets.into()),
        })
    }

    /// A request extension of type `T` (set by an authentication layer that
    /// runs before this one).
    pub fn extension<T: AsRef<str> + Send + Sync + 'static>() -> Self {
        Self {
            kind: Kind::Extension(extension::<T>),
        }
    }

    /// Any function of the request head.
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> Option<String> + Send + Sync + 'static,
    {
        Self {
            kind: Kind::Fn(Arc::new(f)),
        }
    }

    /// Runs `f` on the request's user name, or on `None` when it has none
    /// (missing, empty, or not visible ASCII for a header). The name is
    /// handed over where it lies, in the request, on the stack (an IP
    /// address written out) or in the closure's `String`, rather than
    /// returned as an enum of every kind of name to fill and match.
    #[inline]
    pub(crate) fn with_user<R>(
        &self,
        head: RequestHead<'_>,
        f: impl FnOnce(Option<&str>) -> R,
    ) -> R {
        let f = |user: Option<&str>| f(user.filter(|u| !u.is_empty()));
        match &self.kind {
            Kind::Header(h) => f(header_user(head.headers, h)),
            Kind::PeerIp => {
                let ip = peer_addr(head.extensions).map(|a| IpText::new(a.ip()));
                f(ip.as_ref().map(IpText::as_str))
            }
            Kind::ForwardedFor(trusted) => {
                let ip = peer_addr(head.extensions)
                    .map(|a| IpText::new(forwarded_client(a.ip(), trusted, head.headers)));
                f(ip.as_ref().map(IpText::as_str))
            }
            Kind::Extension(get) => f(get(head.extensions)),
            Kind::Fn(get) => f(get(&head).as_deref()),
        }
    }
}

/// The value of header `name` as a user name, trimmed; `None` when the
/// header is missing or its value is not visible ASCII (what
/// [`http::HeaderValue::to_str`] accepts).
///
/// Scanning the headers in order instead of hashing the name measured
/// about 30 instructions per header passed over, against 180 for the
/// lookup: a gain for a request that carries only this header, a loss
/// from four headers up, which real clients send (`service/typical/*` in
/// the `store` bench).
#[inline]
pub(crate) fn header_user<'a>(headers: &'a http::HeaderMap, name: &HeaderName) -> Option<&'a str> {
    Some(headers.get(name)?.to_str().ok()?.trim_ascii())
}

fn forwarded_client(peer: IpAddr, trusted: &[IpNet], headers: &http::HeaderMap) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let mut client = peer;
    // Later headers and later entries were added by proxies nearer to us.
    let values: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    for hop in values.iter().rev().flat_map(|v| v.rsplit(',')) {
        match hop.trim().parse::<IpAddr>() {
            Ok(ip) => {
                client = ip;
                if !is_trusted(ip) {
                    break;
                }
            }
            // Garbage from an untrusted party ends the chain we can believe.
            Err(_) => break,
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(f: impl FnOnce(http::request::Builder) -> http::request::Builder) -> Parts {
        f(http::Request::builder()).body(()).unwrap().into_parts().0
    }

    fn user(key: &UserKey, p: &Parts) -> Option<String> {
        key.with_user(RequestHead::from_parts(p), |u| u.map(str::to_owned))
    }

    #[cfg(feature = "axum")]
    fn with_peer(ip: &str) -> impl FnOnce(http::request::Builder) -> http::request::Builder {
        let addr: SocketAddr = format!("{ip}:4000").parse().unwrap();
        move |b| b.extension(axum::extract::ConnectInfo(addr))
    }

    #[test]
    fn header_key() {
        let k = UserKey::header("x-user");
        assert_eq!(
            user(&k, &parts(|b| b.header("x-user", " alice "))),
            Some("alice".into())
        );
        assert_eq!(
            user(&k, &parts(|b| b.header("x-user", "\t bob\t"))),
            Some("bob".into()),
            "tabs are trimmed as spaces are"
        );
        assert_eq!(user(&k, &parts(|b| b.header("x-user", " \t "))), None);
        assert_eq!(user(&k, &parts(|b| b.header("x-user", ""))), None);
        assert_eq!(user(&k, &parts(|b| b)), None);
        assert_eq!(user(&k, &parts(|b| b.header("x-user", &b"\xff"[..]))), None);
    }

    // The peer address comes from axum's `ConnectInfo` here.
    #[cfg(feature = "axum")]
    #[test]
    fn peer_ip_key() {
        let k = UserKey::peer_ip();
        assert_eq!(
            user(&k, &parts(with_peer("192.0.2.7"))),
            Some("192.0.2.7".into())
        );
        assert_eq!(
            user(&k, &parts(with_peer("[::ffff:192.0.2.7]"))),
            Some("192.0.2.7".into())
        );
        assert_eq!(
            user(&k, &parts(with_peer("[2001:db8::1]"))),
            Some("2001:db8::1".into())
        );
        assert_eq!(user(&k, &parts(|b| b)), None);
        #[cfg(feature = "tonic")]
        {
            let tonic_peer = tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: Some("198.51.100.1:9".parse().unwrap()),
            };
            assert_eq!(
                user(&k, &parts(|b| b.extension(tonic_peer))),
                Some("198.51.100.1".into())
            );
        }
    }

    // The peer address comes from axum's `ConnectInfo` here.
    #[cfg(feature = "axum")]
    #[test]
    fn forwarded_for_only_behind_trusted_proxies() {
        let k = UserKey::forwarded_for(["10.0.0.0/8"]).unwrap();
        let via_proxy =
            parts(|b| with_peer("10.1.2.3")(b).header("x-forwarded-for", "203.0.113.9, 10.0.0.5"));
        assert_eq!(user(&k, &via_proxy), Some("203.0.113.9".into()));
        let spoofed = parts(|b| with_peer("198.51.100.1")(b).header("x-forwarded-for", "1.2.3.4"));
        assert_eq!(user(&k, &spoofed), Some("198.51.100.1".into()));
        // A client-supplied prefix does not win over what our proxy saw.
        let chain =
            parts(|b| with_peer("10.1.2.3")(b).header("x-forwarded-for", "1.2.3.4, 203.0.113.9"));
        assert_eq!(user(&k, &chain), Some("203.0.113.9".into()));
        let garbage = parts(|b| with_peer("10.1.2.3")(b).header("x-forwarded-for", "nonsense"));
        assert_eq!(user(&k, &garbage), Some("10.1.2.3".into()));
        let no_header = parts(with_peer("10.1.2.3"));
        assert_eq!(user(&k, &no_header), Some("10.1.2.3".into()));
        assert!(UserKey::forwarded_for(["10.0.0.0/33"]).is_err());
        assert!(UserKey::forwarded_for(["proxy.local"]).is_err());
    }

    #[test]
    fn extension_and_closure_keys() {
        #[derive(Clone)]
        struct Account(String);
        impl AsRef<str> for Account {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        let k = UserKey::extension::<Account>();
        assert_eq!(
            user(&k, &parts(|b| b.extension(Account("acme".into())))),
            Some("acme".into())
        );
        assert_eq!(user(&k, &parts(|b| b)), None);
        let k = UserKey::from_fn(|p| p.uri.path().strip_prefix("/u/").map(str::to_owned));
        assert_eq!(user(&k, &parts(|b| b.uri("/u/zed"))), Some("zed".into()));
    }

    #[test]
    fn ip_networks() {
        let n = IpNet::parse("2001:db8::/32").unwrap();
        assert!(n.contains("2001:db8::5".parse().unwrap()));
        assert!(!n.contains("2001:db9::5".parse().unwrap()));
        assert!(!n.contains("10.0.0.1".parse().unwrap()));
        let all = IpNet::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
    }
}
