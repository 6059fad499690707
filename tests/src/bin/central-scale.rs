//! The central node under many nodes: real tonic streams on loopback, each
//! node reporting `--users` users x 4 resources every slot.
//!
//! Run with: `cargo run --release -p throttle-tests --bin central-scale -- --nodes 1000 --users 100`
//!
//! Prints the report -> answer round trip (p50, p99), reports answered,
//! quota pushes that arrived after their slot had begun (an assigner that
//! cannot keep up), the central node's CPU time, and the process's CPU time
//! and resident memory. The central node's streams run on a runtime of one
//! worker thread (`--central-threads N` gives them N), its ledger on a
//! thread of its own, and the simulated nodes on a runtime of one worker
//! thread (`--node-threads N`: N); the CPU time of each is measured on its
//! threads.
//!
//! Answers slower than `--slow-ms` (5) are counted by the slot they were
//! in and by the node's report point: a slow slot (an assign running
//! late) and slow points (a queue at some moment of every slot) look
//! different there.
//!
//! Nodes accept packed quotas ([`v1::PackedQuota`]) and answers that
//! refer to the push before them ([`v1::QuotaRef`]), and write packed
//! reports ([`v1::PackedUsage`]), as the reporter's do with this central;
//! `--refs 0` has them take whole answers, `--classic 1` use the legacy system
//! forms both ways.
//!
//! Every node reports at boundary + 50 ms, as the legacy nodes did;
//! `--spread-ms S` spreads them over S ms after that, each at the point
//! the reporter gives its node id (`throttle_layer::reporter::report_point`).
//!
//! Figures are of the `--seconds` (10) after a `--warm-up` (2 s, at least).
//! The central node keeps `nr_slot` (60) slots of history, and until it is
//! full each slot's assigns take fresh memory: `--warm-up 65` measures the
//! steady state of a long-running central node.
//!
//! A simulated node does on the wire what a real one does, and no more on
//! its shared thread: it encodes its next report before the slot boundary
//! (a real node encodes its own, on its own machine, in microseconds; the
//! simulated ones encode their unchanging usage once and put each slot's
//! number in front of it) and
//! reads only the two numbers of each message it needs (the slot a quota
//! answers, the first slot of a push) instead of decoding 1,000 nodes'
//! quotas one after another. Otherwise the round trip of the last node of
//! a burst would mostly be the other 999 nodes' encoding and decoding on
//! the one thread they share, not the central node.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use parking_lot::Mutex;
use prost::Message as _;
use prost::encoding::{DecodeContext, WireType, decode_varint, skip_field};
use throttle_central::limits::StaticLimits;
use throttle_central::{Central, LEDGER_THREAD};
use throttle_clock::{Clock, CoarseClock, SlotLength};
use throttle_layer::reporter::report_point;
use throttle_proto::v1;
use throttle_proto::wire::Inbound;
use throttle_proto::wire::fields::{
    CENTRAL_MESSAGE_QUOTA, ENTRY_KEY, MAP_FIELD as SLOTS, PACKED_SLOT, QUOTA_PACKED,
    QUOTA_REPORT_SLOT, QUOTA_SERVICES,
};
use throttle_tests::fleet;

fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (100 Hz on Linux).
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| stat_cpu_seconds(&s))
        .unwrap_or(0.0)
}

/// User + system seconds from a `/proc/.../stat` line.
fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0)
}

/// CPU seconds of this process's threads named `name`.
fn threads_cpu_seconds(name: &str) -> f64 {
    throttle_tests::threads_cpu_time(name).map_or(0.0, |t| t.as_secs_f64())
}

/// What a simulated node reads of a `CentralMessage`: the slot a quota
/// answers (`report_slot`) or, for a push, the first slot it holds. The
/// rest of the message is skipped, not decoded.
#[derive(Debug, Clone, Default, PartialEq)]
struct Seen {
    quota: bool,
    report_slot: Option<i64>,
    first_slot: Option<i64>,
    /// The quota's bytes.
    len: usize,
}

/// Calls `f(tag, wire type, field)` for each field of the message in `buf`,
/// with a length-delimited field's bytes as its own buffer.
fn fields(
    mut buf: Bytes,
    mut f: impl FnMut(u32, WireType, &mut Bytes) -> Result<(), prost::DecodeError>,
) -> Result<(), prost::DecodeError> {
    while buf.has_remaining() {
        let (tag, wire_type) = prost::encoding::decode_key(&mut buf)?;
        if wire_type == WireType::LengthDelimited {
            // Shares `buf`'s memory; an error if it runs past the message.
            let mut field = Bytes::new();
            prost::encoding::bytes::merge(
                wire_type,
                &mut field,
                &mut buf,
                DecodeContext::default(),
            )?;
            f(tag, wire_type, &mut field)?;
        } else {
            f(tag, wire_type, &mut buf)?;
        }
    }
    Ok(())
}

impl Seen {
    fn saw_slot(&mut self, slot: i64) {
        self.first_slot = Some(self.first_slot.map_or(slot, |s| s.min(slot)));
    }

    fn read_quota(&mut self, quota: Bytes) -> Result<(), prost::DecodeError> {
        self.quota = true;
        self.len = quota.len();
        fields(quota, |tag, wt, buf| match tag {
            QUOTA_REPORT_SLOT if wt == WireType::Varint => {
                self.report_slot = Some(decode_varint(buf)? as i64);
                Ok(())
            }
            // A service entry: its value's `slots` entries' keys.
            QUOTA_SERVICES => fields(buf.clone(), |tag, _, entry| {
                if tag != 2 {
                    return Ok(());
                }
                fields(entry.clone(), |tag, _, slot_entry| {
                    if tag != SLOTS {
                        return Ok(());
                    }
                    fields(slot_entry.clone(), |tag, wt, key| {
                        if tag == ENTRY_KEY && wt == WireType::Varint {
                            self.saw_slot(decode_varint(key)? as i64);
                        } else if wt != WireType::LengthDelimited {
                            skip_field(wt, tag, key, DecodeContext::default())?;
                        }
                        Ok(())
                    })
                })
            }),
            QUOTA_PACKED => fields(buf.clone(), |tag, wt, field| {
                if tag == PACKED_SLOT && wt == WireType::Varint {
                    self.saw_slot(decode_varint(field)? as i64);
                } else if wt != WireType::LengthDelimited {
                    skip_field(wt, tag, field, DecodeContext::default())?;
                }
                Ok(())
            }),
            _ if wt == WireType::LengthDelimited => Ok(()),
            _ => skip_field(wt, tag, buf, DecodeContext::default()),
        })
    }
}

impl prost::Message for Seen {
    fn encode_raw(&self, _: &mut impl bytes::BufMut) {}

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        if tag == CENTRAL_MESSAGE_QUOTA {
            let mut quota = Bytes::new();
            prost::encoding::bytes::merge(wire_type, &mut quota, buf, ctx)?;
            self.read_quota(quota)
        } else {
            skip_field(wire_type, tag, buf, ctx)
        }
    }

    fn encoded_len(&self) -> usize {
        0
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

/// Opens the `Exchange` stream, sending [`Inbound`] (reports as encoded
/// bytes) and reading [`Seen`].
async fn exchange(
    url: String,
    outbound: tokio::sync::mpsc::Receiver<Inbound>,
) -> anyhow::Result<tonic::Streaming<Seen>> {
    let channel = tonic::transport::Endpoint::from_shared(url)?
        .connect()
        .await?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await?;
    let path = http::uri::PathAndQuery::from_static("/throttle.v1.Central/Exchange");
    let request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outbound));
    let codec = tonic_prost::ProstCodec::<Inbound, Seen>::default();
    Ok(grpc.streaming(request, path, codec).await?.into_inner())
}

/// Node `n`'s report for `slot`: the same usage every slot.
fn report(n: u64, users: u64, total_users: u64, slot: i64) -> v1::Report {
    v1::Report {
        node_id: String::new(),
        slot_number: slot,
        consumption: [("front".to_string(), fleet::usage(n, users, total_users))].into(),
        rejection: [("front".to_string(), v1::Usage::default())].into(),
        packed: Vec::new(),
        answered: false,
    }
}

/// Node `n`'s report without its slot number, encoded as its maps or, as
/// the reporter writes it for this central, with its usage packed.
fn report_body(n: u64, users: u64, total_users: u64, packed: bool) -> Vec<u8> {
    let report = report(n, users, total_users, 0);
    if !packed {
        return report.encode_to_vec();
    }
    // Maps only: packing does not fail.
    throttle_proto::wire::packed_report(&report).map_or_else(|_| Vec::new(), |b| b.to_vec())
}

/// A report for `slot` from the encoding of the same report for slot 0
/// (which has no field 2): prost writes fields in number order, so the slot
/// number (field 2) goes before the usage (fields 3 and 4).
fn with_slot(body: &[u8], slot: i64) -> Vec<u8> {
    let mut report = Vec::with_capacity(body.len() + 11);
    prost::encoding::int64::encode(2, &slot, &mut report);
    report.extend_from_slice(body);
    report
}

/// Reports the central has read, and of those answered ahead of filing
/// (an answer rendered before the report came), over its streams.
async fn answered_ahead(central: &throttle_central::RunningCentral) -> (u64, u64) {
    let conns = central
        .monitor(throttle_central::Subject::Connections, Default::default())
        .await
        .unwrap_or_default();
    let sum = |field: &str| {
        conns["connections"]
            .as_array()
            .map_or(0, |c| c.iter().filter_map(|c| c[field].as_u64()).sum())
    };
    (sum("reports"), sum("answered_ahead"))
}

fn main() -> anyhow::Result<()> {
    let nodes = throttle_tests::arg("--nodes", 1000.0) as u64;
    let users = throttle_tests::arg("--users", 100.0) as u64;
    let seconds = throttle_tests::arg("--seconds", 10.0) as u64;
    let total_users = fleet::total_users(nodes, users);
    let central_threads = throttle_tests::arg("--central-threads", 1.0) as usize;
    let node_threads = throttle_tests::arg("--node-threads", 1.0) as usize;
    let warm_up = throttle_tests::arg("--warm-up", 2.0).max(2.0) as u64;
    // Reports go at boundary + 50 ms, or with `--spread-ms` each node at its
    // point of that window after it, where the reporter would place it.
    let spread = Duration::from_secs_f64(throttle_tests::arg("--spread-ms", 0.0).max(0.0) / 1000.0);
    // Round trips over this are listed by slot and report point.
    let slow_ms = throttle_tests::arg("--slow-ms", 5.0) as u64;
    // Nodes accept packed quotas and refs and write packed reports, as the
    // reporter's do, unless `--classic 1` (or `--refs 0`).
    let packed = throttle_tests::arg("--classic", 0.0) == 0.0;
    let refs = packed && throttle_tests::arg("--refs", 1.0) != 0.0;
    let mut accepts: Vec<String> = Vec::new();
    if packed {
        accepts.push(throttle_proto::PACKED_QUOTAS.into());
    }
    if refs {
        accepts.push(throttle_proto::QUOTA_REFS.into());
    }
    // The nodes send `with_slot` of a report encoded once; it must be what
    // prost writes for the whole report.
    let probe = report(0, users, total_users, 1_800_000_000);
    anyhow::ensure!(
        with_slot(
            &report(0, users, total_users, 0).encode_to_vec(),
            probe.slot_number
        ) == probe.encode_to_vec(),
        "a report with its slot put in front is not the report prost encodes"
    );
    // And packed, it must be the same report once unpacked.
    let mut unpacked = v1::Report::decode(
        &with_slot(&report_body(0, users, total_users, true), probe.slot_number)[..],
    )?;
    unpacked.unpack()?;
    anyhow::ensure!(unpacked == probe, "the packed report is not the report");
    let central_rt = throttle_tests::workers("central", central_threads)?;
    let rt = throttle_tests::workers("nodes", node_threads)?;
    let on_central = central_rt.handle().clone();
    rt.block_on(async {
        let limits = fleet::limits(total_users);
        let rss_before = throttle_tests::rss_mib();
        // Bound and spawned on the central's runtime: its streams run there.
        let central = on_central
            .spawn(async {
                let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                Central::builder()
                    .limits(Arc::new(StaticLimits::new(limits)))
                    .spawn(grpc, None)
            })
            .await??;
        let url = format!("http://{}", central.grpc_addr());
        let slot = SlotLength::SECOND;
        // Per report answered: round trip (µs), slot, report point (ms).
        let rtts: Arc<Mutex<Vec<(u64, i64, u64)>>> = Arc::default();
        let sent = Arc::new(AtomicU64::new(0));
        let answered = Arc::new(AtomicU64::new(0));
        let late_pushes = Arc::new(AtomicU64::new(0));
        let pushes = Arc::new(AtomicU64::new(0));
        let quota_bytes = Arc::new(AtomicU64::new(0));
        // Set once the warm-up is over: only reports sent from then on are
        // counted, with their answers and round trips, so an answer to a
        // report sent before the window never counts in it.
        let measuring = Arc::new(AtomicBool::new(false));
        let end = Instant::now() + Duration::from_secs(seconds + warm_up);
        let mut tasks = Vec::new();
        let started = Instant::now();
        for n in 0..nodes {
            let (url, rtts, sent, answered, late, pushes) =
                (url.clone(), rtts.clone(), sent.clone(), answered.clone(), late_pushes.clone(), pushes.clone());
            let measuring = measuring.clone();
            let (accepts, quota_bytes) = (accepts.clone(), quota_bytes.clone());
            let delay = report_point(&fleet::node_id(n), Duration::from_millis(50), spread);
            tasks.push(tokio::spawn(async move {
                let body = report_body(n, users, total_users, packed);
                let (tx, rx) = tokio::sync::mpsc::channel(8);
                let hello = v1::Hello {
                    node_id: fleet::node_id(n),
                    slot_ms: slot.as_ms(),
                    services: vec!["front".into()],
                    version: "scale".into(),
                    accepts: accepts.clone(),
                    resumes: false,
                    report_every_ms: 0,
                };
                let _ = tx.send(Inbound::Hello(hello)).await;
                let Ok(mut inbound) = exchange(url, rx).await else { return };
                // The report awaiting its answer: slot, sent at, counted.
                let in_flight: Arc<Mutex<Option<(i64, Instant, bool)>>> = Arc::default();
                let reader = {
                    let in_flight = in_flight.clone();
                    let measuring = measuring.clone();
                    tokio::spawn(async move {
                        while let Ok(Some(m)) = inbound.message().await {
                            if !m.quota {
                                continue;
                            }
                            if measuring.load(Ordering::Relaxed) {
                                quota_bytes.fetch_add(m.len as u64, Ordering::Relaxed);
                            }
                            let now_slot = slot.slot_at(CoarseClock.now_ms());
                            match m.report_slot {
                                Some(s) => {
                                    if let Some((want, at, true)) = *in_flight.lock()
                                        && want == s
                                    {
                                        let rtt = at.elapsed().as_micros() as u64;
                                        rtts.lock().push((rtt, s, delay.as_millis() as u64));
                                        answered.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                                None => {
                                    pushes.fetch_add(1, Ordering::Relaxed);
                                    if m.first_slot.is_some_and(|s| s < now_slot) {
                                        late.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                            }
                        }
                    })
                };
                while Instant::now() < end {
                    let now = CoarseClock.now_ms();
                    // The next slot's report, encoded before its time comes.
                    let s = slot.slot_at(now) + 1;
                    let report = Inbound::Report(with_slot(&body, s).into());
                    tokio::time::sleep(slot.until_next(now) + delay).await;
                    if slot.slot_at(CoarseClock.now_ms()) != s {
                        continue;
                    }
                    let counted = measuring.load(Ordering::Relaxed);
                    *in_flight.lock() = Some((s, Instant::now(), counted));
                    if counted {
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                    if tx.send(report).await.is_err() {
                        break;
                    }
                }
                // The last report's answer is still on its way.
                tokio::time::sleep(Duration::from_millis(500)).await;
                reader.abort();
            }));
        }
        // Measure from the first full slot after everyone has connected,
        // or later (`--warm-up`).
        tokio::time::sleep(Duration::from_secs(warm_up)).await;
        let (cpu0, central0, ledger0, nodes0, t0) = (
            cpu_seconds(),
            threads_cpu_seconds("central"),
            threads_cpu_seconds(LEDGER_THREAD),
            threads_cpu_seconds("nodes"),
            Instant::now(),
        );
        measuring.store(true, Ordering::Relaxed);
        let ahead0 = answered_ahead(&central).await;
        let (late0, pushes0) = (
            late_pushes.load(Ordering::Relaxed),
            pushes.load(Ordering::Relaxed),
        );
        // While the streams are open (they close as the nodes finish).
        tokio::time::sleep_until(end.into()).await;
        let ahead = answered_ahead(&central).await;
        for t in tasks {
            let _ = t.await;
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu0;
        let central_cpu = threads_cpu_seconds("central") - central0;
        let ledger_cpu = threads_cpu_seconds(LEDGER_THREAD) - ledger0;
        let nodes_cpu = threads_cpu_seconds("nodes") - nodes0;
        let answers = rtts.lock().clone();
        let mut r: Vec<u64> = answers.iter().map(|a| a.0).collect();
        r.sort_unstable();
        let pct = |p: f64| r.get(((r.len().max(1) - 1) as f64 * p) as usize).copied().unwrap_or(0) as f64 / 1000.0;
        // Where the slow round trips were: by slot (from the first one
        // measured) and by report point, in 50 ms bins.
        let slow: Vec<_> = answers.iter().filter(|a| a.0 > slow_ms * 1000).collect();
        let first_slot = answers.iter().map(|a| a.1).min().unwrap_or(0);
        let count_by = |key: &dyn Fn(&(u64, i64, u64)) -> i64| {
            let mut by = std::collections::BTreeMap::<i64, usize>::new();
            for a in &slow {
                *by.entry(key(a)).or_default() += 1;
            }
            by.iter().map(|(k, n)| format!("{k}: {n}")).collect::<Vec<_>>().join(", ")
        };
        println!(
            "{nodes} nodes x {users} users x 4 resources per report ({} entries per slot), {total_users} limited users, {seconds} s",
            nodes * users * 4
        );
        println!("| what | value |\n|---|---:|");
        println!("| report -> answer p50 | {:.2} ms |", pct(0.5));
        println!("| report -> answer p99 | {:.2} ms |", pct(0.99));
        println!(
            "| answers over {slow_ms} ms (`--slow-ms`) | {} of {}; by slot measured: {}; by report point (ms): {} |",
            slow.len(),
            answers.len(),
            count_by(&|a| a.1 - first_slot),
            count_by(&|a| (a.2 / 50 * 50) as i64),
        );
        println!(
            "| reports answered ahead of filing (the central's count) | {} of {} |",
            ahead.1.saturating_sub(ahead0.1),
            ahead.0.saturating_sub(ahead0.0)
        );
        println!(
            "| reports answered / sent | {} / {} |",
            answered.load(Ordering::Relaxed),
            sent.load(Ordering::Relaxed)
        );
        println!(
            "| quota pushes arriving after their slot began | {} of {} |",
            late_pushes.load(Ordering::Relaxed) - late0,
            pushes.load(Ordering::Relaxed) - pushes0
        );
        println!(
            "| quotas received ({}) | {:.1} MB/s |",
            match (packed, refs) {
                (true, true) => "packed, answers by refs",
                (true, false) => "packed, answers whole (`--refs 0`)",
                _ => "classic, `--classic 1`",
            },
            quota_bytes.load(Ordering::Relaxed) as f64 / 1e6 / wall
        );
        println!(
            "| a report ({}) | {} bytes |",
            if packed { "packed" } else { "classic" },
            report_body(0, users, total_users, packed).len()
        );
        println!("| ingest | {:.0} entries/s |", (nodes * users * 4) as f64 / slot.as_duration().as_secs_f64());
        println!("| central node CPU: streams (its worker threads) | {:.0}% of one core |", 100.0 * central_cpu / wall);
        println!("| central node CPU: ledger (its own thread) | {:.0}% of one core |", 100.0 * ledger_cpu / wall);
        println!("| simulated nodes CPU (their worker threads) | {:.0}% of one core |", 100.0 * nodes_cpu / wall);
        println!("| process CPU (all threads) | {:.0}% of one core |", 100.0 * cpu / wall);
        println!("| resident memory, whole process | {:.0} MiB (+{:.0} MiB) |", throttle_tests::rss_mib(), throttle_tests::rss_mib() - rss_before);
        println!("| setup | {:.1} s |", started.elapsed().as_secs_f64() - wall);
        central.shutdown().await;
        Ok::<(), anyhow::Error>(())
    })
}
