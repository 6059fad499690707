//! A proxy's identity from the client certificate it showed under mutual
//! TLS.

use throttle_proto::MAX_NAME_LEN;
use tonic::transport::server::TlsConnectInfo;
use x509_parser::extensions::GeneralName;

use crate::net::NodeConnInfo;

/// The identity the client certificate of `request`'s connection names:
/// its first URI subject alternative name (a SPIFFE id, as Istio issues),
/// else its first DNS name, else its subject's common name. `None` without
/// mutual TLS, or for a name that is no node id (empty, longer than
/// [`MAX_NAME_LEN`], or not visible ASCII).
pub(super) fn identity<T>(request: &tonic::Request<T>) -> Option<String> {
    let tls = request.extensions().get::<TlsConnectInfo<NodeConnInfo>>()?;
    let certs = tls.peer_certs()?;
    let leaf = certs.first()?;
    named(leaf.as_ref())
}

/// The node id the DER certificate `der` names (see [`identity`]).
fn named(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let alternatives = cert.subject_alternative_name().ok().flatten();
    let names = alternatives.map(|a| &a.value.general_names);
    let first =
        |want: fn(&GeneralName<'_>) -> Option<String>| names.and_then(|n| n.iter().find_map(want));
    let uri = first(|n| match n {
        GeneralName::URI(s) => Some((*s).to_owned()),
        _ => None,
    });
    let dns = || {
        first(|n| match n {
            GeneralName::DNSName(s) => Some((*s).to_owned()),
            _ => None,
        })
    };
    let common = || {
        let cn = cert.subject().iter_common_name().next()?;
        cn.as_str().ok().map(str::to_owned)
    };
    let id = uri.or_else(dns).or_else(common)?;
    let valid =
        !id.is_empty() && id.len() <= MAX_NAME_LEN && id.bytes().all(|b| b.is_ascii_graphic());
    if !valid {
        tracing::warn!("a proxy's client certificate names no usable node id");
    }
    valid.then_some(id)
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    use super::named;

    fn cert(sans: Vec<SanType>, cn: Option<&str>) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.subject_alt_names = sans;
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        let key = KeyPair::generate().expect("a key");
        params
            .self_signed(&key)
            .expect("a certificate")
            .der()
            .to_vec()
    }

    #[test]
    fn a_certificate_names_its_uri_then_its_dns_name_then_its_common_name() {
        let spiffe = "spiffe://cluster.local/ns/edge/sa/envoy";
        let uri = SanType::URI(spiffe.try_into().expect("an URI"));
        let dns = || SanType::DnsName("envoy-1.edge".try_into().expect("a name"));
        assert_eq!(
            named(&cert(vec![dns(), uri], Some("cn"))).as_deref(),
            Some(spiffe)
        );
        assert_eq!(
            named(&cert(vec![dns()], Some("cn"))).as_deref(),
            Some("envoy-1.edge")
        );
        assert_eq!(
            named(&cert(vec![], Some("envoy-2"))).as_deref(),
            Some("envoy-2")
        );
        assert_eq!(named(&cert(vec![], None)), None);
    }

    #[test]
    fn a_name_that_is_no_node_id_names_nobody() {
        assert_eq!(named(&cert(vec![], Some("envoy one"))), None);
        assert_eq!(named(&cert(vec![], Some(&"e".repeat(300)))), None);
        assert_eq!(named(b"not a certificate"), None);
    }
}
