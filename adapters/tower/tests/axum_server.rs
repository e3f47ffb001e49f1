//! The example server's router over real HTTP on loopback: served by
//! `axum::serve` with connect info, asked by hyper-util's client. The
//! admitted burst, the `429`s, their fields, and admission again after
//! `Retry-After` are asserted on the wire.

#[path = "../examples/axum_server/app.rs"]
mod app;

mod common;

use common::Answer;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{StatusCode, Uri};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Serves the example's router on a free loopback port.
async fn start() -> SocketAddr {
    let router = app::router(app::limiter()).unwrap();
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// A client whose connections leave from `source`.
fn client(source: Ipv4Addr) -> Client<HttpConnector, Empty<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(IpAddr::V4(source)));
    Client::builder(TokioExecutor::new()).build(connector)
}

async fn get(client: &Client<HttpConnector, Empty<Bytes>>, addr: SocketAddr, path: &str) -> Answer {
    let uri: Uri = format!("http://{addr}{path}").parse().unwrap();
    let response = client.get(uri).await.unwrap();
    Answer::read(response).await
}

#[tokio::test]
async fn the_example_admits_its_burst_then_answers_429_over_loopback() {
    assert_eq!(
        (app::BURST, app::PER_SECOND),
        (5, 1),
        "the assertions below assume these"
    );
    let addr = start().await;
    let alice = client(Ipv4Addr::LOCALHOST);

    // The burst, well within the second a token takes to come back.
    for i in 0..app::BURST {
        let a = get(&alice, addr, "/hello/alice").await;
        assert_eq!(a.status, StatusCode::OK, "request {i}");
        assert_eq!(a.text, "Hello, alice!\n");
        assert_eq!(a.header("ratelimit-policy"), Some(r#""default";q=5;w=5"#));
        let expected = format!(r#""default";r={};t={}"#, app::BURST - 1 - i, i + 1);
        assert_eq!(a.header("ratelimit"), Some(expected.as_str()));
        assert_eq!(a.header("retry-after"), None);
    }

    // Then refused, on every route: the quota is the client's.
    for path in ["/hello/alice", "/"] {
        let refused = get(&alice, addr, path).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{path}");
        assert_eq!(refused.header("retry-after"), Some("1"));
        assert_eq!(refused.header("ratelimit"), Some(r#""default";r=0;t=1"#));
        assert_eq!(
            refused.header("ratelimit-policy"),
            Some(r#""default";q=5;w=5"#)
        );
        assert!(refused.text.contains("retry after 1 s"), "{}", refused.text);
    }

    // Another client address has a quota of its own (Linux routes all of
    // 127.0.0.0/8 to loopback).
    if cfg!(target_os = "linux") {
        let bob = client(Ipv4Addr::new(127, 0, 0, 2));
        let a = get(&bob, addr, "/hello/bob").await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.header("ratelimit"), Some(r#""default";r=4;t=1"#));
    }

    // After Retry-After, one token is back: exactly one more is admitted.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(get(&alice, addr, "/").await.status);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

#[tokio::test]
async fn the_example_limiter_holds_its_clients() {
    let limiter = app::limiter();
    let held = limiter.keys_held().unwrap();
    assert!(held.capacity >= app::CLIENTS, "{held:?}");
    assert_eq!(held.held, 0);
}
