//! What a configuration connects to, with its TLS settings applied: the
//! Redis locker, a stream's own server, a Pub/Sub endpoint, an MQTT
//! endpoint's options. A program that builds from a [`Config`](super::Config)
//! uses these and never handles TLS itself.

use std::time::Duration;

use guard_core::lock::Scope;
use guard_redis::{RedisConnection, RedisGuardError, Topology};
use guard_std::GuardConfig;

use super::{MqttSource, PubSubSource, RedisLocker, StreamSource, TlsFiles};
use guard_endpoints::mqtt::{MqttError, MqttOptions};
use guard_endpoints::redis::{EndpointError, PubSubEndpoint};

/// Connects to `topology`, over TLS with `tls`'s settings when given.
async fn connect(
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

impl StreamSource {
    /// Connects to the stream's own server (its `url`, over TLS for a
    /// `rediss://` one), each request bounded by `timeout`. A stream
    /// without a URL of its own uses the locker's connection instead.
    pub async fn connect(&self, timeout: Duration) -> Result<RedisConnection, RedisGuardError> {
        let url = self
            .url
            .as_ref()
            .map_or_else(String::new, |url| url.as_str().to_owned());
        connect(Topology::Standalone { url }, timeout, self.tls.as_ref()).await
    }
}

impl PubSubSource {
    /// The endpoint of this source: its URL (over TLS for a `rediss://`
    /// one), patterns and handler queue, elected under `scope` with
    /// `config`'s locker.
    pub fn endpoint(
        &self,
        config: &GuardConfig,
        scope: &Scope,
    ) -> Result<PubSubEndpoint, EndpointError> {
        let patterns: Vec<&str> = self.patterns.iter().map(String::as_str).collect();
        let endpoint = PubSubEndpoint::new(&self.url, config, scope, &patterns)?
            .with_queue(self.queue, self.when_full)?;
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            return endpoint.with_tls(tls.redis());
        }
        Ok(endpoint)
    }
}

impl MqttSource {
    /// The connection options of this source for `client_id` (over TLS
    /// when configured).
    pub fn options(&self, client_id: &str) -> Result<MqttOptions, MqttError> {
        let options = MqttOptions::new(&self.host, self.port, client_id)?;
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            return Ok(options.with_tls(tls.mqtt().clone()));
        }
        Ok(options)
    }
}
