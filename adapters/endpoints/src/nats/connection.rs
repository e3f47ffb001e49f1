//! Connecting, and running async-nats's futures on a tokio runtime.

use futures_lite::future;
use guard_std::run::CallerRuntime;
use guard_std::run::{Control, Runtime as _};

use super::{NatsError, NatsOptions};

pub(crate) use crate::runtime::on_tokio;

/// One attempt to connect.
pub(crate) async fn connect(options: &NatsOptions) -> Result<async_nats::Client, NatsError> {
    let mut connect = async_nats::ConnectOptions::new()
        .connection_timeout(options.connect_timeout)
        // After the first connection the client reconnects by itself,
        // forever, and subscribes again; a pause between attempts keeps a
        // server that is down from being hammered.
        .max_reconnects(None);
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
    what: &str,
) -> Option<async_nats::Client> {
    let failures = guard_std::Throttle::new();
    while !control.is_stopped() {
        let attempt = async { Some(connect(options).await) };
        let stopped = async {
            control.stopped().await;
            None
        };
        match future::or(stopped, attempt).await {
            None => return None,
            Some(Ok(client)) => return Some(client),
            Some(Err(e)) => {
                if let Some(held) = failures.admit() {
                    log::warn!("{what}: {e}; trying again ({held} more not logged)");
                }
                future::or(control.stopped(), async {
                    CallerRuntime.sleep(options.reconnect_delay).await;
                })
                .await;
            }
        }
    }
    None
}
