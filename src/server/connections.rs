//! The connection cap: at most `--max-connections` webhook connections at a time.
//!
//! A connection takes a permit when it is accepted (before the TLS handshake) and gives it back
//! when it closes. Over the cap, a new connection is closed at once instead of waiting: the API
//! server then fails that call fast (and applies the webhook's failurePolicy) rather than after
//! its whole `timeoutSeconds`, and the connections already open keep being served. Clients that
//! hold a connection without using it cannot keep their permit for long: the header-read timeout
//! closes a connection that does not send a complete request head in time (with hyper, that
//! timer also runs while an HTTP/1.1 keep-alive connection waits for its next request), and the
//! TLS handshake has its own timeout. The probes on the metrics address are not behind the cap.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum_server::accept::Accept;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The protocol a connection negotiated: `h2`, `http/1.1`, `none` (no ALPN: HTTP/1.1, or
/// HTTP/2 with prior knowledge) or `other` (not expected: the server offers only the first two).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabels {
    pub protocol: &'static str,
}

/// What the acceptor counts: connections refused at the cap
/// (`allot_connections_refused_total`), accepted by protocol (`allot_connections_accepted_total`:
/// the API server speaks HTTP/1.1 to a Service webhook, one connection per concurrent call, and
/// HTTP/2 to a loopback URL, one connection for all) and open now, TLS established
/// (`allot_connections_open`; a connection still in its handshake holds a permit, not a count).
#[derive(Clone, Debug, Default)]
pub struct ConnectionCounters {
    pub refused: Counter,
    pub accepted: Family<ProtocolLabels, Counter>,
    pub open: Gauge,
}

/// A stream that knows the application protocol its handshake negotiated.
pub trait Negotiated {
    /// The ALPN protocol, `None` when the client offered none.
    fn alpn(&self) -> Option<&[u8]>;
}

impl<S> Negotiated for tokio_rustls::server::TlsStream<S> {
    fn alpn(&self) -> Option<&[u8]> {
        self.get_ref().1.alpn_protocol()
    }
}

/// The `protocol` label of a negotiated ALPN value (a fixed set: clients cannot add series).
fn protocol_label(alpn: Option<&[u8]>) -> &'static str {
    match alpn {
        Some(b"h2") => "h2",
        Some(b"http/1.1") => "http/1.1",
        // The server offers only those two; anything else would have failed the handshake.
        Some(_) => "other",
        None => "none",
    }
}

/// Wraps an acceptor (TLS) so that only `max` connections are open at once.
#[derive(Clone)]
pub struct CappedAcceptor<A> {
    inner: A,
    permits: Arc<Semaphore>,
    counters: ConnectionCounters,
}

impl<A> CappedAcceptor<A> {
    pub fn new(inner: A, max: usize, counters: ConnectionCounters) -> CappedAcceptor<A> {
        CappedAcceptor { inner, permits: Arc::new(Semaphore::new(max.max(1))), counters }
    }
}

impl<I, S, A> Accept<I, S> for CappedAcceptor<A>
where
    A: Accept<I, S>,
    A::Future: Send + 'static,
    A::Stream: Negotiated + Send + 'static,
    A::Service: Send + 'static,
{
    type Stream = Permitted<A::Stream>;
    type Service = A::Service;
    type Future = Pin<Box<dyn Future<Output = io::Result<(Self::Stream, Self::Service)>> + Send>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            // Dropping the stream closes the connection before any TLS work is spent on it.
            drop(stream);
            self.counters.refused.inc();
            tracing::debug!("connection cap reached; closed a new connection");
            return Box::pin(std::future::ready(Err(io::Error::other("connection cap reached"))));
        };
        let accepted = self.inner.accept(stream, service);
        let counters = self.counters.clone();
        Box::pin(async move {
            let (stream, service) = accepted.await?;
            let protocol = protocol_label(stream.alpn());
            counters.accepted.get_or_create(&ProtocolLabels { protocol }).inc();
            counters.open.inc();
            Ok((Permitted { stream, _permit: permit, open: counters.open }, service))
        })
    }
}

/// A connection holding one of the cap's permits until it is dropped.
pub struct Permitted<S> {
    stream: S,
    _permit: OwnedSemaphorePermit,
    /// `allot_connections_open`, lowered when the connection is dropped.
    open: Gauge,
}

impl<S> Drop for Permitted<S> {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Permitted<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Permitted<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
