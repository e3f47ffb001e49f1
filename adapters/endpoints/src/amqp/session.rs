//! One connection to the broker, with the channel the consumer uses, and
//! the declarations and waits every consumer shares.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::link::Link;
use futures_lite::future;
use guard_std::run::CallerRuntime;
use guard_std::run::{Control, Runtime as _};
use lapin::options::{
    BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, Consumer, ExchangeKind};

use super::{AmqpError, AmqpOptions, Counters};

/// A connection and its one channel.
///
/// Dropping it closes the connection (lapin sends the close when the
/// last handle to the connection goes): the broker requeues what the
/// channel had not acknowledged and deletes the connection's exclusive
/// queues.
pub(crate) struct Session {
    /// Kept so the connection lives as long as the channel is used.
    connection: Connection,
    pub(crate) channel: Channel,
    timeout: Duration,
}

impl Session {
    /// Connects and opens a channel, within the options' connect timeout.
    pub(crate) async fn open(options: &AmqpOptions) -> Result<Self, AmqpError> {
        let server = options.server();
        let failed = |e: lapin::Error| AmqpError::Connect {
            server: server.clone(),
            source: Arc::new(e),
        };
        within(options.connect_timeout, "connect", async {
            let mut properties = ConnectionProperties::default();
            if let Some(name) = &options.connection_name {
                properties = properties.with_connection_name(name.as_str().into());
            }
            let connection = Connection::connect_uri(options.uri.clone(), properties)
                .await
                .map_err(failed)?;
            let channel = connection.create_channel().await.map_err(failed)?;
            Ok(Session {
                connection,
                channel,
                timeout: options.connect_timeout,
            })
        })
        .await
    }

    /// Closes the connection and waits (within the connect timeout) for
    /// the broker's answer, so what the channel had not acknowledged is
    /// back in its queue when this returns. A connection that failed
    /// already has nothing to close.
    pub(crate) async fn close(self) {
        future::or(
            async {
                // An error means it was closed already.
                self.connection.close(200, "OK".into()).await.ok();
            },
            async {
                CallerRuntime.sleep(self.timeout).await;
            },
        )
        .await;
    }
}

/// `work`, or a [`AmqpError::Timeout`] naming `what` after `limit`.
pub(crate) async fn within<T>(
    limit: Duration,
    what: &'static str,
    work: impl Future<Output = Result<T, AmqpError>>,
) -> Result<T, AmqpError> {
    future::or(work, async {
        CallerRuntime.sleep(limit).await;
        Err(AmqpError::Timeout { what, limit })
    })
    .await
}

/// Declares the queue `name` (`what` names it in errors); an empty name
/// asks the broker to name it. Returns the queue's name.
pub(crate) async fn declare_queue(
    channel: &Channel,
    what: &'static str,
    name: &ShortString,
    options: QueueDeclareOptions,
    arguments: FieldTable,
) -> Result<ShortString, AmqpError> {
    channel
        .queue_declare(name.clone(), options, arguments)
        .await
        .map(|queue| queue.name().clone())
        .map_err(|e| AmqpError::Declare {
            what,
            name: name.to_string(),
            source: Arc::new(e),
        })
}

/// Declares the durable fanout exchange `name` (it outlives a broker
/// restart; the bindings of exclusive queues do not, and are made again).
pub(crate) async fn declare_fanout(channel: &Channel, name: &ShortString) -> Result<(), AmqpError> {
    channel
        .exchange_declare(
            name.clone(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| AmqpError::Declare {
            what: "exchange",
            name: name.to_string(),
            source: Arc::new(e),
        })
}

/// Binds `queue` to the fanout `exchange` (a fanout ignores the key).
pub(crate) async fn bind(
    channel: &Channel,
    queue: &ShortString,
    exchange: &ShortString,
) -> Result<(), AmqpError> {
    channel
        .queue_bind(
            queue.clone(),
            exchange.clone(),
            ShortString::default(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| AmqpError::Declare {
            what: "binding",
            name: queue.to_string(),
            source: Arc::new(e),
        })
}

/// Limits the channel to `prefetch` unacknowledged deliveries (`name`
/// names the queue or exchange in errors).
pub(crate) async fn limit(channel: &Channel, prefetch: u16, name: &str) -> Result<(), AmqpError> {
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .map_err(|e| AmqpError::Declare {
            what: "prefetch",
            name: name.to_owned(),
            source: Arc::new(e),
        })
}

/// Starts consuming `queue` with manual acknowledgements (a tag the
/// broker makes up).
pub(crate) async fn consume(channel: &Channel, queue: &ShortString) -> Result<Consumer, AmqpError> {
    channel
        .basic_consume(
            queue.clone(),
            ShortString::default(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| AmqpError::Consume {
            queue: queue.to_string(),
            source: Some(Arc::new(e)),
        })
}

/// Waits `delay`, or less if `control` stops meanwhile.
pub(crate) async fn pause(control: &Control, delay: Duration) {
    future::or(control.stopped(), async {
        CallerRuntime.sleep(delay).await;
    })
    .await;
}

/// What a connection attempt came to.
pub(crate) enum Attempt<T> {
    /// It worked.
    Done(T),
    /// Stop was requested first.
    Stopped,
}

/// Runs `attempt` until it works, `control` stops, or the broker refuses
/// a declaration for good (returned: no reconnection fixes it). Other
/// failures are counted and reported to `link` (which logs the first of a
/// burst, then a count), and tried again after the options' reconnect
/// delay.
pub(crate) async fn until_done<T, A, Fut>(
    options: &AmqpOptions,
    control: &Control,
    counters: &Counters,
    link: &Link,
    mut attempt: A,
) -> Result<Attempt<T>, AmqpError>
where
    A: FnMut() -> Fut,
    Fut: Future<Output = Result<T, AmqpError>>,
{
    loop {
        if control.is_stopped() {
            return Ok(Attempt::Stopped);
        }
        let tried = future::or(
            async {
                control.stopped().await;
                None
            },
            async { Some(attempt().await) },
        )
        .await;
        match tried {
            None => return Ok(Attempt::Stopped),
            Some(Ok(done)) => {
                counters.connected();
                link.up();
                return Ok(Attempt::Done(done));
            }
            Some(Err(e)) if e.is_refused_declaration() => {
                link.stopped(&e);
                return Err(e);
            }
            Some(Err(e)) => {
                counters.failed();
                let then = format!("trying again every {:?}", options.reconnect_delay);
                link.down(&e, &then);
                pause(control, options.reconnect_delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn a_refused_connection_keeps_lapin_s_error_as_its_source() {
        // A port that was just free: nothing listens on it.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let options = AmqpOptions::new(&format!("amqp://guest:guest@127.0.0.1:{port}/orders"))
            .expect("options");
        let Err(err) = future::block_on(Session::open(&options)) else {
            panic!("connected to a port nobody listens on");
        };
        assert!(
            matches!(&err, AmqpError::Connect { server, .. } if *server == format!("127.0.0.1:{port}/orders")),
            "{err}"
        );
        let source = err.source().expect("lapin's error");
        assert!(
            source.downcast_ref::<lapin::Error>().is_some(),
            "{source:?}"
        );
    }

    #[test]
    fn a_wait_is_cut_at_its_limit() {
        let limit = Duration::from_millis(20);
        let waited = future::block_on(within(limit, "answer", future::pending::<Result<(), _>>()));
        assert!(
            matches!(waited, Err(AmqpError::Timeout { what: "answer", limit: l }) if l == limit),
            "{waited:?}"
        );
    }
}
