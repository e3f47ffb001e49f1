//! An HTTP sink: each message is one `POST` of its payload.
//!
//! The client is hyper's HTTP/1.1 client on async-io (the reactor smol and
//! the gateway run on, through `smol-hyper`), with rustls for `https`
//! (the `tls` feature): no second reactor and no thread of its own, and
//! hyper is already in the gateway for its metrics server.
//!
//! **What a request carries.** The payload as the body (`Content-Type`
//! as configured, `application/octet-stream` by default), the message's
//! stable id as `Idempotency-Key` (the IETF draft's header: a receiver
//! that keeps the keys it has seen drops a repeat), its fence as
//! `Guard-Fence` when it was read under a lease, its origin as
//! `Guard-Origin`, and the headers given with [`HttpSink::with_header`]
//! (credentials such as `Authorization`). A byte of an id or origin that
//! a header cannot carry is percent-encoded.
//!
//! **What an answer means.**
//!
//! | answer | outcome |
//! |---|---|
//! | 2xx | delivered |
//! | 429, 503 | [`SinkError::Transient`] with the `Retry-After` it gives (seconds or an HTTP date, at most a day) |
//! | 408, other 5xx, no answer within the timeout, a connection that fails | [`SinkError::Transient`] |
//! | 409 with `Guard-Highest-Fence: <n>` | [`SinkError::StaleFence`] (a fenced receiver refused a stale leader) |
//! | other 1xx, 3xx and 4xx | [`SinkError::Permanent`] with the status and the first 256 bytes of the body (redirects are not followed) |
//!
//! **Order.** By default one request at a time goes out, on one
//! kept-alive connection, so messages reach the receiver in the order
//! they are sent. [`HttpSink::with_in_flight`]`(n)` lets up to `n` go out
//! at once, each on a kept-alive connection of its own (up to `n` of
//! them): more messages a second to a receiver that answers in parallel,
//! and no order between those in flight together. A connection the
//! server closed while idle is replaced before the next request, and a
//! failed one after it.

use std::fmt;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use async_io::Timer;
use async_lock::Semaphore;
use futures_lite::future;
use futures_lite::io::{AsyncRead, AsyncWrite};
use guard_core::retry::RetryAfter;
use guard_std::BoxFuture;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST, HeaderName, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, StatusCode, Uri};
use smol_hyper::rt::FuturesIo;

use super::{MessageSink, Outgoing, SinkError};
use crate::{InvalidInput, Parameter};

/// How long a request may take by default, connecting included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The header that carries a message's stable id.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The header that carries the fence a message was read under.
pub const FENCE_HEADER: &str = "guard-fence";

/// The header that carries a message's origin.
pub const ORIGIN_HEADER: &str = "guard-origin";

/// The header a fenced receiver answers a `409` with: the highest fence it
/// has accepted.
pub const HIGHEST_FENCE_HEADER: &str = "guard-highest-fence";

/// The most of a refusal's body kept in its reason.
pub const BODY_EXCERPT: usize = 256;

/// The most of an answer's body read; a longer one closes the connection.
const BODY_LIMIT: usize = 64 * 1024;

/// The most requests [`HttpSink::with_in_flight`] lets out at once.
pub const MAX_IN_FLIGHT: usize = 256;

/// The longest `Retry-After` honoured: a day.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// A connection's byte stream: plain TCP or TLS over it.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

type Stream = FuturesIo<Box<dyn Io>>;

/// A kept-alive connection: the request side and the task that drives it
/// (polled along with each request, never spawned).
struct Kept {
    sender: SendRequest<Full<Bytes>>,
    driver: Pin<Box<Connection<Stream, Full<Bytes>>>>,
}

/// Where the requests go, parsed once.
#[derive(Clone, Debug)]
struct Target {
    uri: Uri,
    host: String,
    port: u16,
    authority: HeaderValue,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls: bool,
}

/// A sink that `POST`s each message to one URL.
///
/// ```no_run
/// # smol::block_on(async {
/// use guard_endpoints::sink::http::HttpSink;
/// use guard_endpoints::sink::{MessageSink, Outgoing};
///
/// let sink = HttpSink::new("http://127.0.0.1:8080/ingest")?;
/// let message = Outgoing { id: "orders:1700000000000-0", origin: "orders", fence: Some(7), payload: b"{}" };
/// sink.send(&message).await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct HttpSink {
    target: Target,
    timeout: Duration,
    content_type: HeaderValue,
    #[cfg(feature = "tls")]
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// Headers sent with every request.
    headers: Vec<(HeaderName, HeaderValue)>,
    /// Requests let out at once.
    in_flight: usize,
    /// A permit per request out: `in_flight` of them.
    permits: Semaphore,
    /// Kept-alive connections not in use (a request takes one out and
    /// puts it back once answered, so one cut short leaves none
    /// half-used): at most `in_flight`.
    idle: Mutex<Vec<Kept>>,
}

impl fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSink")
            // A query often carries a token: its text is never shown.
            .field("url", &self.target.shown())
            .field("timeout", &self.timeout)
            .field("in_flight", &self.in_flight)
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// `type/subtype`, each an HTTP token, then any `; parameters`
/// (RFC 9110, 8.3.1): what a receiver can parse as a media type.
fn is_media_type(text: &str) -> bool {
    let is_token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    let essence = text.split(';').next().unwrap_or_default().trim();
    matches!(essence.split_once('/'), Some((kind, sub)) if is_token(kind) && is_token(sub))
}

fn invalid(parameter: Parameter, value: impl Into<String>, rule: &str) -> InvalidInput {
    InvalidInput::new(parameter, value, rule)
}

impl HttpSink {
    /// A sink that posts to `url` (`http://` or, with the `tls` feature,
    /// `https://`), within [`DEFAULT_TIMEOUT`].
    ///
    /// Refuses a URL that is not one, another scheme, and one with a user
    /// or password (they would be sent in no header: give the receiver's
    /// credentials another way).
    pub fn new(url: &str) -> Result<Self, InvalidInput> {
        let refused = |rule: &str| invalid(Parameter::SinkUrl, url, rule);
        let uri: Uri = url
            .parse()
            .map_err(|_| refused("an absolute http:// or https:// URL"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(refused("an http:// or https:// URL")),
        };
        #[cfg(not(feature = "tls"))]
        if tls {
            return Err(refused(
                "an http:// URL: https needs guard-endpoints' `tls` feature",
            ));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| refused("a URL with a host"))?;
        if authority.as_str().contains('@') {
            return Err(invalid(
                Parameter::SinkUrl,
                "(a URL with credentials)",
                "a URL without a user or password",
            ));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(refused("a URL with a host"));
        }
        // A port written but out of range reads as none: refused, never
        // taken for the scheme's default.
        let written = authority.as_str();
        let after_host = written.rfind(']').map_or(written, |end| &written[end..]);
        let port = match (after_host.contains(':'), authority.port_u16()) {
            (false, _) => {
                if tls {
                    443
                } else {
                    80
                }
            }
            (true, Some(port)) if port != 0 => port,
            (true, _) => return Err(refused("a URL with a port from 1 to 65535")),
        };
        let authority = HeaderValue::from_str(authority.as_str())
            .map_err(|_| refused("a host a Host header can carry"))?;
        Ok(HttpSink {
            target: Target {
                host: host.to_owned(),
                port,
                authority,
                uri,
                tls,
            },
            timeout: DEFAULT_TIMEOUT,
            content_type: HeaderValue::from_static("application/octet-stream"),
            #[cfg(feature = "tls")]
            tls: None,
            headers: Vec::new(),
            in_flight: 1,
            permits: Semaphore::new(1),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Lets up to `in_flight` requests out at once (1 to
    /// [`MAX_IN_FLIGHT`]; 1 unless set), each on a kept-alive connection
    /// of its own: those in flight together may arrive in any order.
    pub fn with_in_flight(mut self, in_flight: usize) -> Result<Self, InvalidInput> {
        if !(1..=MAX_IN_FLIGHT).contains(&in_flight) {
            return Err(invalid(
                Parameter::InFlight,
                in_flight.to_string(),
                &format!("from 1 to {MAX_IN_FLIGHT}"),
            ));
        }
        self.in_flight = in_flight;
        self.permits = Semaphore::new(in_flight);
        Ok(self)
    }

    /// Sends `name: value` with every request (an `Authorization`, a
    /// tenant). Refuses a name the sink sets itself (`Host`,
    /// `Content-Type`: see [`with_content_type`](Self::with_content_type),
    /// `Content-Length`, `Transfer-Encoding`, `Connection`,
    /// `Idempotency-Key`, any `Guard-…`), a name given twice, and a name
    /// or value a header cannot carry; the value is never shown in an
    /// error or in `Debug` (it is often a secret).
    ///
    /// ```
    /// use guard_endpoints::sink::http::HttpSink;
    ///
    /// let sink = HttpSink::new("https://cloud.example/ingest")?
    ///     .with_header("Authorization", "Bearer 0123456789")?;
    /// assert!(HttpSink::new("https://cloud.example/ingest")?.with_header("Host", "x").is_err());
    /// # Ok::<(), guard_endpoints::InvalidInput>(())
    /// ```
    pub fn with_header(mut self, name: &str, value: &str) -> Result<Self, InvalidInput> {
        let refused = |rule: &str| invalid(Parameter::Header, name, rule);
        let parsed = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| refused("a header name (letters, digits and `-`)"))?;
        let own = [
            "host",
            "content-type",
            "content-length",
            "transfer-encoding",
            "connection",
            IDEMPOTENCY_KEY,
        ];
        if own.contains(&parsed.as_str()) || parsed.as_str().starts_with("guard-") {
            return Err(refused("a header the sink does not set itself"));
        }
        if self.headers.iter().any(|(n, _)| *n == parsed) {
            return Err(refused("a header given once"));
        }
        let mut value = HeaderValue::from_str(value).map_err(|_| {
            invalid(
                Parameter::Header,
                format!("{name}: (its value)"),
                "a value of visible ASCII characters and spaces",
            )
        })?;
        value.set_sensitive(true);
        self.headers.push((parsed, value));
        Ok(self)
    }

    /// Requests let out at once.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Each request, connecting included, ends within `timeout` (at least
    /// a millisecond).
    pub fn with_timeout(mut self, timeout: Duration) -> Result<Self, InvalidInput> {
        if timeout < Duration::from_millis(1) {
            return Err(invalid(
                Parameter::RequestTimeout,
                format!("{timeout:?}"),
                "at least 1 ms",
            ));
        }
        self.timeout = timeout;
        Ok(self)
    }

    /// The `Content-Type` of every request: a media type, `type/subtype`
    /// with any `; parameters` (`application/json; charset=utf-8`).
    pub fn with_content_type(mut self, content_type: &str) -> Result<Self, InvalidInput> {
        self.content_type = HeaderValue::from_str(content_type)
            .ok()
            .filter(|_| is_media_type(content_type))
            .ok_or_else(|| {
                invalid(
                    Parameter::ContentType,
                    content_type,
                    "a media type a header can carry, such as \"application/json\"",
                )
            })?;
        Ok(self)
    }

    /// The TLS settings of an `https://` URL (trusted roots, a client
    /// certificate); the system's roots without it.
    #[cfg(feature = "tls")]
    pub fn with_tls(mut self, config: std::sync::Arc<rustls::ClientConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    /// The URL requests go to.
    pub fn url(&self) -> &Uri {
        &self.target.uri
    }

    /// A new connection to the target, TLS included.
    async fn connect(&self) -> Result<Kept, String> {
        let tcp = async_net::TcpStream::connect((self.target.host.as_str(), self.target.port))
            .await
            .map_err(|e| format!("connect to {}: {e}", self.target.authority_text()))?;
        // A request is written whole before its answer is read.
        let _ = tcp.set_nodelay(true);
        let io: Box<dyn Io> = if self.target.tls {
            self.wrap_tls(tcp).await?
        } else {
            Box::new(tcp)
        };
        let (sender, driver) = hyper::client::conn::http1::handshake(FuturesIo::new(io))
            .await
            .map_err(|e| format!("HTTP handshake with {}: {e}", self.target.authority_text()))?;
        Ok(Kept {
            sender,
            driver: Box::pin(driver),
        })
    }

    #[cfg(feature = "tls")]
    async fn wrap_tls(&self, tcp: async_net::TcpStream) -> Result<Box<dyn Io>, String> {
        let config = match &self.tls {
            Some(config) => config.clone(),
            // The system's roots, as an MQTT connection without a CA.
            None => crate::mqtt::MqttTls::new()
                .client_config()
                .map_err(|e| e.to_string())?,
        };
        let name = rustls::pki_types::ServerName::try_from(self.target.host.clone())
            .map_err(|e| format!("TLS server name {:?}: {e}", self.target.host))?;
        let stream = futures_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {}: {e}", self.target.authority_text()))?;
        Ok(Box::new(stream))
    }

    #[cfg(not(feature = "tls"))]
    async fn wrap_tls(&self, _tcp: async_net::TcpStream) -> Result<Box<dyn Io>, String> {
        // `new` refuses https without the feature.
        Err("https needs guard-endpoints' `tls` feature".to_owned())
    }

    fn request(&self, message: &Outgoing<'_>) -> Result<Request<Full<Bytes>>, SinkError> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(self.target.uri.path_and_query().map_or("/", |p| p.as_str()))
            .header(HOST, self.target.authority.clone())
            .header(CONTENT_TYPE, self.content_type.clone())
            .header(IDEMPOTENCY_KEY, header_text(message.id))
            .header(ORIGIN_HEADER, header_text(message.origin));
        if let Some(fence) = message.fence {
            request = request.header(FENCE_HEADER, fence);
        }
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        request
            .body(Full::new(Bytes::copy_from_slice(message.payload)))
            .map_err(|e| SinkError::Permanent {
                reason: format!("request not built: {e}"),
            })
    }

    /// One exchange on `kept`: the answer's status, headers and body (up
    /// to [`BODY_LIMIT`]), the connection driven meanwhile, and whether
    /// the connection is still open (a finished one is never polled
    /// again).
    async fn exchange(
        kept: &mut Kept,
        request: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, hyper::HeaderMap, Bytes, bool), String> {
        let Kept { sender, driver } = kept;
        let answer = async {
            sender
                .ready()
                .await
                .map_err(|e| format!("connection not ready: {e}"))?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| format!("request failed: {e}"))?;
            let (head, body) = response.into_parts();
            let body = Limited::new(body, BODY_LIMIT)
                .collect()
                .await
                .map_err(|e| format!("answer's body: {e}"))?
                .to_bytes();
            Ok((head.status, head.headers, body))
        };
        let mut answer = std::pin::pin!(answer);
        let driven = future::or(async { Some(answer.as_mut().await) }, async {
            // The connection may end right after the answer (a server
            // that closes once it has answered): what it read is already
            // handed to the request side, which still completes, with
            // the answer or with the reason it has none.
            let _ = driver.as_mut().await;
            None
        })
        .await;
        match driven {
            Some(result) => result.map(|answered| (answered, true)),
            None => answer.await.map(|answered| (answered, false)),
        }
        .map(|((status, headers, body), open)| (status, headers, body, open))
    }

    /// The kept-alive connection used last, if any is idle.
    fn take_idle(&self) -> Option<Kept> {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
    }

    async fn send_once(&self, message: &Outgoing<'_>) -> Result<(), SinkError> {
        let request = self.request(message)?;
        let _permit = self.permits.acquire().await;
        // Taken out while in use: a request cut short (its timeout, its
        // caller gone) leaves no half-used connection behind.
        let mut reusable = None;
        while let Some(mut k) = self.take_idle() {
            // One the server closed while idle is finished: replaced
            // before sending rather than failed on.
            if future::poll_once(k.driver.as_mut()).await.is_none() {
                reusable = Some(k);
                break;
            }
        }
        let mut connection = match reusable {
            Some(k) => k,
            None => self.connect().await.map_err(transient)?,
        };
        let (status, headers, body, open) = Self::exchange(&mut connection, request)
            .await
            .map_err(transient)?;
        let closing = headers
            .get(hyper::header::CONNECTION)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        if open && !closing {
            self.idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(connection);
        }
        outcome(status, &headers, &body, message.fence)
    }
}

impl Target {
    /// The URL to show: its query, often a token, as `?…`.
    fn shown(&self) -> String {
        let uri = &self.uri;
        let query = if uri.query().is_some() { "?…" } else { "" };
        format!(
            "{}://{}{}{query}",
            uri.scheme_str().unwrap_or("http"),
            self.authority_text(),
            uri.path()
        )
    }

    fn authority_text(&self) -> &str {
        self.authority.to_str().unwrap_or("the sink")
    }
}

impl MessageSink for HttpSink {
    fn send<'a>(&'a self, message: &'a Outgoing<'a>) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let timeout = self.timeout;
            let timed_out = async {
                Timer::after(timeout).await;
                Err(transient(format!("no answer within {timeout:?}")))
            };
            future::or(self.send_once(message), timed_out).await
        })
    }
}

fn transient(reason: String) -> SinkError {
    SinkError::Transient {
        reason,
        retry_after: None,
    }
}

/// What an answer means (see the module's table).
fn outcome(
    status: StatusCode,
    headers: &hyper::HeaderMap,
    body: &[u8],
    fence: Option<u64>,
) -> Result<(), SinkError> {
    if status.is_success() {
        return Ok(());
    }
    let said = || {
        let excerpt = &body[..body.len().min(BODY_EXCERPT)];
        let text = String::from_utf8_lossy(excerpt);
        let more = if body.len() > BODY_EXCERPT { "…" } else { "" };
        format!("HTTP {}: {}{more}", status.as_u16(), text.trim())
    };
    match status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
            Err(SinkError::Transient {
                reason: said(),
                retry_after: headers.get(RETRY_AFTER).and_then(retry_after),
            })
        }
        StatusCode::REQUEST_TIMEOUT => Err(transient(said())),
        s if s.is_server_error() => Err(transient(said())),
        StatusCode::CONFLICT => {
            let highest = headers
                .get(HIGHEST_FENCE_HEADER)
                .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
            match (fence, highest) {
                (Some(fence), Some(highest)) => Err(SinkError::StaleFence { fence, highest }),
                _ => Err(SinkError::Permanent { reason: said() }),
            }
        }
        _ => Err(SinkError::Permanent { reason: said() }),
    }
}

/// A `Retry-After` value: delta-seconds or an HTTP date (read by
/// guard-core's `RetryAfter` against the system clock), at most a day.
fn retry_after(value: &HeaderValue) -> Option<Duration> {
    let asked = RetryAfter::parse(value.to_str().ok()?).ok()?;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    Some(asked.delay_from(now).min(MAX_RETRY_AFTER))
}

/// `text` as a header value: visible ASCII as it is, anything else
/// percent-encoded (so `%` itself too).
fn header_text(text: &str) -> HeaderValue {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x21..=0x7e).contains(&b) && b != b'%' || b == b' ' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    // Only visible ASCII and spaces are left.
    HeaderValue::from_str(out.trim()).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_outcomes() {
        let none = hyper::HeaderMap::new();
        assert_eq!(outcome(StatusCode::NO_CONTENT, &none, b"", None), Ok(()));
        let mut later = hyper::HeaderMap::new();
        later.insert(RETRY_AFTER, HeaderValue::from_static("7"));
        assert_eq!(
            outcome(StatusCode::TOO_MANY_REQUESTS, &later, b"slow down", None),
            Err(SinkError::Transient {
                reason: "HTTP 429: slow down".into(),
                retry_after: Some(Duration::from_secs(7)),
            })
        );
        assert!(
            outcome(StatusCode::BAD_GATEWAY, &none, b"", None).is_err_and(|e| e.is_transient())
        );
        assert!(
            outcome(StatusCode::REQUEST_TIMEOUT, &none, b"", None).is_err_and(|e| e.is_transient())
        );
        let long = "x".repeat(1000);
        let Err(SinkError::Permanent { reason }) =
            outcome(StatusCode::BAD_REQUEST, &none, long.as_bytes(), None)
        else {
            panic!("a 400 is permanent")
        };
        assert_eq!(reason, format!("HTTP 400: {}…", "x".repeat(BODY_EXCERPT)));
        assert!(matches!(
            outcome(StatusCode::MOVED_PERMANENTLY, &none, b"", None),
            Err(SinkError::Permanent { .. })
        ));
        let mut fenced = hyper::HeaderMap::new();
        fenced.insert(HIGHEST_FENCE_HEADER, HeaderValue::from_static("12"));
        assert_eq!(
            outcome(StatusCode::CONFLICT, &fenced, b"", Some(9)),
            Err(SinkError::StaleFence {
                fence: 9,
                highest: 12
            })
        );
        assert!(matches!(
            outcome(StatusCode::CONFLICT, &none, b"", Some(9)),
            Err(SinkError::Permanent { .. })
        ));
    }

    #[test]
    fn retry_after_is_seconds_or_a_date_and_at_most_a_day() {
        let at = |s: &'static str| retry_after(&HeaderValue::from_static(s));
        assert_eq!(at("120"), Some(Duration::from_secs(120)));
        assert_eq!(at("99999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(at("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO));
        let soon = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
        let wait = retry_after(&HeaderValue::from_str(&soon).unwrap()).unwrap();
        assert!(
            wait <= Duration::from_secs(30) && wait >= Duration::from_secs(28),
            "{wait:?}"
        );
        assert_eq!(at("soon"), None);
        assert_eq!(at("-5"), None);
    }

    #[test]
    fn ids_and_origins_are_carried_whole() {
        assert_eq!(
            header_text("orders:1700000000000-0"),
            "orders:1700000000000-0"
        );
        assert_eq!(header_text("100%"), "100%25");
        assert_eq!(header_text("a\r\nb"), "a%0D%0Ab");
        assert_eq!(header_text("été"), "%C3%A9t%C3%A9");
    }

    #[test]
    fn urls_are_refused_naming_the_rule() {
        for (url, rule) in [
            ("", "an absolute"),
            ("ftp://example.com/", "an http:// or https:// URL"),
            ("/relative", "an http:// or https:// URL"),
            (
                "http://user:secret@example.com/",
                "without a user or password",
            ),
        ] {
            let e = HttpSink::new(url).unwrap_err();
            assert_eq!(e.parameter, Parameter::SinkUrl, "{url}");
            assert!(e.to_string().contains(rule), "{url}: {e}");
            assert!(!e.to_string().contains("secret"), "{e}");
        }
        let sink = HttpSink::new("http://127.0.0.1:9/in?x=1").unwrap();
        assert_eq!(
            (sink.target.host.as_str(), sink.target.port),
            ("127.0.0.1", 9)
        );
        let v6 = HttpSink::new("http://[::1]/").unwrap();
        assert_eq!((v6.target.host.as_str(), v6.target.port), ("::1", 80));
        assert!(
            HttpSink::new("http://h/")
                .unwrap()
                .with_timeout(Duration::ZERO)
                .is_err()
        );
        for refused in [
            "a\nb",
            "",
            "json",
            "application/",
            "/json",
            "a/b/c",
            "text /plain",
        ] {
            assert!(
                HttpSink::new("http://h/")
                    .unwrap()
                    .with_content_type(refused)
                    .is_err(),
                "{refused:?}"
            );
        }
        for taken in [
            "application/json",
            "application/json; charset=utf-8",
            "application/vnd.api+json",
        ] {
            assert!(
                HttpSink::new("http://h/")
                    .unwrap()
                    .with_content_type(taken)
                    .is_ok(),
                "{taken:?}"
            );
        }
    }

    #[test]
    fn a_url_s_query_is_never_shown() {
        let sink = HttpSink::new("https://cloud.example:8443/in?api_key=TopSecret42").unwrap();
        let shown = format!("{sink:?}");
        assert!(shown.contains("https://cloud.example:8443/in?…"), "{shown}");
        assert!(!shown.contains("TopSecret42"), "{shown}");
        let plain = HttpSink::new("http://h/in").unwrap();
        assert!(format!("{plain:?}").contains("http://h/in\""), "{plain:?}");
    }
}
