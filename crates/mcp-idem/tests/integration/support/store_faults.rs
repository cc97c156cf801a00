//! The store-fault tests' support: the one fault-injecting TCP forwarder, which stands between a
//! gateway and a real Redis or PostgreSQL server and forwards bytes both ways until the test makes
//! it fail, and the waits and checks of answers during and after a fault.
//!
//! * [`Forwarder::cut`] / [`Forwarder::resume`]: an outage. It stops listening (connections are
//!   refused) and drops every live connection; then it listens on the same port again.
//! * [`Forwarder::lose_next_reply`]: a lost answer. The next command the client sends that
//!   contains a given byte string (an idempotency key, which the store's claim is the first
//!   command to carry) reaches the server and is carried out, but the server's reply is dropped;
//!   then the connection is closed and the outage begins (as `cut`), so that the gateway cannot
//!   tidy up before the test looks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::AbortHandle;

use crate::support::http::{Answer, Raw, SharedStore};

/// Where a server's reply to one command ends, so that all of it is dropped (and the command
/// has been carried out) before the connection is closed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ReplyEnd {
    /// Redis: the first bytes of the reply (a script answers once it has run).
    Redis,
    /// PostgreSQL: the `ReadyForQuery` message after the statement (its implicit transaction is
    /// committed by then).
    Postgres,
}

impl ReplyEnd {
    /// The one for `store`'s protocol.
    pub(crate) fn of(store: SharedStore) -> Self {
        match store {
            SharedStore::Redis
            | SharedStore::RedisCluster
            | SharedStore::RedisTls
            | SharedStore::RedisTlsCluster => Self::Redis,
            SharedStore::Postgres => Self::Postgres,
        }
    }

    fn is_complete(self, dropped: &[u8]) -> bool {
        match self {
            Self::Redis => !dropped.is_empty(),
            Self::Postgres => {
                dropped.len() >= 6
                    && dropped[dropped.len() - 6..dropped.len() - 1] == [b'Z', 0, 0, 0, 5]
            }
        }
    }
}

/// The lost answer the test asked for, until a command triggers it.
#[derive(Debug)]
struct Armed {
    trigger: Vec<u8>,
    end: ReplyEnd,
}

#[derive(Debug, Default)]
struct Shared {
    /// The accept loop and every live connection.
    tasks: Mutex<Vec<AbortHandle>>,
    armed: Mutex<Option<Armed>>,
    /// Replies dropped so far.
    lost: AtomicUsize,
}

impl Shared {
    fn cut(&self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// Whether `chunk` (following `tail`, the end of what this connection sent before) contains
    /// the armed trigger; disarms it if so.
    fn triggered(&self, tail: &[u8], chunk: &[u8]) -> Option<ReplyEnd> {
        let mut armed = self.armed.lock().unwrap();
        let trigger = &armed.as_ref()?.trigger;
        let seen = [tail, chunk].concat();
        let found = seen
            .windows(trigger.len())
            .any(|window| window == &trigger[..]);
        found.then(|| armed.take().expect("armed").end)
    }
}

/// A TCP forwarder from a local port to `target` (`HOST:PORT`), which can fail on demand.
pub(crate) struct Forwarder {
    pub(crate) port: u16,
    target: String,
    shared: Arc<Shared>,
}

impl Forwarder {
    pub(crate) async fn start(target: &str) -> Self {
        let forwarder = Self {
            port: 0,
            target: target.to_owned(),
            shared: Arc::default(),
        };
        forwarder.listen(0).await
    }

    /// Listens on `port` (0: any) and forwards each connection until aborted.
    async fn listen(mut self, port: u16) -> Self {
        let socket = TcpSocket::new_v4().expect("a socket");
        socket.set_reuseaddr(true).expect("SO_REUSEADDR");
        socket
            .bind(([127, 0, 0, 1], port).into())
            .expect("bind the forwarder");
        let listener = socket.listen(128).expect("listen");
        self.port = listener.local_addr().unwrap().port();
        let (target, shared) = (self.target.clone(), Arc::clone(&self.shared));
        let accept = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let (target, connection) = (target.clone(), Arc::clone(&shared));
                let pipe = tokio::spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(&target).await {
                        forward(inbound, outbound, &connection).await;
                    }
                });
                shared.tasks.lock().unwrap().push(pipe.abort_handle());
            }
        });
        self.shared
            .tasks
            .lock()
            .unwrap()
            .push(accept.abort_handle());
        self
    }

    /// The outage: stops listening (connections are refused) and drops every live connection.
    pub(crate) fn cut(&self) {
        self.shared.cut();
    }

    /// The end of the outage: listens on the same port again.
    pub(crate) async fn resume(self) -> Self {
        let port = self.port;
        self.listen(port).await
    }

    /// Drops the server's reply to the next command containing `trigger`, closes that connection
    /// and begins an outage (see the module docs). Once only.
    pub(crate) fn lose_next_reply(&self, trigger: &str, end: ReplyEnd) {
        *self.shared.armed.lock().unwrap() = Some(Armed {
            trigger: trigger.as_bytes().to_vec(),
            end,
        });
    }

    /// How many replies were dropped.
    pub(crate) fn lost_replies(&self) -> usize {
        self.shared.lost.load(Ordering::SeqCst)
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.cut();
    }
}

/// Forwards both ways until either side closes, or until a reply was dropped as armed.
async fn forward(inbound: TcpStream, outbound: TcpStream, shared: &Shared) {
    let (mut client_in, mut client_out) = inbound.into_split();
    let (mut server_in, mut server_out) = outbound.into_split();
    let losing: Mutex<Option<ReplyEnd>> = Mutex::new(None);
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        let mut tail = Vec::new();
        loop {
            let n = match client_in.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Decided before the command goes out, so before any reply can come back.
            if let Some(end) = shared.triggered(&tail, &buf[..n]) {
                *losing.lock().unwrap() = Some(end);
            }
            tail = [&tail[..], &buf[..n]].concat();
            tail.drain(..tail.len().saturating_sub(1024));
            if server_out.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        let mut dropped = Vec::new();
        loop {
            let n = match server_in.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => n,
            };
            let end = *losing.lock().unwrap();
            match end {
                Some(end) => {
                    dropped.extend_from_slice(&buf[..n]);
                    if end.is_complete(&dropped) {
                        return true;
                    }
                }
                None => {
                    if client_out.write_all(&buf[..n]).await.is_err() {
                        return false;
                    }
                }
            }
        }
    };
    let lost = tokio::select! {
        () = up => false,
        lost = down => lost,
    };
    if lost {
        drop((client_in, client_out, server_in, server_out));
        shared.lost.fetch_add(1, Ordering::SeqCst);
        shared.cut();
    }
}

/// A [`Forwarder`] in front of the server of `store` at `url`, and the store URL that reaches the
/// server through it.
pub(crate) async fn behind_forwarder(url: &str, store: SharedStore) -> (Forwarder, String) {
    let (_, target) = through_port(url, 0, store);
    let forwarder = Forwarder::start(&target).await;
    let (via, _) = through_port(url, forwarder.port, store);
    (forwarder, via)
}

/// `url` (`redis://…` or `postgres://…`) with its `HOST:PORT` replaced by `127.0.0.1:port`, and
/// the original `HOST:PORT`. PostgreSQL URLs get `connect_timeout=2`.
fn through_port(url: &str, port: u16, store: SharedStore) -> (String, String) {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, host) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    let default_port = match store {
        SharedStore::Redis => 6379,
        SharedStore::RedisCluster => 7000,
        SharedStore::RedisTls => 6380,
        SharedStore::RedisTlsCluster => 7100,
        SharedStore::Postgres => 5432,
    };
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:{default_port}")
    };
    let via = format!("{scheme}://{userinfo}127.0.0.1:{port}{tail}");
    let via = match store {
        SharedStore::Redis
        | SharedStore::RedisCluster
        | SharedStore::RedisTls
        | SharedStore::RedisTlsCluster => via,
        SharedStore::Postgres => {
            let sep = if tail.contains('?') { '&' } else { '?' };
            format!("{via}{sep}connect_timeout=2")
        }
    };
    (via, host)
}

/// Sends `message` until it is not refused `idempotency_store_unavailable`; panics after 30 s.
pub(crate) async fn until_available(raw: &Raw, message: &serde_json::Value) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = raw.call(message.clone()).await;
        if answer.error_type().as_deref() != Some("idempotency_store_unavailable") {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "the proxy did not recover: {}",
            answer.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) fn assert_unavailable(answer: &Answer) {
    assert_eq!(
        answer.error_type().as_deref(),
        Some("idempotency_store_unavailable"),
        "{}",
        answer.body
    );
}
