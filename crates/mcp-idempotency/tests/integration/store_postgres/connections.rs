//! Connection failures: an unreachable or silent server at open, malformed URLs and schemas, and an
//! outage (a forwarder in front of the database stopped and restarted) that the store recovers from.

use super::*;

/// A closed port fails at open, quickly, naming host and database but not the password.
#[tokio::test]
async fn unreachable_server_fails_fast_at_open() {
    let port = closed_port().await;
    let started = Instant::now();
    let err = PostgresStore::open(&format!(
        "postgres://postgres:hunter2@127.0.0.1:{port}/somedb"
    ))
    .await
    .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(err.is_unavailable(), "{err:?}");
    let message = format!("{err} {err:?}");
    assert!(
        message.contains(&format!("127.0.0.1:{port}/somedb")),
        "{message}"
    );
    assert!(message.contains("onnection refused"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
}

/// A server that accepts connections and never answers: open gives up after `connect_timeout`.
#[tokio::test]
async fn silent_server_times_out_at_open() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    let silent = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            keep.lock().unwrap().push(socket);
        }
    });
    let started = Instant::now();
    let err = PostgresStore::open(&format!(
        "postgres://postgres:hunter2@127.0.0.1:{port}/db?connect_timeout=1"
    ))
    .await
    .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(err.is_unavailable(), "{err:?}");
    assert!(!format!("{err} {err:?}").contains("hunter2"));
    silent.abort();
}

#[tokio::test]
async fn malformed_urls_and_schemas_are_refused() {
    for (url, needle) in [
        (
            "postgres://u:hunter2@localhost:notaport/db",
            "invalid value for option `port`",
        ),
        (
            "postgres://u:hunter2@localhost/db?bogus=1",
            "unknown option `bogus`",
        ),
        (
            "postgres://u:hunter2@localhost/db?schema=no-dashes",
            "schema",
        ),
        (
            "postgres://u:hunter2@localhost/db?sslmode=allow",
            "unknown sslmode",
        ),
    ] {
        let err = PostgresStore::open(url).await.unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidUrl { .. }),
            "{url}: {err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(needle), "{url}: {message}");
        assert!(!message.contains("hunter2"), "{url}: {message}");
    }
    let err = PostgresStore::open_in_schema(DEFAULT_URL, "x\"; DROP TABLE y; --")
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidUrl { .. }), "{err:?}");
}

/// The database goes away (a proxy in front of it stops) and comes back: operations fail with
/// `Unavailable` within a bounded time during the outage and succeed afterwards, without reopening
/// the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovers_after_an_outage() {
    let Some(url) = reachable_url().await else {
        return;
    };
    let config = tokio_postgres::Config::from_str(&url).unwrap();
    let (Some(tokio_postgres::config::Host::Tcp(host)), Some(port)) =
        (config.get_hosts().first(), config.get_ports().first())
    else {
        eprintln!("note: skipping the outage test: DATABASE_URL is not a TCP host and port");
        return;
    };
    let upstream: SocketAddr = tokio::net::lookup_host((host.as_str(), *port))
        .await
        .unwrap()
        .next()
        .unwrap();
    if config.get_password().is_some() {
        eprintln!("note: skipping the outage test: it does not forward passwords");
        return;
    }
    let mut proxy = Proxy::start(upstream, 0).await;
    let proxied_url = format!(
        "postgres://{}@127.0.0.1:{}/{}?connect_timeout=2",
        config.get_user().unwrap_or("postgres"),
        proxy.port,
        config.get_dbname().unwrap_or("postgres")
    );
    let store = Arc::new(TestStore::open_via(&proxied_url, &url, &fresh_schema()).await);
    let scope = scope();
    let first = claim_req(&record_id(&scope, "before"), T0, RecordLimits::UNLIMITED);
    assert_eq!(store.claim(&first).await.unwrap(), ClaimOutcome::Claimed);

    proxy.stop();
    let during = claim_req(&record_id(&scope, "during"), T0, RecordLimits::UNLIMITED);
    for _ in 0..3 {
        let started = Instant::now();
        let err = store.claim(&during).await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let err = store.get(&first.id, T0).await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
    }
    // Many at once, so that they queue for one batch: each gets its own `Unavailable`, as fast.
    let many: Vec<_> = (0..20)
        .map(|i| {
            claim_req(
                &record_id(&scope, &format!("many-{i}")),
                T0,
                RecordLimits::UNLIMITED,
            )
        })
        .collect();
    let started = Instant::now();
    for answer in claim_all(&store, many.clone()).await {
        let err = answer.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        assert!(
            !err.to_string().contains("unavailable: store unavailable"),
            "{err}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    proxy = Proxy::start(upstream, proxy.port).await;
    assert_eq!(store.claim(&during).await.unwrap(), ClaimOutcome::Claimed);
    assert!(store.get(&first.id, T0).await.unwrap().is_some());
    for answer in claim_all(&store, many).await {
        assert_eq!(answer.unwrap(), ClaimOutcome::Claimed);
    }
    drop(proxy);
}

/// A TCP forwarder to the database that can be stopped (listener closed, connections cut).
struct Proxy {
    port: u16,
    accept: JoinHandle<()>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: SocketAddr, port: u16) -> Self {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket
            .bind(SocketAddr::from(([127, 0, 0, 1], port)))
            .unwrap();
        let listener = socket.listen(64).unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(Mutex::new(Vec::new()));
        let tracked = connections.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let forward = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                tracked.lock().unwrap().push(forward);
            }
        });
        Self {
            port,
            accept,
            connections,
        }
    }

    fn stop(&self) {
        self.accept.abort();
        for connection in self.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}
