//! Reads the server's `capabilities` off the raw byte stream of a stdio-style transport.
//!
//! rmcp parses `server/discover` and `initialize` results into typed capabilities that have no
//! room for `tools.idempotency`, so the member is gone by the time rmcp hands the result over. The
//! tap sits under rmcp's reader: it looks at each newline-delimited message until the handshake
//! is over, keeps the `capabilities` object of the first result that has one, and then passes
//! bytes through untouched.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use serde_json::Value;
use tokio::io::{AsyncRead, ReadBuf};

/// Longest line the tap buffers; a longer one is skipped (it is no handshake result). Not
/// [`MAX_SERVER_MESSAGE_BYTES`](crate::jsonrpc::MAX_SERVER_MESSAGE_BYTES): rmcp reads every message,
/// the tap only looks for a small one, so it holds less.
const MAX_LINE: usize = 4 << 20;

/// What the tap saw, shared with whoever builds the session.
#[derive(Clone, Debug, Default)]
pub(crate) struct TapHandle {
    inner: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Set once the handshake is over: the tap stops looking.
    done: AtomicBool,
    capabilities: Mutex<Option<Value>>,
}

impl TapHandle {
    /// Stops looking and returns the `capabilities` object seen, if any.
    pub(crate) fn finish(&self) -> Option<Value> {
        self.inner.done.store(true, Ordering::Release);
        self.inner
            .capabilities
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// An [`AsyncRead`] that watches the messages going through it.
#[derive(Debug)]
pub(crate) struct CapabilityTap<R> {
    inner: R,
    handle: TapHandle,
    line: Vec<u8>,
    /// The current line is longer than [`MAX_LINE`]: skip to its end.
    skipping: bool,
}

impl<R> CapabilityTap<R> {
    pub(crate) fn new(inner: R) -> (Self, TapHandle) {
        let handle = TapHandle::default();
        let tap = Self {
            inner,
            handle: handle.clone(),
            line: Vec::new(),
            skipping: false,
        };
        (tap, handle)
    }

    fn watching(&self) -> bool {
        !self.handle.inner.done.load(Ordering::Acquire)
    }

    fn scan(&mut self, bytes: &[u8]) {
        for chunk in bytes.split_inclusive(|&b| b == b'\n') {
            let complete = chunk.ends_with(b"\n");
            if !self.skipping {
                if self.line.len() + chunk.len() > MAX_LINE {
                    self.skipping = true;
                    self.line = Vec::new();
                } else {
                    self.line.extend_from_slice(chunk);
                }
            }
            if complete {
                if !self.skipping {
                    let line = std::mem::take(&mut self.line);
                    self.inspect(&line);
                }
                self.skipping = false;
            }
        }
    }

    fn inspect(&self, line: &[u8]) {
        let Ok(message) = serde_json::from_slice::<Value>(line) else {
            return;
        };
        let Some(capabilities) = crate::protocol::capabilities(&message) else {
            return;
        };
        let mut seen = self
            .handle
            .inner
            .capabilities
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if seen.is_none() {
            *seen = Some(capabilities.clone());
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for CapabilityTap<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if self.watching() {
                self.scan(&buf.filled()[before..]);
            } else if !self.line.is_empty() {
                self.line = Vec::new();
            }
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test]
    async fn keeps_the_first_capabilities_and_passes_bytes_through() {
        let input = concat!(
            "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n",
            "not json\n",
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"capabilities\":{\"tools\":{\"idempotency\":{}}}}}\n",
            "{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"capabilities\":{}}}\n",
        );
        let (mut tap, handle) = CapabilityTap::new(input.as_bytes());
        let mut out = String::new();
        tap.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, input);
        assert_eq!(
            handle.finish(),
            Some(serde_json::json!({"tools": {"idempotency": {}}}))
        );
    }

    #[tokio::test]
    async fn a_line_split_across_reads_is_seen_whole() {
        let line = b"{\"id\":1,\"result\":{\"capabilities\":{\"tools\":{}}}}\n";
        let (client, mut server) = tokio::io::duplex(8);
        let (mut tap, handle) = CapabilityTap::new(client);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            server.write_all(line).await.unwrap();
        });
        let mut out = vec![0; line.len()];
        tap.read_exact(&mut out).await.unwrap();
        writer.await.unwrap();
        assert_eq!(handle.finish(), Some(serde_json::json!({"tools": {}})));
    }

    #[tokio::test]
    async fn stops_looking_once_finished() {
        let (mut tap, handle) = CapabilityTap::new(&b"{\"result\":{\"capabilities\":{}}}\n"[..]);
        assert_eq!(handle.finish(), None);
        let mut out = Vec::new();
        tap.read_to_end(&mut out).await.unwrap();
        assert_eq!(handle.finish(), None);
    }
}
