//! The clients: each sends calls through gateway processes on hosts it picks, retries what it
//! did not get an answer to (on the same connection, another one, another host), sends duplicates
//! while a call runs, and repeats calls as a model does. Every answer is kept for the checks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::io::{
    AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf,
};

use super::calls::{ClientAnswer, Group, Keying, Reply};
use super::process;
use super::tool::{CLIENT_KEY_META, GROUP_META};
use super::{lock, World};

/// The longest a client waits for an answer before it gives up on it; each request draws its
/// own timeout from 5 s up to this (clients differ: an agent framework's retry, an SDK's default).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// Attempts a client makes for one call before leaving it unresolved (the checks' final attempt
/// then resolves it, once the faults have healed).
pub const MAX_ATTEMPTS: u32 = 8;

/// The rejections a client retries.
fn retryable(kind: &str) -> bool {
    matches!(
        kind,
        "idempotency_key_in_progress"
            | "idempotency_store_unavailable"
            | "idempotency_shutting_down"
            | "idempotency_scope_unknown"
    )
}

/// One connection to a gateway process.
struct Connection {
    host: usize,
    to_gateway: WriteHalf<DuplexStream>,
    lines: Lines<BufReader<ReadHalf<DuplexStream>>>,
    next_id: u64,
}

/// Why a request got no answer.
#[derive(Debug)]
enum NoAnswer {
    /// The connection ended (its process was killed or stopped).
    Closed,
    /// Nothing came within the client's timeout.
    TimedOut,
}

impl Connection {
    /// Connects to a new process on `host`, sending the handshake the seed draws.
    async fn open(world: &Arc<World>, host: usize, principal: &str, who: &str) -> Option<Self> {
        let (process, pipes) = process::spawn(world, host, principal)?;
        let mut connection = Self {
            host,
            to_gateway: pipes.to_gateway,
            lines: BufReader::new(pipes.from_gateway).lines(),
            next_id: 1,
        };
        let handshake = world.rng_index(3);
        let sent = match handshake {
            0 => {
                let params = json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": who, "version": "1"},
                });
                let ok = connection
                    .request(world, "initialize", params)
                    .await
                    .is_ok();
                ok && connection
                    .send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
                    .await
            }
            1 => connection
                .request(world, "server/discover", json!({}))
                .await
                .is_ok(),
            _ => true,
        };
        let name = ["initialize", "server/discover", "no handshake"][handshake];
        world
            .history
            .note(who, format!("connects to p{process}@h{host} ({name})"));
        sent.then_some(connection)
    }

    async fn send(&mut self, message: &Value) -> bool {
        let mut line = message.to_string();
        line.push('\n');
        self.to_gateway.write_all(line.as_bytes()).await.is_ok()
            && self.to_gateway.flush().await.is_ok()
    }

    /// Sends a request and waits for the response with its id (skipping any other line).
    async fn request(
        &mut self,
        world: &World,
        method: &str,
        params: Value,
    ) -> Result<String, NoAnswer> {
        let timeout = world.draw_ms(5_000, CLIENT_TIMEOUT.as_millis() as u64);
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if !self.send(&message).await {
            return Err(NoAnswer::Closed);
        }
        let wait = async {
            while let Ok(Some(line)) = self.lines.next_line().await {
                let response: BTreeMap<String, Box<RawValue>> = match serde_json::from_str(&line) {
                    Ok(response) => response,
                    Err(_) => continue,
                };
                if response.get("id").map(|raw| raw.get()) == Some(id.to_string().as_str()) {
                    return Ok(line);
                }
            }
            Err(NoAnswer::Closed)
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or(Err(NoAnswer::TimedOut))
    }
}

/// Reads a response line as a [`Reply`]; `None` if it is neither a result nor an error.
fn reply_of(line: &str) -> Option<Reply> {
    let response: BTreeMap<String, Box<RawValue>> = serde_json::from_str(line).ok()?;
    if let Some(result) = response.get("result") {
        return Some(Reply::Result(result.get().to_owned()));
    }
    let error: Value = serde_json::from_str(response.get("error")?.get()).ok()?;
    Some(Reply::Error {
        code: error["code"].as_i64().unwrap_or_default(),
        kind: error["data"]["type"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    })
}

/// A client of `principal`, sending `calls` calls one after the other.
pub async fn run(world: Arc<World>, client: usize, principal: String, calls: usize) {
    let who = format!("c{client}");
    let mut connection: Option<Connection> = None;
    let mut last_answered: Option<Group> = None;
    for _ in 0..calls {
        let group = match last_answered.take() {
            Some(earlier) if earlier.keying == Keying::KeyFromWithSep && world.chance(0.3) => {
                world.reuse_key(&earlier)
            }
            _ => world.new_group(&principal),
        };
        world.history.note(
            &who,
            format!(
                "group {} {:?} {} key {}",
                group.name,
                group.keying,
                group.keying.tool(),
                group.key.as_deref().unwrap_or("-")
            ),
        );
        let replied = call(&world, &who, &group, &mut connection, false).await;
        if replied {
            last_answered = Some(group.clone());
        }
        // A model repeats its calls, not its mistakes: a reused key is not sent again.
        if replied && group.reuses.is_none() && world.chance(0.25) {
            let repeat = world.model_repeat(&group);
            world.history.note(
                &who,
                format!(
                    "repeats as a model does: group {} ({:?})",
                    repeat.name, repeat.keying
                ),
            );
            call(&world, &who, &repeat, &mut connection, false).await;
        }
        tokio::time::sleep(world.draw_ms(0, 3_000)).await;
    }
}

/// The checks' one attempt at `group` once the faults healed, on a new connection: whether it
/// got an answer.
pub async fn final_attempt(world: &Arc<World>, group: &Group) -> bool {
    call(world, "final", group, &mut None, true).await
}

/// Sends the group's call until it gets a final answer or runs out of attempts; whether it got
/// one. `final_attempt`: the checks' one attempt after the faults healed.
async fn call(
    world: &Arc<World>,
    who: &str,
    group: &Group,
    connection: &mut Option<Connection>,
    final_attempt: bool,
) -> bool {
    let attempts = if final_attempt { 1 } else { MAX_ATTEMPTS };
    for attempt in 1..=attempts {
        if !final_attempt && lock(&world.faults).take_duplicate() {
            for _ in 0..2 {
                let (world, who, group) = (Arc::clone(world), format!("{who}+dup"), group.clone());
                tokio::spawn(async move {
                    let mut own = None;
                    once(&world, &who, &group, &mut own, false).await;
                });
            }
        }
        match once(world, who, group, connection, final_attempt).await {
            Some(true) => return true,
            Some(false) => {}
            None => *connection = None,
        }
        let backoff =
            mcp_idempotency::backoff(attempt, Duration::from_millis(200), Duration::from_secs(10));
        tokio::time::sleep(backoff + world.draw_ms(0, 500)).await;
    }
    false
}

/// One attempt: `Some(true)` for a final answer, `Some(false)` for one to retry, `None` when
/// the connection is no longer usable.
async fn once(
    world: &Arc<World>,
    who: &str,
    group: &Group,
    connection: &mut Option<Connection>,
    final_attempt: bool,
) -> Option<bool> {
    if connection.is_none() || (!final_attempt && world.chance(0.4)) {
        let host = world.rng_index(world.hosts.len());
        *connection = Connection::open(world, host, &group.principal, who).await;
    }
    let conn = connection.as_mut()?;
    let params = world.call_params(group);
    world.history.note(
        who,
        format!("calls {} (group {})", group.keying.tool(), group.name),
    );
    let line = match conn.request(world, "tools/call", params).await {
        Ok(line) => line,
        Err(why) => {
            world
                .history
                .note(who, format!("no answer for {}: {why:?}", group.name));
            return None;
        }
    };
    if lock(&world.faults).take_answer_lost(conn.host) {
        world
            .history
            .note(who, format!("the answer for {} is lost", group.name));
        tokio::time::sleep(world.draw_ms(1_000, CLIENT_TIMEOUT.as_millis() as u64)).await;
        return None;
    }
    let reply = reply_of(&line)?;
    let done = match &reply {
        Reply::Result(_) => true,
        Reply::Error { kind, .. } => !retryable(kind),
    };
    world
        .history
        .note(who, format!("gets for {}: {}", group.name, line));
    lock(&world.answers).push(ClientAnswer {
        group: group.name.clone(),
        at: world.elapsed(),
        reply,
        final_attempt,
    });
    Some(done)
}

impl World {
    /// A new group for `principal`, its keying drawn.
    pub fn new_group(&self, principal: &str) -> Group {
        const KEYINGS: &[Keying] = &[
            Keying::Sep,
            Keying::Sep,
            Keying::Meta,
            Keying::KeyFrom,
            Keying::KeyFromWithSep,
            Keying::Argument,
            Keying::Window,
            Keying::WindowUnprotected,
            Keying::Unkeyed,
        ];
        let keying = KEYINGS[self.rng_index(KEYINGS.len())];
        // Numbers count per principal, so that two principals use the same keys and identifiers.
        let number = self.next_number(principal);
        let name = self.next_group_name();
        let mut arguments = json!({
            "amount": self.rng_index(5) + 1,
            "order_id": format!("o-{number}"),
            "intent": name,
        });
        let key = match keying {
            Keying::Sep | Keying::Meta | Keying::KeyFromWithSep => Some(format!("k-{number}")),
            Keying::Argument => {
                arguments["request_id"] = json!(format!("r-{number}"));
                Some(format!("r-{number}"))
            }
            _ => None,
        };
        let group = Group {
            name,
            principal: principal.to_owned(),
            keying,
            key,
            arguments,
            reuses: None,
        };
        lock(&self.groups).push(group.clone());
        group
    }

    /// A new operation (another identifier, other arguments) sent with the client's key of
    /// `earlier`.
    pub fn reuse_key(&self, earlier: &Group) -> Group {
        let number = self.next_number(&earlier.principal);
        let mut arguments = earlier.arguments.clone();
        let name = self.next_group_name();
        arguments["order_id"] = json!(format!("o-{number}"));
        arguments["intent"] = json!(name);
        let group = Group {
            name,
            arguments,
            reuses: Some(earlier.name.clone()),
            ..earlier.clone()
        };
        lock(&self.groups).push(group.clone());
        group
    }

    /// The call a model makes again after `group` answered: the same arguments with a fresh
    /// key (a new group for a tool the client's key alone protects, the same group where the
    /// business identifier, the argument or the window decides), or with none.
    pub fn model_repeat(&self, group: &Group) -> Group {
        match group.keying {
            Keying::Sep | Keying::Meta => {
                let number = self.next_number(&group.principal);
                let keying = if self.chance(0.5) {
                    group.keying
                } else {
                    Keying::Unkeyed
                };
                let repeat = Group {
                    name: self.next_group_name(),
                    key: (keying != Keying::Unkeyed).then(|| format!("k-{number}")),
                    keying,
                    ..group.clone()
                };
                lock(&self.groups).push(repeat.clone());
                repeat
            }
            Keying::KeyFromWithSep => Group {
                key: Some(format!("k-{}", self.next_number(&group.principal))),
                ..group.clone()
            },
            _ => group.clone(),
        }
    }

    /// The `params` of a call of `group`.
    pub fn call_params(&self, group: &Group) -> Value {
        let mut params = json!({
            "name": group.keying.tool(),
            "arguments": group.arguments,
            "_meta": {GROUP_META: group.name},
        });
        match (group.keying, &group.key) {
            (Keying::Sep, Some(key)) => params["idempotencyKey"] = json!(key),
            (Keying::Meta, Some(key)) => params["_meta"]["idempotencyKey"] = json!(key),
            (Keying::KeyFromWithSep, Some(key)) => {
                params["idempotencyKey"] = json!(key);
                // For the checks: which key of the client's came with the call that ran.
                params["_meta"][CLIENT_KEY_META] = json!(key);
            }
            _ => {}
        }
        params
    }
}
