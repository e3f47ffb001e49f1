//! Connecting, and running async-nats's futures on a tokio runtime.

use futures_lite::future;
use guard_std::run::CallerRuntime;
use guard_std::run::{Control, Runtime as _};

use super::{NatsError, NatsOptions};
use crate::link::Link;

pub(crate) use crate::runtime::on_tokio;

/// One attempt to connect; the client reports its own disconnections and
/// reconnections after it to `link`.
pub(crate) async fn connect(
    options: &NatsOptions,
    link: &Link,
) -> Result<async_nats::Client, NatsError> {
    let events = link.clone();
    let mut connect = async_nats::ConnectOptions::new()
        .connection_timeout(options.connect_timeout)
        // After the first connection the client reconnects by itself,
        // forever, and subscribes again; a pause between attempts keeps a
        // server that is down from being hammered.
        .max_reconnects(None)
        .event_callback(move |event| {
            let events = events.clone();
            async move {
                match event {
                    async_nats::Event::Connected => events.up(),
                    async_nats::Event::Disconnected => {
                        events.down(&"disconnected", "the client reconnects by itself");
                    }
                    _ => {}
                }
            }
        });
    if let Some(name) = &options.name {
        connect = connect.name(name);
    }
    on_tokio(connect.connect(options.url.as_str()))
        .await
        .map_err(|e| NatsError::server(format!("connect {}", options.server()), e))
}

/// Connects, trying again after the reconnect delay until it succeeds;
/// `None` once `control` stops.
pub(crate) async fn connect_until_stopped(
    options: &NatsOptions,
    control: &Control,
    link: &Link,
) -> Option<async_nats::Client> {
    while !control.is_stopped() {
        let attempt = async { Some(connect(options, link).await) };
        let stopped = async {
            control.stopped().await;
            None
        };
        match future::or(stopped, attempt).await {
            None => return None,
            Some(Ok(client)) => {
                link.up();
                return Some(client);
            }
            Some(Err(e)) => {
                let then = format!("trying again in {:?}", options.reconnect_delay);
                link.down(&e, &then);
                future::or(control.stopped(), async {
                    CallerRuntime.sleep(options.reconnect_delay).await;
                })
                .await;
            }
        }
    }
    None
}
