//! Line-length limits of `mcp-idem wrap`, against the real binary (docs/reliability.md, "Bad
//! input"): a client line over `--max-line-bytes` is discarded without being held whole and
//! answered with a JSON-RPC error, nothing runs, and the session goes on; a server line over the
//! gateway's reading limit reaches the client intact, without being held whole either. Memory is
//! checked with the process's peak resident set (`VmHWM`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::support::common::{ledger_lines, StdioPeer, TIMEOUT};
use crate::support::wrap::{charge, charge_id, padded_charge, peak_rss_kb, Sandbox, EXE};

/// A keyed charge still executes once and replays: the session survived what came before.
fn assert_still_serving(wrap: &mut StdioPeer, id: u64, key: &str) {
    let arguments = json!({"amount":1,"currency":"EUR"});
    let first = charge_id(&wrap.request(charge(id, arguments.clone(), key)));
    let again = charge_id(&wrap.request(charge(id + 1, arguments, key)));
    assert_eq!(first, again);
}

/// Asserts a `-32600` error naming the limit of `limit` bytes.
fn assert_line_refused(response: &Value, limit: usize) {
    assert!(response.get("result").is_none(), "not an error: {response}");
    assert_eq!(response["error"]["code"], -32600, "{response}");
    let message = response["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("line limit of {limit} bytes")),
        "the message names the limit: {response}"
    );
}

#[test]
fn a_100_mb_client_line_is_discarded_with_an_error_in_bounded_memory() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&[]);
    assert_still_serving(&mut wrap, 1, "before-huge");

    // The line is streamed while `wrap` reads it (the pipe holds 64 kB).
    let line = padded_charge(3, "huge-1", 100 << 20, false);
    let len = line.len();
    wrap.send_bytes(&line);
    drop(line);
    // The id precedes the long part, so the error carries it.
    let response = wrap.response(&json!(3));
    assert_line_refused(&response, 4 << 20);
    let peak_kb = peak_rss_kb(wrap.pid());
    eprintln!("wrap discarded a {len}-byte line; peak RSS {peak_kb} kB");
    assert!(peak_kb < 100_000, "peak RSS {peak_kb} kB");

    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
    // Nothing was recorded for the key either: it runs now.
    let retry = wrap.request(charge(5, json!({"amount":1,"currency":"EUR"}), "huge-1"));
    charge_id(&retry);
    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 2);
    assert_still_serving(&mut wrap, 6, "after-huge");
    assert!(!wrap.stderr().contains("panicked"), "{}", wrap.stderr());
    assert_eq!(wrap.finish().code(), Some(0));
}

#[test]
fn the_limit_is_set_by_max_line_bytes_and_an_id_after_the_long_part_is_null() {
    let sandbox = Sandbox::new();
    let mut wrap = sandbox.wrap_demo(&["--max-line-bytes", "64KiB"]);

    // Just under the limit: read and executed.
    let fits = padded_charge(1, "fits", 60 << 10, false);
    assert!(fits.len() <= (64 << 10) + 1);
    wrap.send_bytes(&fits);
    charge_id(&wrap.response(&json!(1)));

    // Over it with the id last: the gateway does not read that far, so the error's id is null.
    wrap.send_bytes(&padded_charge(2, "id-last", 100 << 10, true));
    let response = wrap.response(&Value::Null);
    assert_line_refused(&response, 64 << 10);

    assert_eq!(ledger_lines(&sandbox.ledger()).len(), 1);
    assert_still_serving(&mut wrap, 10, "after-id-last");
    assert_eq!(wrap.finish().code(), Some(0));
}

/// One line of the client's output: its length (without the newline) and its first and last bytes.
struct SeenLine {
    len: usize,
    head: Vec<u8>,
    tail: Vec<u8>,
}

/// Reads one line without keeping it whole.
fn read_line_summary(reader: &mut impl BufRead) -> Option<SeenLine> {
    let mut seen = SeenLine {
        len: 0,
        head: Vec::new(),
        tail: Vec::new(),
    };
    loop {
        let available = reader.fill_buf().expect("read wrap's output");
        if available.is_empty() {
            return (seen.len > 0).then_some(seen);
        }
        let (taken, content, done) = match available.iter().position(|&b| b == b'\n') {
            Some(end) => (end + 1, &available[..end], true),
            None => (available.len(), available, false),
        };
        if seen.head.len() < 200 {
            let more = (200 - seen.head.len()).min(content.len());
            seen.head.extend_from_slice(&content[..more]);
        }
        seen.tail.extend_from_slice(content);
        let keep = seen.tail.len().saturating_sub(200);
        seen.tail.drain(..keep);
        seen.len += content.len();
        reader.consume(taken);
        if done {
            return Some(seen);
        }
    }
}

#[test]
fn a_200_mb_server_line_reaches_the_client_intact_in_bounded_memory() {
    let sandbox = Sandbox::new();
    let pad = 200 << 20;
    let head =
        r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":""#;
    let after = r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"after"}}"#;
    let script = format!(
        "printf '%s' '{head}'; head -c {pad} /dev/zero | tr '\\0' x; printf '\"}}}}\\n%s\\n' '{after}'; cat >/dev/null"
    );
    let mut wrap = Command::new(EXE)
        .args([
            "wrap",
            "--store",
            &sandbox.store(),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .env("MCP_IDEM_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(sandbox.path("wrap.stderr")).unwrap())
        .spawn()
        .expect("spawn wrap");
    let mut stdout = BufReader::new(wrap.stdout.take().unwrap());

    let long = read_line_summary(&mut stdout).expect("the long line");
    assert_eq!(long.len, head.len() + pad + 3);
    let mut expected_head = head.as_bytes().to_vec();
    expected_head.resize(200, b'x');
    assert_eq!(long.head, expected_head);
    assert!(long.tail.ends_with(b"xxxx\"}}"));
    let next = read_line_summary(&mut stdout).expect("the line after it");
    assert_eq!(next.head, after.as_bytes());

    let peak_kb = peak_rss_kb(wrap.id());
    eprintln!(
        "wrap passed a {}-byte server line; peak RSS {peak_kb} kB",
        long.len
    );
    assert!(peak_kb < 200_000, "peak RSS {peak_kb} kB");

    // The session goes on: a request reaches the server (`cat`) and EOF ends the run cleanly.
    let mut stdin = wrap.stdin.take().unwrap();
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
        .unwrap();
    drop(stdin);
    let deadline = std::time::Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = wrap.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "wrap did not exit");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0));
    let stderr = std::fs::read_to_string(sandbox.path("wrap.stderr")).unwrap();
    assert!(stderr.contains("longer than the line limit"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
