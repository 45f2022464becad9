//! Body streams as they pass through the proxy: a size limit, an idle timeout, and a tap that
//! shows each chunk to a parser without copying or holding it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::BoxError;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

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
