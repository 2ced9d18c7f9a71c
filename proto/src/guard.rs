//! Bounded listeners: what every TCP (and Unix) listener of both daemons accepts through,
//! so that a flood of idle connections cannot use up the process's descriptors or memory.
//!
//! - A cap on open connections in all and per peer address, and a reserve of file
//!   descriptors that connections may never take (the Unix socket, agents' streams, the
//!   store and job files keep working under a flood).
//! - Classes ([`slot`]): the per-address caps count only connections that have not
//!   proved who they are; agents (a client certificate) and token users (a request that
//!   authenticated) are out of them, with a reserve of the total kept for them, and an
//!   unauthenticated connection may live only so long.
//! - A handshake deadline: a connection must send its first request's headers (HTTP/2:
//!   a HEADERS frame after the preface; HTTP/1: the end of the header block) within it.
//! - An idle deadline: a connection that sends nothing for this long is closed (the
//!   gRPC server's keepalive pings keep live clients talking).
//! - Every refusal counts in [`Stats`] by reason (the daemons export them as metrics)
//!   and is logged as one summary line per period, not one line per connection.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};

/// Who a connection comes from, as the caps count it: a TCP peer's address, or a Unix
/// socket peer's uid (from its credentials).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    Ip(IpAddr),
    Uid(u32),
}
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

mod slot;
mod transport;
pub use slot::Auth;
use slot::{Class, Slot};
pub use transport::{TcpPeer, Transport};

/// What a listener allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open connections in all.
    pub max_connections: usize,
    /// Open connections from one peer address.
    pub max_per_address: usize,
    /// Time from accept to the first request's headers.
    pub handshake_timeout: Duration,
    /// Time without a byte from the peer before the connection is closed.
    pub idle_timeout: Duration,
    /// Descriptors kept free for everything that is not a new connection.
    pub reserved_fds: u64,
    /// Connections in all that only authenticated peers may take (unauthenticated ones
    /// stop at `max_connections` less this).
    pub authenticated_reserve: usize,
    /// An unauthenticated connection is closed this long after accept (`None`: never
    /// for that reason; listeners whose peers never authenticate).
    pub auth_timeout: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 16_384,
            max_per_address: 256,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            reserved_fds: 256,
            authenticated_reserve: 1024,
            auth_timeout: None,
        }
    }
}

/// What the peer speaks: decides when its handshake is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// gRPC: the client preface, then frames until the first HEADERS frame.
    Http2,
    /// The metrics and web pages: the first request's header block (`\r\n\r\n`).
    Http1,
}

/// Why a connection was refused or closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The listener's cap on open connections.
    Total,
    /// The cap per peer address.
    PerAddress,
    /// Too few free descriptors left (the reserve).
    Descriptors,
    /// No request headers within the handshake deadline.
    Handshake,
    /// Nothing from the peer within the idle deadline.
    Idle,
    /// Not authenticated within the listener's `auth_timeout`.
    Unauthenticated,
}

impl Refusal {
    pub const ALL: [Refusal; 6] = [
        Refusal::Total,
        Refusal::PerAddress,
        Refusal::Descriptors,
        Refusal::Handshake,
        Refusal::Idle,
        Refusal::Unauthenticated,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Total => "total_cap",
            Refusal::PerAddress => "per_address_cap",
            Refusal::Descriptors => "fd_reserve",
            Refusal::Handshake => "handshake_timeout",
            Refusal::Idle => "idle_timeout",
            Refusal::Unauthenticated => "auth_timeout",
        }
    }
}

/// Connections per peer, oldest first.
type Queues = HashMap<Peer, std::collections::VecDeque<std::sync::Weak<Slot>>>;

/// A listener's counters, shared with its connections and read by the metrics.
#[derive(Debug)]
pub struct Stats {
    pub name: &'static str,
    limits: Limits,
    /// Unauthenticated connections per peer.
    open: Mutex<HashMap<Peer, usize>>,
    /// TLS handshakes under way per peer, oldest first.
    pending: Mutex<Queues>,
    /// Unauthenticated connections per peer, oldest first.
    unauthenticated_order: Mutex<Queues>,
    total: AtomicU64,
    unauthenticated: AtomicU64,
    refused: [AtomicU64; 6],
    log: crate::ratelog::RateLog,
}

impl Stats {
    pub fn new(name: &'static str, limits: Limits) -> Arc<Stats> {
        Arc::new(Stats {
            name,
            limits,
            open: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            unauthenticated_order: Mutex::new(HashMap::new()),
            total: AtomicU64::new(0),
            unauthenticated: AtomicU64::new(0),
            refused: Default::default(),
            log: crate::ratelog::RateLog::new(Duration::from_secs(10)),
        })
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Connections refused or closed for `why` since start.
    pub fn refused(&self, why: Refusal) -> u64 {
        self.refused[why as usize].load(Ordering::Relaxed)
    }

    fn count(&self, why: Refusal, peer: Option<Peer>) {
        self.refused[why as usize].fetch_add(1, Ordering::Relaxed);
        let name = self.name;
        self.log.note(|n, secs| {
            tracing::warn!(
                listener = name,
                reason = why.as_str(),
                last_peer = ?peer,
                "{n} connection(s) refused or closed on the {name} listener in the last {secs} s ({}); see gpuctl_connections_refused_total",
                why.as_str()
            );
        });
    }

    /// Connections open now that have not authenticated (TLS handshakes excluded).
    pub fn unauthenticated(&self) -> u64 {
        self.unauthenticated.load(Ordering::Relaxed)
    }

    /// Takes a slot for a connection from `peer`, or says why not: pending its TLS
    /// handshake (`tls`), else unauthenticated at once.
    fn admit(self: &Arc<Self>, peer: Option<Peer>, tls: bool) -> Result<Arc<Slot>, Refusal> {
        if self.open() as usize >= self.limits.max_connections {
            return Err(Refusal::Total);
        }
        if !tls {
            self.admit_unauthenticated(peer)?;
        }
        self.total.fetch_add(1, Ordering::Relaxed);
        // A slot from here on: dropped, it gives its counts back.
        let class = if tls {
            Class::Pending
        } else {
            Class::Unauthenticated
        };
        let slot = Slot::new(self.clone(), peer, class);
        // Counted last: a peer over its cap does not use up the count's estimate.
        if fds_left().is_some_and(|left| left < self.limits.reserved_fds) {
            return Err(Refusal::Descriptors);
        }
        Ok(slot)
    }

    /// The oldest unauthenticated connection of `peer` still open.
    fn oldest_unauthenticated(&self, peer: Option<Peer>) -> Option<Arc<Slot>> {
        let mut order = self
            .unauthenticated_order
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let q = order.get_mut(&peer?)?;
        while let Some(w) = q.pop_front() {
            if let Some(slot) = w.upgrade() {
                return Some(slot);
            }
        }
        None
    }

    /// Counts one more unauthenticated connection of `peer`, if the caps allow.
    fn admit_unauthenticated(&self, peer: Option<Peer>) -> Result<(), Refusal> {
        let cap = (self.limits.max_connections)
            .saturating_sub(self.limits.authenticated_reserve)
            .max(1);
        if self.unauthenticated() as usize >= cap {
            return Err(Refusal::Total);
        }
        if let Some(p) = peer {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            let n = open.entry(p).or_default();
            if *n >= self.limits.max_per_address {
                return Err(Refusal::PerAddress);
            }
            *n += 1;
        }
        self.unauthenticated.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Free descriptors under the soft limit (`None` where they cannot be counted).
/// Counting them lists /proc/self/fd (a millisecond with thousands open), so a count
/// serves for [`FD_RECOUNT`], less one for each connection admitted meanwhile.
fn fds_left() -> Option<u64> {
    static CACHE: Mutex<Option<(std::time::Instant, u64)>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((at, left)) = cache.as_mut()
        && at.elapsed() < FD_RECOUNT
    {
        *left = left.saturating_sub(1);
        return Some(*left + 1);
    }
    let (soft, _) = nix_rlimit()?;
    let used = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    let left = soft.saturating_sub(used);
    *cache = Some((std::time::Instant::now(), left));
    Some(left)
}

/// How long a count of free descriptors is used.
const FD_RECOUNT: Duration = Duration::from_millis(100);

fn nix_rlimit() -> Option<(u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one struct rlimit to the pointer given.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    (rc == 0).then_some((r.rlim_cur, r.rlim_max))
}

/// Raises the soft descriptor limit to the hard one (as servers do at start); answers
/// the limit in effect.
pub fn raise_fd_limit() -> Option<u64> {
    let (soft, hard) = nix_rlimit()?;
    if soft < hard {
        let r = libc::rlimit {
            rlim_cur: hard,
            rlim_max: hard,
        };
        // SAFETY: setrlimit reads one struct rlimit from the pointer given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } == 0 {
            return Some(hard);
        }
    }
    Some(soft)
}

/// Where a connection is in its handshake.
#[derive(Debug)]
enum Phase {
    /// HTTP/2: bytes of the 24-byte preface still to come.
    Preface(usize),
    /// HTTP/2: inside a frame; `header` collects the 9-byte frame header, then `skip`
    /// payload bytes follow.
    Frames {
        header: [u8; 9],
        have: usize,
        skip: usize,
    },
    /// HTTP/1: how many bytes of `\r\n\r\n` were seen last.
    Header(usize),
    Done,
}

/// An accepted connection under its listener's limits.
#[derive(Debug)]
pub struct Guarded<S> {
    inner: S,
    phase: Phase,
    /// The next deadline (handshake, then idle) and when the peer last sent a byte.
    deadline: Pin<Box<Sleep>>,
    last_read: Instant,
    accepted: Instant,
    limits: Limits,
    slot: Arc<Slot>,
}

impl<S> Guarded<S> {
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Advances the handshake over bytes the peer sent.
    fn saw(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.phase {
                Phase::Done => return,
                Phase::Preface(left) => {
                    let n = (*left).min(bytes.len());
                    *left -= n;
                    bytes = &bytes[n..];
                    if *left == 0 {
                        self.phase = Phase::Frames {
                            header: [0; 9],
                            have: 0,
                            skip: 0,
                        };
                    }
                }
                Phase::Frames { header, have, skip } => {
                    if *skip > 0 {
                        let n = (*skip).min(bytes.len());
                        *skip -= n;
                        bytes = &bytes[n..];
                        continue;
                    }
                    let n = (9 - *have).min(bytes.len());
                    header[*have..*have + n].copy_from_slice(&bytes[..n]);
                    *have += n;
                    bytes = &bytes[n..];
                    if *have == 9 {
                        // Frame type 1 is HEADERS: the first request has arrived.
                        if header[3] == 1 {
                            self.phase = Phase::Done;
                        } else {
                            *skip = usize::from(header[0]) << 16
                                | usize::from(header[1]) << 8
                                | usize::from(header[2]);
                            *have = 0;
                        }
                    }
                }
                Phase::Header(matched) => {
                    for (i, b) in bytes.iter().enumerate() {
                        let want = b"\r\n\r\n"[*matched];
                        *matched = if *b == want {
                            *matched + 1
                        } else if *b == b'\r' {
                            1
                        } else {
                            0
                        };
                        if *matched == 4 {
                            self.phase = Phase::Done;
                            bytes = &bytes[i + 1..];
                            break;
                        }
                    }
                    if !matches!(self.phase, Phase::Done) {
                        return;
                    }
                }
            }
        }
    }

    /// The deadline after the handshake: idle from the last read, and for a
    /// connection not yet authenticated, its end of `auth_timeout` too.
    fn next_deadline(&self) -> (Instant, Refusal) {
        let idle = self.last_read + self.limits.idle_timeout;
        match self.limits.auth_timeout {
            Some(t) if self.slot.class() != Class::Authenticated && self.accepted + t < idle => {
                (self.accepted + t, Refusal::Unauthenticated)
            }
            _ => (idle, Refusal::Idle),
        }
    }

    /// Closes a connection that a newer one of its address took the place of.
    fn evicted(&self) -> io::Error {
        self.slot.stats.count(Refusal::PerAddress, self.slot.peer);
        io::Error::new(
            io::ErrorKind::ConnectionReset,
            "connection closed: a newer one of its address took its place",
        )
    }

    /// `Some(why)` when the connection's deadline has passed.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<Refusal> {
        self.slot.waker.register(cx.waker());
        loop {
            if self.deadline.as_mut().poll(cx).is_pending() {
                return None;
            }
            if !matches!(self.phase, Phase::Done) {
                return Some(Refusal::Handshake);
            }
            // Reads push the idle deadline lazily: re-arm from the last read.
            let (next, why) = self.next_deadline();
            if next <= Instant::now() {
                return Some(why);
            }
            self.deadline.as_mut().reset(next);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.slot.is_evicted() {
            return Poll::Ready(Err(self.evicted()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.last_read = Instant::now();
                    // Only a handshake in progress looks at the bytes.
                    if !matches!(self.phase, Phase::Done) {
                        let got = buf.filled()[before..].to_vec();
                        self.saw(&got);
                        if matches!(self.phase, Phase::Done) {
                            let (next, _) = self.next_deadline();
                            self.deadline.as_mut().reset(next);
                        }
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.expired(cx) {
                None if self.slot.is_evicted() => Poll::Ready(Err(self.evicted())),
                Some(why) => {
                    self.slot.stats.count(why, self.slot.peer);
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("connection closed: {}", why.as_str()),
                    )))
                }
                None => Poll::Pending,
            },
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Guarded<Transport<tokio::net::TcpStream>> {
    type ConnectInfo = TcpPeer;
    fn connect_info(&self) -> Self::ConnectInfo {
        TcpPeer {
            addr: self.inner.get_ref().peer_addr().ok(),
            tls: self.inner.is_tls(),
            certificate: self.inner.peer_certificate(),
            auth: Auth::of(&self.slot),
        }
    }
}

impl tonic::transport::server::Connected for Guarded<Transport<tokio::net::UnixStream>> {
    type ConnectInfo = tonic::transport::server::UdsConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.get_ref().connect_info()
    }
}

/// One kind of listener (TCP or Unix) that [`Listener`] accepts from.
pub trait Accept: Send + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(Self::Stream, Option<Peer>)>>;
}

impl Accept for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(Self::Stream, Option<Peer>)>> {
        tokio::net::TcpListener::poll_accept(self, cx).map_ok(|(s, a)| {
            // Small replies and commands go out at once, not after the peer's delayed
            // ACK (up to 40 ms on Linux).
            let _ = s.set_nodelay(true);
            (s, Some(Peer::Ip(a.ip())))
        })
    }
}

impl Accept for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(Self::Stream, Option<Peer>)>> {
        // Each local user has their own cap (their uid, from the socket's credentials).
        tokio::net::UnixListener::poll_accept(self, cx).map_ok(|(s, _)| {
            let uid = s.peer_cred().ok().map(|c| Peer::Uid(c.uid()));
            (s, uid)
        })
    }
}

type Handshake<S> = Pin<Box<dyn Future<Output = Option<Guarded<Transport<S>>>> + Send>>;

/// A listener whose connections are [`Guarded`]: a `Stream` of them for tonic, and
/// `accept` for axum. With TLS, handshakes run side by side inside the listener, each
/// within its connection's handshake deadline and holding its permit.
pub struct Listener<L: Accept> {
    inner: L,
    stats: Arc<Stats>,
    protocol: Protocol,
    /// After EMFILE/ENFILE: accept again only after this (the backlog waits meanwhile).
    backoff: Option<Pin<Box<Sleep>>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handshakes: FuturesUnordered<Handshake<L::Stream>>,
}

impl<L: Accept> Listener<L> {
    pub fn new(inner: L, stats: Arc<Stats>, protocol: Protocol) -> Self {
        Listener {
            inner,
            stats,
            protocol,
            backoff: None,
            tls: None,
            handshakes: FuturesUnordered::new(),
        }
    }

    /// Serves TLS with `config` on every connection.
    pub fn with_tls(self, config: Arc<rustls::ServerConfig>) -> Self {
        Listener {
            tls: Some(tokio_rustls::TlsAcceptor::from(config)),
            ..self
        }
    }

    pub fn get_ref(&self) -> &L {
        &self.inner
    }

    fn poll_next_conn(&mut self, cx: &mut Context<'_>) -> Poll<Guarded<Transport<L::Stream>>> {
        while let Poll::Ready(conn) = self.poll_accepted(cx) {
            let Some(tls) = &self.tls else {
                return Poll::Ready(conn.map(Transport::Plain));
            };
            self.handshakes.push(Box::pin(handshake(tls.clone(), conn)));
        }
        while let Poll::Ready(Some(done)) = self.handshakes.poll_next_unpin(cx) {
            if let Some(conn) = done {
                return Poll::Ready(conn);
            }
        }
        Poll::Pending
    }

    fn poll_accepted(&mut self, cx: &mut Context<'_>) -> Poll<Guarded<L::Stream>> {
        loop {
            if let Some(b) = &mut self.backoff {
                if b.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.backoff = None;
            }
            let (stream, peer) = match self.inner.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(x)) => x,
                Poll::Ready(Err(e)) => {
                    if matches!(e.raw_os_error(), Some(24 /* EMFILE */ | 23 /* ENFILE */)) {
                        self.stats.count(Refusal::Descriptors, None);
                    }
                    // Accept errors (out of descriptors, a peer gone before accept)
                    // are never the server's end: wait a moment and go on.
                    let wait = Duration::from_millis(50);
                    self.backoff = Some(Box::pin(tokio::time::sleep(wait)));
                    continue;
                }
            };
            match self.stats.admit(peer, self.tls.is_some()) {
                Ok(slot) => {
                    let limits = self.stats.limits;
                    let now = Instant::now();
                    return Poll::Ready(Guarded {
                        inner: stream,
                        phase: match self.protocol {
                            Protocol::Http2 => Phase::Preface(24),
                            Protocol::Http1 => Phase::Header(0),
                        },
                        deadline: Box::pin(tokio::time::sleep_until(
                            now + limits.handshake_timeout,
                        )),
                        last_read: now,
                        accepted: now,
                        limits,
                        slot,
                    });
                }
                // Dropping the stream closes it at once.
                Err(why) => self.stats.count(why, peer),
            }
        }
    }
}

/// The TLS handshake of an admitted connection, within its handshake deadline; `None`
/// (counted, the connection closed) when it fails, runs out of time, or a newer
/// handshake of the same address took its place. Done, the connection is settled: a
/// client certificate authenticates it, else it must fit the unauthenticated caps.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    tls: tokio_rustls::TlsAcceptor,
    conn: Guarded<S>,
) -> Option<Guarded<Transport<S>>> {
    let Guarded {
        inner,
        phase,
        deadline,
        last_read,
        accepted,
        limits,
        slot,
    } = conn;
    let at = deadline.deadline();
    let done = tokio::select! {
        done = tokio::time::timeout_at(at, tls.accept(inner)) => done,
        () = slot.evicted.notified() => {
            slot.stats.count(Refusal::PerAddress, slot.peer);
            return None;
        }
    };
    match done {
        Ok(Ok(t)) => {
            let certificate = t
                .get_ref()
                .1
                .peer_certificates()
                .is_some_and(|c| !c.is_empty());
            if let Err(why) = slot.settle(certificate) {
                slot.stats.count(why, slot.peer);
                return None;
            }
            Some(Guarded {
                inner: Transport::Tls(Box::new(t)),
                phase,
                deadline,
                last_read,
                accepted,
                limits,
                slot,
            })
        }
        Ok(Err(_)) | Err(_) => {
            slot.stats.count(Refusal::Handshake, slot.peer);
            None
        }
    }
}

impl<S> Guarded<S> {
    /// Applies `f` to the stream, keeping the limits and deadlines.
    fn map<T>(self, f: impl FnOnce(S) -> T) -> Guarded<T> {
        Guarded {
            inner: f(self.inner),
            phase: self.phase,
            deadline: self.deadline,
            last_read: self.last_read,
            accepted: self.accepted,
            limits: self.limits,
            slot: self.slot,
        }
    }
}

impl<L: Accept + Unpin> futures::Stream for Listener<L> {
    type Item = io::Result<Guarded<Transport<L::Stream>>>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_next_conn(cx).map(|c| Some(Ok(c)))
    }
}

impl axum::serve::Listener for Listener<tokio::net::TcpListener> {
    type Io = Guarded<Transport<tokio::net::TcpStream>>;
    type Addr = SocketAddr;
    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let conn = std::future::poll_fn(|cx| self.poll_next_conn(cx)).await;
            if let Ok(addr) = conn.get_ref().get_ref().peer_addr() {
                return (conn, addr);
            }
        }
    }
    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

#[cfg(test)]
mod tests;
