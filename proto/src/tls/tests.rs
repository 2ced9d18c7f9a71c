use super::*;

const NOW: i64 = 1_800_000_000;

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A server on loopback with `ca`'s identity; returns its address.
async fn serve(ca: &Ca) -> std::net::SocketAddr {
    let config = server_config(ca.server_identity(&[], now_s()).unwrap(), ca.der()).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let a = acceptor.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                if let Ok(mut t) = a.accept(s).await {
                    let _ = t.write_all(b"hi").await;
                }
            });
        }
    });
    addr
}

#[test]
fn the_ca_is_created_private_then_reloaded() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (ca, created) = Ca::load_or_create(dir.path(), NOW).unwrap();
    assert!(created);
    let mode = std::fs::metadata(dir.path().join("ca.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let (again, created) = Ca::load_or_create(dir.path(), NOW).unwrap();
    assert!(!created);
    assert_eq!(ca.fingerprint(), again.fingerprint());
    assert!(ca.fingerprint().starts_with("sha256:") && ca.fingerprint().len() == 71);
    std::fs::set_permissions(
        dir.path().join("ca.key"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let e = Ca::load_or_create(dir.path(), NOW)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("chmod 600"), "{e}");
}

#[test]
fn fingerprints_parse_and_bad_ones_are_refused() {
    let f = fingerprint(b"x");
    assert_eq!(hex::encode(parse_fingerprint(&f).unwrap()), f[7..]);
    for bad in ["", "sha256:", "md5:00", &f[7..], "sha256:zz"] {
        assert!(parse_fingerprint(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_node_certificate_names_the_node_alone_and_verifies_under_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = Ca::load_or_create(dir.path(), NOW).unwrap();
    let req = NodeRequest::new("node7").unwrap();
    let der = ca
        .sign_node(&req.csr_der, "node7", NOW - 60, NOW + 3600)
        .unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let v =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .unwrap();
    let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(NOW as u64));
    v.verify_client_cert(&der, &[], at).unwrap();
    // Past its end it no longer verifies.
    let late = UnixTime::since_unix_epoch(std::time::Duration::from_secs(NOW as u64 + 7200));
    assert!(v.verify_client_cert(&der, &[], late).is_err());
    // Signed by another CA, refused.
    let other_dir = tempfile::tempdir().unwrap();
    let (other, _) = Ca::load_or_create(other_dir.path(), NOW).unwrap();
    let foreign = other
        .sign_node(&req.csr_der, "node7", NOW - 60, NOW + 3600)
        .unwrap();
    assert!(v.verify_client_cert(&foreign, &[], at).is_err());
    // A request that is not one is refused with a reason.
    assert!(ca.sign_node(b"garbage", "node7", NOW, NOW + 1).is_err());
}

#[tokio::test]
async fn fetch_ca_pins_the_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = Ca::load_or_create(dir.path(), now_s()).unwrap();
    let addr = serve(&ca).await.to_string();
    assert_eq!(fetch_ca(&addr, &ca.fingerprint()).await.unwrap(), ca.pem());
    let other = fingerprint(b"another CA");
    let e = fetch_ca(&addr, &other).await.err().unwrap().to_string();
    assert!(e.contains("pinned fingerprint"), "{e}");
}

/// Our client and server settle on X25519 in one round trip (no P-384 ECDH: ring has no
/// assembly for it, and it cost a millisecond a handshake on each side).
#[tokio::test]
async fn handshakes_use_x25519() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = Ca::load_or_create(dir.path(), now_s()).unwrap();
    let addr = serve(&ca).await;
    let client = ClientTls::new(&ca.pem(), None).unwrap();
    let tls = tokio_rustls::TlsConnector::from(client.config.clone());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from(SERVER_NAME).unwrap();
    let stream = tls.connect(name, tcp).await.unwrap();
    let (_, conn) = stream.get_ref();
    let group = conn.negotiated_key_exchange_group().unwrap().name();
    assert_eq!(group, rustls::NamedGroup::X25519);
    assert_eq!(conn.handshake_kind(), Some(rustls::HandshakeKind::Full));
}
