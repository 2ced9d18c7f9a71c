//! TLS on every TCP connection, with the cluster's own CA.
//!
//! `gpuctld` creates the CA in its state dir on first start (`ca.pem`, public, and
//! `ca.key`, 0600, as it creates the cluster key) and a server certificate on every
//! start. Every controller certificate carries the name [`SERVER_NAME`], which is what
//! clients verify (as Nomad's clients verify `server.<region>.nomad`): trust comes from
//! pinning the cluster's CA, which only the controller can sign with, not from DNS.
//!
//! A node joins with a single-use token: it fetches the CA over a connection it checks
//! against the CA fingerprint it was given ([`fetch_ca`]), then sends a certificate
//! request for its key (made here, [`NodeRequest`]); the controller signs it for the node
//! name alone ([`Ca::sign_node`]). From then on the node presents that certificate
//! (mutual TLS) and the controller knows which node a connection is by the certificate's
//! fingerprint.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};

/// The name every controller certificate carries and every client verifies.
pub const SERVER_NAME: &str = "gpuctld";

const CA_CERT: &str = "ca.pem";
const CA_KEY: &str = "ca.key";

/// The CA's lifetime: ten years (it signs the short-lived ones).
const CA_DAYS: i64 = 3650;
/// The controller's own certificate, made again at every start.
const SERVER_DAYS: i64 = 365;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {path}: {source}")]
    File {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {why}")]
    Cert { what: &'static str, why: String },
    #[error(
        "{0:?} is not a CA fingerprint: expected sha256: and 64 hex digits, as `gpuctl admin join-token create` prints"
    )]
    BadFingerprint(String),
    #[error("cannot reach the controller at {addr}: {why}")]
    Connect { addr: String, why: String },
}

fn cert_err(what: &'static str) -> impl Fn(rcgen::Error) -> TlsError {
    move |e| TlsError::Cert {
        what,
        why: e.to_string(),
    }
}

/// `sha256:` and the hex SHA-256 of a certificate's DER bytes.
pub fn fingerprint(der: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(der)))
}

/// The 32 bytes of a `sha256:...` fingerprint.
pub fn parse_fingerprint(s: &str) -> Result<[u8; 32], TlsError> {
    let bad = || TlsError::BadFingerprint(crate::text::shown(s, 100));
    let hex_part = s.trim().strip_prefix("sha256:").ok_or_else(bad)?;
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_part.replace(':', ""), &mut out).map_err(|_| bad())?;
    Ok(out)
}

/// DER bytes as a PEM certificate.
pub fn cert_pem(der: &[u8]) -> String {
    pem::encode(&pem::Pem::new("CERTIFICATE", der))
}

/// The certificates of a PEM file's text, in order.
pub fn certs_from_pem(text: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Cert {
            what: "PEM certificates",
            why: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Cert {
            what: "PEM certificates",
            why: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

fn time_at(unix_s: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(unix_s).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn random_serial() -> SerialNumber {
    use rand::RngCore;
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    b[0] &= 0x7f; // a positive integer
    SerialNumber::from_slice(&b)
}

/// A certificate chain and its private key: what a server or a node presents.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Identity {
    /// The chain's PEM text (leaf first).
    pub fn chain_pem(&self) -> String {
        self.chain.iter().map(|c| cert_pem(c)).collect()
    }
    pub fn key_pem(&self) -> String {
        pem::encode(&pem::Pem::new("PRIVATE KEY", self.key.secret_der()))
    }
}

/// The cluster's certificate authority (the controller's state dir).
pub struct Ca {
    der: CertificateDer<'static>,
    key: KeyPair,
}

impl Ca {
    /// Loads `ca.pem` and `ca.key` from `dir`, or creates them; returns the CA and
    /// whether it was created. The key file must be the owner's alone.
    pub fn load_or_create(dir: &Path, now_s: i64) -> Result<(Ca, bool), TlsError> {
        let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
        if key_path.exists() {
            let key_text = read_private(&key_path, "CA key")?;
            let cert_text =
                std::fs::read_to_string(&cert_path).map_err(|source| TlsError::File {
                    what: "cannot read the CA certificate",
                    path: cert_path.display().to_string(),
                    source,
                })?;
            let key = KeyPair::from_pem(&key_text).map_err(cert_err("the CA key"))?;
            let der = certs_from_pem(&cert_text)?.remove(0);
            return Ok((Ca { der, key }, false));
        }
        let key = KeyPair::generate().map_err(cert_err("a CA key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "gpuctl cluster CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = time_at(now_s - 3600);
        params.not_after = time_at(now_s + CA_DAYS * 86_400);
        params.serial_number = Some(random_serial());
        let cert = params
            .self_signed(&key)
            .map_err(cert_err("the CA certificate"))?;
        write_file(&key_path, key.serialize_pem().as_bytes(), 0o600, "CA key")?;
        write_file(&cert_path, cert.pem().as_bytes(), 0o644, "CA certificate")?;
        Ok((
            Ca {
                der: cert.der().clone(),
                key,
            },
            true,
        ))
    }

    pub fn der(&self) -> &CertificateDer<'static> {
        &self.der
    }

    pub fn pem(&self) -> String {
        cert_pem(&self.der)
    }

    pub fn fingerprint(&self) -> String {
        fingerprint(&self.der)
    }

    fn issuer(&self) -> Result<Issuer<'static, &KeyPair>, TlsError> {
        Issuer::from_ca_cert_der(&self.der, &self.key).map_err(cert_err("the CA certificate"))
    }

    /// A new server certificate: [`SERVER_NAME`], `localhost`, the loopback addresses
    /// and `names` (the host's name and the addresses it listens on).
    pub fn server_identity(&self, names: &[String], now_s: i64) -> Result<Identity, TlsError> {
        let mut all = vec![
            SERVER_NAME.to_string(),
            "localhost".into(),
            "127.0.0.1".into(),
            "::1".into(),
        ];
        for n in names {
            if !n.is_empty() && !all.contains(n) {
                all.push(n.clone());
            }
        }
        // A name a certificate cannot carry (a host name with '_') is left out: clients
        // verify SERVER_NAME, which is always there.
        let mut params = CertificateParams::default();
        params.subject_alt_names = all
            .into_iter()
            .filter_map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(ip) => Some(SanType::IpAddress(ip)),
                Err(_) => n.try_into().ok().map(SanType::DnsName),
            })
            .collect();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, SERVER_NAME);
        params.distinguished_name = dn;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = time_at(now_s - 3600);
        params.not_after = time_at(now_s + SERVER_DAYS * 86_400);
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(cert_err("a server key"))?;
        let cert = params
            .signed_by(&key, &self.issuer()?)
            .map_err(cert_err("the server certificate"))?;
        Ok(Identity {
            chain: vec![cert.der().clone(), self.der.clone()],
            key: PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        })
    }

    /// Signs a node's certificate request for `node` alone, valid from `not_before` to
    /// `not_after` (Unix seconds): whatever names or uses the request asks for, the
    /// certificate names the node and serves only to authenticate a client.
    pub fn sign_node(
        &self,
        csr_der: &[u8],
        node: &str,
        not_before: i64,
        not_after: i64,
    ) -> Result<CertificateDer<'static>, TlsError> {
        let mut csr = CertificateSigningRequestParams::from_der(&csr_der.to_vec().into())
            .map_err(cert_err("the node's certificate request"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, node);
        params.distinguished_name = dn;
        params.subject_alt_names = match node.to_string().try_into() {
            Ok(name) => vec![SanType::DnsName(name)],
            Err(_) => vec![],
        };
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = time_at(not_before);
        params.not_after = time_at(not_after);
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        csr.params = params;
        let cert = csr
            .signed_by(&self.issuer()?)
            .map_err(cert_err("the node certificate"))?;
        Ok(cert.der().clone())
    }
}

/// A node's new key and its certificate request.
pub struct NodeRequest {
    pub key_pem: String,
    pub csr_der: Vec<u8>,
}

impl NodeRequest {
    pub fn new(node: &str) -> Result<NodeRequest, TlsError> {
        let key = KeyPair::generate().map_err(cert_err("a node key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, node);
        params.distinguished_name = dn;
        let csr = params
            .serialize_request(&key)
            .map_err(cert_err("a certificate request"))?;
        Ok(NodeRequest {
            key_pem: key.serialize_pem(),
            csr_der: csr.der().to_vec(),
        })
    }
}

/// rustls with ring (aws-lc-rs would need cmake and a C toolchain on every host).
#[allow(deprecated)] // "no post-quantum key exchange": ring has none; tonic uses the same
/// ring's provider, with X25519 the first key exchange offered and chosen. rustls
/// 0.23.48 lists P-384 first, and ring's P-384 has no assembly: its ECDH cost about a
/// millisecond of CPU a handshake on each side here, a third of a CLI call over TCP
/// (docs/benchmarks.md, "What TLS costs"). P-256 and P-384 stay, after it.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::kx_group;
    let mut p = rustls::crypto::ring::default_provider();
    p.kx_groups = vec![kx_group::X25519, kx_group::SECP256R1, kx_group::SECP384R1];
    Arc::new(p)
}

/// The controller's TLS: its identity, and client certificates verified against the
/// cluster CA when a client presents one (nodes do; users with tokens do not).
pub fn server_config(
    id: Identity,
    ca: &CertificateDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let bad = |e: &dyn std::fmt::Display| TlsError::Cert {
        what: "the TLS server configuration",
        why: e.to_string(),
    };
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).map_err(|e| bad(&e))?;
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|e| bad(&e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(id.chain, id.key)
        .map_err(|e| bad(&e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Checks a server's chain against a pinned CA fingerprint: the chain must hold that CA,
/// and the leaf must verify under it as [`SERVER_NAME`]. Keeps the CA it found.
#[derive(Debug)]
struct Pinned {
    want: [u8; 32],
    found: Mutex<Option<CertificateDer<'static>>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| Sha256::digest(c.as_ref()).as_slice() == self.want)
            .ok_or_else(|| {
                rustls::Error::General(
                    "the controller's certificate chain holds no CA with the pinned fingerprint"
                        .into(),
                )
            })?;
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            self.provider.clone(),
        )
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
        let ok = inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now)?;
        *self.found.lock().expect("not poisoned") = Some(ca.clone().into_owned());
        Ok(ok)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The cluster CA of the controller at `addr` (`host:port`), as PEM, over a TLS
/// connection whose chain must hold a CA with `fingerprint` (`sha256:...`) that signed
/// the server's certificate: what a joining node pins before it sends its token.
pub async fn fetch_ca(addr: &str, fingerprint: &str) -> Result<String, TlsError> {
    let want = parse_fingerprint(fingerprint)?;
    let failed = |why: String| TlsError::Connect {
        addr: addr.to_string(),
        why,
    };
    let pinned = Arc::new(Pinned {
        want,
        found: Mutex::new(None),
        provider: provider(),
    });
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| failed(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(pinned.clone())
        .with_no_client_auth();
    let tcp = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tokio::net::TcpStream::connect(addr),
    )
    .await
    .map_err(|_| failed("timed out".into()))?
    .map_err(|e| failed(e.to_string()))?;
    let name = ServerName::try_from(SERVER_NAME).expect("a valid DNS name");
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tls = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        connector.connect(name, tcp),
    )
    .await
    .map_err(|_| failed("the TLS handshake timed out".into()))?
    .map_err(|e| failed(format!("TLS: {e}")))?;
    drop(tls);
    let ca = pinned.found.lock().expect("not poisoned").take();
    ca.map(|c| cert_pem(&c))
        .ok_or_else(|| failed("the server presented no CA".into()))
}

/// Reads a private file: refused when group or others can read it.
pub fn read_private(path: &Path, what: &'static str) -> Result<String, TlsError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| TlsError::File {
        what: "cannot read",
        path: path.display().to_string(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(err)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TlsError::Cert {
            what,
            why: format!(
                "{} can be read by other users (mode {mode:o}); run `chmod 600 {}`",
                path.display(),
                path.display()
            ),
        });
    }
    std::fs::read_to_string(path).map_err(err)
}

/// Writes a file whole, with `mode` (`statedir::write_whole`).
pub fn write_file(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    what: &'static str,
) -> Result<(), TlsError> {
    crate::statedir::write_whole(path, bytes, mode).map_err(|source| TlsError::File {
        what,
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests;

mod client;
pub use client::{ClientTls, NodeIdentity};
/// What `server_config` makes (for callers that hold one).
pub use rustls::ServerConfig;
