//! `kind = "mqtt"`: a shared subscription, a broadcast, or an elected
//! subscriber.

use guard_endpoints::mqtt::{MqttEndpoint, Subscription};

use super::{Assembly, Content, Event, Task, elected_scope, failed, text};
use crate::config::{MqttDelivery, MqttSource};
use crate::error::GatewayError;

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
    let scope = |kind: &str| elected_scope(built, kind, &name);
    let client_id = format!("{name}-{identity}");
    let options = source.options(&client_id).map_err(|e| context(e.into()))?;
    let subscription = match &source.delivery {
        MqttDelivery::Shared(group) => Subscription::shared(group, &source.filter),
        MqttDelivery::Broadcast | MqttDelivery::Elected => Subscription::plain(&source.filter),
    }
    .map_err(|e| context(e.into()))?;
    let mut endpoint = MqttEndpoint::new(options, subscription).with_link(cx.link);
    if source.delivery == MqttDelivery::Elected {
        let scope = scope("mqtt")?;
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
