//! Closed-loop HTTP load for the benchmark programs: keep-alive
//! connections sending back to back, every latency kept.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// What one run of [`load`] measured.
#[derive(Debug, Default, Clone)]
pub struct Run {
    /// Requests answered 2xx.
    pub ok: u64,
    /// Requests answered 429.
    pub refused: u64,
    /// Requests that failed, or were answered otherwise.
    pub errors: u64,
    /// How long the run lasted.
    pub seconds: f64,
    /// Every request's latency, sorted.
    pub latencies_ns: Vec<u64>,
    /// CPU time of the server's thread over the run, when measured.
    pub server_cpu: Option<Duration>,
}

impl Run {
    /// Requests answered per second.
    pub fn rps(&self) -> f64 {
        (self.ok + self.refused) as f64 / self.seconds
    }

    /// The server thread's CPU time per request, in microseconds: unlike
    /// req/s, not moved by time the server spent descheduled.
    pub fn cpu_us_per_request(&self) -> Option<f64> {
        self.per_request_us(self.server_cpu)
    }

    /// `cpu`, time some process spent over the run, per request answered,
    /// in microseconds.
    pub fn per_request_us(&self, cpu: Option<Duration>) -> Option<f64> {
        let requests = self.ok + self.refused;
        (requests > 0).then_some(())?;
        Some(cpu?.as_secs_f64() * 1e6 / requests as f64)
    }

    /// The latency below which a share `p` of the requests fell, in
    /// microseconds.
    pub fn percentile(&self, p: f64) -> f64 {
        if self.latencies_ns.is_empty() {
            return 0.0;
        }
        let i = ((self.latencies_ns.len() - 1) as f64 * p) as usize;
        self.latencies_ns[i] as f64 / 1000.0
    }
}

/// `connections` keep-alive connections sending back to back for `seconds`;
/// each request is for `user(connection, i)`.
pub async fn load(
    addr: SocketAddr,
    connections: usize,
    seconds: f64,
    user: fn(usize, u64) -> String,
) -> Run {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for c in 0..connections {
        tasks.push(tokio::spawn(async move {
            let mut run = Run::default();
            let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
                run.errors += 1;
                return run;
            };
            let _ = stream.set_nodelay(true);
            let Ok((mut sender, conn)) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
            else {
                run.errors += 1;
                return run;
            };
            tokio::spawn(conn);
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                let req = http::Request::get("/")
                    .header("host", "bench")
                    .header("x-user", user(c, i))
                    .body(Empty::<Bytes>::new());
                let Ok(req) = req else { break };
                let started = Instant::now();
                if sender.ready().await.is_err() {
                    run.errors += 1;
                    break;
                }
                match sender.send_request(req).await {
                    Ok(res) => {
                        let status = res.status();
                        let _ = res.into_body().collect().await;
                        run.latencies_ns.push(started.elapsed().as_nanos() as u64);
                        if status.is_success() {
                            run.ok += 1;
                        } else if status == http::StatusCode::TOO_MANY_REQUESTS {
                            run.refused += 1;
                        } else {
                            run.errors += 1;
                        }
                    }
                    Err(_) => {
                        run.errors += 1;
                        break;
                    }
                }
            }
            run
        }));
    }
    let mut total = Run {
        seconds,
        ..Run::default()
    };
    for t in tasks {
        if let Ok(r) = t.await {
            total.ok += r.ok;
            total.refused += r.refused;
            total.errors += r.errors;
            total.latencies_ns.extend(r.latencies_ns);
        }
    }
    total.latencies_ns.sort_unstable();
    total
}

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
