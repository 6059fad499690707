//! The wire of a legacy node (lua-resty-throttle in nginx), written for the
//! tests from its description, not from the central's code: a TCP
//! connection, TLS 1.2 without checking the certificate (SNI: the IP), an
//! HTTP/1.1 upgrade to a presigned URL, masked unfragmented text frames
//! out, one text frame in, and a bare TCP close.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{DigitallySignedStruct, SignatureScheme};

/// A byte stream, plain or TLS.
trait Wire: Read + Write + Send {}
impl<T: Read + Write + Send> Wire for T {}

/// One connection of a legacy node to a central.
pub struct LegacyClient {
    wire: Box<dyn Wire>,
    tcp: TcpStream,
}

impl std::fmt::Debug for LegacyClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LegacyClient").finish_non_exhaustive()
    }
}

/// A presigned URL's query, as the legacy node computes it (AWS
/// Signature V4 query authentication, S3 style): signed for `GET path`
/// with the `host` header `host`, at `at`, valid 60 s.
pub fn presigned_query(
    access_key: &str,
    secret_key: &str,
    host: &str,
    path: &str,
    at: SystemTime,
) -> String {
    let (date, day) = amz_date(at);
    let scope = format!("{day}/us-east-1/s3/aws4_request");
    let credential = format!("{access_key}/{scope}");
    let mut query = [
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256".to_owned()),
        ("X-Amz-Credential", credential),
        ("X-Amz-Date", date.clone()),
        ("X-Amz-Expires", "60".to_owned()),
        ("X-Amz-SignedHeaders", "host".to_owned()),
    ]
    .map(|(k, v)| format!("{}={}", uri_encode(k), uri_encode(&v)));
    query.sort();
    let query = query.join("&");
    let canonical = format!("GET\n{path}\n{query}\nhost:{host}\n\nhost\nUNSIGNED-PAYLOAD");
    let hashed = hex(&Sha256::digest(canonical.as_bytes()));
    let to_sign = format!("AWS4-HMAC-SHA256\n{date}\n{scope}\n{hashed}");
    let mut key = hmac(format!("AWS4{secret_key}").as_bytes(), day.as_bytes());
    for part in ["us-east-1", "s3", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex(&hmac(&key, to_sign.as_bytes()));
    format!("{query}&X-Amz-Signature={signature}")
}

impl LegacyClient {
    /// Opens `ws(s)://addr/throttle?query` as the legacy node does; `Err`
    /// holds the HTTP status of a refused upgrade (0: no HTTP answer).
    ///
    /// # Panics
    ///
    /// When the TLS client cannot be set up (a test's mistake).
    pub fn connect(addr: SocketAddr, tls: bool, query: &str) -> Result<Self, u16> {
        let tcp =
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).map_err(|_| 0u16)?;
        tcp.set_nodelay(true).map_err(|_| 0u16)?;
        let wire: Box<dyn Wire> = match tls {
            false => Box::new(tcp.try_clone().map_err(|_| 0u16)?),
            true => {
                let config = tls12_without_verification();
                let name = ServerName::from(addr.ip());
                let conn = rustls::ClientConnection::new(config, name).expect("TLS client");
                let tcp = tcp.try_clone().map_err(|_| 0u16)?;
                Box::new(rustls::StreamOwned::new(conn, tcp))
            }
        };
        let mut client = Self { wire, tcp };
        client
            .tcp
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|_| 0u16)?;
        let request = format!(
            "GET /throttle?{query} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: {}\r\nSec-WebSocket-Version: 13\r\n\r\n",
            websocket_key()
        );
        client
            .wire
            .write_all(request.as_bytes())
            .map_err(|_| 0u16)?;
        let head = client.read_head().map_err(|_| 0u16)?;
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if status == 101 {
            Ok(client)
        } else {
            Err(status)
        }
    }

    /// Sends `text` as one masked, unfragmented text frame.
    ///
    /// # Errors
    ///
    /// When the connection is gone.
    pub fn send_text(&mut self, text: &str) -> io::Result<()> {
        let payload = text.as_bytes();
        let mut frame = vec![0x81u8];
        match payload.len() {
            n @ 0..=125 => frame.push(0x80 | n as u8),
            n @ 126..=65_535 => {
                frame.push(0x80 | 126);
                frame.extend((n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend((n as u64).to_be_bytes());
            }
        }
        let mask: [u8; 4] = rand::random();
        frame.extend(mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.wire.write_all(&frame)?;
        self.wire.flush()
    }

    /// The next text frame, if one comes within `within`; `None` on a
    /// timeout, another frame or a closed connection.
    pub fn recv_text(&mut self, within: Duration) -> Option<String> {
        let deadline = Instant::now() + within;
        let mut head = [0u8; 2];
        self.read_exact_by(&mut head, deadline)?;
        let len = match head[1] & 0x7f {
            126 => {
                let mut n = [0u8; 2];
                self.read_exact_by(&mut n, deadline)?;
                u64::from(u16::from_be_bytes(n))
            }
            127 => {
                let mut n = [0u8; 8];
                self.read_exact_by(&mut n, deadline)?;
                u64::from_be_bytes(n)
            }
            n => u64::from(n),
        };
        let masked = head[1] & 0x80 != 0;
        if head[0] != 0x81 || masked || len > 1 << 24 {
            return None;
        }
        let mut payload = vec![0u8; usize::try_from(len).ok()?];
        self.read_exact_by(&mut payload, deadline)?;
        String::from_utf8(payload).ok()
    }

    /// Ends the connection with a bare TCP close, as the legacy node does.
    pub fn close(self) {
        let _ = self.tcp.shutdown(std::net::Shutdown::Both);
    }

    fn read_exact_by(&mut self, buf: &mut [u8], deadline: Instant) -> Option<()> {
        let mut filled = 0;
        while filled < buf.len() {
            let left = deadline.checked_duration_since(Instant::now())?;
            self.tcp
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .ok()?;
            match self.wire.read(&mut buf[filled..]) {
                Ok(0) => return None,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        Some(())
    }

    /// The response head, up to its blank line.
    fn read_head(&mut self) -> io::Result<String> {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && head.len() < 16_384 {
            if self.wire.read(&mut byte)? == 0 {
                break;
            }
            head.push(byte[0]);
        }
        Ok(String::from_utf8_lossy(&head).into_owned())
    }
}

/// TLS 1.2 only, any certificate accepted: what the legacy node's
/// `ngx.socket.tcp` with `ssl_verify = false` offers.
fn tls12_without_verification() -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(AnyCertificate(provider.clone()));
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12])
        .expect("TLS 1.2 is built in")
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Arc::new(config)
}

/// Accepts any certificate; checks only that the handshake is signed.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `Sec-WebSocket-Key`: 16 random bytes in base64.
fn websocket_key() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: [u8; 16] = rand::random();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, b| n << 8 | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out + "=="
}

/// RFC 3986 unreserved characters kept, every other byte `%XX`.
fn uri_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `yyyymmddThhmmssZ` and `yyyymmdd` of `at`, UTC.
fn amz_date(at: SystemTime) -> (String, String) {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(i64::try_from(days).unwrap_or(0));
    let day = format!("{y:04}{m:02}{d:02}");
    let time = format!("{:02}{:02}{:02}", rest / 3600, rest / 60 % 60, rest % 60);
    (format!("{day}T{time}Z"), day)
}

/// The proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_keys_are_written_as_the_node_writes_them() {
        let at = UNIX_EPOCH + Duration::from_secs(1_369_353_600);
        assert_eq!(amz_date(at), ("20130524T000000Z".into(), "20130524".into()));
        let leap = UNIX_EPOCH + Duration::from_secs(1_709_251_199);
        assert_eq!(amz_date(leap).0, "20240229T235959Z");
        assert_eq!(websocket_key().len(), 24);
        assert_eq!(uri_encode("a/b c"), "a%2Fb%20c");
    }
}
