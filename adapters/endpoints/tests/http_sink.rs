//! The HTTP sink against a receiver on loopback that records each request
//! and answers as scripted: what a request carries, what each answer
//! means, waits the receiver asks for, and connections that fail, close
//! or never answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use guard_core::retry::{RetryPolicy, WithoutRandom};
use guard_endpoints::sink::http::HttpSink;
use guard_endpoints::sink::{LeaseGate, MessageSink, Outgoing, SinkError, deliver};
use guard_testkit::{Answer, HttpReceiver, free_port};

fn message<'a>(id: &'a str, payload: &'a [u8]) -> Outgoing<'a> {
    Outgoing {
        id,
        origin: "orders",
        fence: Some(42),
        payload,
    }
}

#[test]
fn each_message_is_one_post_with_its_key_fence_and_origin_on_one_connection() {
    let receiver = HttpReceiver::start().expect("receiver");
    let sink = HttpSink::new(&receiver.url("/ingest?v=1"))
        .unwrap()
        .with_content_type("application/json")
        .unwrap();
    smol::block_on(async {
        for i in 0..100 {
            let id = format!("orders:1700000000000-{i}");
            let payload = format!("{{\"n\":{i}}}");
            sink.send(&message(&id, payload.as_bytes()))
                .await
                .expect("delivered");
        }
    });
    let requests = receiver.requests();
    assert_eq!(requests.len(), 100);
    for (i, r) in requests.iter().enumerate() {
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/ingest?v=1")
        );
        assert_eq!(
            r.header("idempotency-key"),
            Some(format!("orders:1700000000000-{i}").as_str())
        );
        assert_eq!(r.header("guard-fence"), Some("42"));
        assert_eq!(r.header("guard-origin"), Some("orders"));
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.body, format!("{{\"n\":{i}}}").into_bytes(), "in order");
    }
    assert_eq!(receiver.connections(), 1, "one kept-alive connection");
    // No fence, no header.
    smol::block_on(sink.send(&Outgoing {
        fence: None,
        ..message("k", b"x")
    }))
    .unwrap();
    assert_eq!(receiver.requests()[100].header("guard-fence"), None);
}

#[test]
fn a_refusal_is_permanent_with_the_status_and_body_and_is_not_retried() {
    let receiver = HttpReceiver::start().expect("receiver");
    receiver.script([Answer::status(400).with_body("field `temp` is not a number")]);
    let sink = HttpSink::new(&receiver.url("/")).unwrap();
    let policy = RetryPolicy::fixed_delay(3, Duration::from_millis(10));
    let delivery = smol::block_on(deliver(
        &sink,
        &message("a", b"{}"),
        &policy,
        &mut WithoutRandom,
        None,
    ));
    assert_eq!(delivery.attempts, 1);
    assert_eq!(
        delivery.outcome,
        Err(SinkError::Permanent {
            reason: "HTTP 400: field `temp` is not a number".into()
        })
    );
    assert_eq!(receiver.requests().len(), 1);
}

#[test]
fn a_429_and_a_503_are_retried_after_the_wait_the_receiver_asks_for() {
    let receiver = HttpReceiver::start().expect("receiver");
    receiver.script([
        Answer::status(429).with_header("Retry-After", "1"),
        Answer::status(503).with_header("Retry-After", "1"),
        Answer::status(200),
    ]);
    let sink = HttpSink::new(&receiver.url("/")).unwrap();
    // The policy alone would retry after 10 ms.
    let policy = RetryPolicy::fixed_delay(5, Duration::from_millis(10));
    let started = Instant::now();
    let delivery = smol::block_on(deliver(
        &sink,
        &message("b", b"{}"),
        &policy,
        &mut WithoutRandom,
        None,
    ));
    let took = started.elapsed();
    assert_eq!(delivery.outcome, Ok(()));
    assert_eq!(delivery.attempts, 3);
    assert!(took >= Duration::from_secs(2), "waited {took:?}, asked 2 s");
    let requests = receiver.requests();
    assert!(
        requests
            .iter()
            .all(|r| r.header("idempotency-key") == Some("b")),
        "the same key on every attempt"
    );
}

#[test]
fn server_errors_are_transient_and_retried_until_the_policy_is_spent() {
    let receiver = HttpReceiver::start().expect("receiver");
    receiver.script((0..3).map(|_| Answer::status(500).with_body("db down")));
    let sink = HttpSink::new(&receiver.url("/")).unwrap();
    let policy = RetryPolicy::fixed_delay(2, Duration::from_millis(10));
    let delivery = smol::block_on(deliver(
        &sink,
        &message("c", b"{}"),
        &policy,
        &mut WithoutRandom,
        None,
    ));
    assert_eq!(delivery.attempts, 3, "1 + 2 retries");
    assert_eq!(
        delivery.outcome,
        Err(SinkError::Transient {
            reason: "HTTP 500: db down".into(),
            retry_after: None
        })
    );
}

/// A lease a test ends by hand.
struct TestLease(AtomicBool);

impl LeaseGate for TestLease {
    fn fence(&self) -> u64 {
        42
    }
    fn is_valid(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[test]
fn no_attempt_is_made_once_the_lease_the_message_was_read_under_has_ended() {
    let receiver = HttpReceiver::start().expect("receiver");
    receiver.script((0..10).map(|_| Answer::status(503)));
    let sink = HttpSink::new(&receiver.url("/")).unwrap();
    let lease = TestLease(AtomicBool::new(true));
    let policy = RetryPolicy::fixed_delay(9, Duration::from_millis(300));
    let delivery = smol::block_on(async {
        let ends = async {
            // During the first wait between attempts.
            smol::Timer::after(Duration::from_millis(100)).await;
            lease.0.store(false, Ordering::SeqCst);
            std::future::pending::<()>().await;
        };
        futures_lite::future::or(
            deliver(
                &sink,
                &message("d", b"{}"),
                &policy,
                &mut WithoutRandom,
                Some(&lease),
            ),
            async {
                ends.await;
                unreachable!()
            },
        )
        .await
    });
    assert_eq!(delivery.attempts, 1, "nothing sent after the lease ended");
    assert_eq!(delivery.outcome, Err(SinkError::LeaseEnded { fence: 42 }));
    assert_eq!(receiver.requests().len(), 1);
    // Ended before the first attempt: nothing at all.
    let delivery = smol::block_on(deliver(
        &sink,
        &message("e", b"{}"),
        &policy,
        &mut WithoutRandom,
        Some(&lease),
    ));
    assert_eq!(delivery.attempts, 0);
    assert_eq!(receiver.requests().len(), 1);
}

#[test]
fn a_fenced_receiver_refusing_a_stale_fence_is_told_apart() {
    let receiver = HttpReceiver::start().expect("receiver");
    receiver.script([Answer::status(409).with_header("Guard-Highest-Fence", "57")]);
    let sink = HttpSink::new(&receiver.url("/")).unwrap();
    let outcome = smol::block_on(sink.send(&message("d", b"{}")));
    assert_eq!(
        outcome,
        Err(SinkError::StaleFence {
            fence: 42,
            highest: 57
        })
    );
}

#[test]
fn a_receiver_that_never_answers_times_out_and_the_next_request_gets_a_new_connection() {
    let receiver = HttpReceiver::start().expect("receiver");
    receiver.script([Answer::Silent]);
    let sink = HttpSink::new(&receiver.url("/"))
        .unwrap()
        .with_timeout(Duration::from_millis(500))
        .unwrap();
    let started = Instant::now();
    let outcome = smol::block_on(sink.send(&message("e", b"{}")));
    let took = started.elapsed();
    assert!(
        matches!(&outcome, Err(SinkError::Transient { reason, .. }) if reason.contains("no answer within 500ms")),
        "{outcome:?}"
    );
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(5),
        "{took:?}"
    );
    smol::block_on(sink.send(&message("e", b"{}"))).expect("delivered on a new connection");
    assert_eq!(receiver.connections(), 2);
}

#[test]
fn a_connection_the_receiver_closed_while_idle_is_replaced_before_the_next_request() {
    let receiver = HttpReceiver::start().expect("receiver");
    receiver.script([Answer::status(200).then_close(), Answer::status(200)]);
    let sink = HttpSink::new(&receiver.url("/")).unwrap();
    smol::block_on(async {
        sink.send(&message("f1", b"{}")).await.expect("first");
        // The close reaches the client while it is idle.
        async_io::Timer::after(Duration::from_millis(200)).await;
        sink.send(&message("f2", b"{}"))
            .await
            .expect("no failure on the closed connection");
    });
    assert_eq!(receiver.connections(), 2);
    assert_eq!(receiver.requests().len(), 2, "each sent once");
}

#[test]
fn an_unreachable_receiver_is_transient_and_named() {
    let port = free_port().unwrap();
    let sink = HttpSink::new(&format!("http://127.0.0.1:{port}/")).unwrap();
    let outcome = smol::block_on(sink.send(&message("g", b"{}")));
    assert!(
        matches!(&outcome, Err(SinkError::Transient { reason, .. }) if reason.contains(&format!("connect to 127.0.0.1:{port}"))),
        "{outcome:?}"
    );
}

#[test]
fn a_port_out_of_range_is_refused_not_taken_for_the_default() {
    for url in [
        "http://127.0.0.1:99999/ingest",
        "http://127.0.0.1:65536/",
        "http://127.0.0.1:0/",
        "http://127.0.0.1:abc/",
    ] {
        assert!(HttpSink::new(url).is_err(), "{url} accepted");
    }
    assert!(HttpSink::new("http://127.0.0.1:65535/").is_ok());
    assert!(HttpSink::new("http://127.0.0.1/").is_ok());
}

#[test]
fn requests_in_flight_go_out_together_each_on_a_connection_of_its_own_never_more() {
    let ids: Vec<String> = (0..40).map(|i| format!("orders:{i}")).collect();
    let messages: Vec<Outgoing<'_>> = ids.iter().map(|id| message(id, b"{}")).collect();
    for (in_flight, connections) in [(None, 1), (Some(4), 4)] {
        let receiver = HttpReceiver::start().expect("receiver");
        let mut sink = HttpSink::new(&receiver.url("/")).unwrap();
        if let Some(n) = in_flight {
            sink = sink.with_in_flight(n).unwrap();
        }
        // All forty sent at once: the first `in_flight` connect together,
        // the rest wait for one of them and reuse it.
        let outcomes = smol::block_on(futures_util::future::join_all(
            messages.iter().map(|m| sink.send(m)),
        ));
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
        assert_eq!(receiver.requests().len(), 40);
        assert_eq!(
            receiver.connections(),
            connections,
            "in flight {in_flight:?}: a connection per request in flight, no more"
        );
    }
    for refused in [0, guard_endpoints::sink::http::MAX_IN_FLIGHT + 1] {
        let error = HttpSink::new("http://127.0.0.1:1/")
            .unwrap()
            .with_in_flight(refused)
            .unwrap_err();
        assert_eq!(error.parameter, guard_endpoints::Parameter::InFlight);
        assert!(error.to_string().contains("from 1 to 256"), "{error}");
    }
}

#[test]
fn headers_given_go_with_every_request_and_the_sink_s_own_are_refused() {
    let receiver = HttpReceiver::start().expect("receiver");
    let sink = HttpSink::new(&receiver.url("/"))
        .unwrap()
        .with_header("Authorization", "Bearer s3cret-token")
        .unwrap()
        .with_header("X-Tenant", "site-7")
        .unwrap();
    assert!(
        !format!("{sink:?}").contains("s3cret"),
        "Debug hides a header's value"
    );
    smol::block_on(async {
        for id in ["a", "b"] {
            sink.send(&message(id, b"{}")).await.expect("delivered");
        }
    });
    for r in receiver.requests() {
        assert_eq!(r.header("authorization"), Some("Bearer s3cret-token"));
        assert_eq!(r.header("x-tenant"), Some("site-7"));
        assert_eq!(r.header("guard-fence"), Some("42"), "the sink's own stay");
    }
    let base = || HttpSink::new("http://127.0.0.1:1/").unwrap();
    for name in [
        "Host",
        "content-type",
        "Content-Length",
        "Idempotency-Key",
        "Guard-Fence",
        "guard-anything",
        "bad name",
        "",
    ] {
        let error = base().with_header(name, "x").unwrap_err();
        assert_eq!(
            error.parameter,
            guard_endpoints::Parameter::Header,
            "{name}"
        );
    }
    let twice = base()
        .with_header("X-A", "1")
        .unwrap()
        .with_header("x-a", "2")
        .unwrap_err();
    assert!(twice.to_string().contains("once"), "{twice}");
    let error = base()
        .with_header("Authorization", "Bearer s3cret\n")
        .unwrap_err();
    assert!(!error.to_string().contains("s3cret"), "{error}");
}
