use super::*;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn limits() -> Limits {
    Limits {
        max_connections: 100,
        max_per_address: 3,
        handshake_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(600),
        reserved_fds: 0,
        authenticated_reserve: 0,
        auth_timeout: None,
    }
}

/// Serves `l` with a task per connection that reads until the connection ends, and
/// answers how each ended (Ok: the peer closed; Err: the guard closed it).
async fn serve(
    l: tokio::net::TcpListener,
    limits: Limits,
    protocol: Protocol,
) -> (
    Arc<Stats>,
    tokio::sync::mpsc::UnboundedReceiver<Result<(), String>>,
) {
    let stats = Stats::new("test", limits);
    let mut incoming = Listener::new(l, stats.clone(), protocol);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(mut c)) = incoming.next().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut b = [0u8; 256];
                loop {
                    match c.read(&mut b).await {
                        Ok(0) => break tx.send(Ok(())),
                        Ok(_) => {}
                        Err(e) => break tx.send(Err(e.to_string())),
                    }
                }
            });
        }
    });
    (stats, rx)
}

async fn closed(s: &mut tokio::net::TcpStream) -> bool {
    let mut b = [0u8; 16];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn connections_past_the_per_address_cap_are_closed_and_counted() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (stats, _rx) = serve(l, limits(), Protocol::Http2).await;
    let mut kept = Vec::new();
    for _ in 0..3 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(PREFACE).await.unwrap();
        kept.push(s);
    }
    for _ in 0..2 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(closed(&mut s).await, "refused at once");
    }
    assert_eq!(stats.refused(Refusal::PerAddress), 2);
    assert_eq!(stats.open(), 3);
    // A slot given back is taken again.
    drop(kept.pop());
    let t0 = Instant::now();
    while stats.open() > 2 && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(stats.open(), 2);
}

#[tokio::test]
async fn a_connection_without_request_headers_is_closed_at_the_handshake_deadline() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (stats, mut rx) = serve(l, limits(), Protocol::Http2).await;
    // The preface and a SETTINGS frame only: the flood's connection.
    let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
    idle.write_all(PREFACE).await.unwrap();
    idle.write_all(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100])
        .await
        .unwrap();
    // A real client: preface, SETTINGS, then a HEADERS frame, then pings now and then.
    let mut live = tokio::net::TcpStream::connect(addr).await.unwrap();
    live.write_all(PREFACE).await.unwrap();
    live.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    live.write_all(&[0, 0, 2, 1, 4, 0, 0, 0, 1, 0x82, 0x84])
        .await
        .unwrap();
    assert!(closed(&mut idle).await);
    assert!(
        rx.recv()
            .await
            .unwrap()
            .unwrap_err()
            .contains("handshake_timeout")
    );
    assert_eq!(stats.refused(Refusal::Handshake), 1);
    // The live one outlives the handshake deadline while it talks...
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        live.write_all(&[0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
            .await
            .unwrap();
    }
    assert_eq!(stats.open(), 1);
    // ...and is closed once it has been silent past the idle deadline.
    assert!(closed(&mut live).await);
    assert_eq!(stats.refused(Refusal::Idle), 1);
    assert_eq!(stats.open(), 0);
}

#[tokio::test]
async fn http1_handshake_ends_with_the_header_block() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (stats, _rx) = serve(l, limits(), Protocol::Http1).await;
    // Slowloris: a header line at a time, never the blank line.
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut ok = tokio::net::TcpStream::connect(addr).await.unwrap();
    ok.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r")
        .await
        .unwrap();
    ok.write_all(b"\n").await.unwrap();
    for _ in 0..3 {
        slow.write_all(b"X-A: b\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(closed(&mut slow).await);
    assert_eq!(stats.refused(Refusal::Handshake), 1);
    assert_eq!(stats.open(), 1, "the complete request's connection stays");
}

#[tokio::test]
async fn the_total_cap_holds_across_addresses() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let mut lim = limits();
    lim.max_connections = 2;
    lim.max_per_address = 100;
    let (stats, _rx) = serve(l, lim, Protocol::Http2).await;
    let _a = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _b = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(closed(&mut c).await);
    assert_eq!(stats.refused(Refusal::Total), 1);
}

#[tokio::test]
async fn the_descriptor_reserve_is_never_handed_to_a_connection() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let mut lim = limits();
    // More than the process could ever have free: every connection would eat into it.
    lim.reserved_fds = u64::MAX;
    let (stats, _rx) = serve(l, lim, Protocol::Http2).await;
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert!(closed(&mut c).await);
    assert_eq!(stats.refused(Refusal::Descriptors), 1);
    assert_eq!(stats.open(), 0, "its slot is given back");
}

#[tokio::test]
async fn unix_peers_are_capped_per_uid() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    let stats = Stats::new("unix-test", limits());
    let mut incoming = Listener::new(l, stats.clone(), Protocol::Http2);
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(Ok(c)) = incoming.next().await {
            held.push(c);
        }
    });
    let mut kept = Vec::new();
    for _ in 0..3 {
        kept.push(tokio::net::UnixStream::connect(&path).await.unwrap());
    }
    let mut fourth = tokio::net::UnixStream::connect(&path).await.unwrap();
    let mut b = [0u8; 4];
    let n = tokio::time::timeout(Duration::from_secs(5), fourth.read(&mut b)).await;
    assert!(
        matches!(n, Ok(Ok(0) | Err(_))),
        "the fourth of one uid is closed"
    );
    assert_eq!(stats.refused(Refusal::PerAddress), 1);
    assert_eq!(stats.open(), 3);
}

/// Over TLS: a client that connects and never shakes hands is closed at the handshake
/// deadline and counted, while a real TLS client is served meanwhile (handshakes run
/// side by side), and its bytes after the handshake are what the guard watches.
#[tokio::test]
async fn tls_handshakes_run_side_by_side_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let (ca, _) = crate::tls::Ca::load_or_create(dir.path(), now).unwrap();
    let config =
        crate::tls::server_config(ca.server_identity(&[], now).unwrap(), ca.der()).unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let stats = Stats::new("test", limits());
    let mut incoming = Listener::new(l, stats.clone(), Protocol::Http2).with_tls(config);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(mut c)) = incoming.next().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(c.get_ref().is_tls());
                let mut b = [0u8; 256];
                while matches!(c.read(&mut b).await, Ok(n) if n > 0) {}
            });
        }
    });
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    // A real client, after the silent one.
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        #[allow(deprecated)]
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from(crate::tls::SERVER_NAME).unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect(name, tcp)
        .await
        .unwrap();
    tls.write_all(PREFACE).await.unwrap();
    // A HEADERS frame's header (empty payload): the first request has begun.
    tls.write_all(&[0, 0, 0, 1, 4, 0, 0, 0, 1]).await.unwrap();
    assert_eq!(
        rx.recv().await,
        Some(true),
        "the TLS client was handed over"
    );
    assert!(closed(&mut silent).await, "the silent one is closed");
    assert_eq!(stats.refused(Refusal::Handshake), 1);
}

/// A TLS listener and a way to dial it as a node (with a certificate under its CA) or
/// as anyone; each connection handed over reports its `Auth` and how it ended.
struct TlsBench {
    addr: std::net::SocketAddr,
    stats: Arc<Stats>,
    ca_pem: String,
    node: crate::tls::ClientTls,
    handed: tokio::sync::mpsc::UnboundedReceiver<Auth>,
}

impl TlsBench {
    async fn start(limits: Limits) -> TlsBench {
        use tonic::transport::server::Connected as _;
        let dir = tempfile::tempdir().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let (ca, _) = crate::tls::Ca::load_or_create(dir.path(), now).unwrap();
        let config =
            crate::tls::server_config(ca.server_identity(&[], now).unwrap(), ca.der()).unwrap();
        let req = crate::tls::NodeRequest::new("node7").unwrap();
        let der = ca
            .sign_node(&req.csr_der, "node7", now - 60, now + 3600)
            .unwrap();
        let identity =
            crate::tls::NodeIdentity::from_pem(&crate::tls::cert_pem(&der), &req.key_pem).unwrap();
        let node = crate::tls::ClientTls::new(&ca.pem(), Some(identity)).unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let stats = Stats::new("test", limits);
        let mut incoming = Listener::new(l, stats.clone(), Protocol::Http2).with_tls(config);
        let (tx, handed) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(Ok(mut c)) = incoming.next().await {
                let _ = tx.send(c.connect_info().auth);
                tokio::spawn(async move {
                    let mut b = [0u8; 256];
                    while matches!(c.read(&mut b).await, Ok(n) if n > 0) {}
                });
            }
        });
        TlsBench {
            addr,
            stats,
            ca_pem: ca.pem(),
            node,
            handed,
        }
    }

    /// A TLS connection that has sent its first request's headers; `None` if refused.
    async fn dial(
        &self,
        as_node: bool,
    ) -> Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let config = if as_node {
            self.node.rustls_config()
        } else {
            crate::tls::ClientTls::new(&self.ca_pem, None)
                .unwrap()
                .rustls_config()
        };
        let tcp = tokio::net::TcpStream::connect(self.addr).await.ok()?;
        let name = rustls::pki_types::ServerName::try_from(crate::tls::SERVER_NAME).unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .ok()?;
        tls.write_all(PREFACE).await.ok()?;
        tls.write_all(&[0, 0, 0, 1, 4, 0, 0, 0, 1]).await.ok()?;
        tls.flush().await.ok()?;
        Some(tls)
    }
}

/// HTTP/2 PING frames every 50 ms until the connection is closed; answers whether it
/// was closed within `within`.
async fn pings_until_closed(
    s: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    within: Duration,
) -> bool {
    let ping = [0u8, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    let t0 = Instant::now();
    let mut b = [0u8; 64];
    while t0.elapsed() < within {
        if s.write_all(&ping).await.is_err() || s.flush().await.is_err() {
            return true;
        }
        let r = tokio::time::timeout(Duration::from_millis(50), s.read(&mut b)).await;
        if matches!(r, Ok(Ok(0) | Err(_))) {
            return true;
        }
    }
    false
}

/// One address full of unauthenticated connections (all of a node's users share its
/// address with its agent): a client with a certificate under the CA still gets in; a
/// newcomer without one closes the address's oldest unauthenticated connection rather
/// than being refused (a token's user must get to send its token), and once its request
/// authenticates it is out of the caps; the unauthenticated are closed at
/// `auth_timeout` however busy they keep themselves.
#[tokio::test]
async fn authenticated_peers_are_out_of_the_per_address_cap_and_deadline() {
    let mut lim = limits();
    lim.max_per_address = 2;
    lim.handshake_timeout = Duration::from_secs(2);
    lim.idle_timeout = Duration::from_secs(30);
    lim.auth_timeout = Some(Duration::from_millis(1500));
    let mut b = TlsBench::start(lim).await;
    let mut squatters = Vec::new();
    for _ in 0..2 {
        squatters.push(b.dial(false).await.expect("under the cap"));
        b.handed.recv().await.unwrap();
    }
    assert_eq!(b.stats.unauthenticated(), 2);
    // The agent of that address, with its certificate.
    let mut agent = b.dial(true).await.expect("a node's connection is admitted");
    assert!(b.handed.recv().await.unwrap().is_authenticated());
    assert_eq!(
        b.stats.unauthenticated(),
        2,
        "not counted against the address"
    );
    // A token's user: in, in place of the oldest squatter; its request authenticates.
    let mut user = b.dial(false).await.expect("a newcomer is admitted");
    b.handed.recv().await.unwrap().authenticated();
    assert!(
        closed_tls(&mut squatters[0]).await,
        "the oldest unauthenticated made room"
    );
    assert_eq!(b.stats.refused(Refusal::PerAddress), 1);
    assert_eq!(b.stats.unauthenticated(), 1);
    // The squatter that is left pings on, and is closed at the deadline all the same.
    assert!(pings_until_closed(&mut squatters[1], Duration::from_secs(4)).await);
    assert_eq!(b.stats.refused(Refusal::Unauthenticated), 1);
    assert!(
        !pings_until_closed(&mut agent, Duration::from_millis(300)).await,
        "the agent stays"
    );
    assert!(
        !pings_until_closed(&mut user, Duration::from_millis(300)).await,
        "the token's user stays"
    );
    assert_eq!(b.stats.unauthenticated(), 0);
}

async fn closed_tls(s: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> bool {
    let mut b = [0u8; 64];
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
    false
}

/// Slow TLS handshakes of one address cannot keep a new one from its turn: past
/// `max_per_address` pending, the oldest is closed for the newcomer.
#[tokio::test]
async fn the_oldest_pending_handshake_of_an_address_makes_room() {
    let mut lim = limits();
    lim.max_per_address = 3;
    lim.handshake_timeout = Duration::from_secs(20);
    let mut b = TlsBench::start(lim).await;
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(tokio::net::TcpStream::connect(b.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _agent = b
        .dial(true)
        .await
        .expect("admitted past the slow handshakes");
    assert!(b.handed.recv().await.unwrap().is_authenticated());
    assert!(
        closed(&mut silent[0]).await,
        "the oldest slow handshake made room"
    );
    assert_eq!(b.stats.refused(Refusal::PerAddress), 1);
}
