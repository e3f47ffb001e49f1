//! The direct connection a request drives itself on a standalone server:
//! it never hands one request's late reply to the next, survives a server
//! restart without a failed request, and honours the URL's password and
//! database.

use std::time::Duration;

use guard_redis::{DIRECT_CONNECTIONS, RedisConnection, STANDALONE_CONNECTIONS, Topology};
use guard_testkit::RedisServer;

fn connect(url: String, timeout: Duration) -> RedisConnection {
    smol::block_on(RedisConnection::connect(
        Topology::Standalone { url },
        timeout,
    ))
    .expect("connect")
}

fn echo(conn: &RedisConnection, text: &str) -> String {
    smol::block_on(conn.query(redis::cmd("ECHO").arg(text))).expect("ECHO")
}

/// The number in `connected_clients:<n>` of `INFO clients`.
fn connected_clients(conn: &RedisConnection) -> usize {
    let info: String =
        smol::block_on(conn.query(redis::cmd("INFO").arg("clients"))).expect("INFO clients");
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("connected_clients in INFO clients")
}

/// A server that asks for `password` (set after start: the harness's
/// readiness check does not authenticate).
fn with_password(password: &str) -> RedisServer {
    let server = RedisServer::start().expect("redis-server");
    let reply = server
        .command(&format!("CONFIG SET requirepass {password}"))
        .expect("CONFIG SET");
    assert!(reply.starts_with("+OK"), "CONFIG SET requirepass: {reply}");
    server
}

#[test]
fn a_request_that_timed_out_does_not_leave_its_late_reply_to_the_next() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]).expect("redis-server");
    let conn = connect(server.url(), Duration::from_millis(500));
    assert_eq!(echo(&conn, "warm"), "warm");
    // The server answers "+OK" after 800 ms, when the request has given up.
    let slow: Result<String, _> =
        smol::block_on(conn.query(redis::cmd("DEBUG").arg("SLEEP").arg("0.8")));
    assert!(slow.is_err(), "DEBUG SLEEP 0.8 within 500 ms: {slow:?}");
    // Let the late "+OK" arrive, on whichever connection carried it.
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..20 {
        let mine = format!("mine-{i}");
        assert_eq!(echo(&conn, &mine), mine, "request {i} got another's reply");
    }
}

#[test]
fn a_restarted_server_costs_no_failed_request() {
    let mut server = RedisServer::start().expect("redis-server");
    let conn = connect(server.url(), Duration::from_secs(2));
    assert_eq!(echo(&conn, "before"), "before");
    server.restart().expect("restart");
    // The old connections' close has reached us by the time the new
    // server answers PING (the restart waits for that).
    std::thread::sleep(Duration::from_millis(100));
    // The direct connection notices the close before sending; the
    // multiplexed ones reconnect in the background.
    assert_eq!(echo(&conn, "after"), "after");
}

#[test]
fn a_url_s_password_and_database_hold_on_the_direct_connection() {
    let server = with_password("s3cret");
    let url = format!("redis://:s3cret@127.0.0.1:{}/3", server.port());
    let conn = connect(url, Duration::from_secs(2));
    let _: () = smol::block_on(conn.query(redis::cmd("SET").arg("where").arg("db3")))
        .expect("SET over an authenticated connection");
    let info: String = smol::block_on(conn.query(&redis::cmd("CLIENT").arg("INFO").to_owned()))
        .expect("CLIENT INFO");
    assert!(info.contains(" db=3 "), "not on database 3: {info}");
    // The direct connection opened (authenticated) beside the
    // multiplexed ones: had its AUTH failed, only those would be here.
    assert_eq!(
        connected_clients(&conn),
        STANDALONE_CONNECTIONS + DIRECT_CONNECTIONS
    );
    let size: i64 = smol::block_on(conn.query(&redis::cmd("DBSIZE"))).expect("DBSIZE");
    assert_eq!(size, 1, "the key is in database 3, beside nothing else");
}

#[test]
fn a_wrong_password_is_an_error_not_a_silent_fallback() {
    let server = with_password("s3cret");
    let url = format!("redis://:wrong@127.0.0.1:{}/", server.port());
    let connected = smol::block_on(RedisConnection::connect(
        Topology::Standalone { url },
        Duration::from_secs(2),
    ));
    let err = connected.expect_err("a wrong password connects");
    assert!(
        err.to_string().to_lowercase().contains("pass") || err.to_string().contains("AUTH"),
        "the error names the authentication: {err}"
    );
}

#[test]
fn a_request_that_falls_back_to_a_multiplexed_connection_after_a_restart_does_not_fail() {
    let mut server =
        RedisServer::start_with(&["--enable-debug-command", "yes"]).expect("redis-server");
    let conn = connect(server.url(), Duration::from_secs(2));
    assert_eq!(echo(&conn, "before"), "before");
    // The multiplexed connections see the server go and try to reconnect
    // while it is down; they are not used again until a request finds the
    // direct connection busy.
    server.restart().expect("restart");
    std::thread::sleep(Duration::from_millis(300));
    smol::block_on(async {
        let busy = async {
            let slept: Result<(), _> = conn
                .query(redis::cmd("DEBUG").arg("SLEEP").arg("0.3"))
                .await;
            slept.expect("DEBUG SLEEP over the direct connection");
        };
        let beside = async {
            async_io::Timer::after(Duration::from_millis(50)).await;
            for i in 0..(2 * STANDALONE_CONNECTIONS) {
                let text = format!("beside-{i}");
                let got: String = conn
                    .query(redis::cmd("ECHO").arg(&text))
                    .await
                    .expect("a request over a multiplexed connection after the restart");
                assert_eq!(got, text);
            }
        };
        futures_lite::future::zip(busy, beside).await;
    });
}
