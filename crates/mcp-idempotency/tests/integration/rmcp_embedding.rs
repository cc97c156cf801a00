//! A real rmcp server embedded behind the interceptor in process (`StdioProxy::spawn_in_process`,
//! what `idempotent_stdio` does with the process's stdin and stdout): SEP-3182 with no gateway.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mcp_idempotency::stdio::StdioProxy;
use mcp_idempotency::store::MemoryStore;
use mcp_idempotency::{Deduplicator, EngineConfig, Scope};
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::io::{
    AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf,
};

use crate::counter_server::Counter;

struct Client {
    lines: Lines<BufReader<ReadHalf<DuplexStream>>>,
    out: WriteHalf<DuplexStream>,
}

impl Client {
    async fn request(&mut self, message: Value) -> Value {
        let id = message["id"].clone();
        let mut line = message.to_string();
        line.push('\n');
        self.out.write_all(line.as_bytes()).await.unwrap();
        loop {
            let line = tokio::time::timeout(Duration::from_secs(5), self.lines.next_line())
                .await
                .expect("response in time")
                .unwrap()
                .expect("server output open");
            let response: Value = serde_json::from_str(&line).unwrap();
            if response["id"] == id {
                return response;
            }
        }
    }
}

#[tokio::test]
async fn an_embedded_rmcp_server_gets_sep_3182() {
    let executions = Arc::new(AtomicU64::new(0));
    let server = Counter::new(Arc::clone(&executions));
    // The client's side of "stdio": the test writes requests and reads responses here.
    let (client_side, proxy_client_side) = tokio::io::duplex(64 * 1024);
    let (proxy_in, proxy_out) = tokio::io::split(proxy_client_side);
    let dedup = Deduplicator::new(EngineConfig::default(), Arc::new(MemoryStore::new()));
    let transport =
        StdioProxy::new(dedup, Scope::new("embedded", "me")).spawn_in_process(proxy_in, proxy_out);
    let running =
        tokio::spawn(async move { server.serve(transport).await.unwrap().waiting().await });

    let (read, out) = tokio::io::split(client_side);
    let mut client = Client {
        lines: BufReader::new(read).lines(),
        out,
    };
    let init = client
        .request(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}}),
        )
        .await;
    assert_eq!(
        init["result"]["capabilities"]["tools"]["idempotency"],
        json!({})
    );
    let initialized = "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n";
    client.out.write_all(initialized.as_bytes()).await.unwrap();

    let call = |id: u64, key: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "bump", "arguments": {}, "idempotencyKey": key}})
    };
    let first = client.request(call(2, "k")).await;
    let retry = client.request(call(3, "k")).await;
    assert_eq!(first["result"], retry["result"]);
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    let other = client.request(call(4, "other")).await;
    assert_ne!(other["result"], first["result"]);
    assert_eq!(executions.load(Ordering::SeqCst), 2);

    drop(client);
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the server stops when its client goes away")
        .unwrap()
        .unwrap();
}
