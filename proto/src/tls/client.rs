//! The client side: tonic channels that dial TLS themselves, with the cluster CA pinned
//! (nothing else is trusted) and, for a node, the certificate it holds now (a renewed
//! one is used from the next connection on, without a restart).

use std::sync::{Arc, RwLock};

use rustls::client::ResolvesClientCert;
use rustls::pki_types::ServerName;
use rustls::sign::CertifiedKey;

use super::{SERVER_NAME, TlsError, certs_from_pem, provider};

/// A node's current certificate and key, swapped when it renews.
#[derive(Debug)]
pub struct NodeIdentity(RwLock<Arc<CertifiedKey>>);

impl NodeIdentity {
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Arc<NodeIdentity>, TlsError> {
        Ok(Arc::new(NodeIdentity(RwLock::new(certified(
            cert_pem, key_pem,
        )?))))
    }

    /// Uses this certificate for every connection from now on.
    pub fn replace(&self, cert_pem: &str, key_pem: &str) -> Result<(), TlsError> {
        *self.0.write().expect("not poisoned") = certified(cert_pem, key_pem)?;
        Ok(())
    }
}

fn certified(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, TlsError> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    let chain = certs_from_pem(cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| TlsError::Cert {
        what: "the node's private key",
        why: e.to_string(),
    })?;
    let key = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Cert {
            what: "the node's private key",
            why: e.to_string(),
        })?;
    Ok(Arc::new(CertifiedKey::new(chain, key)))
}

impl ResolvesClientCert for NodeIdentity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().expect("not poisoned").clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// How a client dials the controller over TLS.
#[derive(Clone)]
pub struct ClientTls {
    pub(super) config: Arc<rustls::ClientConfig>,
}

impl ClientTls {
    /// Trusts `ca_pem` alone; presents `identity` when given (a node).
    pub fn new(ca_pem: &str, identity: Option<Arc<NodeIdentity>>) -> Result<ClientTls, TlsError> {
        let bad = |e: &dyn std::fmt::Display| TlsError::Cert {
            what: "the TLS client configuration",
            why: e.to_string(),
        };
        let mut roots = rustls::RootCertStore::empty();
        for c in certs_from_pem(ca_pem)? {
            roots.add(c).map_err(|e| bad(&e))?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(&e))?
            .with_root_certificates(roots);
        let mut config = match identity {
            Some(id) => builder.with_client_cert_resolver(id),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(ClientTls {
            config: Arc::new(config),
        })
    }

    /// The rustls configuration (tests that speak TLS by hand).
    #[cfg(test)]
    pub(crate) fn rustls_config(&self) -> Arc<rustls::ClientConfig> {
        self.config.clone()
    }

    /// A channel to `endpoint` (its URL's host and port; `https://`) that dials TLS
    /// through this configuration, connecting when first used.
    pub fn channel(&self, endpoint: tonic::transport::Endpoint) -> tonic::transport::Channel {
        endpoint.connect_with_connector_lazy(self.connector())
    }

    /// The same, connected now.
    pub async fn connect(
        &self,
        endpoint: tonic::transport::Endpoint,
    ) -> Result<tonic::transport::Channel, tonic::transport::Error> {
        endpoint.connect_with_connector(self.connector()).await
    }

    fn connector(
        &self,
    ) -> impl tower::Service<
        http::Uri,
        Response = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
        Error = std::io::Error,
        Future = impl Send,
    > + Send
    + Clone
    + 'static {
        let tls = tokio_rustls::TlsConnector::from(self.config.clone());
        tower::service_fn(move |uri: http::Uri| {
            let tls = tls.clone();
            async move {
                let host = uri.host().unwrap_or("localhost").trim_matches(['[', ']']);
                let port = uri.port_u16().unwrap_or(443);
                let tcp = tokio::net::TcpStream::connect((host, port)).await?;
                // Small requests and reports go out at once, not after a delayed ACK.
                tcp.set_nodelay(true)?;
                let name = ServerName::try_from(SERVER_NAME).expect("a valid DNS name");
                let stream = tls.connect(name, tcp).await?;
                Ok(hyper_util::rt::TokioIo::new(stream))
            }
        })
    }
}
