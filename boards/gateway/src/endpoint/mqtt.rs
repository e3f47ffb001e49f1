//! `kind = "mqtt"`: a shared subscription, a broadcast, or an elected
//! subscriber, in one module: the `[[endpoints]]` entry as written, its
//! check, the validated source, what `check` prints of it, its connection
//! options and its assembly.

use guard_endpoints::Parameter;
use guard_endpoints::mqtt::{MqttError, MqttOptions};
use serde::Deserialize;

use super::{Assembly, Content, Event, Task, elected_scope, failed, text};
use crate::config::check::{Env, as_expected, expand, non_empty};
use crate::config::raw;
use crate::config::tls::{self, TlsFiles, TlsKeys};
use crate::config::{ConfigError, Source, invalid};
use crate::error::GatewayError;
use guard_endpoints::mqtt::{MqttEndpoint, Subscription};

/// The default MQTT port.
const MQTT_PORT: u16 = 1883;
/// The default MQTT port over TLS.
const MQTTS_PORT: u16 = 8883;

/// `kind = "mqtt"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttSource {
    /// The broker's host.
    pub host: String,
    /// The broker's port.
    pub port: u16,
    /// The topic filter.
    pub filter: String,
    /// Who receives each message.
    pub delivery: MqttDelivery,
    /// TLS, when `tls = true` or a `tls_*` file is given: the files
    /// (none: the system's roots).
    pub tls: Option<TlsFiles>,
}

/// How an MQTT endpoint subscribes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MqttDelivery {
    /// `$share/<group>/<filter>`: the broker gives each message to one
    /// member; no guard.
    Shared(String),
    /// A plain subscription on every replica: a broadcast.
    Broadcast,
    /// A plain subscription on the elected replica only.
    Elected,
}

/// A `kind = "mqtt"` entry of `[[endpoints]]` as written (an unknown key
/// is refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MqttEntry {
    pub name: String,
    pub host: String,
    pub port: Option<u16>,
    pub filter: String,
    pub share_group: Option<String>,
    #[serde(default)]
    pub guard: bool,
    pub limit: Option<String>,
    pub limit_key: Option<String>,
    pub when_limited: Option<raw::WhenLimited>,
    pub max_wait_ms: Option<u64>,
    pub max_payload_bytes: Option<u64>,
    pub tls: Option<bool>,
    pub tls_ca: Option<String>,
    pub tls_cert: Option<String>,
    pub tls_key: Option<String>,
}

/// `kind = "mqtt"`: checked with the library's filter and share rules.
pub(crate) fn resolve(
    m: &MqttEntry,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<Source, ConfigError> {
    let filter = non_empty(key, "filter", &m.filter, "a topic filter")?;
    // The endpoint's own rules, named by the key they refuse.
    let subscription = match &m.share_group {
        Some(group) => Subscription::shared(group, &filter),
        None => Subscription::plain(&filter),
    };
    if let Err(MqttError::InvalidInput(guard_endpoints::InvalidInput {
        parameter,
        value,
        rule,
        ..
    })) = subscription
    {
        let field = match parameter {
            Parameter::ShareGroup => "share_group",
            _ => "filter",
        };
        return Err(invalid(key(field), value, as_expected(&rule)));
    }
    let delivery = match (&m.share_group, m.guard) {
        (Some(_), true) => {
            return Err(invalid(
                key("guard"),
                true,
                "no guard with `share_group`: the broker delivers each message to one member already",
            ));
        }
        (Some(group), false) => MqttDelivery::Shared(group.clone()),
        (None, true) => MqttDelivery::Elected,
        (None, false) => MqttDelivery::Broadcast,
    };
    let broker = broker(
        &Broker {
            host: &m.host,
            port: m.port,
            tls: m.tls,
            keys: TlsKeys {
                ca: &m.tls_ca,
                cert: &m.tls_cert,
                key: &m.tls_key,
            },
        },
        key,
        env,
    )?;
    let source = Source::Mqtt(MqttSource {
        host: broker.host,
        port: broker.port,
        filter,
        delivery,
        tls: broker.tls,
    });
    Ok(source)
}

/// A broker as a `[[endpoints]]` or a `[[sinks]]` entry names it.
pub(crate) struct Broker<'a> {
    pub host: &'a str,
    pub port: Option<u16>,
    pub tls: Option<bool>,
    pub keys: TlsKeys<'a>,
}

/// A broker, checked: its host, its port (1883, or 8883 over TLS, unless
/// given) and its TLS files.
pub(crate) struct CheckedBroker {
    pub host: String,
    pub port: u16,
    pub tls: Option<TlsFiles>,
}

/// Checks a broker's `host`, `port`, `tls` and `tls_*` keys.
pub(crate) fn broker(
    b: &Broker<'_>,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<CheckedBroker, ConfigError> {
    let host = expand(&key("host"), b.host, env)?;
    let host = non_empty(key, "host", &host, "the broker's host")?;
    // A host name (ASCII letters, digits, `-`, `_` as container
    // names have, and `.`; an international name in its `xn--`
    // form; fully qualified with a trailing dot or not) or an IP
    // address.
    let name = |h: &str| {
        let h = h.strip_suffix('.').unwrap_or(h);
        h.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
        // A name's last label is never all digits: `127.0.0.1.` is no
        // host name (and no address either).
        && h
            .rsplit('.')
            .next()
            .is_some_and(|tld| !tld.chars().all(|c| c.is_ascii_digit()))
    };
    if !(name(&host) || host.parse::<std::net::IpAddr>().is_ok()) {
        return Err(invalid(
            key("host"),
            format!("{:?}", b.host),
            "a host name or IP address alone (no scheme, path or port: the port is `port`; an international name in its xn-- form)",
        ));
    }
    if b.port == Some(0) {
        return Err(invalid(key("port"), 0, "a port from 1 to 65535"));
    }
    let keys = &b.keys;
    let tls = match (b.tls, keys.first()) {
        (Some(false), Some((field, value))) => {
            return Err(invalid(
                key(field),
                format!("{value:?}"),
                "no TLS files with tls = false",
            ));
        }
        (Some(false), None) | (None, None) => None,
        (Some(true), _) | (None, Some(_)) => {
            Some(tls::read(keys, key, &|at, value| expand(at, value, env))?)
        }
    };
    let default_port = if tls.is_some() { MQTTS_PORT } else { MQTT_PORT };
    Ok(CheckedBroker {
        host,
        port: b.port.unwrap_or(default_port),
        tls,
    })
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

/// What `check` prints of an MQTT source.
pub(super) fn describe(source: &MqttSource) -> String {
    match &source.delivery {
        MqttDelivery::Shared(group) => format!("mqtt, shared subscription {group}"),
        MqttDelivery::Broadcast => "mqtt, broadcast".to_owned(),
        MqttDelivery::Elected => "mqtt, elected subscriber".to_owned(),
    }
}

/// The subscription of an MQTT endpoint.
pub(super) fn start(cx: Assembly<'_>, source: &MqttSource) -> Result<Task, GatewayError> {
    let (name, inbox, emit, control) = (cx.name, cx.inbox, cx.emit, cx.control);
    let (identity, built, timing) = (cx.identity, cx.built, cx.timing);
    let context = |source| failed(&name, source);
    let ready = cx.ready;
    let scope = |kind: &str| elected_scope(built, ready, kind, &name);
    let client_id = format!("{name}-{identity}");
    let options = source.options(&client_id).map_err(|e| context(e.into()))?;
    let subscription = match &source.delivery {
        MqttDelivery::Shared(group) => Subscription::shared(group, &source.filter),
        MqttDelivery::Broadcast | MqttDelivery::Elected => Subscription::plain(&source.filter),
    }
    .map_err(|e| context(e.into()))?;
    let mut endpoint = MqttEndpoint::new(options, subscription).with_link(cx.link);
    if source.delivery == MqttDelivery::Elected {
        let scope = scope(super::kind::MQTT)?;
        endpoint = endpoint
            .with_guard(&built.guards, &scope)
            .and_then(|e| e.with_guard_settings(timing))
            .map_err(|e| context(e.into()))?
            .with_unhandled(inbox.unhandled_to(&emit));
    }
    Ok(Box::pin(async move {
        endpoint
            .run(control, |message| {
                let (inbox, emit, name) = (inbox.clone(), emit.clone(), name.clone());
                async move {
                    let lease = message.lease.as_ref();
                    if !inbox
                        .pass(&message.topic, &message.payload, lease, &emit)
                        .await
                        || !inbox
                            .forward_or_keep(&message.topic, &message.payload, lease, &emit)
                            .await
                    {
                        return;
                    }
                    emit(Event::Received {
                        endpoint: name,
                        from: message.topic,
                        fence: message.fence,
                        content: Content::Payload(text(&message.payload)),
                    });
                }
            })
            .await;
    }))
}
