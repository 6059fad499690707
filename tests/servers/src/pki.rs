//! Certificates made at run time for the tests that speak TLS: a CA, a
//! server certificate for `localhost` and 127.0.0.1, and a client
//! certificate, all PEM.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// A CA and the certificates it signed.
#[derive(Debug)]
pub struct Pki {
    /// The CA's certificate.
    pub ca: String,
    /// The server's certificate and key, for `localhost` and 127.0.0.1.
    pub server: (String, String),
    /// A client's certificate and key, naming `client_names`.
    pub client: (String, String),
}

impl Pki {
    /// A new CA, its server certificate, and a client certificate whose
    /// subject alternative names are `client_names` (DNS names).
    pub fn new(client_names: &[&str]) -> Self {
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Names of their own: a leaf whose subject is its issuer's looks
        // self-signed to BoringSSL (Envoy).
        ca_params.distinguished_name = rcgen::DistinguishedName::new();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "throttle test CA");
        let ca = ca_params.self_signed(&ca_key).expect("the CA").pem();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf = |names: Vec<String>| {
            let key = KeyPair::generate().expect("a key");
            let mut cert = CertificateParams::new(names.clone()).expect("parameters");
            cert.distinguished_name = rcgen::DistinguishedName::new();
            let name = names.first().map_or("client", String::as_str);
            cert.distinguished_name.push(DnType::CommonName, name);
            let cert = cert.signed_by(&key, &issuer).expect("a certificate");
            (cert.pem(), key.serialize_pem())
        };
        let server = leaf(vec!["localhost".into(), "127.0.0.1".into()]);
        let client = leaf(client_names.iter().map(|n| (*n).to_owned()).collect());
        Self { ca, server, client }
    }
}
