//! Forwarding headers: whatever a client writes in `X-Forwarded-For` or
//! `Forwarded` (unterminated quotes, commas, bytes that are not ASCII,
//! fields of its own), the key under N trusted proxies is the address the
//! N-th proxy from the right appended (none for an unspecified address),
//! for every N up to the proxies' number.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arbitrary::Arbitrary;
use guard_tower::{ClientIp, KeyExtractor};
use http::{HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Proxy {
    /// The address it appends: IPv4, or IPv6 when `v6` is set.
    v4: [u8; 4],
    v6: Option<[u8; 16]>,
    /// Appended as a field of its own rather than to the last field.
    new_field: bool,
    /// `Forwarded` only: the node quoted, with a port.
    quoted: bool,
}

#[derive(Arbitrary, Debug)]
struct Input {
    forwarded: bool,
    /// The client's own fields, any bytes a header value may hold.
    client: Vec<Vec<u8>>,
    proxies: Vec<Proxy>,
}

fn header_bytes(bytes: &[u8]) -> Vec<u8> {
    // What a header value may hold: no CR, LF or NUL (hyper refuses them).
    bytes
        .iter()
        .copied()
        .filter(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
        .collect()
}

fn entry(proxy: &Proxy, forwarded: bool) -> (IpAddr, String) {
    let ip = match proxy.v6 {
        Some(v6) => IpAddr::V6(Ipv6Addr::from(v6)),
        None => IpAddr::V4(Ipv4Addr::from(proxy.v4)),
    };
    let node = match (forwarded, ip, proxy.quoted) {
        (false, ip, _) => ip.to_string(),
        (true, IpAddr::V6(v6), _) => format!("for=\"[{v6}]:4711\""),
        (true, ip, true) => format!("for=\"{ip}:80\""),
        (true, ip, false) => format!("for={ip}"),
    };
    (ip, node)
}

fuzz_target!(|input: Input| {
    let name = HeaderName::from_static(if input.forwarded {
        "forwarded"
    } else {
        "x-forwarded-for"
    });
    let mut fields: Vec<Vec<u8>> = input
        .client
        .iter()
        .take(4)
        .map(|f| header_bytes(f))
        .collect();
    let mut appended = Vec::new();
    for proxy in input.proxies.iter().take(4) {
        let (ip, node) = entry(proxy, input.forwarded);
        match fields.last_mut() {
            Some(last) if !proxy.new_field => {
                last.extend_from_slice(b", ");
                last.extend_from_slice(node.as_bytes());
            }
            _ => fields.push(node.into_bytes()),
        }
        appended.push(ip);
    }
    let mut request = http::Request::builder().body(()).unwrap().into_parts().0;
    for field in &fields {
        request
            .headers
            .append(name.clone(), HeaderValue::from_bytes(field).unwrap());
    }
    for hops in 1..=appended.len() {
        let trust = if input.forwarded {
            ClientIp::forwarded(hops)
        } else {
            ClientIp::x_forwarded_for(hops)
        };
        let trust = trust.unwrap().with_ipv6_prefix(128).unwrap();
        // The unspecified addresses are no address: no key.
        let expected = Some(appended[appended.len() - hops].to_canonical())
            .filter(|ip| !ip.is_unspecified())
            .map(|ip| ip.to_string());
        let key = trust.extract(&request).map(|k| k.into_owned());
        assert_eq!(key, expected, "{hops} trusted proxies, fields {fields:?}");
    }
});
