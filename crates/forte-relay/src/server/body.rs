//! Bodies too large to hold in memory: a request's handed to blocking store work chunk by chunk
//! as it arrives, and read from the connection only once that work asks for it; a stored part
//! sent out as it is read. Either way a request holds at most [`CHUNKS_IN_FLIGHT`] chunks
//! (hyper's chunks are at most its read buffer, about 400 KiB; ours [`SEND_CHUNK`]), so about
//! 2 MiB, whatever the size of the part.

use std::io::Read;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_util::{Future, StreamExt};
use http_body::{Frame, SizeHint};
use tokio::sync::{mpsc, oneshot};

use super::store::{Reader, StoreError};
use super::{Answer, Failure};

/// Chunks queued between the connection and the blocking work, either way.
const CHUNKS_IN_FLIGHT: usize = 4;

/// How much of a stored part is read at a time to be sent.
const SEND_CHUNK: usize = 256 << 10;

/// A request body as blocking work sees it: nothing is read from the connection before the
/// first call of `next`, so work that refuses the request first (a quota) reads none of it.
pub struct Chunks {
    arrived: mpsc::Receiver<Bytes>,
    wanted: Option<oneshot::Sender<()>>,
}

impl Iterator for Chunks {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if let Some(wanted) = self.wanted.take() {
            let _ = wanted.send(());
        }
        self.arrived.blocking_recv()
    }
}

/// Runs `work` off the async workers with `body` as it arrives. A body that breaks off (the
/// client went away, or it paused too long: [`Stalling`]) ends the chunks early: the work sees
/// a short body. What the work did not read (it refused the request first: a quota) is read
/// and thrown away after the answer ([`discard`]).
pub async fn with_body<T: Send + 'static>(
    body: Body,
    work: impl FnOnce(Chunks) -> Result<T, StoreError> + Send + 'static,
) -> Answer<T> {
    let (arriving, arrived) = mpsc::channel(CHUNKS_IN_FLIGHT);
    let (wanted, read_it) = oneshot::channel();
    let chunks = Chunks {
        arrived,
        wanted: Some(wanted),
    };
    let worker = tokio::task::spawn_blocking(move || work(chunks));
    let mut stream = body.into_data_stream();
    let mut ended = false;
    // Dropped unsent when the work ends without reading the body.
    if read_it.await.is_ok() {
        loop {
            match stream.next().await {
                Some(Ok(chunk)) => {
                    if arriving.send(chunk).await.is_err() {
                        break;
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!("request body broke off: {e}");
                    ended = true;
                    break;
                }
                None => {
                    ended = true;
                    break;
                }
            }
        }
    }
    drop(arriving);
    if !ended {
        tokio::spawn(discard(stream));
    }
    worker
        .await
        .map_err(|e| super::internal_error(&format!("worker failed: {e}")))?
        .map_err(Failure::from)
}

/// How long the rest of a refused body may pause before the connection is dropped.
const DISCARD_STALL: std::time::Duration = std::time::Duration::from_secs(30);

/// Reads and throws away the rest of a body the relay answered without reading. HTTP/1.1
/// clients send a body whole before they read the answer: a connection closed under it is a
/// reset they would retry, where the answer (413: over the quota) says not to. It costs the
/// link the refused body once, and the relay nothing it keeps; its length was bounded by the
/// gate ([`crate::api::MAX_BODY`]).
async fn discard(mut stream: axum::body::BodyDataStream) {
    while let Ok(Some(Ok(_))) = tokio::time::timeout(DISCARD_STALL, stream.next()).await {}
}

/// The length a request declares (`Content-Length`): a part's bytes are charged before they are
/// read, so a body must say how long it is.
pub fn declared_length(headers: &axum::http::HeaderMap) -> Answer<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            Failure::new(
                StatusCode::LENGTH_REQUIRED,
                "an upload must declare its Content-Length".to_string(),
            )
        })
}

/// A stored body sent as it is read, from a blocking thread.
pub fn stream_out((mut reader, length): Reader, what: String) -> Response {
    let (sending, sent) = mpsc::channel::<std::io::Result<Bytes>>(CHUNKS_IN_FLIGHT);
    tokio::task::spawn_blocking(move || loop {
        let mut chunk = vec![0u8; SEND_CHUNK];
        let read = match reader.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => {
                chunk.truncate(n);
                Ok(Bytes::from(chunk))
            }
            Err(e) => {
                tracing::error!("cannot read {what}: {e}");
                Err(e)
            }
        };
        let failed = read.is_err();
        // The client went away, or the read failed: the response ends short, which the
        // client sees against the Content-Length.
        if sending.blocking_send(read).is_err() || failed {
            return;
        }
    });
    let stream = futures_util::stream::unfold(sent, |mut sent| async move {
        sent.recv().await.map(|chunk| (chunk, sent))
    });
    (
        [(header::CONTENT_LENGTH, length)],
        Body::from_stream(stream),
    )
        .into_response()
}

/// The least a body must bring in each `stall` (the idle timeout) while the relay waits for it:
/// 137 bytes a second, below one upload's share of any link forte is used on (64 uploads
/// through a 10 kB/s `--bwlimit` bring 4.7 KiB each in 30 s).
pub const FLOOR_PER_STALL: u64 = 4 << 10;

/// A request body that fails once it brought less than [`FLOOR_PER_STALL`] in `stall` (the idle
/// timeout) while the relay waited for it: a client that declares a body and then pauses, or
/// trickles it a byte at a time, holds its connection, its spool file or its part of the
/// memory budget ([`super::memory`]) no longer than that. (Reset by any byte, a trickle of
/// one byte every 20 s held a body and 300 MiB of that budget for as long as it went on: the
/// review of issue 45.)
pub struct Stalling {
    inner: Body,
    stall: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    /// Bytes that arrived since the timer was last set.
    brought: u64,
}

impl Stalling {
    pub fn new(inner: Body, stall: Duration) -> Self {
        Self {
            inner,
            stall,
            timer: Box::pin(tokio::time::sleep(stall)),
            brought: 0,
        }
    }
}

impl http_body::Body for Stalling {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if let Some(Ok(arrived)) = &frame {
                this.brought += arrived.data_ref().map_or(0, Bytes::len) as u64;
            }
            if this.brought >= FLOOR_PER_STALL {
                this.brought = 0;
                let next = tokio::time::Instant::now() + this.stall;
                this.timer.as_mut().reset(next);
            }
            return Poll::Ready(frame);
        }
        ready!(this.timer.as_mut().poll(cx));
        let what = format!(
            "the body brought {} bytes in {} s, less than {FLOOR_PER_STALL} (paused or trickled)",
            this.brought,
            this.stall.as_secs()
        );
        tracing::warn!("a request body given up: {what}");
        let paused = std::io::Error::new(std::io::ErrorKind::TimedOut, what);
        Poll::Ready(Some(Err(axum::Error::new(paused))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
