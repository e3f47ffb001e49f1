//! guard-endpoints: a library of message sources that apply the seeds'
//! delivery rule to real servers; the adapters under it stay seams (time,
//! IO, storage, runtime). It holds no application: the gateway's
//! configuration, admission and assembly live in `boards/gateway`, which
//! builds each source from its validated configuration with the builders
//! here.
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
//! - `nats` (feature `nats`): a queue group (no guard), a plain subject
//!   (broadcast, optionally elected), and a JetStream durable consumer
//!   (redelivery, dead letters after the last delivery);
//! - `amqp` (feature `amqp`): RabbitMQ work queues (no guard, the broker's
//!   dead-letter exchange), elected fanout consumers, and the broker's
//!   single-active-consumer queues compared with our election;
//! - `postgres` (feature `postgres`): a table of work every replica polls,
//!   each row claimed by one (`FOR UPDATE SKIP LOCKED`) under a lease;
//! - `mysql` (feature `mysql`): MariaDB/MySQL binlog change data capture
//!   by one elected reader, checkpointed under its fence;
//! - [`delivery`]: the one delivery path of every elected endpoint: the
//!   lease checked before each side effect ([`delivery::ElectedLease`]
//!   handed with each message), and what was read but not handled handed
//!   to an [`delivery::UnhandledSink`] with its content and reason;
//! - [`link`]: whether each source reaches its server ([`link::Link`]),
//!   its connection losses counted and their logs throttled in one place;
//! - [`queue`]: the bounded handler queue of a broadcast source and its
//!   [`queue::WhenFull`] policy.
//!
//! The `tls` feature (off by default) connects over TLS: `rediss://` URLs
//! for the Redis sources (`PubSubEndpoint::with_tls` for a private CA or a
//! client certificate) and `MqttOptions::with_tls` for MQTT.
//!
//! Errors are typed: [`mqtt::MqttError`], [`redis::EndpointError`] and
//! the errors of the feature-gated sources (`NatsError`, `AmqpError`,
//! `PgQueueError`, `BinlogError`) name the [`Parameter`] they refuse and
//! keep their cause in [`source`](std::error::Error::source).
//!
//! Kafka and configuration services of the Nacos kind need no endpoint
//! here: a Kafka consumer group already delivers each record to one
//! member (the seeds' rule: no guard), and a configuration change must
//! reach every replica (deliberately not deduplicated); see the README.
// docs.rs (nightly, `--cfg docsrs`) marks each feature-gated item with
// the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "amqp")]
pub mod amqp;
mod deliver;
pub mod delivery;
// The elected consumer of a broadcast source, for the sources that have
// one besides MQTT and Redis Pub/Sub.
#[cfg(any(feature = "nats", feature = "amqp", feature = "mysql"))]
mod elected;
mod lease_thread;
pub mod link;
pub mod mqtt;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "nats")]
pub mod nats;
mod observe;
mod parameter;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod queue;
pub mod redis;
mod runtime;
pub mod sink;

pub use parameter::{InvalidInput, Parameter, Refusal, redacted};
