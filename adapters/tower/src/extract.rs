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
            Trust::XForwardedFor(hops) => forwarded_entry(
                &request.headers,
                &X_FORWARDED_FOR,
                hops,
                Grammar::XForwardedFor,
            ),
            Trust::Forwarded(hops) => {
                forwarded_entry(&request.headers, &FORWARDED, hops, Grammar::Forwarded)
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

/// Which list grammar a forwarding header has.
#[derive(Clone, Copy)]
enum Grammar {
    /// `X-Forwarded-For`: addresses separated by commas, nothing quoted.
    XForwardedFor,
    /// `Forwarded` (RFC 7239): elements separated by commas outside
    /// quoted strings.
    Forwarded,
}

/// The entry `hops` positions from the right of the list made of every
/// `name` field in order: `None` when there is no such field (use the
/// peer), `Some(None)` when there is one but the entry is missing or is
/// not an address (no key).
///
/// Only the trusted entries are read, from the right: the fields last to
/// first, each split from its end, so nothing a client wrote left of them
/// (an unterminated quote, a stray comma, bytes that are not ASCII) moves
/// where they begin. Empty list elements are skipped (RFC 9110's list
/// rule); a proxy never appends one.
fn forwarded_entry(
    headers: &HeaderMap,
    name: &HeaderName,
    hops: usize,
    grammar: Grammar,
) -> Option<Option<IpAddr>> {
    let fields = headers.get_all(name);
    fields.iter().next()?;
    let entry = fields
        .iter()
        .rev()
        .flat_map(|field| split_from_right(field.as_bytes(), grammar))
        .map(trim_ows)
        .filter(|element| !element.is_empty())
        .nth(hops.saturating_sub(1));
    let entry = entry.and_then(|bytes| std::str::from_utf8(bytes).ok());
    Some(entry.and_then(|text| match grammar {
        Grammar::XForwardedFor => parse_node(text),
        Grammar::Forwarded => parse_forwarded_element(text),
    }))
}

/// The elements of one field's list, last first: split at each comma (for
/// `Forwarded`, outside quoted strings), scanning from the field's end.
fn split_from_right(field: &[u8], grammar: Grammar) -> impl Iterator<Item = &[u8]> {
    let quotes = matches!(grammar, Grammar::Forwarded);
    let mut end = Some(field.len());
    std::iter::from_fn(move || {
        let stop = end?;
        let mut quoted = false;
        let mut i = stop;
        while let Some(at) = i.checked_sub(1) {
            i = at;
            match field.get(at) {
                // Inside a quoted string, a quote after an odd run of
                // backslashes is escaped, not the string's start.
                Some(b'"') if quotes && !(quoted && escaped_at(field, at)) => quoted = !quoted,
                Some(b',') if !quoted => {
                    end = Some(at);
                    return field.get(at + 1..stop);
                }
                _ => {}
            }
        }
        end = None;
        field.get(..stop)
    })
}

/// Whether the byte at `at` follows an odd number of backslashes.
fn escaped_at(field: &[u8], at: usize) -> bool {
    let before = field.get(..at).unwrap_or_default();
    before.iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1
}

/// `bytes` without leading and trailing spaces and tabs.
fn trim_ows(bytes: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !is_ows(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    bytes.get(start..end).unwrap_or_default()
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

/// The `for=` node of one `Forwarded` element (`for=192.0.2.60`,
/// `for="[2001:db8::1]:4711"`); `unknown` and obfuscated nodes are not
/// addresses, and neither is an element with two `for` parameters (RFC
/// 7239 allows one).
fn parse_forwarded_element(element: &str) -> Option<IpAddr> {
    let mut nodes = split_outside_quotes(element, ';').filter_map(|pair| {
        let (key, value) = pair.trim().split_once('=')?;
        key.trim()
            .eq_ignore_ascii_case("for")
            .then_some(value.trim())
    });
    let value = nodes.next()?;
    if nodes.next().is_some() {
        return None;
    }
    let value = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    parse_node(value)
}

/// A node: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]`,
/// `[2001:db8::1]:80`, an IPv6 address with a zone (`fe80::1%eth0`, the
/// zone dropped), or a port obfuscated as RFC 7239 allows (`:_p1`). Not an
/// address: anything else, the unspecified addresses (`0.0.0.0`, `::`),
/// an empty port, a zone on an IPv4 address.
fn parse_node(node: &str) -> Option<IpAddr> {
    let host = match node.strip_prefix('[') {
        Some(rest) => {
            let (inside, after) = rest.split_once(']')?;
            if !after.is_empty() && !after.strip_prefix(':').is_some_and(is_port) {
                return None;
            }
            inside
        }
        // One colon: an IPv4 address and its port. More: an IPv6
        // address without brackets, hence without a port.
        None => match node.split_once(':') {
            Some((host, port)) if !port.contains(':') => is_port(port).then_some(host)?,
            _ => node,
        },
    };
    let (address, zone) = match host.split_once('%') {
        Some((address, zone)) => (address, Some(zone)),
        None => (host, None),
    };
    let ip = address.parse::<IpAddr>().ok()?;
    let zone_fits = zone.is_none_or(|zone| ip.is_ipv6() && is_token(zone));
    // Canonical first: `::ffff:0.0.0.0` is the unspecified IPv4 address.
    (zone_fits && !ip.to_canonical().is_unspecified()).then_some(ip)
}

/// A port: one to five digits, or an obfuscated one (`_` and a token).
fn is_port(port: &str) -> bool {
    match port.strip_prefix('_') {
        Some(obfuscated) => is_token(obfuscated),
        None => (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// Letters, digits, `.`, `_` and `-`, at least one.
fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
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
    fn a_client_s_unterminated_quote_never_swallows_its_proxy_s_entry() {
        let one = ClientIp::forwarded(1).unwrap();
        let xff = ClientIp::x_forwarded_for(1).unwrap();
        let two_xff = ClientIp::x_forwarded_for(2).unwrap();
        // The proxy appends to the client's field, or adds a field.
        for headers in [
            vec![("forwarded", r#"for=6.6.6.6;x=", for=203.0.113.7"#)],
            vec![
                ("forwarded", r#"for=6.6.6.6;x=""#),
                ("forwarded", "for=203.0.113.7"),
            ],
            vec![("forwarded", r#"for="6.6.6.6, for=203.0.113.7"#)],
        ] {
            let p = parts(&headers, Some("10.0.0.1:1"));
            assert_eq!(key(&one, &p).as_deref(), Some("203.0.113.7"), "{headers:?}");
        }
        let p = parts(&[("x-forwarded-for", r#"6.6.6.6, ", 203.0.113.7"#)], None);
        assert_eq!(key(&xff, &p).as_deref(), Some("203.0.113.7"));
        // The entry before the proxy's is the client's own text: no key,
        // never an address the quote smuggled in.
        assert_eq!(key(&two_xff, &p), None);
        // A claimed address left of the trusted entry is never the key.
        let spoof = parts(
            &[("forwarded", r#"for=10.0.0.5;x="a, for=198.51.100.9"#)],
            None,
        );
        assert_eq!(key(&one, &spoof).as_deref(), Some("198.51.100.9"));
    }

    #[test]
    fn bytes_that_are_not_ascii_left_of_the_trusted_entries_do_not_matter() {
        let one = ClientIp::x_forwarded_for(1).unwrap();
        let mut p = parts(&[], Some("10.0.0.1:1"));
        p.headers.append(
            X_FORWARDED_FOR,
            http::HeaderValue::from_bytes(b"6.6.6.\xff, 203.0.113.7").unwrap(),
        );
        assert_eq!(key(&one, &p).as_deref(), Some("203.0.113.7"));
        let two = ClientIp::x_forwarded_for(2).unwrap();
        assert_eq!(key(&two, &p), None, "the client's own entry is no address");
    }

    #[test]
    fn empty_list_elements_are_skipped_and_a_second_for_is_no_address() {
        let one = ClientIp::x_forwarded_for(1).unwrap();
        let two = ClientIp::x_forwarded_for(2).unwrap();
        let p = parts(&[("x-forwarded-for", "192.0.2.1,, 203.0.113.7, ")], None);
        assert_eq!(key(&one, &p).as_deref(), Some("203.0.113.7"));
        assert_eq!(key(&two, &p).as_deref(), Some("192.0.2.1"));
        let fwd = ClientIp::forwarded(1).unwrap();
        let twice = parts(&[("forwarded", "for=192.0.2.1;for=203.0.113.7")], None);
        assert_eq!(key(&fwd, &twice), None);
    }

    /// One vector: the header's name, its field lines, the trusted
    /// proxies and the address expected (`None`: no key).
    type Vector = (
        &'static str,
        &'static [&'static [u8]],
        usize,
        Option<&'static str>,
    );

    /// Peer vectors: (header, field lines, trusted proxies, the address).
    /// Ported from realclientip-go's `realclientip_test.go` (A to D),
    /// client-ip and forwarded-header-value (F), actix-web's `info.rs` (G)
    /// and werkzeug's `ProxyFix` tests (H), each converted to counting
    /// from the right; E are adversarial cases built from the peers'
    /// behaviour (a client's open quote, non-ASCII bytes, ports, zones). Where
    /// the peers disagree we keep RFC 7239 and RFC 9110: empty list
    /// elements are skipped (realclientip-go counts them), a second `for`
    /// in one element is no address (it takes the first), an IPv6 zone is
    /// dropped rather than kept in the key.
    const PEER_VECTORS: &[Vector] = &[
        // A1: counted across three field lines.
        ("x-forwarded-for", &[b"4.4.4.4, 5.5.5.5", b"::1, fe80::382b:141b:fa4a:2a16%28", b"7.7.7.7.7, 8.8.8.8, 9.9.9.9, 10.10.10.10,11.11.11.11, 12.12.12.12"], 1, Some("12.12.12.12")),
        ("x-forwarded-for", &[b"4.4.4.4, 5.5.5.5", b"::1, fe80::382b:141b:fa4a:2a16%28", b"7.7.7.7.7, 8.8.8.8, 9.9.9.9, 10.10.10.10,11.11.11.11, 12.12.12.12"], 5, Some("8.8.8.8")),
        ("x-forwarded-for", &[b"4.4.4.4, 5.5.5.5", b"::1, fe80::382b:141b:fa4a:2a16%28", b"7.7.7.7.7, 8.8.8.8, 9.9.9.9, 10.10.10.10,11.11.11.11, 12.12.12.12"], 6, None),
        ("x-forwarded-for", &[b"4.4.4.4, 5.5.5.5", b"::1, fe80::382b:141b:fa4a:2a16%28", b"7.7.7.7.7, 8.8.8.8, 9.9.9.9, 10.10.10.10,11.11.11.11, 12.12.12.12"], 7, Some("fe80::382b:141b:fa4a:2a16")),
        ("x-forwarded-for", &[b"4.4.4.4, 5.5.5.5", b"::1, fe80::382b:141b:fa4a:2a16%28", b"7.7.7.7.7, 8.8.8.8, 9.9.9.9, 10.10.10.10,11.11.11.11, 12.12.12.12"], 10, Some("4.4.4.4")),
        ("x-forwarded-for", &[b"4.4.4.4, 5.5.5.5", b"::1, fe80::382b:141b:fa4a:2a16%28", b"7.7.7.7.7, 8.8.8.8, 9.9.9.9, 10.10.10.10,11.11.11.11, 12.12.12.12"], 11, None),
        // A3 to A5.
        ("forwarded", &[b"For=\"::ffff:bc15:0006\"", b"host=what;for=6.6.6.6;proto=https"], 1, Some("6.6.6.6")),
        ("forwarded", &[b"For=\"::ffff:bc15:0006\"", b"host=what;for=6.6.6.6;proto=https"], 2, Some("188.21.0.6")),
        ("forwarded", &[b"For=\"::ffff:bc15:0006\"", b"For=nope", b"host=what;for=6.6.6.6;proto=https"], 2, None),
        ("forwarded", &[b"For=\"::ffff:bc15:0006\"", b"For=0.0.0.0", b"host=what;for=6.6.6.6;proto=https"], 2, None),
        // B: ports, brackets, mapped and NAT64 addresses, junk.
        ("x-forwarded-for", &[b"2.2.2.2:3384, 3.3.3.3", b"4.4.4.4:39333"], 3, Some("2.2.2.2")),
        ("x-forwarded-for", &[b"[2607:f8b0:4004:83f::18]:3838"], 1, Some("2607:f8b0:4004:83f::18")),
        ("forwarded", &[b"host=what;for=6.6.6.6;proto=https", b"Host=blah;For=\"2607:f8b0:4004:83f::18\";Proto=https"], 1, Some("2607:f8b0:4004:83f::18")),
        ("forwarded", &[b"host=what;for=6.6.6.6;proto=https", b"For=\"[2607:f8b0:4004:83f::18%eth0]:3393\";Proto=https", b"Host=blah;For=[fe80::1111%zone]:9943;Proto=https"], 2, Some("2607:f8b0:4004:83f::18")),
        ("x-forwarded-for", &[b"3.3.3.3", b"4.4.4.4,[::ffff:188.0.2.128]:48483"], 1, Some("188.0.2.128")),
        ("x-forwarded-for", &[b"3.3.3.3", b"4.4.4.4, 64:ff9b::188.0.2.128"], 1, Some("64:ff9b::bc00:280")),
        ("x-forwarded-for", &[b"4.4.4.4, 5.5.5.5", b"::1, nope"], 1, None),
        ("x-forwarded-for", &[b"::1, nope", b"192.168.1.1, !?!, ::, 0.0.0.0"], 2, None),
        ("x-forwarded-for", &[b"[::ffff:0.0.0.0]:80"], 1, None),
        ("forwarded", &[b"host=what;for=:48485;proto=https,For=2.2.2.2", b"For=\"\", For=\"::ffff:192.168.1.1\""], 1, Some("192.168.1.1")),
        ("forwarded", &[b"host=what;for=:48485;proto=https,For=2.2.2.2", b"For=\"\", For=\"::ffff:192.168.1.1\""], 3, Some("2.2.2.2")),
        ("forwarded", &[b"host=what;for=:48485;proto=https,For=2.2.2.2", b"For=\"\", For=\"::ffff:192.168.1.1\""], 4, None),
        // C: one element.
        ("forwarded", &[b"For=\"[2607:f8b0:4004:83f::200e]:4711\""], 1, Some("2607:f8b0:4004:83f::200e")),
        ("forwarded", &[b"FOR=[2607:f8b0:4004:83f::200e]"], 1, Some("2607:f8b0:4004:83f::200e")),
        ("forwarded", &[b"For=\"[fe80::abcd%zone]:4711\""], 1, Some("fe80::abcd")),
        ("forwarded", &[b"FoR=192.0.2.60:4711"], 1, Some("192.0.2.60")),
        ("forwarded", &[b"for=\"192.0.2.60:4823\""], 1, Some("192.0.2.60")),
        ("forwarded", &[b"for=192.0.2.999"], 1, None),
        ("forwarded", &[b"for=\"2607:f8b0:4004:83f::999999\""], 1, None),
        ("forwarded", &[b"for=\"_test\""], 1, None),
        ("forwarded", &[b"for="], 1, None),
        ("forwarded", &[b"by=1.1.1.1; for=2.2.2.2;host=myhost; proto=https"], 1, Some("2.2.2.2")),
        ("forwarded", &[b"by=1::1;host=myhost;for=2::2;proto=https"], 1, Some("2::2")),
        ("forwarded", &[b"for=\"[0:0:0:0:0:ffff:bc15:0006]\""], 1, Some("188.21.0.6")),
        ("forwarded", &[b"for=\"1.1.1.1"], 1, None),
        ("forwarded", &[b"for=\"::1]\""], 1, None),
        ("forwarded", &[b"for=\"[0:0:0:0:0:ffff:bc15:0006\"]"], 1, None),
        ("forwarded", &[b"for=1.1.1.\\1"], 1, None),
        ("forwarded", &[b"for= 1.1.1.1"], 1, Some("1.1.1.1")),
        // D: a client's open quote, non-ASCII, a second `for`.
        ("forwarded", &[b"For=\"1.1.1.1, For=2.2.2.2, For=3.3.3.3\", For=\"4.4.4.4\""], 1, Some("4.4.4.4")),
        ("forwarded", &[b"For=\"1.1.1.1, For=2.2.2.2"], 1, Some("2.2.2.2")),
        ("forwarded", &[b"For=\"1.1.1.1, For=2.2.2.2"], 2, None),
        ("forwarded", &["For=1.1.1.1;@!=\u{1F600}, For=2.2.2.2".as_bytes()], 1, Some("2.2.2.2")),
        ("forwarded", &[b"For=1.1.1.1;For=2.2.2.2, For=3.3.3.3"], 2, None),
        ("forwarded", &[b"For=\"[1.1.1.1]\""], 1, Some("1.1.1.1")),
        // E: built from the peers' behaviour.
        ("forwarded", &[b"for=1.1.1.1;x=\", for=203.0.113.7"], 1, Some("203.0.113.7")),
        ("forwarded", &[b"for=1.1.1.1;x=\", for=\"[2001:db8::7]:4711\""], 1, Some("2001:db8::7")),
        ("forwarded", &[b"for=1.1.1.1;x=\"\\\", for=203.0.113.7"], 1, Some("203.0.113.7")),
        ("x-forwarded-for", &[b"1.1.1.1, \", 203.0.113.7, 10.0.0.2"], 2, Some("203.0.113.7")),
        ("x-forwarded-for", &[b"\"1.2.3.4, 203.0.113.7"], 1, Some("203.0.113.7")),
        ("x-forwarded-for", &[b"\"1.2.3.4\", 203.0.113.7"], 2, None),
        ("forwarded", &[b"for=1.1.1.1;x=\"a,b\", For=192.0.2.60"], 2, Some("1.1.1.1")),
        ("forwarded", &[b"for=192.0.2.60;x=\"a;b,c\", for=198.51.100.17"], 2, Some("192.0.2.60")),
        ("x-forwarded-for", &[b"\xd1\x8b, 203.0.113.7"], 1, Some("203.0.113.7")),
        ("x-forwarded-for", &[b"\xd1\x8b", b"203.0.113.7"], 1, Some("203.0.113.7")),
        ("x-forwarded-for", &[b"\xff1.2.3.4, 203.0.113.7"], 2, None),
        ("x-forwarded-for", &[b""], 1, None),
        ("x-forwarded-for", &[b"  fe80::1%eth0 , 4.4.4.4 "], 2, Some("fe80::1")),
        ("x-forwarded-for", &[b"1.1.1.1,\t203.0.113.7"], 2, Some("1.1.1.1")),
        ("x-forwarded-for", &[b"1.1.1.1 203.0.113.7"], 1, None),
        ("x-forwarded-for", &[b"2001:db8::1:443"], 1, Some("2001:db8::1:443")),
        ("x-forwarded-for", &[b"[2001:db8::1]:"], 1, None),
        ("x-forwarded-for", &[b"192.0.2.60:"], 1, None),
        ("x-forwarded-for", &[b"[192.0.2.60]:80"], 1, Some("192.0.2.60")),
        ("x-forwarded-for", &[b"[fe80::1%28]:80"], 1, Some("fe80::1")),
        ("x-forwarded-for", &[b"fe80::1%28"], 1, Some("fe80::1")),
        ("x-forwarded-for", &[b"[fe80::1%28]"], 1, Some("fe80::1")),
        ("x-forwarded-for", &[b"1.1.1.1%"], 1, None),
        ("x-forwarded-for", &[b"0.0.0.1% :"], 1, None),
        ("x-forwarded-for", &[b"::fffF:0:1%:"], 1, None),
        ("x-forwarded-for", &[b"001.002.003.004"], 1, None),
        ("forwarded", &[b"for=_hidden;for=198.51.100.17"], 1, None),
        ("forwarded", &[b"for=unknown"], 1, None),
        ("forwarded", &[b"proto=https;by=203.0.113.43"], 1, None),
        ("forwarded", &[b"for=192.0.2.60", b"proto=http"], 2, Some("192.0.2.60")),
        ("forwarded", &[b"for = 1.2.3.4 ; proto=https"], 1, Some("1.2.3.4")),
        // F: client-ip and forwarded-header-value.
        ("x-forwarded-for", &[b"foo,1.2.3.4"], 1, Some("1.2.3.4")),
        ("x-forwarded-for", &[b"1.1.1.1, foo, 2001:db8:85a3:8d3:1319:8a2e:370:7348", b"bar", b"2.2.2.2, 1.2.3.4"], 4, Some("2001:db8:85a3:8d3:1319:8a2e:370:7348")),
        ("forwarded", &[b"for=\"_mdn\"", b"For=\"[2001:db8:cafe::17]:4711\"", b"for=192.0.2.60;proto=http;by=203.0.113.43"], 2, Some("2001:db8:cafe::17")),
        ("forwarded", &[b"for=\"_mdn\"", b"For=\"[2001:db8:cafe::17]:4711\"", b"for=192.0.2.60;proto=http;by=203.0.113.43"], 3, None),
        ("forwarded", &[b"foo, for=1.2.3.4"], 1, Some("1.2.3.4")),
        ("forwarded", &[b"for='1.2.3.4'"], 1, None),
        ("forwarded", &[b"for=192.0.2.43;proto=https, for=198.51.100.17;by=\"[::1]:1234\";host=\"example.com\""], 2, Some("192.0.2.43")),
        // G: actix-web's.
        ("forwarded", &[b"for=192.0.2.60; proto=https; by=203.0.113.43; host=rust-lang.org"], 1, Some("192.0.2.60")),
        ("forwarded", &[b"  for = 1.2.3.4  "], 1, Some("1.2.3.4")),
        ("forwarded", &[b"for=2001:db8::1"], 1, Some("2001:db8::1")),
        // Werkzeug's ProxyFix: too few entries is no key (it uses the peer).
        ("x-forwarded-for", &[b"192.168.0.3, 192.168.0.2"], 3, None),
    ];

    #[test]
    fn peer_vectors_counted_from_the_right() {
        for (name, fields, hops, expected) in PEER_VECTORS {
            let trust = match *name {
                "forwarded" => ClientIp::forwarded(*hops),
                _ => ClientIp::x_forwarded_for(*hops),
            }
            .unwrap()
            .with_ipv6_prefix(128)
            .unwrap();
            let mut p = parts(&[], Some("10.0.0.3:1"));
            for field in *fields {
                p.headers.append(
                    HeaderName::from_static(name),
                    http::HeaderValue::from_bytes(field).unwrap(),
                );
            }
            let got = key(&trust, &p);
            assert_eq!(
                got.as_deref(),
                *expected,
                "{name} {fields:?}, {hops} proxies"
            );
        }
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
