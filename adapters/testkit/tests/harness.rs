//! The test harness itself.

use guard_testkit::{RedisServer, find_binary};

#[test]
fn a_missing_binary_names_its_debian_package() {
    let err = find_binary(
        "redis-server",
        "redis-server",
        std::ffi::OsStr::new("/nonexistent"),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "`redis-server` was not found: install the Debian package `redis-server` (apt-get install redis-server); the test script does this"
    );
}

#[test]
fn a_server_is_stopped_by_pid_when_dropped() {
    let server = RedisServer::start().expect("redis-server");
    let port = server.port();
    assert!(server.command("PING").unwrap().starts_with("+PONG"));
    drop(server);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing listens any more"
    );
}
