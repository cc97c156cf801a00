//! Scope isolation through the real `mcp-idem proxy` for each `--scope-by` mode: with `none` every
//! caller shares one record per key; with `header:x-user`, `bearer` and `jwt` (HS256, secret in a
//! file) the same key sent by two principals runs twice and neither ever gets the other's
//! outcome, each principal's retry replays its own, and a request without a usable credential
//! (missing header or token, expired JWT, wrong audience, bad signature) is refused with 401
//! before anything runs. The demo server's ledger counts the charges that really happened.
//!
//! JWTs are minted here with HMAC-SHA256 built on `sha2` (a dependency of the binary), so no
//! token fixtures are needed.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::support::common::ledger_lines;
use crate::support::http::{charge, ledger_in, sqlite_in, HttpDemo, Proxy, Raw};

const ISSUER: &str = "https://issuer.mcp-idem.test";
const AUDIENCE: &str = "mcp-idem-proxy-tests";
const SECRET: &[u8] = b"an HMAC secret for tests only, 48 bytes long....";

/// Demo server and a proxy with `args` (a SQLite store in the temp dir is added).
struct Setup {
    _dir: tempfile::TempDir,
    ledger: std::path::PathBuf,
    _server: HttpDemo,
    _proxy: Proxy,
    raw: Raw,
}

fn setup(args: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let server = HttpDemo::spawn(&ledger, &[]);
    let store = sqlite_in(&dir);
    let mut all = vec!["--store", store.as_str()];
    all.extend_from_slice(args);
    let proxy = Proxy::spawn(&server.base_url(), &all);
    let raw = Raw::new(&proxy);
    Setup {
        _dir: dir,
        ledger,
        _server: server,
        _proxy: proxy,
        raw,
    }
}

type Headers<'a> = &'a [(&'a str, &'a str)];

/// Charges with key `key` as `who`; returns the charge id.
async fn charge_as(s: &Setup, id: u64, key: &str, who: Headers<'_>) -> String {
    let answer = s.raw.call_with(charge(id, 10, Some(key)), who).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["id"], id, "{}", answer.body);
    answer
        .charge_id()
        .unwrap_or_else(|| panic!("a charge: {}", answer.body))
}

/// Principals `a` and `b` use the same key: two executions, each retry replays its own.
async fn assert_isolated(s: &Setup, a: Headers<'_>, b: Headers<'_>) {
    let key = "shared-key";
    let of_a = charge_as(s, 1, key, a).await;
    let of_b = charge_as(s, 2, key, b).await;
    assert_ne!(of_a, of_b, "B got A's outcome");
    let lines = ledger_lines(&s.ledger);
    assert_eq!(lines.len(), 2, "one charge per principal: {lines:?}");
    assert_eq!(charge_as(s, 3, key, a).await, of_a, "A's retry replays A's");
    assert_eq!(charge_as(s, 4, key, b).await, of_b, "B's retry replays B's");
    assert_eq!(ledger_lines(&s.ledger).len(), 2);
}

/// A keyed call as `who` is refused with 401 and runs nothing.
async fn assert_refused(s: &Setup, who: Headers<'_>) -> Value {
    let before = ledger_lines(&s.ledger).len();
    let answer = s
        .raw
        .call_with(charge(9, 10, Some("shared-key")), who)
        .await;
    assert_eq!(answer.status, 401, "{}", answer.body);
    let challenge = answer
        .headers
        .get(http::header::WWW_AUTHENTICATE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(challenge.starts_with("Bearer"), "{challenge:?}");
    let json = answer.json();
    assert_eq!(json["id"], 9, "{json}");
    assert!(json.get("result").is_none(), "{json}");
    assert_eq!(ledger_lines(&s.ledger).len(), before, "nothing charged");
    json
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_none_shares_one_record_per_key() {
    let s = setup(&["--scope-by", "none"]);
    let of_a = charge_as(&s, 1, "k", &[("x-user", "alice")]).await;
    let of_b = charge_as(&s, 2, "k", &[("x-user", "bob")]).await;
    assert_eq!(of_a, of_b, "one tenant: the second caller gets the replay");
    assert_eq!(ledger_lines(&s.ledger).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_by_header_isolates_its_values() {
    let s = setup(&["--scope-by", "header:x-user"]);
    assert_isolated(&s, &[("x-user", "alice")], &[("x-user", "bob")]).await;
    assert_refused(&s, &[]).await;
    assert_refused(&s, &[("x-user", "")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_by_bearer_isolates_tokens() {
    let s = setup(&["--scope-by", "bearer"]);
    assert_isolated(
        &s,
        &[("authorization", "Bearer token-of-alice")],
        &[("authorization", "Bearer token-of-bob")],
    )
    .await;
    assert_refused(&s, &[]).await;
    assert_refused(&s, &[("authorization", "Basic YWxpY2U6cHc=")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_by_jwt_isolates_subjects_and_refuses_bad_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("jwt-secret");
    std::fs::write(&secret_file, SECRET).unwrap();
    let secret_arg = secret_file.to_str().unwrap();
    let s = setup(&[
        "--scope-by",
        "jwt",
        "--jwt-hmac-secret",
        secret_arg,
        "--jwt-issuer",
        ISSUER,
        "--jwt-audience",
        AUDIENCE,
    ]);
    let now = unix_now();
    let bearer = |claims: Value| format!("Bearer {}", hs256(SECRET, &claims));
    let alice = bearer(claims("alice", AUDIENCE, now + 3600));
    let bob = bearer(claims("bob", AUDIENCE, now + 3600));
    assert_isolated(
        &s,
        &[("authorization", alice.as_str())],
        &[("authorization", bob.as_str())],
    )
    .await;

    // Alice's retry with an expired token (well past the default 30 s leeway) is not replayed.
    let expired = bearer(claims("alice", AUDIENCE, now - 3600));
    assert_refused(&s, &[("authorization", expired.as_str())]).await;
    // A token for another audience.
    let elsewhere = bearer(claims("alice", "another-service", now + 3600));
    assert_refused(&s, &[("authorization", elsewhere.as_str())]).await;
    // A token signed with another secret.
    let forged = format!(
        "Bearer {}",
        hs256(
            b"not the proxy's secret, but long enough to be one",
            &claims("alice", AUDIENCE, now + 3600)
        )
    );
    assert_refused(&s, &[("authorization", forged.as_str())]).await;
    // No token.
    assert_refused(&s, &[]).await;
    assert_eq!(ledger_lines(&s.ledger).len(), 2);
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(subject: &str, audience: &str, exp: u64) -> Value {
    json!({"iss": ISSUER, "sub": subject, "aud": audience, "exp": exp, "iat": unix_now()})
}

/// A compact HS256 JWT (RFC 7519) with `claims`.
fn hs256(secret: &[u8], claims: &Value) -> String {
    let header = base64url(br#"{"alg":"HS256","typ":"JWT"}"#);
    let payload = base64url(claims.to_string().as_bytes());
    let signing_input = format!("{header}.{payload}");
    let signature = hmac_sha256(secret, signing_input.as_bytes());
    format!("{signing_input}.{}", base64url(&signature))
}

/// HMAC-SHA256 (RFC 2104).
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let inner = Sha256::new()
        .chain_update(block.map(|b| b ^ 0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(block.map(|b| b ^ 0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// Base64url without padding (RFC 4648 §5).
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

#[test]
fn the_hand_made_primitives_match_known_vectors() {
    // RFC 4648 §10 (base64, here without padding) and RFC 4231 test case 2.
    assert_eq!(base64url(b"foobar"), "Zm9vYmFy");
    assert_eq!(base64url(b"fooba"), "Zm9vYmE");
    assert_eq!(base64url(b"foob"), "Zm9vYg");
    assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
    let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
}
