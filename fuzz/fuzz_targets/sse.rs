//! The SSE splitter the HTTP relay forwards upstream event streams with, on arbitrary bytes cut
//! into arbitrary chunks. The input's first byte says how many cut points follow (0 to 7, one byte
//! each, as a fraction of the stream); the rest is the stream.
//!
//! Asserts: however the stream is cut, the same events come out; the bytes handed out (events'
//! raw bytes, then what is passed through unparsed) are exactly the bytes fed in, also when a size
//! limit makes the splitter give up mid-stream; every event is one complete event on its own;
//! [`event_data`] agrees with the splitter; an event rewritten with [`Event::with_data`] (as the
//! relay does for a discovery result) parses back to the same fields; the relay's interceptor
//! takes every event's data.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_idempotency::interceptor::{Interceptor, InterceptorConfig, ServerAction};
use mcp_idempotency::sse::{event_data, Event, EventSplitter};

const INITIALIZE: &str =
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"fuzz","version":"0"}}}"#;

/// Feeds `chunks` to a splitter limited to `max` bytes per event; returns the events and every
/// byte handed out, in order.
fn split(chunks: &[&[u8]], max: usize) -> (Vec<Event>, Vec<u8>) {
    let mut splitter = EventSplitter::new(max);
    let mut events = Vec::new();
    let mut out = Vec::new();
    let mut take = |fed: mcp_idempotency::sse::Fed| {
        for event in fed.events {
            out.extend_from_slice(&event.raw);
            events.push(event);
        }
        out.extend_from_slice(&fed.passthrough);
    };
    for chunk in chunks {
        take(splitter.feed(chunk));
    }
    take(splitter.finish());
    (events, out)
}

fn fields(event: &Event) -> (Option<&str>, Option<&str>, Option<&str>) {
    (
        event.data.as_deref(),
        event.event.as_deref(),
        event.id.as_deref(),
    )
}

fuzz_target!(|input: &[u8]| {
    let Some((&cuts, rest)) = input.split_first() else {
        return;
    };
    let cuts = usize::from(cuts % 8).min(rest.len());
    let (cut_bytes, stream) = rest.split_at(cuts);
    let mut points: Vec<usize> = cut_bytes
        .iter()
        .map(|&b| usize::from(b) * stream.len() / 255)
        .collect();
    points.sort_unstable();
    let mut chunks = Vec::new();
    let mut start = 0;
    for point in points {
        chunks.push(&stream[start..point]);
        start = point;
    }
    chunks.push(&stream[start..]);

    let (whole, whole_out) = split(&[stream], usize::MAX);
    let (cut, cut_out) = split(&chunks, usize::MAX);
    assert_eq!(whole, cut, "cutting the stream changed its events");
    assert_eq!(whole_out, stream, "bytes handed out differ from bytes fed");
    assert_eq!(cut_out, stream, "bytes handed out differ from bytes fed (cut)");

    // A limit from the input: the splitter may give up parsing, never lose or reorder bytes.
    let max = usize::from(cut_bytes.first().copied().unwrap_or(0));
    let (limited, limited_out) = split(&chunks, max);
    assert_eq!(limited_out, stream, "bytes handed out differ (limit {max})");
    assert!(limited.len() <= whole.len());
    assert_eq!(&whole[..limited.len()], &limited[..], "limit changed the events");

    let data: Vec<String> = whole.iter().filter_map(|e| e.data.clone()).collect();
    assert_eq!(event_data(stream), data);

    let mut interceptor: Interceptor = Interceptor::new(InterceptorConfig::default());
    let _ = interceptor.on_client_message(INITIALIZE);
    for event in &whole {
        let (again, _) = split(&[&event.raw], usize::MAX);
        assert_eq!(again.as_slice(), std::slice::from_ref(event), "an event is not whole");

        let Some(data) = &event.data else { continue };
        let rewritten = event.with_data(data);
        let (parsed, _) = split(&[&rewritten], usize::MAX);
        assert_eq!(parsed.len(), 1, "with_data made {} events", parsed.len());
        assert_eq!(fields(&parsed[0]), fields(event), "with_data changed the fields");

        if let ServerAction::ForwardRewritten(message) = interceptor.on_server_message(data) {
            let (parsed, _) = split(&[&event.with_data(&message)], usize::MAX);
            assert_eq!(parsed.len(), 1);
            assert_eq!(parsed[0].data.as_deref(), Some(message.as_str()));
        }
    }
});
