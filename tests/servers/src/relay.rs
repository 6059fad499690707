//! [`Relay`]: a TCP relay between a node and a central that a test cuts
//! and mends, as a network partition would cut the node off while it
//! keeps serving.

use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Relays every connection made to [`Relay::addr`] to a target address,
/// byte for byte, until [`Relay::cut`]: then its connections are closed
/// and new ones closed as they come, until [`Relay::mend`].
#[derive(Debug)]
pub struct Relay {
    /// Where nodes connect.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    cut: AtomicBool,
    stopped: AtomicBool,
    /// Both ends of every open connection, to close on a cut.
    open: Mutex<Vec<TcpStream>>,
}

impl Relay {
    /// A relay on a free 127.0.0.1 port to `target`.
    ///
    /// # Panics
    ///
    /// If no port can be bound.
    pub fn to(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a relay port");
        let addr = listener.local_addr().expect("the relay's address");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let shared = Arc::new(Shared::default());
        let accepting = shared.clone();
        std::thread::spawn(move || accept(&listener, target, &accepting));
        Self { addr, shared }
    }

    /// `http://` and its address, for a node's `--central`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Closes every relayed connection, and each new one as it comes.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        let open = std::mem::take(&mut *self.shared.lock());
        for s in open {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Relays new connections again.
    pub fn mend(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.cut();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<TcpStream>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Accepts until the relay is dropped.
fn accept(listener: &TcpListener, target: SocketAddr, shared: &Arc<Shared>) {
    while !shared.stopped.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) if !shared.cut.load(Ordering::SeqCst) => {
                relay(client, target, shared);
            }
            // Cut: closed as it came.
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Relays `client` to `target` on two threads, one a direction.
fn relay(client: TcpStream, target: SocketAddr, shared: &Arc<Shared>) {
    let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) else {
        return;
    };
    let _ = client.set_nonblocking(false);
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    {
        let mut open = shared.lock();
        for s in [&client, &server] {
            if let Ok(s) = s.try_clone() {
                open.push(s);
            }
        }
    }
    std::thread::spawn(move || copy(client, server));
    std::thread::spawn(move || copy(s2, c2));
}

/// Copies `from` to `to` until either ends, then closes both.
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// An echo server on a free port: each connection gets back what it sends.
    fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        let addr = listener.local_addr().expect("its address");
        std::thread::spawn(move || {
            for mut s in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut r = s.try_clone().expect("a clone");
                    let _ = std::io::copy(&mut r, &mut s);
                });
            }
        });
        addr
    }

    fn round_trip(addr: SocketAddr) -> std::io::Result<Vec<u8>> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"ping")?;
        let mut got = [0; 4];
        s.read_exact(&mut got)?;
        Ok(got.to_vec())
    }

    #[test]
    fn a_relay_carries_bytes_until_cut_and_again_once_mended() {
        let relay = Relay::to(echo());
        assert_eq!(round_trip(relay.addr).expect("relayed"), b"ping");
        let mut open = TcpStream::connect(relay.addr).expect("connected");
        open.write_all(b"ab").expect("written");
        let mut two = [0; 2];
        open.read_exact(&mut two).expect("echoed");
        relay.cut();
        let mut rest = Vec::new();
        let read = open.read_to_end(&mut rest);
        assert!(
            read.is_err() || rest.is_empty(),
            "an open connection is closed"
        );
        assert!(
            round_trip(relay.addr).is_err(),
            "a new one is closed as it comes"
        );
        relay.mend();
        assert_eq!(round_trip(relay.addr).expect("relayed again"), b"ping");
    }
}
