//! [`ClientIp`]: the domain is the client's IP address as seen behind the
//! proxies the service trusts, grouped by prefix.
//!
//! Behind a load balancer every socket peer is the balancer, so the client
//! is in `Forwarded` (RFC 7239) or `X-Forwarded-For`. Anyone can write
//! those headers, so only the addresses appended by trusted proxies count:
//! reading from the right, each trusted proxy vouches for the address before
//! it, and the first address that is not a trusted proxy is the client. A
//! peer that is not trusted is the client itself, whatever the headers say.
//! A header that does not parse (an obfuscated `for=_hidden`, a zone id, a
//! port on an unquoted IPv6, garbage) falls back to the socket peer and is
//! counted ([`ClientIp::malformed`]): a limit keyed on it then binds the
//! proxy, never nobody.
//!
//! Addresses are grouped: IPv4 by /32 and IPv6 by /64 by default (one
//! subscriber gets a whole /64; Boulder groups by /48), so rotating through
//! a prefix does not escape a per-client limit. IPv4-mapped IPv6 addresses
//! are IPv4. The domain is the canonical text: `203.0.113.7`,
//! `2001:db8:1:2::/64`.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::Request;

use super::key::{DomainOf, peer_ip};

/// Addresses read from one header at most: a longer chain is not a real
/// path through proxies, and reading it costs time.
const MAX_HOPS: usize = 32;

/// A trusted proxy's range did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an IP address or a CIDR range (e.g. 10.0.0.0/8, fd00::/8)")]
pub struct BadRange(String);

/// The client's IP address behind trusted proxies (see the module docs).
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: Vec<(IpAddr, u8)>,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
    malformed: Arc<AtomicU64>,
}

impl Default for ClientIp {
    fn default() -> Self {
        Self {
            trusted: Vec::new(),
            ipv4_prefix: 32,
            ipv6_prefix: 64,
            malformed: Arc::default(),
        }
    }
}

impl ClientIp {
    /// No trusted proxy: the socket peer, grouped /32 and /64.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the proxies in `range` (`10.0.0.0/8`, `fd00::/8`, or one
    /// address) to append the address they received a request from.
    pub fn trust(mut self, range: &str) -> Result<Self, BadRange> {
        let bad = || BadRange(range.to_owned());
        let (address, bits) = match range.split_once('/') {
            Some((address, bits)) => (address, Some(bits)),
            None => (range, None),
        };
        let address: IpAddr = address.trim().parse().map_err(|_| bad())?;
        let address = address.to_canonical();
        let width = if address.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => width,
            Some(bits) => bits
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= width)
                .ok_or_else(bad)?,
        };
        self.trusted.push((mask(address, bits), bits));
        Ok(self)
    }

    /// IPv4 addresses grouped by this prefix (1 to 32; default 32).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.ipv4_prefix = bits.clamp(1, 32);
        self
    }

    /// IPv6 addresses grouped by this prefix (1 to 128; default 64, 48
    /// as Boulder groups them).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.clamp(1, 128);
        self
    }

    /// Requests whose forwarding header did not parse, so far (they were
    /// keyed by the socket peer).
    pub fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }

    fn is_trusted(&self, address: IpAddr) -> bool {
        self.trusted
            .iter()
            .any(|(range, bits)| mask(address, *bits) == *range)
    }

    /// The client's address: `peer`, or what trusted proxies vouch for.
    pub fn client(&self, peer: IpAddr, forwarded: Option<&str>, xff: Option<&str>) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.is_trusted(peer) {
            return peer;
        }
        let chain = match (forwarded, xff) {
            (Some(header), _) => forwarded_for(header),
            (None, Some(header)) => x_forwarded_for(header),
            (None, None) => return peer,
        };
        let Some(chain) = chain else {
            self.malformed.fetch_add(1, Ordering::Relaxed);
            return peer;
        };
        // From the right: the last hop that is not a trusted proxy.
        let mut client = peer;
        for address in chain.into_iter().rev() {
            client = address;
            if !self.is_trusted(address) {
                break;
            }
        }
        client
    }

    /// The domain text of `address`, grouped by prefix.
    pub fn group(&self, address: IpAddr) -> String {
        let address = address.to_canonical();
        let (bits, width) = match address {
            IpAddr::V4(_) => (self.ipv4_prefix, 32),
            IpAddr::V6(_) => (self.ipv6_prefix, 128),
        };
        if bits >= width {
            address.to_string()
        } else {
            format!("{}/{bits}", mask(address, bits))
        }
    }
}

impl<B> DomainOf<B> for ClientIp {
    fn domain_of(&self, request: &Request<B>) -> Option<String> {
        let peer = peer_ip(request)?;
        // Several lines of one header are one list; a value that is not
        // text does not parse.
        let header = |name: &str| -> Option<Cow<'_, str>> {
            let mut lines = request.headers().get_all(name).iter();
            fn text(value: &http::HeaderValue) -> &str {
                value.to_str().unwrap_or("\u{0}")
            }
            let first = text(lines.next()?);
            // One line, the usual case, is borrowed; more are joined.
            let mut joined: Option<String> = None;
            for line in lines {
                let joined = joined.get_or_insert_with(|| first.to_owned());
                joined.push(',');
                joined.push_str(text(line));
            }
            Some(joined.map_or(Cow::Borrowed(first), Cow::Owned))
        };
        let (forwarded, xff) = (header("forwarded"), header("x-forwarded-for"));
        let client = self.client(peer, forwarded.as_deref(), xff.as_deref());
        Some(self.group(client))
    }
}

/// `address` with all but its first `bits` bits cleared.
fn mask(address: IpAddr, bits: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => {
            let keep = u32::MAX
                .checked_shl(32 - u32::from(bits.min(32)))
                .unwrap_or(0);
            IpAddr::V4((u32::from(v4) & keep).into())
        }
        IpAddr::V6(v6) => {
            let keep = u128::MAX
                .checked_shl(128 - u32::from(bits.min(128)))
                .unwrap_or(0);
            IpAddr::V6((u128::from(v6) & keep).into())
        }
    }
}

/// `X-Forwarded-For: client, proxy1, proxy2`; `None` if any hop does not
/// parse or there are too many.
fn x_forwarded_for(header: &str) -> Option<Vec<IpAddr>> {
    let hops: Vec<&str> = header.split(',').map(str::trim).collect();
    if hops.len() > MAX_HOPS {
        return None;
    }
    hops.into_iter()
        .map(|hop| hop.parse::<IpAddr>().ok().map(|ip| ip.to_canonical()))
        .collect()
}

/// `Forwarded: for=192.0.2.60;proto=http, for="[2001:db8::1]:4711"`: the
/// `for=` of each element; `None` if one has none that is an address.
fn forwarded_for(header: &str) -> Option<Vec<IpAddr>> {
    let elements: Vec<&str> = header.split(',').collect();
    if elements.len() > MAX_HOPS {
        return None;
    }
    elements
        .into_iter()
        .map(|element| {
            let value = element.split(';').find_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| value.trim())
            })?;
            node(value.trim_matches('"'))
        })
        .collect()
}

/// A `Forwarded` node: `192.0.2.60`, `192.0.2.60:80`, `[2001:db8::1]`,
/// `[2001:db8::1]:4711`.
fn node(text: &str) -> Option<IpAddr> {
    let address = if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.starts_with(':')) {
            return None;
        }
        inside.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6)?
    } else {
        let host = match text.split_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            Some(_) => return None,
            None => text,
        };
        host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)?
    };
    Some(address.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap_or_else(|_| panic!("{text}"))
    }

    fn behind_proxies() -> ClientIp {
        ClientIp::new()
            .trust("10.0.0.0/8")
            .and_then(|c| c.trust("fd00::/8"))
            .expect("ranges")
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_writes() {
        let keys = behind_proxies();
        assert_eq!(
            keys.client(ip("203.0.113.9"), None, Some("198.51.100.1")),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn trusted_proxies_vouch_from_the_right() {
        let keys = behind_proxies();
        // A client that wrote its own X-Forwarded-For: the rightmost
        // address not a trusted proxy is the one the first proxy saw.
        assert_eq!(
            keys.client(
                ip("10.0.0.2"),
                None,
                Some("1.2.3.4, 198.51.100.7, 10.0.0.1")
            ),
            ip("198.51.100.7")
        );
        // Every hop trusted: the leftmost.
        assert_eq!(
            keys.client(ip("10.0.0.2"), None, Some("10.9.9.9, 10.0.0.1")),
            ip("10.9.9.9")
        );
        assert_eq!(keys.client(ip("10.0.0.2"), None, None), ip("10.0.0.2"));
    }

    #[test]
    fn forwarded_is_read_before_x_forwarded_for() {
        let keys = behind_proxies();
        let forwarded =
            r#"for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711""#;
        assert_eq!(
            keys.client(ip("10.0.0.2"), Some(forwarded), Some("198.51.100.7")),
            ip("2001:db8:cafe::17")
        );
        assert_eq!(
            keys.client(ip("10.0.0.2"), Some("For=\"192.0.2.43:47011\""), None),
            ip("192.0.2.43")
        );
    }

    #[test]
    fn what_does_not_parse_is_the_peer_and_counted() {
        let keys = behind_proxies();
        let huge = "1.2.3.4, ".repeat(64 * 1024 / 9);
        for (forwarded, xff) in [
            (Some("for=_hidden"), None),
            (Some("for=unknown"), None),
            (Some("for=2001:db8::1"), None),
            (None, Some("fe80::1%eth0")),
            (None, Some("1.2.3.4, not-an-address")),
            (None, Some(huge.as_str())),
            (None, Some("\u{0}")),
        ] {
            assert_eq!(
                keys.client(ip("10.0.0.2"), forwarded, xff),
                ip("10.0.0.2"),
                "{forwarded:?} {xff:?}"
            );
        }
        assert_eq!(keys.malformed(), 7);
    }

    #[test]
    fn addresses_are_grouped_by_prefix() {
        let keys = ClientIp::new();
        assert_eq!(keys.group(ip("203.0.113.7")), "203.0.113.7");
        assert_eq!(keys.group(ip("2001:db8:1:2:3:4:5:6")), "2001:db8:1:2::/64");
        assert_eq!(keys.group(ip("::ffff:198.51.100.1")), "198.51.100.1");
        let boulder = ClientIp::new().ipv6_prefix(48).ipv4_prefix(24);
        assert_eq!(boulder.group(ip("2001:db8:1:2::9")), "2001:db8:1::/48");
        assert_eq!(boulder.group(ip("203.0.113.7")), "203.0.113.0/24");
    }

    #[test]
    fn ranges_that_do_not_parse_are_refused() {
        for range in ["10.0.0.0/33", "fd00::/129", "ten", "10.0.0.0/x", ""] {
            assert!(ClientIp::new().trust(range).is_err(), "{range}");
        }
        assert!(ClientIp::new().trust("192.0.2.1").is_ok());
    }
}
