//! `ThrottleLayer` in axum (through `oneshot`) and in a tonic server on a
//! real socket.

mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use bytes::Bytes;
use common::{ALICE_HAS_NONE, T, amount, builder, get_as, hello, quota, store};
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use throttle_layer::store::Fallback;
use throttle_layer::{MissingUser, SlotStore, ThrottleLayer, Usage, UserKey};
use throttle_proto::v1;
use tower::ServiceExt;

/// A call to `/pkg.Svc/Call` by alice with `content_type`: a gRPC call when
/// `method` is POST.
fn call_as_alice(method: Method, content_type: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri("/pkg.Svc/Call")
        .header("x-user", "alice")
        .header("content-type", content_type)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn allowed_requests_pass_and_are_counted() {
    let (clock, store) = store();
    let app = hello().layer(builder(&store).build().unwrap());
    for _ in 0..3 {
        let res = app.clone().oneshot(get_as("alice", "/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "hello");
    }
    clock.set(T + 1_000);
    let r = store.collect(100);
    assert_eq!(amount(&r.consumption, "alice", "requests"), 3);
}

#[tokio::test]
async fn refused_http_request_gets_429_and_headers() {
    let (_, store) = store();
    quota(
        &store,
        r#"{"front": {"100": {"alice": {"requests": 0.0}, "bob": {"requests": 2.0}}}}"#,
    );
    let app = hello().layer(builder(&store).build().unwrap());
    let res = app.clone().oneshot(get_as("alice", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = res.headers();
    assert_eq!(h["retry-after"], "1", "750 ms to the next slot, rounded up");
    assert_eq!(h["ratelimit-policy"], r#""requests";q=0;w=1"#);
    assert_eq!(h["ratelimit"], r#""requests";r=0;t=1"#);
    assert_eq!(h["x-ratelimit-limit"], "0");
    assert_eq!(h["x-ratelimit-remaining"], "0");
    assert_eq!(h["x-ratelimit-reset"], "1");
    // bob: 2 allowed... 0, 1, 2 consumed are not above 2; the fourth is refused.
    for _ in 0..3 {
        assert_eq!(
            app.clone()
                .oneshot(get_as("bob", "/"))
                .await
                .unwrap()
                .status(),
            StatusCode::OK
        );
    }
    let res = app.clone().oneshot(get_as("bob", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["x-ratelimit-limit"], "2");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        body,
        "Too Many Requests: requests of service front exhausted\n"
    );
}

/// A refusal reuses the last one's headers only when its figures are the
/// same: users with other limits, other resources, a gRPC request after an
/// HTTP one, and the next slot each get their own.
#[tokio::test]
async fn each_refusal_carries_its_own_figures() {
    let (clock, store) = store();
    let q = |slot: i64| {
        format!(
            r#"{{"front": {{"{slot}": {{"alice": {{"requests": 0.0}}, "bob": {{"requests": 12.0}},
                "carol": {{"requests": 100.0, "database_read": 0.0}}}}}}}}"#
        )
    };
    quota(&store, &q(100));
    quota(&store, &q(101));
    let app = hello()
        .route("/pkg.Svc/Call", post(|| async { "never" }))
        .layer(builder(&store).cost("database_read", 1).build().unwrap());
    let refused = |user: &'static str| {
        let app = app.clone();
        let req = get_as(user, "/");
        async move {
            let res = app.oneshot(req).await.unwrap();
            assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{user}");
            let h = res.headers();
            let get = |name: &str| h.get(name).map(|v| v.to_str().unwrap().to_owned());
            assert_eq!(get("grpc-status"), None);
            (
                get("ratelimit-policy").unwrap(),
                get("ratelimit").unwrap(),
                get("x-ratelimit-limit").unwrap(),
                get("retry-after").unwrap(),
            )
        }
    };
    // The headers of a refusal on `resource` with quota `q`, nothing
    // remaining, reset in 1 s.
    let expected = |resource: &str, q: u32| {
        (
            format!(r#""{resource}";q={q};w=1"#),
            format!(r#""{resource}";r=0;t=1"#),
            q.to_string(),
            "1".to_owned(),
        )
    };
    let alice = expected("requests", 0);
    // Bob's 13 requests: 0..=12 consumed are not above 12.
    for _ in 0..13 {
        let res = app.clone().oneshot(get_as("bob", "/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    let bob = expected("requests", 12);
    let carol = expected("database_read", 0);
    for _ in 0..2 {
        assert_eq!(refused("alice").await, alice);
        assert_eq!(refused("alice").await, alice);
        assert_eq!(refused("bob").await, bob);
        assert_eq!(refused("carol").await, carol);
    }
    // gRPC after HTTP, for the same user: its own headers, and a pushback
    // read at each refusal.
    let grpc = |pushback: &'static str| {
        let app = app.clone();
        async move {
            let req = call_as_alice(Method::POST, "application/grpc");
            let res = app.oneshot(req).await.unwrap();
            let h = res.headers();
            assert_eq!(h["grpc-status"], "8");
            assert_eq!(h["grpc-retry-pushback-ms"], pushback);
            assert!(!h.contains_key("retry-after"));
            assert!(!h.contains_key("ratelimit"));
        }
    };
    grpc("750").await;
    clock.set(T + 100);
    grpc("650").await;
    assert_eq!(refused("alice").await, alice);
    // The next slot: bob starts again and is refused at his 14th request.
    clock.set(T + 1_000);
    for _ in 0..13 {
        let res = app.clone().oneshot(get_as("bob", "/")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(refused("bob").await, bob);
}

#[tokio::test]
async fn reject_status_and_headers_are_configurable() {
    let (_, store) = store();
    quota(&store, ALICE_HAS_NONE);
    let layer = builder(&store)
        .reject_status(StatusCode::SERVICE_UNAVAILABLE)
        .rate_limit_headers(false)
        .build()
        .unwrap();
    let app = hello().layer(layer);
    let res = app.oneshot(get_as("alice", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    assert!(!res.headers().contains_key("ratelimit-policy"));
    assert!(!res.headers().contains_key("x-ratelimit-limit"));
}

#[tokio::test]
async fn metered_and_plain_layers_refuse_alike() {
    let (_, store) = store();
    quota(&store, ALICE_HAS_NONE);
    let plain = hello().layer(builder(&store).build().unwrap());
    let metered = hello().layer(builder(&store).traffic_down().traffic_up().build().unwrap());
    let mut seen = Vec::new();
    for app in [plain, metered] {
        let res = app.oneshot(get_as("alice", "/")).await.unwrap();
        let status = res.status();
        let retry = res.headers()["retry-after"].clone();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        seen.push((status, retry, body));
    }
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0].0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        seen[0].2,
        "Too Many Requests: requests of service front exhausted\n"
    );
}

#[tokio::test]
async fn grpc_requests_are_refused_trailers_only() {
    let (_, store) = store();
    quota(&store, ALICE_HAS_NONE);
    let app = Router::new()
        .route("/pkg.Svc/Call", post(|| async { "never" }))
        .layer(builder(&store).build().unwrap());
    let req = call_as_alice(Method::POST, "application/grpc+proto");
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let h = res.headers();
    assert_eq!(h["grpc-status"], "8");
    assert_eq!(h["content-type"], "application/grpc");
    assert!(h["grpc-message"].to_str().unwrap().contains("requests"));
    assert_eq!(h["grpc-retry-pushback-ms"], "750");
    assert!(
        res.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .is_empty()
    );
    // Every gRPC call is a POST: anything else with a gRPC content type
    // gets the HTTP refusal.
    let req = call_as_alice(Method::GET, "application/grpc");
    let res = app.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!res.headers().contains_key("grpc-status"));
    assert_eq!(res.headers()["retry-after"], "1");
}

/// A body of `chunks` frames of `size` bytes.
fn chunked(chunks: usize, size: usize) -> Body {
    let frames = (0..chunks).map(move |_| Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; size])));
    Body::from_stream(futures_util::stream::iter(frames))
}

#[tokio::test]
async fn streaming_bodies_are_counted_exactly() {
    let (clock, store) = store();
    let upload = builder(&store).traffic_up().build().unwrap();
    let download = builder(&store).traffic_down().build().unwrap();
    let app = Router::new()
        .route(
            "/upload",
            post(|body: Body| async move {
                let n = body.collect().await.unwrap().to_bytes().len();
                n.to_string()
            })
            .layer(upload),
        )
        .route(
            "/download",
            get(|| async { chunked(10, 1000) }).layer(download),
        );
    let req = Request::post("/upload")
        .header("x-user", "alice")
        .body(chunked(7, 333))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "2331");
    let res = app
        .clone()
        .oneshot(get_as("alice", "/download"))
        .await
        .unwrap();
    assert_eq!(
        res.into_body().collect().await.unwrap().to_bytes().len(),
        10_000
    );

    // A client that goes away after two frames is charged for two frames.
    let mut body = app
        .clone()
        .oneshot(get_as("bob", "/download"))
        .await
        .unwrap()
        .into_body();
    for _ in 0..2 {
        body.frame().await.unwrap().unwrap();
    }
    drop(body);

    clock.set(T + 1_000);
    let r = store.collect(100);
    assert_eq!(amount(&r.consumption, "alice", "traffic_up"), 2331);
    assert_eq!(amount(&r.consumption, "alice", "traffic_down"), 10_000);
    assert_eq!(amount(&r.consumption, "alice", "requests"), 2);
    assert_eq!(amount(&r.consumption, "bob", "traffic_down"), 2_000);
}

#[tokio::test]
async fn handler_amounts_and_route_costs() {
    let (clock, store) = store();
    let db = builder(&store)
        .handler_usage()
        .resource("database_write")
        .build()
        .unwrap();
    let search = builder(&store).cost("database_read", 3).build().unwrap();
    let app = Router::new()
        .route(
            "/db",
            get(|usage: Usage| async move {
                assert_eq!(usage.user(), Some("alice"));
                assert!(usage.add("database_write", 4));
                "ok"
            })
            .layer(db),
        )
        .route("/search", get(|| async { "found" }))
        .route_layer(search);
    assert_eq!(
        app.clone()
            .oneshot(get_as("alice", "/db"))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        app.clone()
            .oneshot(get_as("alice", "/search"))
            .await
            .unwrap()
            .status(),
        200
    );
    // Handler amounts count for the slot in which they happen.
    clock.set(T + 1_000);
    assert_eq!(
        app.clone()
            .oneshot(get_as("alice", "/db"))
            .await
            .unwrap()
            .status(),
        200
    );
    let r = store.collect(100);
    // Registered when the layers were built: every user has room for all.
    assert_eq!(store.service("front").cells_per_user(), Some(3));
    assert_eq!(amount(&r.consumption, "alice", "database_write"), 4);
    assert_eq!(
        amount(&r.consumption, "alice", "database_read"),
        6,
        "route_layer covers /db too"
    );
    assert_eq!(
        amount(&r.consumption, "alice", "requests"),
        3,
        "/db is under both layers"
    );
    clock.set(T + 2_000);
    let r = store.collect(101);
    assert_eq!(amount(&r.consumption, "alice", "database_write"), 4);
}

#[tokio::test]
async fn usage_without_the_layer_is_a_clear_500() {
    let app = Router::new().route("/db", get(|_: Usage| async { "ok" }));
    let res = app.oneshot(get_as("alice", "/db")).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("handler_usage"));
}

#[tokio::test]
async fn shadow_mode_lets_everything_through() {
    let (clock, store) = store();
    quota(&store, ALICE_HAS_NONE);
    let app = hello().layer(builder(&store).shadow(true).build().unwrap());
    assert_eq!(
        app.oneshot(get_as("alice", "/")).await.unwrap().status(),
        StatusCode::OK
    );
    clock.set(T + 1_000);
    let r = store.collect(100);
    assert_eq!(amount(&r.consumption, "alice", "requests"), 1);
    assert_eq!(amount(&r.rejection, "alice", "requests"), 0);
}

#[tokio::test]
async fn requests_without_user_are_skipped_or_anonymous() {
    let (clock, store) = store();
    quota(
        &store,
        r#"{"front": {"100": {"anonymous": {"requests": 0.0}}}}"#,
    );
    let skip = hello().layer(builder(&store).build().unwrap());
    let anon = hello().layer(
        builder(&store)
            .missing_user(MissingUser::As("anonymous".into()))
            .build()
            .unwrap(),
    );
    // No header, a blank one, and one that is not visible ASCII: no user.
    let values: [Option<&[u8]>; 3] = [None, Some(b" \t "), Some(b"\xffalice")];
    for value in values {
        let req = || {
            let mut r = Request::get("/");
            if let Some(v) = value {
                r = r.header("x-user", v);
            }
            r.body(Body::empty()).unwrap()
        };
        assert_eq!(
            skip.clone().oneshot(req()).await.unwrap().status(),
            StatusCode::OK,
            "{value:?}"
        );
        assert_eq!(
            anon.clone().oneshot(req()).await.unwrap().status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{value:?}"
        );
    }
    // A padded name is the name.
    assert_eq!(
        skip.oneshot(get_as(" bob\t", "/")).await.unwrap().status(),
        StatusCode::OK
    );
    clock.set(T + 1_000);
    let r = store.collect(100);
    assert_eq!(amount(&r.rejection, "anonymous", "requests"), 3);
    assert_eq!(amount(&r.consumption, "bob", "requests"), 1);
    assert_eq!(r.consumption["front"].users.len(), 1, "only bob counted");
}

#[tokio::test]
async fn fallback_is_chosen_per_layer() {
    let (_, store) = store();
    let open = hello().layer(builder(&store).build().unwrap());
    let closed = hello().layer(builder(&store).fallback(Fallback::Deny).build().unwrap());
    assert_eq!(
        open.oneshot(get_as("alice", "/")).await.unwrap().status(),
        StatusCode::OK
    );
    let res = closed.oneshot(get_as("alice", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().contains_key("retry-after"));
    assert!(
        !res.headers().contains_key("ratelimit-policy"),
        "no quota to describe"
    );
}

#[tokio::test]
async fn builder_errors() {
    let (_, store) = store();
    assert!(matches!(
        ThrottleLayer::builder(&store, "front").build(),
        Err(throttle_layer::layer::LayerError::NoUserKey)
    ));
    assert!(builder(&store).cost("", 1).build().is_err());
}

#[tokio::test]
async fn method_router_layer_and_peer_ip() {
    let (clock, store) = store();
    let layer = ThrottleLayer::builder(&store, "front")
        .user(UserKey::peer_ip())
        .build()
        .unwrap();
    let app = Router::new().route("/", get(|| async { "hello" }).layer(layer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        .unwrap();
    });
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    clock.set(T + 1_000);
    let r = store.collect(100);
    assert_eq!(amount(&r.consumption, "127.0.0.1", "requests"), 1);
    server.abort();
}

mod grpc {
    use super::*;
    use std::pin::Pin;
    use throttle_proto::v1::central_client::CentralClient;
    use throttle_proto::v1::central_server::{Central, CentralServer};
    use throttle_proto::v1::{central_message, node_message};
    use tokio_stream::Stream;
    use tonic::{Request as GrpcRequest, Response, Status, Streaming};

    /// A tonic service to put the layer in front of: answers Hello with Welcome.
    struct Greeter;

    #[tonic::async_trait]
    impl Central for Greeter {
        type ExchangeStream =
            Pin<Box<dyn Stream<Item = Result<v1::CentralMessage, Status>> + Send>>;

        async fn exchange(
            &self,
            request: GrpcRequest<Streaming<v1::NodeMessage>>,
        ) -> Result<Response<Self::ExchangeStream>, Status> {
            // A tonic handler finds the layer's Usage in the extensions.
            if let Some(usage) = request.extensions().get::<Usage>() {
                usage.add("database_read", 2);
            }
            let mut inbound = request.into_inner();
            let out = async_stream(move |tx| async move {
                while let Ok(Some(m)) = inbound.message().await {
                    if let Some(node_message::Kind::Hello(_)) = m.kind {
                        let welcome = central_message::Kind::Welcome(v1::Welcome {
                            slot_ms: 1000,
                            epoch: 0,
                            accepts: Vec::new(),
                            incarnation: 0,
                        });
                        let _ = tx
                            .send(Ok(v1::CentralMessage {
                                kind: Some(welcome),
                            }))
                            .await;
                    }
                }
            });
            Ok(Response::new(out))
        }
    }

    fn async_stream<F, Fut>(
        f: F,
    ) -> Pin<Box<dyn Stream<Item = Result<v1::CentralMessage, Status>> + Send>>
    where
        F: FnOnce(tokio::sync::mpsc::Sender<Result<v1::CentralMessage, Status>>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(f(tx));
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
    }

    async fn call(
        client: &mut CentralClient<tonic::transport::Channel>,
        user: &str,
    ) -> Result<(), Status> {
        let hello = v1::NodeMessage {
            kind: Some(node_message::Kind::Hello(v1::Hello::default())),
        };
        let mut req = GrpcRequest::new(tokio_stream::iter(vec![hello]));
        req.metadata_mut().insert("x-user", user.parse().unwrap());
        let mut stream = client.exchange(req).await?.into_inner();
        let first = stream.message().await?;
        assert!(matches!(
            first.and_then(|m| m.kind),
            Some(central_message::Kind::Welcome(_))
        ));
        Ok(())
    }

    #[tokio::test]
    async fn tonic_server_with_the_layer() {
        let (clock, store) = store();
        quota(&store, ALICE_HAS_NONE);
        let layer = ThrottleLayer::builder(&store, "front")
            .user(UserKey::header("x-user"))
            .handler_usage()
            .build()
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .layer(layer)
                .add_service(CentralServer::new(Greeter))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let mut client = CentralClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        call(&mut client, "bob").await.unwrap();
        let err = call(&mut client, "alice").await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("requests"), "{}", err.message());
        let pushback: u64 = err
            .metadata()
            .get("grpc-retry-pushback-ms")
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(pushback <= 1000, "{pushback}");
        clock.set(T + 1_000);
        let r = store.collect(100);
        assert_eq!(amount(&r.consumption, "bob", "requests"), 1);
        assert_eq!(
            amount(&r.consumption, "bob", "database_read"),
            2,
            "handler amount via tonic"
        );
        assert_eq!(amount(&r.rejection, "alice", "requests"), 1);
        assert_eq!(
            amount(&r.consumption, "alice", "database_read"),
            0,
            "refused: handler never ran"
        );
        server.abort();
        let _ = Duration::ZERO;
    }
}

/// A user key longer than a name may be would never be limited (the
/// central could not account for it): refused before the store is asked.
#[tokio::test]
async fn an_overlong_user_key_is_refused_not_unlimited() {
    let (clock, store) = store();
    let app = hello().layer(builder(&store).build().unwrap());
    let longest = "u".repeat(throttle_proto::MAX_NAME_LEN);
    let res = app.clone().oneshot(get_as(&longest, "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let too_long = "u".repeat(throttle_proto::MAX_NAME_LEN + 1);
    let res = app.clone().oneshot(get_as(&too_long, "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    let grpc = Request::builder()
        .method(Method::POST)
        .uri("/pkg.Svc/Call")
        .header("x-user", &too_long)
        .header("content-type", "application/grpc")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(grpc).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "3");
    clock.advance(Duration::from_secs(1));
    let report = store.collect(100);
    assert_eq!(amount(&report.consumption, &longest, "requests"), 1);
    assert!(
        report.consumption["front"]
            .users
            .keys()
            .all(|u| u.len() <= throttle_proto::MAX_NAME_LEN),
        "the long key was never counted"
    );
}

/// A user the central has blocked is refused whatever their quota: 403 (or
/// the status chosen) saying blocked, gRPC `PERMISSION_DENIED`; shadow mode
/// lets them through.
#[tokio::test]
async fn a_blocked_user_is_refused_whatever_their_quota() {
    let (_clock, store) = store();
    let app = hello().layer(builder(&store).build().unwrap());
    let res = app.clone().oneshot(get_as("mallory", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    store.set_blocked("front", vec!["mallory".into()]);
    let res = app.clone().oneshot(get_as("mallory", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"Blocked: user blocked from service front\n");
    let res = app.clone().oneshot(get_as("alice", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "nobody else");
    let grpc = Request::builder()
        .method(Method::POST)
        .uri("/pkg.Svc/Call")
        .header("x-user", "mallory")
        .header("content-type", "application/grpc")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(grpc).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "7");
    let teapot = hello().layer(
        builder(&store)
            .blocked_status(StatusCode::IM_A_TEAPOT)
            .build()
            .unwrap(),
    );
    let res = teapot.oneshot(get_as("mallory", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::IM_A_TEAPOT);
    let shadow = hello().layer(builder(&store).shadow(true).build().unwrap());
    let res = shadow.oneshot(get_as("mallory", "/")).await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "shadow mode lets them through"
    );
    store.set_blocked("front", Vec::new());
    let res = app.oneshot(get_as("mallory", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "unblocked");
}

/// With the central's limits known, a refusal's `RateLimit-Policy` and
/// `X-RateLimit-Limit` carry the user's configured limit and its window
/// (the shortest, where a rule sets several), not this node's share of
/// the slot; a byte resource says so (`qu`); a gRPC refusal names the
/// limit and its period.
#[tokio::test]
async fn refusals_carry_the_configured_limit_and_its_window() {
    let (_, store) = store();
    let app = hello()
        .route("/pkg.Svc/Call", post(|| async { "never" }))
        .layer(builder(&store).traffic_down().build().unwrap());
    quota(
        &store,
        r#"{"front": {"100": {"alice": {"requests": 0.0}, "bob": {"requests": 5.0, "traffic_down": 0.0}}}}"#,
    );
    let allowance = |resource: &str, window_seconds, amount| v1::Allowance {
        resource: resource.into(),
        window_seconds,
        amount,
    };
    store.set_limits(v1::Limits {
        service: "front".into(),
        every: vec![
            allowance("requests", 60, 6000.0),
            allowance("requests", 1, 100.0),
        ],
        users: vec![v1::UserLimits {
            user: "bob".into(),
            allowances: vec![allowance("traffic_down", 1, 52_428_800.0)],
            default_quota: Default::default(),
        }],
        ..v1::Limits::default()
    });
    let res = app.clone().oneshot(get_as("alice", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = res.headers();
    assert_eq!(h["ratelimit-policy"], r#""requests";q=100;w=1"#);
    assert_eq!(h["x-ratelimit-limit"], "100");
    let res = app.clone().oneshot(get_as("bob", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        res.headers()["ratelimit-policy"],
        r#""traffic_down";q=52428800;w=1;qu="content-bytes""#
    );
    let res = app
        .clone()
        .oneshot(call_as_alice(Method::POST, "application/grpc"))
        .await
        .unwrap();
    let message = res.headers()["grpc-message"].to_str().unwrap().to_owned();
    assert_eq!(
        message,
        "rate limit exceeded: requests (100 per second) of service front exhausted"
    );
}

/// A user the central says is bound by their per-minute quota is refused
/// naming it.
#[tokio::test]
async fn a_refusal_names_the_period_that_binds() {
    let (_, store) = store();
    let app = hello()
        .route("/pkg.Svc/Call", post(|| async { "never" }))
        .layer(builder(&store).build().unwrap());
    quota(&store, ALICE_HAS_NONE);
    requests_limited(&store, &[(1, 100.0), (60, 3000.0)]);
    store.set_bound(v1::Bound {
        service: "front".into(),
        keys: vec![v1::BoundKey {
            user: "alice".into(),
            resource: "requests".into(),
            window_seconds: 60,
        }],
        budgets: Vec::new(),
    });
    let res = app.clone().oneshot(get_as("alice", "/")).await.unwrap();
    assert_eq!(
        res.headers()["ratelimit-policy"],
        r#""requests";q=3000;w=60"#
    );
    let res = app
        .oneshot(call_as_alice(Method::POST, "application/grpc"))
        .await
        .unwrap();
    assert_eq!(
        res.headers()["grpc-message"].to_str().unwrap(),
        "rate limit exceeded: requests (3000 per minute) of service front exhausted"
    );
}

/// Every user of `front` limited in requests to each (window in seconds,
/// amount) of `periods`, as the central tells it.
fn requests_limited(store: &SlotStore, periods: &[(u32, f64)]) {
    let every = (periods.iter())
        .map(|&(window_seconds, amount)| v1::Allowance {
            resource: "requests".into(),
            window_seconds,
            amount,
        })
        .collect();
    store.set_limits(v1::Limits {
        service: "front".into(),
        every,
        ..v1::Limits::default()
    });
}

/// The central's budget of alice's hour: `remaining` for two nodes.
fn alice_has_left_of_the_hour(store: &SlotStore, remaining: f64) {
    let budget = v1::Budget {
        user: "alice".into(),
        resource: "requests".into(),
        window_seconds: 3600,
        remaining,
        nodes: 2,
        refill: 0.0,
    };
    store.set_bound(v1::Bound {
        service: "front".into(),
        keys: Vec::new(),
        budgets: vec![budget],
    });
}

/// While the node has no quota for the slot (the central away), a user
/// with little left of their hour is admitted at most this node's share
/// of it, spent by every admission since the central said so, and refused
/// naming the hour after; on quota, the budget is spent but never refuses.
#[tokio::test]
async fn without_quotas_a_node_keeps_to_the_budget_it_was_told() {
    let (clock, store) = store();
    let app = hello().layer(builder(&store).build().unwrap());
    quota(
        &store,
        r#"{"front": {"100": {"alice": {"requests": 50.0}}}}"#,
    );
    requests_limited(&store, &[(1, 50.0), (3600, 600.0)]);
    alice_has_left_of_the_hour(&store, 21.0);
    let admitted = |n: usize| {
        let app = app.clone();
        async move {
            let mut ok = 0;
            let mut last = None;
            for _ in 0..n {
                let res = app.clone().oneshot(get_as("alice", "/")).await.unwrap();
                if res.status() == StatusCode::OK {
                    ok += 1;
                } else {
                    last = Some(res.headers()["ratelimit-policy"].clone());
                }
            }
            (ok, last)
        }
    };
    // On quota: 14 of its 50, all admitted; 10 (21 over two nodes) is
    // not a bound while the quota holds.
    assert_eq!(admitted(14).await, (14, None));
    // Two slots on, no quota came: the last one would admit 50, the
    // budget is spent.
    clock.set(T + 2_000);
    let (ok, policy) = admitted(20).await;
    assert_eq!(ok, 0, "spent on quota already");
    assert_eq!(policy.unwrap(), r#""requests";q=600;w=3600"#);
    // A fresh budget: 7 of it.
    alice_has_left_of_the_hour(&store, 14.0);
    assert_eq!(admitted(20).await.0, 7);
    // Others keep to the last quota alone.
    let res = app.clone().oneshot(get_as("bob", "/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

/// A handler takes an amount before the work it pays for: allowed while
/// the user's quota of that resource is not yet exceeded (as a request
/// costing it would be), refused with a 429 naming it after, with one
/// rejection counted and nothing charged; a resource the quota does not
/// limit is always taken.
#[tokio::test]
async fn a_handler_takes_an_amount_before_its_work() {
    let (clock, store) = store();
    quota(
        &store,
        r#"{"front": {"100": {"alice": {"requests": 100.0, "database_read": 6.0}}}}"#,
    );
    let layer = builder(&store).handler_usage().build().unwrap();
    let app = Router::new()
        .route(
            "/search",
            get(|usage: Usage| async move {
                usage.try_take("cache_read", 1_000)?;
                // Three pages of 5 rows: 0 and 5 are not above 6; 10 is.
                for _ in 0..3 {
                    usage.try_take("database_read", 5)?;
                }
                Ok::<_, throttle_layer::Exhausted>("found")
            }),
        )
        .layer(layer);
    let res = app
        .clone()
        .oneshot(get_as("alice", "/search"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        body,
        "Too Many Requests: database_read exhausted: 10 used of a quota of 6 this slot\n"
    );
    // The layer refuses the next request itself: database_read is spent.
    let res = app
        .clone()
        .oneshot(get_as("alice", "/search"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    clock.set(T + 1_000);
    let r = store.collect(100);
    assert_eq!(amount(&r.consumption, "alice", "database_read"), 10);
    assert_eq!(amount(&r.rejection, "alice", "database_read"), 2);
    assert_eq!(amount(&r.consumption, "alice", "cache_read"), 1_000);
}
