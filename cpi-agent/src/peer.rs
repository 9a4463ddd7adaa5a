//! Who answers on a local TCP port: the owners of the sockets listening for it, from
//! the agent's own network namespace's `/proc/net/tcp` and `/proc/net/tcp6`. Plain
//! HTTP proves nothing of its peer, but a listening socket's owner is the user that
//! created it, which no other user can borrow: on loopback, a listener owned by root
//! (or by the agent's own user) is a peer the agent may believe ([`Peer`]): the kubelet
//! it asks for pod names (cpi-agent/src/kubelet.rs), the receiver it pushes windows and
//! credentials to (cpi-agent/src/push.rs).

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};

use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

/// How the agent can tell who answers at a URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    /// `https://`: rustls verifies the server's certificate.
    Tls,
    /// `http://` to a host whose every address is this host's own (loopback, the
    /// wildcard `0.0.0.0`/`::`, an interface's address, whatever name or spelling led
    /// there: `localhost.`, `127.1`, `::ffff:127.0.0.1`): believed when every socket
    /// listening for them belongs to root or the agent's user.
    Loopback(Vec<SocketAddr>),
    /// `http://` to a host with an address elsewhere: nothing proves who answers. Every
    /// address found is listed (none where the host could not be resolved): a local
    /// user listening on one of this host's own is sent nothing.
    Unproven(Vec<SocketAddr>),
}

impl Peer {
    /// The peer of a URL (`http[s]://HOST[:PORT]…`; the caller checked the scheme).
    pub(crate) fn of(url: &str) -> Peer {
        let Ok(uri) = url.parse::<ureq::http::Uri>() else {
            return Peer::Unproven(Vec::new());
        };
        if uri
            .scheme_str()
            .is_some_and(|s| s.eq_ignore_ascii_case("https"))
        {
            return Peer::Tls;
        }
        let port = uri.port_u16().unwrap_or(80);
        let host = uri.host().unwrap_or("");
        let host = host.trim_start_matches('[').trim_end_matches(']');
        // As the client will find them (getaddrinfo: /etc/hosts, then DNS), resolved
        // once here; `localhost` as both loopbacks, whatever /etc/hosts says.
        let mut addrs: Vec<SocketAddr> =
            if host.trim_end_matches('.').eq_ignore_ascii_case("localhost") {
                vec![
                    SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port),
                    SocketAddr::new(Ipv6Addr::LOCALHOST.into(), port),
                ]
            } else {
                match (host, port).to_socket_addrs() {
                    Ok(found) => found
                        .map(|a| SocketAddr::new(a.ip().to_canonical(), port))
                        .collect(),
                    Err(_) => return Peer::Unproven(Vec::new()),
                }
            };
        addrs.dedup();
        if !addrs.is_empty() && addrs.iter().all(|a| is_local(a.ip())) {
            Peer::Loopback(addrs)
        } else {
            Peer::Unproven(addrs)
        }
    }

    /// The HTTP client for this peer, configured by `config`. Over plain http it
    /// connects only to the addresses this peer was judged on ([`Pinned`]): a name that
    /// resolves elsewhere later (DNS rebinding, an edited /etc/hosts) is not followed
    /// past the checks made of its listeners.
    pub(crate) fn client(&self, config: Config) -> ureq::Agent {
        match self {
            Peer::Tls => config.into(),
            Peer::Loopback(to) | Peer::Unproven(to) => {
                ureq::Agent::with_parts(config, DefaultConnector::new(), Pinned(to.clone()))
            }
        }
    }

    /// Why a loopback peer is not believed now ([`distrust`] of the sockets listening
    /// for it, looked up now: call it before each request); `None` when believed, and
    /// for the other peers, which the listeners say nothing of.
    /// An unproven peer's own addresses count only when someone listens on them.
    pub(crate) fn distrusted_now(&self) -> Option<(String, bool)> {
        match self {
            Peer::Loopback(to) => distrust(&owners(to), cpi_user::fsafe::euid(), to[0].port()),
            Peer::Unproven(to) => {
                let local: Vec<SocketAddr> =
                    to.iter().copied().filter(|a| is_local(a.ip())).collect();
                let owners = owners(&local);
                (!owners.is_empty())
                    .then(|| distrust(&owners, cpi_user::fsafe::euid(), local[0].port()))
                    .flatten()
            }
            Peer::Tls => None,
        }
    }
}

/// The resolver of a plain-http client: the addresses its [`Peer`] was judged on, never
/// a new lookup. Where the host could not be resolved when the peer was judged, it is
/// looked up per request and only addresses elsewhere are kept: a name that leads to
/// this host only later was never checked, and a local user may be listening there.
#[derive(Debug)]
struct Pinned(Vec<SocketAddr>);

impl Resolver for Pinned {
    fn resolve(
        &self,
        uri: &Uri,
        _: &Config,
        _: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let mut found = self.empty();
        let fresh: Vec<SocketAddr>;
        let from = if self.0.is_empty() {
            let port = uri.port_u16().unwrap_or(80);
            let host = uri.host().unwrap_or("");
            let host = host.trim_start_matches('[').trim_end_matches(']');
            fresh = (host, port)
                .to_socket_addrs()
                .map_err(|_| ureq::Error::HostNotFound)?
                .filter(|a| !is_local(a.ip()))
                .collect();
            &fresh
        } else {
            &self.0
        };
        for a in from {
            if found.try_push(*a).is_err() {
                break;
            }
        }
        if found.is_empty() {
            return Err(ureq::Error::HostNotFound);
        }
        Ok(found)
    }
}

/// Whether a connection to `ip` stays on this host: loopback, the wildcard (which
/// connects to loopback), or an address of one of its interfaces (the route the kernel
/// would take starts there: a UDP `connect` sends nothing).
fn is_local(ip: IpAddr) -> bool {
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    let any: IpAddr = match ip {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    UdpSocket::bind((any, 0))
        .and_then(|s| {
            s.connect((ip, 9))?;
            s.local_addr()
        })
        .is_ok_and(|a| a.ip() == ip)
}

/// Why the sockets `owners` listening on `port` (from [`owners`]) are not believed, and
/// whether that is a refusal (else nothing listens: a failure); `None` when there is
/// one and all belong to root or `me`.
fn distrust(owners: &[u32], me: u32, port: u16) -> Option<(String, bool)> {
    if owners.is_empty() {
        return Some((format!("nothing listens on port {port}"), false));
    }
    let foreign = owners.iter().find(|&&u| u != 0 && u != me)?;
    Some((
        format!(
            "not believed: port {port} is listened on by uid {foreign}, not root, so anyone \
             could be answering"
        ),
        true,
    ))
}

/// The tables read, IPv4 then IPv6.
const TABLES: [&str; 2] = ["/proc/net/tcp", "/proc/net/tcp6"];
/// The `st` column of a listening socket (`TCP_LISTEN`).
const LISTEN: &str = "0A";

/// One listening socket: where it is bound and the uid that created it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Listener {
    /// Its local address (`0.0.0.0`, `::` when bound to every address).
    pub bound: SocketAddr,
    /// The owner, as this namespace sees it.
    pub uid: u32,
}

/// The listening sockets of a `/proc/net/tcp` or `/proc/net/tcp6` text (its header
/// and every other state skipped). Linear in the text, one line held at a time.
pub(crate) fn listeners(text: impl BufRead) -> impl Iterator<Item = Listener> {
    text.lines().map_while(Result::ok).filter_map(|l| parse(&l))
}

/// `sl: LOCAL REMOTE st tx:rx tr:when retrnsmt uid …`, addresses as the kernel prints
/// them: each 32-bit word of the address in host byte order, the port in hex.
fn parse(line: &str) -> Option<Listener> {
    let f: Vec<&str> = line.split_whitespace().take(8).collect();
    if f.len() < 8 || f[3] != LISTEN {
        return None;
    }
    let (addr, port) = f[1].split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words = (0..addr.len() / 8)
        .map(|i| u32::from_str_radix(addr.get(8 * i..8 * i + 8)?, 16).ok())
        .collect::<Option<Vec<u32>>>()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let ip = match (addr.len(), bytes.len()) {
        (8, 4) => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        (32, 16) => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => return None,
    };
    Some(Listener {
        bound: SocketAddr::new(ip, port),
        uid: f[7].parse().ok()?,
    })
}

/// Whether a socket listening on `bound` may take a connection to `to`. Generous on
/// purpose (an IPv6 wildcard counts whether or not it is `IPV6_V6ONLY`, which the table
/// does not say; a connection to the wildcard `to` may reach any listener on its port):
/// a listener counted that would not answer can only make the caller distrust, never
/// trust.
fn may_take(bound: SocketAddr, to: SocketAddr) -> bool {
    bound.port() == to.port()
        && (to.ip().is_unspecified()
            || match (bound.ip(), to.ip()) {
                (IpAddr::V4(b), IpAddr::V4(t)) => b == t || b.is_unspecified(),
                (IpAddr::V6(b), IpAddr::V6(t)) => b == t || b.is_unspecified(),
                (IpAddr::V6(b), IpAddr::V4(t)) => {
                    b.is_unspecified() || b.to_ipv4_mapped() == Some(t)
                }
                (IpAddr::V4(_), IpAddr::V6(_)) => false,
            })
}

/// The owners of the sockets that may take a connection to any of `to`, in the tables
/// `texts` (one per table).
pub(crate) fn owners_in<R: BufRead>(
    texts: impl IntoIterator<Item = R>,
    to: &[SocketAddr],
) -> Vec<u32> {
    texts
        .into_iter()
        .flat_map(listeners)
        .filter(|l| to.iter().any(|t| may_take(l.bound, *t)))
        .map(|l| l.uid)
        .collect()
}

/// [`owners_in`] this network namespace's tables now (a table that cannot be read, as
/// `tcp6` without IPv6, has none).
pub fn owners(to: &[SocketAddr]) -> Vec<u32> {
    let open = |p: &str| std::fs::File::open(p).ok().map(BufReader::new);
    owners_in(TABLES.iter().filter_map(|p| open(p)), to)
}

#[cfg(test)]
mod tests {
    use super::*;

    // As a little-endian kernel prints them: 127.0.0.1:10255 by uid 65534, 0.0.0.0:22
    // by root, an established connection from that port (not a listener), and the same
    // port on ::1 by uid 1000 and on :: by root.
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:280F 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 4242 1 0000000000000000 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1160 1 0000000000000000 100 0 0 10 0
   2: 0100007F:280F 0100007F:D63C 01 00000000:00000000 00:00000000 00000000     0        0 4243 1 0000000000000000 20 4 30 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:280F 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 77 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 78 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000    33        0 79 1 0000000000000000 100 0 0 10 0
";

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn listening_sockets_of_both_tables() {
        let v4: Vec<Listener> = listeners(TCP.as_bytes()).collect();
        assert_eq!(
            v4,
            [
                Listener {
                    bound: at("127.0.0.1:10255"),
                    uid: 65534
                },
                Listener {
                    bound: at("0.0.0.0:22"),
                    uid: 0
                },
            ]
        );
        let v6: Vec<Listener> = listeners(TCP6.as_bytes()).collect();
        assert_eq!(
            v6.iter().map(|l| (l.bound, l.uid)).collect::<Vec<_>>(),
            [
                (at("[::1]:10255"), 1000),
                (at("[::]:80"), 0),
                (at("[::ffff:127.0.0.1]:8080"), 33)
            ]
        );
        // Not a table: nothing, and no panic.
        assert_eq!(
            listeners("0: zz:1 0 0A\n\n1: 01:FFFFF 0 0A 0 0 0 0".as_bytes()).count(),
            0
        );
    }

    #[test]
    fn only_loopback_http_and_https_peers_can_prove_themselves() {
        assert_eq!(
            Peer::of("http://127.0.0.1:10255"),
            Peer::Loopback(vec![at("127.0.0.1:10255")])
        );
        assert_eq!(
            Peer::of("http://[::1]:10255/"),
            Peer::Loopback(vec![at("[::1]:10255")])
        );
        assert_eq!(
            Peer::of("HTTP://LocalHost/x"),
            Peer::Loopback(vec![at("127.0.0.1:80"), at("[::1]:80")])
        );
        // Other spellings of this host, as the client would connect to them.
        for (url, to) in [
            ("http://localhost.:10255", "127.0.0.1:10255"),
            ("http://127.1:10255", "127.0.0.1:10255"),
            ("http://0x7f000001:10255", "127.0.0.1:10255"),
            ("http://[::ffff:127.0.0.1]:10255", "127.0.0.1:10255"),
            ("http://0.0.0.0:10255", "0.0.0.0:10255"),
            ("http://[::]:1", "[::]:1"),
        ] {
            match Peer::of(url) {
                Peer::Loopback(got) => assert!(got.contains(&at(to)), "{url}: {got:?}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        assert_eq!(
            Peer::of("http://192.0.2.1:10255"),
            Peer::Unproven(vec![at("192.0.2.1:10255")])
        );
        assert_eq!(
            Peer::of("http://node-1.invalid:10255"),
            Peer::Unproven(vec![])
        );
        assert_eq!(Peer::of("https://10.0.0.1:10250"), Peer::Tls);
        assert_eq!(Peer::of("HTTPS://127.0.0.1:4040"), Peer::Tls);
    }

    fn resolve(pinned: &[&str], url: &str) -> Result<Vec<SocketAddr>, ureq::Error> {
        let pinned = Pinned(pinned.iter().map(|s| at(s)).collect());
        let uri: Uri = url.parse().unwrap();
        let found = pinned.resolve(&uri, &Config::default(), NextTimeout::default())?;
        Ok(found.iter().copied().collect())
    }

    #[test]
    fn a_plain_http_client_connects_only_where_its_peer_was_judged() {
        // The URL's host is not looked up again, whatever it says now.
        assert_eq!(
            resolve(&["127.0.0.1:4040"], "http://localhost:4040/x").unwrap(),
            [at("127.0.0.1:4040")]
        );
        assert_eq!(
            resolve(&["192.0.2.1:80"], "http://127.0.0.1:80/").unwrap(),
            [at("192.0.2.1:80")]
        );
        // Unresolved when judged: looked up now, and this host's own addresses, never
        // checked, are not kept.
        assert_eq!(
            resolve(&[], "http://192.0.2.7:81").unwrap(),
            [at("192.0.2.7:81")]
        );
        for local in [
            "http://127.0.0.1:81",
            "http://[::1]:81",
            "http://0.0.0.0:81",
        ] {
            assert!(
                matches!(resolve(&[], local), Err(ureq::Error::HostNotFound)),
                "{local}"
            );
        }
    }

    #[test]
    fn the_client_of_a_pinned_peer_reaches_its_listener_under_any_name() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let to = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let mut head = [0u8; 1024];
            let n = c.read(&mut head).unwrap();
            c.write_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
                .unwrap();
            String::from_utf8_lossy(&head[..n]).into_owned()
        });
        let client = Peer::Loopback(vec![to]).client(Config::default());
        // A name nothing resolves: only the pinned address can answer.
        let url = format!("http://elsewhere.invalid:{}/p", to.port());
        let answer = client.get(&url).call().unwrap();
        assert_eq!(answer.status().as_u16(), 204);
        let head = server.join().unwrap();
        assert!(head.starts_with("GET /p HTTP/1.1"), "{head}");
    }

    #[test]
    fn listeners_are_believed_when_all_are_root_or_the_agents() {
        assert_eq!(distrust(&[0], 1000, 80), None);
        assert_eq!(distrust(&[1000, 0], 1000, 80), None);
        assert!(matches!(distrust(&[], 0, 80), Some((_, false))));
        let (why, refused) = distrust(&[0, 1000], 0, 10255).unwrap();
        assert!(
            refused && why.contains("port 10255 is listened on by uid 1000"),
            "{why}"
        );
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn owners_of_exact_wildcard_and_mapped_listeners() {
        let owners = |to: &[&str]| {
            let to: Vec<SocketAddr> = to.iter().map(|s| at(s)).collect();
            owners_in([TCP.as_bytes(), TCP6.as_bytes()], &to)
        };
        assert_eq!(owners(&["127.0.0.1:10255"]), [65534]);
        assert_eq!(owners(&["[::1]:10255"]), [1000]);
        assert_eq!(owners(&["127.0.0.1:10255", "[::1]:10255"]), [65534, 1000]);
        // Wildcards: 0.0.0.0 for IPv4; :: for both.
        assert_eq!(owners(&["127.0.0.1:22"]), [0]);
        // One listener for both addresses: counted once.
        assert_eq!(owners(&["127.0.0.1:80", "[::1]:80"]), [0]);
        // A v4-mapped listener takes its IPv4 address.
        assert_eq!(owners(&["127.0.0.1:8080"]), [33]);
        assert_eq!(owners(&["127.0.0.2:10255"]), Vec::<u32>::new());
        // Whoever listens on the port may take a connection to the wildcard (generous:
        // the ::1 listener would not, and can only make the caller distrust).
        assert_eq!(owners(&["0.0.0.0:10255"]), [65534, 1000]);
        assert_eq!(owners(&["[::1]:22"]), Vec::<u32>::new());
    }
}
