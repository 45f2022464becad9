//! Body streams as they pass through the proxy: a size limit, an idle timeout, and a tap that
//! shows each chunk to a parser without copying or holding it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::BoxError;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::sync::Notify;

/// Why a body stream stopped early.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("request body exceeds the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("no data for {0:?}")]
    Idle(Duration),
    #[error("{0}")]
    Source(BoxError),
}

/// Fails the stream once more than `limit` bytes have passed, and raises `tripped` so the
/// handler can answer 413 instead of the upstream's reaction to a cut-off body.
pub fn limited<S, E>(
    stream: S,
    limit: u64,
    tripped: Arc<AtomicBool>,
) -> impl Stream<Item = Result<Bytes, StreamError>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Into<BoxError>,
{
    let mut seen: u64 = 0;
    stream.map(move |item| {
        let chunk = item.map_err(|e| StreamError::Source(e.into()))?;
        seen = seen.saturating_add(chunk.len() as u64);
        if seen > limit {
            tripped.store(true, Ordering::SeqCst);
            return Err(StreamError::TooLarge { limit });
        }
        Ok(chunk)
    })
}

/// Fails the stream when no chunk arrives for `idle`: a stalled peer must not hold a connection
/// (and an upstream request) open forever.
pub fn idle_timeout<S, E>(
    stream: S,
    idle: Duration,
) -> impl Stream<Item = Result<Bytes, StreamError>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Into<StreamError>,
{
    futures_util::stream::unfold(Some(Box::pin(stream)), move |state| async move {
        let mut stream = state?;
        match tokio::time::timeout(idle, stream.next()).await {
            Ok(Some(item)) => Some((item.map_err(Into::into), Some(stream))),
            Ok(None) => None,
            Err(_) => Some((Err(StreamError::Idle(idle)), None)),
        }
    })
}

/// How far the upstream has read a request body: each chunk it pulls and the end are signalled,
/// so the proxy can tell an upstream that is still reading from one that is stuck.
#[derive(Debug, Default)]
pub struct ReadProgress {
    pulled: Notify,
    ended: AtomicBool,
    waiting_on_client: AtomicBool,
}

impl ReadProgress {
    /// A body with nothing to read (a GET) is read in full from the start.
    pub fn finished() -> Arc<ReadProgress> {
        let progress = ReadProgress::default();
        progress.ended.store(true, Ordering::SeqCst);
        Arc::new(progress)
    }

    /// The upstream has the whole body (or the body failed).
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// The upstream asked for more of the body and the client has not sent it yet: a stall now
    /// is the client's.
    pub fn waiting_on_client(&self) -> bool {
        self.waiting_on_client.load(Ordering::SeqCst)
    }

    /// Resolves at the next chunk or end after the last call.
    pub async fn changed(&self) {
        self.pulled.notified().await
    }

    fn pull(&self) {
        self.pulled.notify_one();
    }

    fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
        self.pulled.notify_one();
    }
}

/// Records in `progress` whether the last pull from the client's `stream` is still waiting.
pub fn watch_client<S>(
    stream: S,
    progress: Arc<ReadProgress>,
) -> impl Stream<Item = S::Item> + Send + 'static
where
    S: Stream + Send + 'static,
{
    let mut stream = Box::pin(stream);
    futures_util::stream::poll_fn(move |cx| {
        let poll = stream.as_mut().poll_next(cx);
        progress
            .waiting_on_client
            .store(poll.is_pending(), Ordering::SeqCst);
        poll
    })
}

/// Reports every chunk pulled from `stream`, and its end, to `progress`. With a declared
/// length the end is the last declared byte: an HTTP client that sends a length-delimited body
/// stops pulling once it has that many bytes.
pub fn report_progress<S, E>(
    stream: S,
    progress: Arc<ReadProgress>,
    declared_len: Option<u64>,
) -> impl Stream<Item = Result<Bytes, E>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Send + 'static,
{
    let at_end = progress.clone();
    let mut pulled: u64 = 0;
    stream
        .inspect(move |item| match item {
            Ok(chunk) => {
                pulled = pulled.saturating_add(chunk.len() as u64);
                if declared_len.is_some_and(|len| pulled >= len) {
                    progress.end();
                } else {
                    progress.pull();
                }
            }
            Err(_) => progress.end(),
        })
        .chain(
            futures_util::stream::once(async move { at_end.end() }).filter_map(|()| async { None }),
        )
}

/// Shows every chunk to `inspect` as it passes.
pub fn tapped<S, E>(
    stream: S,
    mut inspect: impl FnMut(&[u8]) + Send + 'static,
) -> impl Stream<Item = Result<Bytes, E>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
{
    stream.map(move |item| {
        if let Ok(chunk) = &item {
            inspect(chunk);
        }
        item
    })
}

impl From<BoxError> for StreamError {
    fn from(e: BoxError) -> Self {
        StreamError::Source(e)
    }
}

impl From<axum::Error> for StreamError {
    fn from(e: axum::Error) -> Self {
        StreamError::Source(Box::new(e))
    }
}

/// Reads `stream` to its end in a task of its own, showing each chunk to `inspect`, and hands
/// the chunks on through a small buffer. When the receiver goes away (the client hung up), the
/// reading and inspecting go on: a push's report must be seen whether or not the client stays.
pub fn pumped<S, E>(
    stream: S,
    mut inspect: impl FnMut(&[u8]) + Send + 'static,
) -> impl Stream<Item = Result<Bytes, E>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Send + 'static,
{
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut receiver_gone = false;
        while let Some(item) = stream.next().await {
            if let Ok(chunk) = &item {
                inspect(chunk);
            }
            if !receiver_gone && sender.send(item).await.is_err() {
                receiver_gone = true;
            }
        }
    });
    futures_util::stream::unfold(receiver, |mut receiver| async move {
        let item = receiver.recv().await?;
        Some((item, receiver))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;

    fn chunks(sizes: &[usize]) -> impl Stream<Item = Result<Bytes, BoxError>> + Send + 'static {
        let items: Vec<Result<Bytes, BoxError>> = sizes
            .iter()
            .map(|&n| Ok(Bytes::from(vec![b'x'; n])))
            .collect();
        stream::iter(items)
    }

    #[tokio::test]
    async fn limit_passes_up_to_the_limit_and_trips_beyond() {
        let tripped = Arc::new(AtomicBool::new(false));
        let out: Vec<_> = limited(chunks(&[4, 6]), 10, tripped.clone())
            .collect()
            .await;
        assert!(out.iter().all(Result::is_ok));
        assert!(!tripped.load(Ordering::SeqCst));

        let out: Vec<_> = limited(chunks(&[4, 6, 1]), 10, tripped.clone())
            .collect()
            .await;
        assert!(matches!(out[2], Err(StreamError::TooLarge { limit: 10 })));
        assert!(tripped.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_timeout_fails_a_stalled_stream_once() {
        let stalled = chunks(&[1]).chain(stream::pending());
        let mut out = Box::pin(idle_timeout(stalled, Duration::from_secs(60)));
        assert!(matches!(out.next().await, Some(Ok(_))));
        let started = tokio::time::Instant::now();
        assert!(matches!(out.next().await, Some(Err(StreamError::Idle(_)))));
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        assert!(
            out.next().await.is_none(),
            "the stream ends after its timeout"
        );
    }

    #[tokio::test]
    async fn progress_reports_each_chunk_and_the_end() {
        let progress = Arc::new(ReadProgress::default());
        let mut out = Box::pin(report_progress(chunks(&[1, 2]), progress.clone(), None));
        assert!(out.next().await.is_some());
        progress.changed().await;
        assert!(!progress.ended());
        assert!(out.next().await.is_some());
        assert!(!progress.ended());
        assert!(out.next().await.is_none());
        assert!(progress.ended());
        assert!(ReadProgress::finished().ended());
    }

    #[tokio::test]
    async fn a_pending_client_is_recorded_until_it_sends() {
        let progress = Arc::new(ReadProgress::default());
        let (send, receive) = tokio::sync::mpsc::channel::<Result<Bytes, BoxError>>(1);
        let client = futures_util::stream::unfold(receive, |mut r| async move {
            let item = r.recv().await?;
            Some((item, r))
        });
        let mut body = Box::pin(watch_client(client, progress.clone()));
        let waiting = tokio::time::timeout(Duration::from_millis(20), body.next()).await;
        assert!(waiting.is_err());
        assert!(progress.waiting_on_client());
        send.send(Ok(Bytes::from_static(b"x"))).await.expect("send");
        assert!(body.next().await.is_some());
        assert!(!progress.waiting_on_client());
    }

    #[tokio::test]
    async fn the_last_declared_byte_is_the_end() {
        let progress = Arc::new(ReadProgress::default());
        let mut out = Box::pin(report_progress(chunks(&[1, 2]), progress.clone(), Some(3)));
        assert!(out.next().await.is_some());
        assert!(!progress.ended());
        assert!(out.next().await.is_some());
        assert!(progress.ended(), "ended before the stream says so");
    }

    #[tokio::test]
    async fn a_pumped_stream_is_read_to_the_end_even_when_nobody_listens() {
        let seen = Arc::new(std::sync::Mutex::new(0usize));
        let sink = seen.clone();
        let (done, finished) = tokio::sync::oneshot::channel();
        let mut done = Some(done);
        let source = chunks(&[10; 50]);
        let out = pumped(source, move |c| {
            let mut total = sink.lock().expect("lock");
            *total += c.len();
            if *total == 500 {
                let _ = done.take().map(|d| d.send(()));
            }
        });
        let mut out = Box::pin(out);
        assert!(out.next().await.is_some());
        drop(out);
        finished.await.expect("read to the end");
        assert_eq!(*seen.lock().expect("lock"), 500);
    }

    #[tokio::test]
    async fn tap_sees_every_byte_in_order() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let items: Vec<Result<Bytes, BoxError>> =
            vec![Ok(Bytes::from_static(b"ab")), Ok(Bytes::from_static(b"c"))];
        let out: Vec<_> = tapped(stream::iter(items), move |c| {
            sink.lock().expect("lock").extend_from_slice(c)
        })
        .collect()
        .await;
        assert_eq!(out.len(), 2);
        assert_eq!(*seen.lock().expect("lock"), b"abc");
    }
}
