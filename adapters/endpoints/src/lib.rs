//! guard-endpoints: the integration layer. It applies the seeds' delivery
//! rule to real sources and parses the gateway's configuration once into
//! validated types; the adapters under it stay seams (time, IO, storage,
//! runtime).
//!
//! The rule: where the source delivers each message to one consumer, use
//! that and add no guard (a guard would turn legitimate redeliveries into
//! losses); where it broadcasts, elect one consumer by lease and check the
//! lease before every handler call.
//!
//! - [`redis`]: [`redis::PubSubEndpoint`] (broadcast: one elected
//!   subscriber) and [`redis::StreamConsumer`] (a consumer group: ack,
//!   retry, dead letters, claims of a dead consumer's entries);
//! - [`mqtt`]: [`mqtt::MqttEndpoint`] with a shared subscription (the
//!   broker delivers once) or a plain one (broadcast, optionally elected);
//! - [`admission`]: rate limits that act on every message of an endpoint,
//!   and the dead letters of the ones refused;
//! - [`queue`]: the bounded handler queue of a broadcast source and its
//!   [`queue::WhenFull`] policy;
//! - [`config`]: the TOML configuration of a gateway replica.
//!
//! The `tls` feature (off by default) connects over TLS: `rediss://` URLs
//! for the Redis sources (`PubSubEndpoint::with_tls` for a private CA or a
//! client certificate), `MqttOptions::with_tls` for MQTT, and the
//! configuration's `tls_ca`, `tls_cert`, `tls_key` and `tls` keys.
//!
//! Errors are typed: [`mqtt::MqttError`] and [`redis::EndpointError`]
//! name the [`Parameter`] they refuse and keep their cause in
//! [`source`](std::error::Error::source).

pub mod admission;
pub mod config;
mod deliver;
// The elected consumer of a broadcast source, for the sources that have
// one besides MQTT and Redis Pub/Sub.
#[cfg(any(feature = "nats", feature = "amqp"))]
mod elected;
mod lease_thread;
pub mod mqtt;
#[cfg(feature = "nats")]
pub mod nats;
mod parameter;
pub mod queue;
pub mod redis;
mod runtime;

pub use parameter::Parameter;
