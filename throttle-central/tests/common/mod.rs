#![allow(dead_code)] // each test binary uses its own part of it
//! What the central's tests share: one HTTP/1.1 request to its monitor
//! and admin API, over a connection of its own.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An HTTP answer: its status, its head (status line and headers) and its
/// body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) head: String,
    pub(crate) body: String,
}

/// `method path` with a JSON `body`, and `token` as the bearer token if
/// given.
pub(crate) async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> Answer {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: t\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    Answer {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

/// `GET path`, no token.
pub(crate) async fn get(addr: SocketAddr, path: &str) -> Answer {
    request(addr, "GET", path, "", None).await
}
