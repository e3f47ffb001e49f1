//! What a configuration connects to, with its TLS settings applied: the
//! Redis locker, a stream's own server, a Pub/Sub endpoint, an MQTT
//! endpoint's options. A program that builds from a [`Config`](super::Config)
//! uses these and never handles TLS itself.

use std::time::Duration;

use guard_redis::{RedisConnection, RedisGuardError, Topology};

use super::{RedisLocker, TlsFiles};

/// Connects to `topology`, over TLS with `tls`'s settings when given.
pub(crate) async fn connect(
    topology: Topology,
    timeout: Duration,
    tls: Option<&TlsFiles>,
) -> Result<RedisConnection, RedisGuardError> {
    #[cfg(feature = "tls")]
    if let Some(tls) = tls {
        return RedisConnection::connect_with_tls(topology, timeout, tls.redis()).await;
    }
    // Without TLS support no configuration has TLS settings: it refuses
    // every TLS key and `rediss://` URL.
    #[cfg(not(feature = "tls"))]
    let _ = tls;
    RedisConnection::connect(topology, timeout).await
}

impl RedisLocker {
    /// The locker on `conn` this configuration names: its prefix, and the
    /// replicas each grant waits for. (The quarantine is the leases'
    /// alone: the caller adds it to theirs.)
    pub fn locker(
        &self,
        conn: RedisConnection,
    ) -> Result<guard_redis::RedisLocker, RedisGuardError> {
        let locker = guard_redis::RedisLocker::new(conn).with_prefix(&self.prefix)?;
        match self.replica_acks {
            Some((replicas, within)) => locker.with_replica_acks(replicas, within),
            None => Ok(locker),
        }
    }

    /// Connects to the locker's deployment (over TLS for `rediss://`
    /// URLs, with the `tls_*` files), failing if it cannot be reached now.
    pub async fn connect(&self) -> Result<RedisConnection, RedisGuardError> {
        connect(
            self.topology.clone(),
            self.request_timeout,
            self.tls.as_ref(),
        )
        .await
    }
}
