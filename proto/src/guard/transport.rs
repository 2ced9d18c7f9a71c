//! What a guarded connection carries: the accepted stream as it is, or TLS over it (the
//! handshake done by the listener, within the connection's handshake deadline, while it
//! goes on accepting others).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection's bytes: plain, or TLS over the accepted stream.
#[derive(Debug)]
pub enum Transport<S> {
    Plain(S),
    Tls(Box<tokio_rustls::server::TlsStream<S>>),
}

impl<S> Transport<S> {
    /// The accepted stream under any TLS.
    pub fn get_ref(&self) -> &S {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(t) => t.get_ref().0,
        }
    }

    /// The fingerprint (`sha256:...`) of the certificate the peer presented, if any.
    pub fn peer_certificate(&self) -> Option<String> {
        match self {
            Transport::Plain(_) => None,
            Transport::Tls(t) => t
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .map(|c| crate::tls::fingerprint(c)),
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(_))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Transport<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Transport<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Transport::Tls(t) => Pin::new(t.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Transport::Plain(s) => s.is_write_vectored(),
            Transport::Tls(t) => t.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
        }
    }
}

/// What the gRPC server knows of a TCP connection: the peer's address and, over TLS,
/// the fingerprint of the certificate it presented; and the handle with which it says
/// that a request on the connection authenticated.
#[derive(Debug, Clone)]
pub struct TcpPeer {
    pub addr: Option<std::net::SocketAddr>,
    pub tls: bool,
    pub certificate: Option<String>,
    pub auth: super::Auth,
}
