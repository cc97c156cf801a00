//! What passes through unchanged: end of input to the server, malformed lines both ways byte for
//! byte, and server requests and notifications in order.

use super::*;

#[tokio::test]
async fn client_eof_closes_the_server_input() {
    let (dedup, _) = memory_dedup(EngineConfig::default());
    let (mut client, mut server, run) = start(dedup, InterceptorConfig::default());
    client
        .send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    client.close().await;
    assert_eq!(
        server.requests.text().await.unwrap(),
        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n"
    );
    server.requests.expect_eof().await;
    // The server may still answer before it exits.
    server
        .send(r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"bye"}}"#)
        .await;
    drop(server);
    assert_eq!(
        client.recv().await["method"],
        json!("notifications/message")
    );
    assert_eq!(
        finished(run).await,
        ProxyExit {
            orphaned_calls: 0,
            calls_cut_off: 0
        }
    );
    client.from_proxy.expect_eof().await;
}

/// The proxy's parts are tasks of their own; a run whose future is dropped stops them with it,
/// so nothing keeps the streams open behind the caller's back.
#[tokio::test]
async fn an_aborted_run_lets_go_of_both_sides() {
    let (dedup, _) = memory_dedup(EngineConfig::default());
    let (mut client, mut server, run) = start(dedup, InterceptorConfig::default());
    client
        .send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    assert!(server.requests.text().await.is_some());
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    // Neither end was closed by its peer: only the tasks' end lets go of them.
    server.requests.expect_eof().await;
    client.from_proxy.expect_eof().await;
}

#[tokio::test]
async fn malformed_lines_pass_through_byte_for_byte() {
    let (dedup, _) = memory_dedup(EngineConfig::default());
    let (mut client, server, run) = start(dedup, InterceptorConfig::default());
    let (log, server_task) = spawn_echo_server(server);

    let mut long = br#"{"jsonrpc":"2.0","method":"notifications/blob","params":{"data":""#.to_vec();
    long.extend(std::iter::repeat_n(b'x', 2 * 1024 * 1024));
    long.extend_from_slice(b"\"}}\n");
    let mut long_garbage = vec![b'{'; 2 * 1024 * 1024];
    long_garbage.push(b'\n');
    let lines: Vec<Vec<u8>> = vec![
        b"not json\n".to_vec(),
        b"\xff\xfe{\"id\":1,\"method\":\"tools/call\"}\xc3\x28\n".to_vec(),
        b"\n".to_vec(),
        b"   \t \n".to_vec(),
        b"\r\n".to_vec(),
        b"[1,2,3]\n".to_vec(),
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"t\",\"idempotencyKey\":\"k\"}\n".to_vec(),
        b"{\"jsonrpc\" : \"2.0\" , \"method\" : \"notifications/x\" }\r\n".to_vec(),
        long,
        long_garbage,
        b"{}\n".to_vec(),
    ];
    for line in &lines {
        client.send_raw(line).await;
    }
    client.close().await;
    assert_eq!(
        finished(run).await,
        ProxyExit {
            orphaned_calls: 0,
            calls_cut_off: 0
        }
    );
    server_task.await.unwrap();
    let seen = log.lines();
    assert_eq!(seen.len(), lines.len());
    for (sent, seen) in lines.iter().zip(&seen) {
        assert!(
            sent == seen,
            "sent {:?}, server saw {:?}",
            String::from_utf8_lossy(&sent[..sent.len().min(80)]),
            String::from_utf8_lossy(&seen[..seen.len().min(80)]),
        );
    }
    assert_eq!(log.executions(), 0);
}

#[tokio::test]
async fn malformed_server_lines_reach_the_client_byte_for_byte() {
    let (dedup, _) = memory_dedup(EngineConfig::default());
    let (mut client, mut server, run) = start(dedup, InterceptorConfig::default());
    let lines: Vec<&[u8]> = vec![
        b"Server starting...\n",
        b"\xff\xfe binary\n",
        b"\n",
        b"{\"jsonrpc\":\"2.0\",\"id\":\"nobody\",\"result\":{\"a\": 1.000}}\r\n",
    ];
    for line in &lines {
        server.to_proxy.write_all(line).await.unwrap();
    }
    for line in &lines {
        assert_eq!(client.from_proxy.raw().await.unwrap(), line.to_vec());
    }
    client.close().await;
    drop(server);
    finished(run).await;
}

#[tokio::test]
async fn server_messages_pass_through_unchanged_and_in_order() {
    let (dedup, _) = memory_dedup(EngineConfig::default());
    let (mut client, mut server, run) = start(dedup, InterceptorConfig::default());

    client.send(&call(1, "k-chatty", json!({}))).await;
    let request = server.requests.json().await;
    assert_eq!(request["id"], json!(1));
    let chatter = [
        r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":0.50}}"#,
        // A server request reusing the id of the call in flight: a different id space.
        r#"{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{"maxTokens":10}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"\u00e9"}}"#,
        r#"{"jsonrpc":"2.0","id":"elicit-1","method":"elicitation/create","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"n":1.000}}"#,
    ];
    for line in chatter {
        server.send(line).await;
    }
    for line in chatter {
        assert_eq!(client.recv_text().await, format!("{line}\n"));
    }
    // The client's answers to the server's requests reach it unchanged too.
    let answers = [
        r#"{"jsonrpc":"2.0","id":1,"result":{"role":"assistant","content":{"type":"text","text":"hi"}}}"#,
        r#"{"jsonrpc":"2.0","id":"elicit-1","result":{"action":"decline"}}"#,
    ];
    for line in answers {
        client.send(line).await;
    }
    for line in answers {
        assert_eq!(server.requests.text().await.unwrap(), format!("{line}\n"));
    }
    // The call's answer was recorded.
    client.send(&call(2, "k-chatty", json!({}))).await;
    let replay = client.recv_text().await;
    assert_eq!(raw_result(&replay), r#"{"content":[],"n":1.000}"#);

    client.close().await;
    drop(server);
    finished(run).await;
}
