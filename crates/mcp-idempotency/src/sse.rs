//! Splitting a `text/event-stream` body into events as its bytes arrive. Sans-IO.
//!
//! [`event_data`] reads a whole stream at once, for clients that need the JSON-RPC messages a
//! Streamable HTTP answer carried.
//!
//! The gateway forwards an upstream SSE stream to the client as it comes, byte for byte, but must
//! see each event's `data` (a JSON-RPC message) to record the final response of a claimed call and
//! to add the idempotency capability to a discovery result. [`EventSplitter`] cuts the stream at
//! event boundaries (a blank line) and keeps each event's raw bytes, so that an event nobody needs
//! to change is forwarded exactly as received.

/// One event of the stream: its raw bytes (terminating blank line included) and its parsed fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The event exactly as received.
    pub raw: Vec<u8>,
    /// The `data` lines joined with `\n`; `None` when the event has no `data` field.
    pub data: Option<String>,
    /// The `event` field, if any.
    pub event: Option<String>,
    /// The `id` field, if any.
    pub id: Option<String>,
    /// The `retry` field (milliseconds), if any and a number.
    pub retry: Option<u64>,
}

impl Event {
    /// The event with `data` replaced, keeping its `event` and `id` fields.
    pub fn with_data(&self, data: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len() + 32);
        if let Some(event) = &self.event {
            out.extend_from_slice(b"event: ");
            out.extend_from_slice(event.as_bytes());
            out.push(b'\n');
        }
        if let Some(id) = &self.id {
            out.extend_from_slice(b"id: ");
            out.extend_from_slice(id.as_bytes());
            out.push(b'\n');
        }
        for line in data.split('\n') {
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
        out.push(b'\n');
        out
    }
}

/// Accumulates stream bytes and hands out complete events.
#[derive(Debug, Default)]
pub struct EventSplitter {
    pending: Vec<u8>,
    /// Where to resume looking for the end of the pending event.
    scanned: usize,
    /// Most bytes one event may take; past that the splitter gives up parsing (see [`Self::feed`]).
    max_event_bytes: usize,
    overflowed: bool,
}

/// What [`EventSplitter::feed`] produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fed {
    /// Complete events, in order.
    pub events: Vec<Event>,
    /// Bytes to forward as they are, after the events: set once an event grew past the size limit,
    /// from then on the splitter passes everything through unparsed.
    pub passthrough: Vec<u8>,
}

impl EventSplitter {
    /// A splitter that parses events of at most `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            max_event_bytes,
            ..Self::default()
        }
    }

    /// Whether an oversized event made the splitter stop parsing.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Adds bytes from the stream; returns the events they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Fed {
        let mut fed = Fed::default();
        if self.overflowed {
            fed.passthrough.extend_from_slice(bytes);
            return fed;
        }
        self.pending.extend_from_slice(bytes);
        while let Some(end) = event_end(&self.pending, self.scanned) {
            let raw: Vec<u8> = self.pending.drain(..end).collect();
            self.scanned = 0;
            fed.events.push(parse_event(raw));
        }
        self.scanned = self.pending.len().saturating_sub(3);
        if self.pending.len() > self.max_event_bytes {
            self.overflowed = true;
            fed.passthrough = std::mem::take(&mut self.pending);
        }
        fed
    }

    /// The stream ended. An event whose blank line ends in a `\r` (which could have been the
    /// start of `\r\n`) is complete after all; anything else left is an unfinished event, which
    /// SSE discards: its bytes are passed through unparsed.
    pub fn finish(&mut self) -> Fed {
        self.scanned = 0;
        let pending = std::mem::take(&mut self.pending);
        let mut fed = Fed::default();
        if pending.last() == Some(&b'\r') {
            let mut closed = pending.clone();
            closed.push(b'\n');
            if event_end(&closed, 0) == Some(closed.len()) {
                fed.events.push(parse_event(pending));
                return fed;
            }
        }
        fed.passthrough = pending;
        fed
    }
}

/// The end (exclusive) of the first event in `buf`, searching from `from`: the position after the
/// blank line that ends it. Lines end with `\r\n`, `\n` or `\r`.
fn event_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < buf.len() {
        let first_eol = match buf[i] {
            b'\n' => i + 1,
            b'\r' if buf.get(i + 1) == Some(&b'\n') => i + 2,
            // A lone `\r` at the very end may still be followed by `\n`.
            b'\r' if i + 1 == buf.len() => return None,
            b'\r' => i + 1,
            _ => {
                i += 1;
                continue;
            }
        };
        match buf.get(first_eol) {
            Some(b'\n') => return Some(first_eol + 1),
            Some(b'\r') if buf.get(first_eol + 1) == Some(&b'\n') => return Some(first_eol + 2),
            Some(b'\r') if first_eol + 1 == buf.len() => return None,
            Some(b'\r') => return Some(first_eol + 1),
            Some(_) => i = first_eol,
            None => return None,
        }
    }
    None
}

fn parse_event(raw: Vec<u8>) -> Event {
    let mut data: Option<String> = None;
    let mut event = None;
    let mut id = None;
    let mut retry = None;
    let text = String::from_utf8_lossy(&raw).into_owned();
    for line in text.split(['\n', '\r']).filter(|l| !l.is_empty()) {
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => match &mut data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => data = Some(value.to_owned()),
            },
            "event" => event = Some(value.to_owned()),
            "id" => id = Some(value.to_owned()),
            "retry" => retry = value.parse().ok().or(retry),
            _ => {}
        }
    }
    Event {
        raw,
        data,
        event,
        id,
        retry,
    }
}

/// The `data` of every event in a complete `text/event-stream` body, in order (events without data
/// are skipped; an unfinished last event is dropped, as SSE does). Lines may end with `\r\n`, `\n`
/// or `\r`.
pub fn event_data(stream: &[u8]) -> Vec<String> {
    let mut splitter = EventSplitter::new(usize::MAX);
    let mut events = splitter.feed(stream).events;
    events.extend(splitter.finish().events);
    events.into_iter().filter_map(|event| event.data).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_events(chunks: &[&[u8]]) -> Vec<Event> {
        let mut splitter = EventSplitter::new(1 << 20);
        let mut events = Vec::new();
        for chunk in chunks {
            events.extend(splitter.feed(chunk).events);
        }
        events.extend(splitter.finish().events);
        events
    }

    #[test]
    fn splits_events_across_chunks() {
        let stream = b"event: message\ndata: {\"a\":1}\n\n: comment\ndata: x\ndata: y\nid: 7\n\n";
        for split in 0..stream.len() {
            let (a, b) = stream.split_at(split);
            let events = all_events(&[a, b]);
            assert_eq!(events.len(), 2, "split at {split}");
            assert_eq!(events[0].data.as_deref(), Some("{\"a\":1}"));
            assert_eq!(events[0].event.as_deref(), Some("message"));
            assert_eq!(events[1].data.as_deref(), Some("x\ny"));
            assert_eq!(events[1].id.as_deref(), Some("7"));
            let raw: Vec<u8> = events.iter().flat_map(|e| e.raw.clone()).collect();
            assert_eq!(raw, stream, "raw bytes are kept exactly");
        }
    }

    #[test]
    fn every_line_ending_works() {
        for stream in [
            &b"data: 1\r\n\r\ndata: 2\r\n\r\n"[..],
            b"data: 1\r\rdata: 2\r\r",
            b"data: 1\n\ndata: 2\n\n",
        ] {
            for split in 0..stream.len() {
                let (a, b) = stream.split_at(split);
                let data: Vec<_> = all_events(&[a, b])
                    .into_iter()
                    .map(|e| e.data.unwrap())
                    .collect();
                assert_eq!(data, ["1", "2"], "{stream:?} split at {split}");
            }
        }
    }

    #[test]
    fn unfinished_event_is_returned_by_finish() {
        let mut splitter = EventSplitter::new(1024);
        assert!(splitter.feed(b"data: 1\n\ndata: 2").events.len() == 1);
        let fed = splitter.finish();
        assert!(fed.events.is_empty());
        assert_eq!(fed.passthrough, b"data: 2");
    }

    #[test]
    fn event_data_reads_a_whole_stream() {
        let stream =
            b"event: message\r\ndata: {\"a\":1}\r\n\r\n: ping\n\ndata: x\ndata: y\n\ndata: cut";
        assert_eq!(event_data(stream), ["{\"a\":1}", "x\ny"]);
    }

    #[test]
    fn oversized_event_switches_to_passthrough() {
        let mut splitter = EventSplitter::new(8);
        let fed = splitter.feed(b"data: 0123456789");
        assert!(fed.events.is_empty());
        assert_eq!(fed.passthrough, b"data: 0123456789");
        assert!(splitter.overflowed());
        assert_eq!(splitter.feed(b"\n\n").passthrough, b"\n\n");
    }

    #[test]
    fn rewritten_event_keeps_event_and_id() {
        let event = all_events(&[b"event: message\nid: 3\ndata: old\n\n"]).remove(0);
        assert_eq!(
            event.with_data("new\nline"),
            b"event: message\nid: 3\ndata: new\ndata: line\n\n"
        );
    }
}
