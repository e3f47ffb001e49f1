//! `rediss://` (the `tls` feature) on every topology, with certificates
//! the test makes: the locker passes its contract and the limiters decide
//! over TLS on a standalone server, a cluster whose bus is TLS too, and a
//! sentinel set-up; a plain client is refused by a TLS-only port (so TLS
//! is really used), and so is a TLS client that does not trust the CA or,
//! where the server requires one, presents no certificate.

use std::time::Duration;

use guard_core::limit::{Rate, SlidingWindow, TokenBucket};
use guard_redis::{
    Clock, Parameter, RedisConnection, RedisGuardError, RedisLocker, RedisSlidingWindow, RedisTls,
    RedisTokenBucket, Topology,
};
use guard_testkit::{
    RedisCluster, RedisSentinel, RedisServer, SENTINEL_SERVICE, TestCerts, contract,
};

const TIMEOUT: Duration = Duration::from_secs(2);

fn trusting(certs: &TestCerts) -> RedisTls {
    RedisTls::new()
        .with_root_ca(certs.ca_pem())
        .expect("the test CA is a usable root")
}

fn connect(topology: Topology, tls: &RedisTls) -> RedisConnection {
    smol::block_on(RedisConnection::connect_with_tls(topology, TIMEOUT, tls)).expect("connect")
}

/// Acquire, renew, release and the rest of the Locker contract; Redis
/// expires keys on its own clock, so the suite waits in real time.
fn run_contract(conn: &RedisConnection, namespace: &str) {
    let locker = RedisLocker::new(conn.clone());
    smol::block_on(contract::run_all(
        &locker,
        namespace,
        10,
        smol::Timer::after,
    ));
}

/// A token bucket and a sliding window admit exactly their budget.
fn limiters_decide(conn: &RedisConnection, key: &str) {
    let bucket = RedisTokenBucket::new(
        conn.clone(),
        TokenBucket::new(3, Rate::per(1, Duration::from_secs(60))).unwrap(),
    )
    .unwrap();
    let allowed = (0..10)
        .filter(|_| {
            smol::block_on(bucket.check(key, Clock::Server))
                .expect("a decision over TLS")
                .is_allowed()
        })
        .count();
    assert_eq!(allowed, 3, "{key}: the token bucket admits its capacity");
    let window = RedisSlidingWindow::new(
        conn.clone(),
        SlidingWindow::<4>::new(Duration::from_secs(60), 2).unwrap(),
    )
    .unwrap();
    let allowed = (0..5)
        .filter(|_| {
            smol::block_on(window.check(key, Clock::Server))
                .expect("a decision over TLS")
                .is_allowed()
        })
        .count();
    assert_eq!(allowed, 2, "{key}: the sliding window admits its limit");
}

#[test]
fn standalone_over_tls_passes_the_locker_contract_and_limits() {
    let certs = TestCerts::generate().expect("certificates");
    let server = RedisServer::start_tls(&certs).expect("redis-server with TLS");
    assert!(server.url().starts_with("rediss://"), "{}", server.url());
    let conn = connect(
        Topology::Standalone { url: server.url() },
        &trusting(&certs),
    );
    run_contract(&conn, "guard:test:tls:standalone");
    limiters_decide(&conn, "tls-standalone");
}

#[test]
fn cluster_over_tls_passes_the_locker_contract_and_limits() {
    let certs = TestCerts::generate().expect("certificates");
    let cluster = RedisCluster::start_tls(&certs).expect("redis cluster with TLS");
    let conn = connect(
        Topology::Cluster {
            nodes: cluster.urls(),
        },
        &trusting(&certs),
    );
    run_contract(&conn, "guard:test:tls:cluster");
    // Keys over many slots, so every node is reached (over TLS: the
    // nodes announce their TLS ports).
    let locker = RedisLocker::new(conn.clone());
    for i in 0..20 {
        smol::block_on(contract::exclusivity(
            &locker,
            &format!("guard:once:tls-job{i}:slot"),
        ));
    }
    for i in 0..10 {
        limiters_decide(&conn, &format!("tls-cluster-{i}"));
    }
    // SCAN on every master, each reached by the address the cluster
    // announces: the buckets of all ten keys, whichever node holds them.
    let keys = smol::block_on(conn.scan_keys("guard:tb:*tls-cluster-*", "string"))
        .expect("SCAN on every master over TLS");
    assert_eq!(keys.len(), 10, "{keys:?}");
}

#[test]
fn sentinel_over_tls_passes_the_locker_contract() {
    let certs = TestCerts::generate().expect("certificates");
    let sentinel = RedisSentinel::start_tls(&certs).expect("redis sentinel with TLS");
    assert!(sentinel.sentinel_url().starts_with("rediss://"));
    let conn = connect(
        Topology::Sentinel {
            sentinels: vec![sentinel.sentinel_url()],
            service: SENTINEL_SERVICE.into(),
        },
        &trusting(&certs),
    );
    run_contract(&conn, "guard:test:tls:sentinel");
    limiters_decide(&conn, "tls-sentinel");
}

#[test]
fn a_tls_only_port_refuses_plain_clients_and_untrusted_servers_are_refused() {
    let certs = TestCerts::generate().expect("certificates");
    let server = RedisServer::start_tls(&certs).expect("redis-server with TLS");
    // The same port without TLS: the server never answers in plain text.
    let plain = format!("redis://127.0.0.1:{}/", server.port());
    let refused = smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: plain },
        Duration::from_millis(500),
    ));
    assert!(
        refused.is_err(),
        "a plain client is refused by a TLS-only port"
    );

    // TLS, but with the system's roots: the test CA is unknown.
    let untrusted = smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        TIMEOUT,
    ));
    let err = untrusted.expect_err("a server signed by an unknown CA is refused");
    assert!(
        matches!(err, RedisGuardError::Redis(_)),
        "a connection failure, not a timeout: {err}"
    );

    // Another CA: refused as well.
    let other = TestCerts::generate().expect("certificates");
    let wrong = smol::block_on(RedisConnection::connect_with_tls(
        Topology::Standalone { url: server.url() },
        TIMEOUT,
        &trusting(&other),
    ));
    assert!(wrong.is_err(), "a server signed by another CA is refused");

    // Trusting the right CA: a working connection.
    let conn = connect(
        Topology::Standalone { url: server.url() },
        &trusting(&certs),
    );
    let pong: String = smol::block_on(conn.query(&redis::cmd("PING"))).expect("PING");
    assert_eq!(pong, "PONG");
}

#[test]
fn a_server_that_requires_client_certificates_admits_only_them() {
    let certs = TestCerts::generate().expect("certificates");
    let server = RedisServer::start_tls_with(&certs, &["--tls-auth-clients", "yes"])
        .expect("redis-server requiring client certificates");
    let topology = || Topology::Standalone { url: server.url() };

    let anonymous = smol::block_on(RedisConnection::connect_with_tls(
        topology(),
        TIMEOUT,
        &trusting(&certs),
    ));
    assert!(anonymous.is_err(), "no client certificate: refused");

    let identified = trusting(&certs)
        .with_client_identity(certs.client_cert_pem(), certs.client_key_pem())
        .expect("the test client identity");
    assert!(identified.has_root_ca() && identified.has_client_identity());
    let conn = connect(topology(), &identified);
    run_contract(&conn, "guard:test:tls:mutual");

    // A blocking client with the same settings (what a Pub/Sub reader uses).
    let client = identified.client(server.url()).expect("client");
    let mut blocking = client
        .get_connection_with_timeout(TIMEOUT)
        .expect("a blocking TLS connection");
    let pong: String = redis::cmd("PING").query(&mut blocking).expect("PING");
    assert_eq!(pong, "PONG");
}

#[test]
fn bad_certificates_and_urls_are_refused_naming_what() {
    let certs = TestCerts::generate().expect("certificates");
    let parameter = |e: RedisGuardError| match e {
        RedisGuardError::InvalidInput { parameter, .. } => parameter,
        other => panic!("not refused as input: {other}"),
    };

    let err = RedisTls::new()
        .with_root_ca("not a certificate")
        .unwrap_err();
    assert!(err.to_string().contains("no certificate"), "{err}");
    assert_eq!(parameter(err), Parameter::TlsRootCa);
    let err = RedisTls::new()
        .with_root_ca("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
        .unwrap_err();
    assert_eq!(parameter(err), Parameter::TlsRootCa);

    let err = RedisTls::new()
        .with_client_identity("nothing", certs.client_key_pem())
        .unwrap_err();
    assert_eq!(parameter(err), Parameter::TlsClientCert);
    let err = RedisTls::new()
        .with_client_identity(certs.client_cert_pem(), certs.ca_pem())
        .unwrap_err();
    assert_eq!(parameter(err), Parameter::TlsClientKey);
    // A key of another certificate.
    let other = TestCerts::generate().expect("certificates");
    let err = RedisTls::new()
        .with_client_identity(certs.client_cert_pem(), other.client_key_pem())
        .unwrap_err();
    assert_eq!(parameter(err), Parameter::TlsClientKey);
    let shown = format!(
        "{:?}",
        RedisTls::new()
            .with_client_identity(certs.client_cert_pem(), certs.client_key_pem())
            .unwrap()
    );
    assert!(
        !shown.contains("PRIVATE KEY"),
        "the key is never shown: {shown}"
    );

    // TLS settings with a plain URL, and a deployment mixing both.
    let err = smol::block_on(RedisConnection::connect_with_tls(
        Topology::Standalone {
            url: "redis://127.0.0.1:1/".into(),
        },
        TIMEOUT,
        &trusting(&certs),
    ))
    .unwrap_err();
    assert!(err.to_string().contains("rediss://"), "{err}");
    assert_eq!(parameter(err), Parameter::Url);
    let err = smol::block_on(RedisConnection::connect(
        Topology::Cluster {
            nodes: vec![
                "rediss://127.0.0.1:1/".into(),
                "redis://127.0.0.1:2/".into(),
            ],
        },
        TIMEOUT,
    ))
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("\"redis://127.0.0.1:2/\": must be rediss://"),
        "{err}"
    );
}
