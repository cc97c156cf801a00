//! The first step of a stdio session's handshake, taken before rmcp's: a `server/discover` of the
//! client's own, whose answer may come as late as the server likes.
//!
//! rmcp's `Auto` lifecycle sends `server/discover` and, when no answer comes within 10 s, sends
//! `initialize` on the same stream while the first request is still unanswered. A server that
//! was only slow to start (a first `npx -y` downloads its package) then answers the discover
//! first, and rmcp fails the handshake on it ("uncorrelated error response: expected id 1, error
//! response carried 0"), whatever time the caller allowed. So a stdio session first sends this
//! probe, under an id of its own ([`PROBE_ID`]), and waits for its answer:
//!
//! - **answered**: the server is up, and rmcp's `Auto` handshake follows (its own discover, then
//!   `initialize` if the server is legacy);
//! - **no answer within [`LEGACY_AFTER`]** (a legacy server that ignores unknown methods, or one
//!   still starting): rmcp's legacy `initialize` handshake follows, as `Auto` would, and the
//!   probe's answer, should it come later, is taken out of the stream before rmcp reads it
//!   ([`without_late_answer`]).
//!
//! Either way the probe sets no limit on the start: the caller's does (`--connect-timeout`).
//! Messages the server sends before its answer (a log line) reach rmcp as they came.

use std::io;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

use crate::protocol;

/// The probe's JSON-RPC id: one rmcp never uses (its ids are numbers).
pub(super) const PROBE_ID: &str = "mcp-idempotency-probe";

/// How long the probe waits before the legacy handshake follows anyway: rmcp's `Auto` wait.
pub(super) const LEGACY_AFTER: Duration = Duration::from_secs(10);

/// The buffer between [`without_late_answer`]'s task and rmcp.
const PIPE_BYTES: usize = 64 * 1024;

/// What the probe found.
#[derive(Debug)]
pub(super) enum Probe {
    /// The server answered the probe. `before` holds the whole lines it sent before its answer.
    Answered { before: Vec<u8> },
    /// No answer within [`LEGACY_AFTER`]. `before` holds the whole lines the server sent, and
    /// `partial` the start of a line not read to its end yet.
    Silent { before: Vec<u8>, partial: Vec<u8> },
}

/// Sends the probe on `write` and reads `read` until the server answers it, or until
/// [`LEGACY_AFTER`]. Fails when either stream fails or the server's output ends first.
pub(super) async fn discover<R, W>(read: &mut R, write: &mut W) -> io::Result<Probe>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut request = protocol::discover_request(PROBE_ID).to_string();
    request.push('\n');
    write.write_all(request.as_bytes()).await?;
    write.flush().await?;
    let mut before = Vec::new();
    // Outside the wait: `read_until` keeps what it read of a line when the wait ends mid-line.
    let mut line = Vec::new();
    let wait = async {
        loop {
            if read.read_until(b'\n', &mut line).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server's output ended before it answered server/discover",
                ));
            }
            if answers_probe(&line) {
                return Ok(());
            }
            before.append(&mut line);
        }
    };
    match tokio::time::timeout(LEGACY_AFTER, wait).await {
        Ok(Ok(())) => Ok(Probe::Answered { before }),
        Ok(Err(error)) => Err(error),
        Err(_) => Ok(Probe::Silent {
            before,
            partial: line,
        }),
    }
}

/// The server's output as rmcp should read it after a [`Probe::Silent`]: `before`, then `partial`
/// and the rest of `read`, without the probe's answer. A task copies it through a pipe until
/// either side ends; after the answer it copies the rest as it is.
pub(super) fn without_late_answer<R>(mut read: R, before: Vec<u8>, partial: Vec<u8>) -> DuplexStream
where
    R: AsyncBufRead + Unpin + Send + 'static,
{
    let (mut pipe, rest) = tokio::io::duplex(PIPE_BYTES);
    tokio::spawn(async move {
        let copied: io::Result<()> = async {
            pipe.write_all(&before).await?;
            let mut line = partial;
            loop {
                let read_now = read.read_until(b'\n', &mut line).await?;
                if line.is_empty() {
                    return Ok(());
                }
                if answers_probe(&line) {
                    tracing::debug!(
                        "the server answered server/discover after the handshake began"
                    );
                    break;
                }
                pipe.write_all(&line).await?;
                if read_now == 0 {
                    return Ok(());
                }
                line.clear();
            }
            tokio::io::copy_buf(&mut read, &mut pipe).await?;
            Ok(())
        }
        .await;
        if let Err(error) = copied {
            tracing::debug!(%error, "stopped copying the server's output");
        }
    });
    rest
}

/// Whether `line` is the response to the probe (a result or an error under [`PROBE_ID`]).
fn answers_probe(line: &[u8]) -> bool {
    let names_probe = line
        .windows(PROBE_ID.len())
        .any(|window| window == PROBE_ID.as_bytes());
    names_probe
        && serde_json::from_slice::<Value>(line).is_ok_and(|message| {
            message.get("id").and_then(Value::as_str) == Some(PROBE_ID)
                && message.get("method").is_none()
                && (message.get("result").is_some() || message.get("error").is_some())
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tokio::io::{AsyncReadExt, BufReader};

    use super::*;
    use crate::client::Session;

    /// A legacy stdio server that sleeps `delay` before it reads anything, as a server does that
    /// is still being installed; it answers `server/discover` with "method not found" unless
    /// `ignores_discover`, in which case it never answers it.
    async fn slow_legacy_server(stream: DuplexStream, delay: Duration, ignores_discover: bool) {
        tokio::time::sleep(delay).await;
        let (read, mut write) = tokio::io::split(stream);
        let mut lines = BufReader::new(read).lines();
        let log = json!({"jsonrpc": "2.0", "method": "notifications/message",
                         "params": {"level": "info", "data": "starting"}});
        write
            .write_all(format!("{log}\n").as_bytes())
            .await
            .unwrap();
        while let Ok(Some(line)) = lines.next_line().await {
            let message: Value = serde_json::from_str(&line).unwrap();
            let Some(id) = message.get("id") else {
                continue;
            };
            let answer = match message["method"].as_str() {
                Some("initialize") => json!({"jsonrpc": "2.0", "id": id, "result": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {"idempotency": {}}},
                    "serverInfo": {"name": "slow", "version": "0"}}}),
                Some("tools/list") => json!({"jsonrpc": "2.0", "id": id, "result": {
                    "tools": [{"name": "charge", "inputSchema": {"type": "object"}}]}}),
                Some("server/discover") if ignores_discover => continue,
                _ => json!({"jsonrpc": "2.0", "id": id,
                            "error": {"code": -32601, "message": "Method not found"}}),
            };
            let sent = write.write_all(format!("{answer}\n").as_bytes()).await;
            if sent.is_err() {
                return;
            }
        }
    }

    /// A session with a server that starts after `delay`; the tools it lists.
    async fn session_after(delay: Duration, ignores_discover: bool) -> Vec<String> {
        let (client, server) = tokio::io::duplex(64 * 1024);
        tokio::spawn(slow_legacy_server(server, delay, ignores_discover));
        let (read, write) = tokio::io::split(client);
        let session = Session::from_io(read, write)
            .await
            .unwrap_or_else(|error| panic!("no session after {delay:?}: {error}"));
        assert!(session.advertises_idempotency(), "{session:?}");
        let tools = session.peer().list_all_tools().await.unwrap();
        session.close().await;
        tools
            .into_iter()
            .map(|tool| tool.name.into_owned())
            .collect()
    }

    /// A server slower to start than rmcp's 10 s discover wait still gets a session (the paused
    /// clock jumps over the waits): rmcp alone failed it with "uncorrelated error response".
    #[tokio::test(start_paused = true)]
    async fn a_server_slower_to_start_than_the_discover_wait_gets_a_session() {
        for delay in [
            Duration::ZERO,
            Duration::from_secs(3),
            Duration::from_secs(11),
        ] {
            assert_eq!(session_after(delay, false).await, ["charge"], "{delay:?}");
        }
        let long = Duration::from_secs(95);
        assert_eq!(session_after(long, false).await, ["charge"]);
    }

    /// A legacy server that never answers `server/discover` gets the legacy handshake after
    /// [`LEGACY_AFTER`], as with rmcp's `Auto`.
    #[tokio::test(start_paused = true)]
    async fn a_server_that_ignores_discover_gets_the_legacy_handshake() {
        assert_eq!(session_after(Duration::ZERO, true).await, ["charge"]);
        assert_eq!(
            session_after(Duration::from_secs(11), true).await,
            ["charge"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_late_answer_is_taken_out_and_everything_else_kept() {
        let answer = json!({"jsonrpc": "2.0", "id": PROBE_ID, "error": {"code": -32601}});
        let other = r#"{"jsonrpc":"2.0","id":0,"result":{}}"#;
        let server = format!("t\"}}\n{answer}\n{other}\nlast");
        let mut read = without_late_answer(
            BufReader::new(std::io::Cursor::new(server.into_bytes())),
            b"{\"a\":1}\n".to_vec(),
            b"{\"partial\":\"".to_vec(),
        );
        let mut out = String::new();
        read.read_to_string(&mut out).await.unwrap();
        assert_eq!(
            out,
            format!("{{\"a\":1}}\n{{\"partial\":\"t\"}}\n{other}\nlast")
        );
    }

    #[test]
    fn only_the_response_to_the_probe_answers_it() {
        let probe = json!(PROBE_ID);
        assert!(answers_probe(
            json!({"jsonrpc": "2.0", "id": probe, "result": {}})
                .to_string()
                .as_bytes()
        ));
        for other in [
            json!({"jsonrpc": "2.0", "id": 0, "result": {"x": PROBE_ID}}),
            json!({"jsonrpc": "2.0", "id": probe, "method": "ping"}),
        ] {
            assert!(!answers_probe(other.to_string().as_bytes()), "{other}");
        }
        assert!(!answers_probe(PROBE_ID.as_bytes()));
    }
}
