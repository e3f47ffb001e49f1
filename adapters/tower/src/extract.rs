//! What a request is limited by: its key.

use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::header::{FORWARDED, HeaderMap, HeaderName};
use http::request::Parts;

use crate::error::ConfigError;

/// A request's key: borrowed from the request, owned, or an IP address
/// written in place (a key per request must not cost an allocation).
pub struct Key<'a>(Repr<'a>);

enum Repr<'a> {
    Borrowed(&'a str),
    Owned(String),
    Inline(Inline),
}

/// Room for any IP address in text: 45 bytes for the longest IPv6 form
/// (`ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`).
#[derive(Clone, Copy)]
struct Inline {
    len: u8,
    bytes: [u8; 45],
}

impl Inline {
    const EMPTY: Inline = Inline {
        len: 0,
        bytes: [0; 45],
    };

    fn push(&mut self, text: &[u8]) -> fmt::Result {
        let start = usize::from(self.len);
        let end = start + text.len();
        let slot = self.bytes.get_mut(start..end).ok_or(fmt::Error)?;
        slot.copy_from_slice(text);
        self.len = u8::try_from(end).map_err(|_| fmt::Error)?;
        Ok(())
    }

    /// One byte: an octet's digits and dots are written one by one, since
    /// a slice copy of one to three bytes is a call to `memmove`.
    fn push_byte(&mut self, byte: u8) -> fmt::Result {
        let slot = self
            .bytes
            .get_mut(usize::from(self.len))
            .ok_or(fmt::Error)?;
        *slot = byte;
        self.len = self.len.checked_add(1).ok_or(fmt::Error)?;
        Ok(())
    }

    fn push_decimal(&mut self, n: u8) -> fmt::Result {
        if n >= 100 {
            self.push_byte(b'0' + n / 100)?;
        }
        if n >= 10 {
            self.push_byte(b'0' + n / 10 % 10)?;
        }
        self.push_byte(b'0' + n % 10)
    }

    /// Dotted decimal, without `core::fmt` (which costs more than the
    /// limiter's decision).
    fn ipv4(ip: Ipv4Addr) -> Inline {
        let mut inline = Inline::EMPTY;
        for (i, octet) in ip.octets().into_iter().enumerate() {
            // 15 bytes at most: never full.
            let _ = if i > 0 {
                inline.push_byte(b'.')
            } else {
                Ok(())
            };
            let _ = inline.push_decimal(octet);
        }
        inline
    }

    fn as_str(&self) -> &str {
        // Only ASCII is ever written.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl fmt::Write for Inline {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes())
    }
}

impl Key<'_> {
    /// The key.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Borrowed(s) => s,
            Repr::Owned(s) => s,
            Repr::Inline(inline) => inline.as_str(),
        }
    }

    /// The key, owned.
    pub fn into_owned(self) -> String {
        match self.0 {
            Repr::Owned(s) => s,
            _ => self.as_str().to_owned(),
        }
    }
}

impl<'a> From<&'a str> for Key<'a> {
    fn from(key: &'a str) -> Self {
        Key(Repr::Borrowed(key))
    }
}

impl From<String> for Key<'_> {
    fn from(key: String) -> Self {
        Key(Repr::Owned(key))
    }
}

/// The address in text, as `IpAddr`'s `Display` writes it.
impl From<IpAddr> for Key<'_> {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Key(Repr::Inline(Inline::ipv4(v4))),
            IpAddr::V6(v6) => {
                let mut inline = Inline::EMPTY;
                match write!(inline, "{v6}") {
                    Ok(()) => Key(Repr::Inline(inline)),
                    Err(_) => Key(Repr::Owned(v6.to_string())),
                }
            }
        }
    }
}

/// The key of the IPv6 network of `prefix` bits (1 to 127) that holds
/// `ip`: `2001:db8:1:2::/64`.
fn network_key(ip: Ipv6Addr, prefix: u8) -> Key<'static> {
    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
    let network = Ipv6Addr::from(u128::from(ip) & mask);
    // At most 39 bytes of address and 4 of prefix: it fits.
    let mut inline = Inline::EMPTY;
    match write!(inline, "{network}/{prefix}") {
        Ok(()) => Key(Repr::Inline(inline)),
        Err(_) => Key(Repr::Owned(format!("{network}/{prefix}"))),
    }
}

impl fmt::Debug for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reads the key a request is limited by: requests with the same key share
/// one quota.
///
/// `None` means the request has no key; the layer then does what
/// [`MissingKey`](crate::MissingKey) says. Implementations must be cheap
/// and must not block: they run on every request, before the inner
/// service.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key of `request`, borrowed from it where possible.
    fn extract<'a>(&self, request: &'a Parts) -> Option<Key<'a>>;

    /// What the key is read from, completing "the rate limit needs ...":
    /// written in the `400` answer to a request without one, and in logs.
    fn describe(&self) -> &str;
}

/// Where [`ClientIp`] reads the address from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trust {
    /// The peer address only.
    Peer,
    /// `X-Forwarded-For`, this many entries from the right.
    XForwardedFor(usize),
    /// `Forwarded` (RFC 7239), this many elements from the right.
    Forwarded(usize),
}

/// The client's IP address (without the port; an IPv4-mapped IPv6 address
/// as the IPv4 one).
///
/// By default ([`ClientIp::peer`]) the address is the TCP peer's, from the
/// request extension axum's `into_make_service_with_connect_info::<SocketAddr>()`
/// adds (`ConnectInfo<SocketAddr>`, with the default `axum` feature) or a
/// bare `SocketAddr` extension (for servers built on hyper directly).
/// Without either, the request has no key: serve the router with connect
/// info.
///
/// Behind reverse proxies the peer is the proxy, so every client would
/// share one quota. [`ClientIp::x_forwarded_for`] and
/// [`ClientIp::forwarded`] read the address a proxy recorded instead.
///
/// **Spoofing risk.** A forwarding header is whatever the client sent,
/// with each proxy's entry appended. Trust it only when every request
/// reaches the server through exactly the number of proxies you give,
/// each appending its peer's address: the key is then the entry that many
/// positions from the right, which your outermost proxy wrote. With fewer
/// entries than that the request has no key (it did not come through your
/// proxies as configured); without the header at all the peer address is
/// used (the request did not come through a proxy). Taking the leftmost
/// entry, or trusting the header on a server clients reach directly, lets
/// every client choose its own key and escape the limit.
///
/// An IPv6 client is keyed by its network, the first 64 bits of its
/// address by default ([`DEFAULT_IPV6_PREFIX`]): a host is usually given a
/// whole /64, and keyed by its full address it could take a fresh key for
/// every request and fill the limiter's table. The key is then written as
/// the network (`2001:db8:1:2::/64`); [`ClientIp::with_ipv6_prefix`]
/// chooses another length (128 keys each address alone). IPv4 clients
/// (and IPv4-mapped IPv6 ones) are keyed by their address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientIp {
    trust: Trust,
    /// Leading bits of an IPv6 address that make its key, 1 to 128.
    ipv6_prefix: u8,
}

/// The bits of an IPv6 client's address its key keeps unless told
/// otherwise: its /64.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

impl Default for ClientIp {
    fn default() -> Self {
        Self::peer()
    }
}

impl ClientIp {
    /// The TCP peer's address; forwarding headers are ignored.
    pub const fn peer() -> Self {
        ClientIp {
            trust: Trust::Peer,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Keys an IPv6 client by the first `bits` of its address (1 to 128;
    /// [`DEFAULT_IPV6_PREFIX`] unless told). Anything else is refused.
    pub fn with_ipv6_prefix(mut self, bits: u8) -> Result<Self, ConfigError> {
        if !(1..=128).contains(&bits) {
            return Err(ConfigError::Ipv6Prefix { value: bits });
        }
        self.ipv6_prefix = bits;
        Ok(self)
    }

    /// The `X-Forwarded-For` entry `trusted_proxies` positions from the
    /// right (1: the one your single proxy appended). See the spoofing
    /// risk above. Zero proxies is refused.
    pub fn x_forwarded_for(trusted_proxies: usize) -> Result<Self, ConfigError> {
        Self::trusting(trusted_proxies, Trust::XForwardedFor(trusted_proxies))
    }

    /// The `for=` of the `Forwarded` element `trusted_proxies` positions
    /// from the right (RFC 7239). See the spoofing risk above. Zero proxies
    /// is refused.
    pub fn forwarded(trusted_proxies: usize) -> Result<Self, ConfigError> {
        Self::trusting(trusted_proxies, Trust::Forwarded(trusted_proxies))
    }

    fn trusting(trusted_proxies: usize, trust: Trust) -> Result<Self, ConfigError> {
        if trusted_proxies == 0 {
            return Err(ConfigError::TrustedProxies {
                value: trusted_proxies,
            });
        }
        Ok(ClientIp {
            trust,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        })
    }

    /// The client's address under this trust, if the request has one (the
    /// whole address: the key of an IPv6 one is its network).
    pub fn client_addr(&self, request: &Parts) -> Option<IpAddr> {
        let forwarded = match self.trust {
            Trust::Peer => None,
            Trust::XForwardedFor(hops) => {
                forwarded_entry(&request.headers, &X_FORWARDED_FOR, hops, parse_xff_node)
            }
            Trust::Forwarded(hops) => {
                forwarded_entry(&request.headers, &FORWARDED, hops, parse_forwarded_element)
            }
        };
        match forwarded {
            Some(entry) => entry,
            None => peer_addr(request).map(|addr| addr.ip()),
        }
        .map(|ip| ip.to_canonical())
    }
}

impl KeyExtractor for ClientIp {
    fn extract<'a>(&self, request: &'a Parts) -> Option<Key<'a>> {
        self.client_addr(request).map(|ip| match ip {
            IpAddr::V6(v6) if self.ipv6_prefix < 128 => network_key(v6, self.ipv6_prefix),
            ip => Key::from(ip),
        })
    }

    fn describe(&self) -> &str {
        match self.trust {
            Trust::Peer => "the client's IP address (axum's ConnectInfo<SocketAddr>)",
            Trust::XForwardedFor(_) => "the client's IP address (from X-Forwarded-For)",
            Trust::Forwarded(_) => "the client's IP address (from Forwarded)",
        }
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The peer address the server recorded in the request's extensions.
fn peer_addr(request: &Parts) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) = request
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*addr);
    }
    request.extensions.get::<SocketAddr>().copied()
}

/// The entry `hops` positions from the right of the comma-separated list
/// made of every `name` field in order: `None` when there is no such
/// field (use the peer), `Some(None)` when there is one but the entry is
/// missing or is not an address (no key).
fn forwarded_entry(
    headers: &HeaderMap,
    name: &HeaderName,
    hops: usize,
    parse: fn(&str) -> Option<IpAddr>,
) -> Option<Option<IpAddr>> {
    let mut fields = headers.get_all(name).iter().peekable();
    fields.peek()?;
    // Collected once: the list is short (one entry per proxy), and it must
    // be counted from the right across several fields.
    let mut entries: Vec<&str> = Vec::new();
    for field in fields {
        let Ok(text) = field.to_str() else {
            return Some(None);
        };
        entries.extend(split_outside_quotes(text, ','));
    }
    let entry = entries.len().checked_sub(hops).and_then(|i| entries.get(i));
    Some(entry.and_then(|e| parse(e.trim())))
}

/// Splits at `sep` where it is not inside a quoted string.
fn split_outside_quotes(text: &str, sep: char) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let s = rest?;
        let mut quoted = false;
        let mut escaped = false;
        for (i, c) in s.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                c if c == sep && !quoted => {
                    rest = Some(&s[i + c.len_utf8()..]);
                    return Some(&s[..i]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(s)
    })
}

/// An `X-Forwarded-For` entry: an address, with a port for the proxies
/// that add one.
fn parse_xff_node(entry: &str) -> Option<IpAddr> {
    parse_node(entry)
}

/// The `for=` node of one `Forwarded` element (`for=192.0.2.60`,
/// `for="[2001:db8::1]:4711"`); `unknown` and obfuscated nodes are not
/// addresses.
fn parse_forwarded_element(element: &str) -> Option<IpAddr> {
    split_outside_quotes(element, ';').find_map(|pair| {
        let (key, value) = pair.trim().split_once('=')?;
        if !key.trim().eq_ignore_ascii_case("for") {
            return None;
        }
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        parse_node(value)
    })
}

/// `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]` or
/// `[2001:db8::1]:80`.
fn parse_node(node: &str) -> Option<IpAddr> {
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = node.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    let inner = node.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<IpAddr>().ok()
}

/// The value of a request header: clients sharing a value share a quota
/// (an API key, a tenant id).
///
/// A request without the header, with an empty one, or with one that is
/// not visible ASCII has no key. With several fields of that name, the
/// first is used.
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
    describe: String,
}

impl HeaderKey {
    /// The header called `name` (case-insensitive); refused when `name` is
    /// not a valid header name.
    pub fn new(name: &str) -> Result<Self, ConfigError> {
        let header =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| ConfigError::HeaderName {
                value: name.to_owned(),
            })?;
        Ok(HeaderKey {
            describe: format!("the {header} header"),
            name: header,
        })
    }
}

impl KeyExtractor for HeaderKey {
    fn extract<'a>(&self, request: &'a Parts) -> Option<Key<'a>> {
        let value = request.headers.get(&self.name)?.to_str().ok()?;
        (!value.is_empty()).then_some(Key::from(value))
    }

    fn describe(&self) -> &str {
        &self.describe
    }
}

/// The request's path (without the query): each path has its own quota,
/// shared by every client. Every request has one. The path is taken as
/// sent, not decoded: `/a/b` and `/a/%62` are two keys although a router
/// may serve both from one handler; normalise paths in front of the layer,
/// or key with [`key_fn`] over the route, where that matters.
#[derive(Clone, Copy, Debug, Default)]
pub struct PathKey;

impl KeyExtractor for PathKey {
    fn extract<'a>(&self, request: &'a Parts) -> Option<Key<'a>> {
        Some(Key::from(request.uri.path()))
    }

    fn describe(&self) -> &str {
        "the request path"
    }
}

/// A key computed by a closure; see [`key_fn`].
pub struct KeyFn<F> {
    f: F,
    describe: String,
}

impl<F> fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyFn")
            .field("describe", &self.describe)
            .finish_non_exhaustive()
    }
}

/// A key computed by `f` from the request's head; `describe` says what it
/// reads (for the `400` answer when `f` returns `None`).
///
/// ```
/// use guard_tower::key_fn;
///
/// // Tenants named by the first path segment: /acme/orders -> "acme".
/// let tenant = key_fn("a tenant in the path", |request| {
///     let segment = request.uri.path().trim_start_matches('/').split('/').next()?;
///     (!segment.is_empty()).then(|| segment.to_owned())
/// });
/// # let _ = tenant;
/// ```
pub fn key_fn<F>(describe: impl Into<String>, f: F) -> KeyFn<F>
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    KeyFn {
        f,
        describe: describe.into(),
    }
}

impl<F> KeyExtractor for KeyFn<F>
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn extract<'a>(&self, request: &'a Parts) -> Option<Key<'a>> {
        (self.f)(request).map(Key::from)
    }

    fn describe(&self) -> &str {
        &self.describe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)], peer: Option<&str>) -> Parts {
        let mut builder = http::Request::builder().uri("/a/b?c=d");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let (mut parts, ()) = builder.body(()).unwrap().into_parts();
        if let Some(peer) = peer {
            parts.extensions.insert(peer.parse::<SocketAddr>().unwrap());
        }
        parts
    }

    fn key(extractor: &dyn KeyExtractor, parts: &Parts) -> Option<String> {
        extractor.extract(parts).map(Key::into_owned)
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for text in [
            "0.0.0.0",
            "9.10.99.100",
            "255.255.255.255",
            "192.0.2.1",
            "::1",
            "2001:db8::1",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "::ffff:255.255.255.255",
        ] {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(Key::from(ip).as_str(), ip.to_string(), "{text}");
        }
    }

    #[test]
    fn peer_ignores_forwarding_headers() {
        let p = parts(&[("x-forwarded-for", "9.9.9.9")], Some("10.0.0.1:5000"));
        assert_eq!(key(&ClientIp::peer(), &p).as_deref(), Some("10.0.0.1"));
        assert_eq!(key(&ClientIp::peer(), &parts(&[], None)), None);
    }

    #[test]
    fn ipv4_mapped_peers_are_ipv4() {
        let p = parts(&[], Some("[::ffff:192.0.2.1]:80"));
        assert_eq!(key(&ClientIp::peer(), &p).as_deref(), Some("192.0.2.1"));
    }

    #[test]
    fn x_forwarded_for_counts_from_the_right() {
        let one = ClientIp::x_forwarded_for(1).unwrap();
        let two = ClientIp::x_forwarded_for(2).unwrap();
        // The client sent "6.6.6.6" itself; proxy 1 appended 203.0.113.7,
        // proxy 2 appended proxy 1's address.
        let p = parts(
            &[
                ("x-forwarded-for", "6.6.6.6, 203.0.113.7"),
                ("x-forwarded-for", "10.0.0.2"),
            ],
            Some("10.0.0.3:1"),
        );
        assert_eq!(key(&one, &p).as_deref(), Some("10.0.0.2"));
        assert_eq!(key(&two, &p).as_deref(), Some("203.0.113.7"));
        // Fewer entries than proxies: not through the proxies, no key.
        let short = parts(&[("x-forwarded-for", "203.0.113.7")], Some("10.0.0.3:1"));
        assert_eq!(key(&two, &short), None);
        // Not an address: no key.
        let junk = parts(&[("x-forwarded-for", "1.2.3.4, junk")], Some("10.0.0.3:1"));
        assert_eq!(key(&one, &junk), None);
        // No header: the peer.
        let direct = parts(&[], Some("10.0.0.3:1"));
        assert_eq!(key(&one, &direct).as_deref(), Some("10.0.0.3"));
        // A port is dropped; an IPv6 client is keyed by its /64.
        let port = parts(&[("x-forwarded-for", "[2001:db8::1]:443")], None);
        assert_eq!(key(&one, &port).as_deref(), Some("2001:db8::/64"));
        let whole = one.with_ipv6_prefix(128).unwrap();
        assert_eq!(key(&whole, &port).as_deref(), Some("2001:db8::1"));
    }

    #[test]
    fn forwarded_reads_the_for_node() {
        let one = ClientIp::forwarded(1).unwrap();
        let p = parts(
            &[(
                "forwarded",
                r#"for=6.6.6.6;proto=http, for="[2001:db8:cafe::17]:4711";by=10.0.0.1"#,
            )],
            Some("10.0.0.1:1"),
        );
        assert_eq!(key(&one, &p).as_deref(), Some("2001:db8:cafe::/64"));
        let two = ClientIp::forwarded(2).unwrap();
        assert_eq!(key(&two, &p).as_deref(), Some("6.6.6.6"));
        let hidden = parts(&[("forwarded", "for=_hidden")], Some("10.0.0.1:1"));
        assert_eq!(key(&one, &hidden), None);
        let quoted_comma = parts(
            &[("forwarded", r#"for=1.1.1.1;x="a,b", For=192.0.2.60"#)],
            None,
        );
        assert_eq!(key(&one, &quoted_comma).as_deref(), Some("192.0.2.60"));
        assert_eq!(key(&two, &quoted_comma).as_deref(), Some("1.1.1.1"));
    }

    #[test]
    fn zero_trusted_proxies_is_refused() {
        assert_eq!(
            ClientIp::x_forwarded_for(0),
            Err(ConfigError::TrustedProxies { value: 0 })
        );
        assert!(ClientIp::forwarded(0).is_err());
    }

    #[test]
    fn header_and_path_keys() {
        let api = HeaderKey::new("X-Api-Key").unwrap();
        assert_eq!(api.describe(), "the x-api-key header");
        let p = parts(&[("x-api-key", "k1")], None);
        assert_eq!(key(&api, &p).as_deref(), Some("k1"));
        assert_eq!(key(&api, &parts(&[("x-api-key", "")], None)), None);
        assert_eq!(key(&api, &parts(&[], None)), None);
        assert_eq!(key(&PathKey, &p).as_deref(), Some("/a/b"));
        let err = HeaderKey::new("x api").unwrap_err();
        assert_eq!(
            err,
            ConfigError::HeaderName {
                value: "x api".into()
            }
        );
        assert!(err.to_string().contains("\"x api\""), "{err}");
    }
}
