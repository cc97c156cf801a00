//! `ScopeBy`: the principal of an HTTP request in each mode, and every way a JWT is refused.
//!
//! The key pairs in `tests/fixtures/` were made with `openssl genpkey` for these tests only.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use http::header::{HeaderMap, HeaderValue};
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use mcp_idempotency::http::principal::{
    JwtConfig, JwtKey, JwtKeyError, Principal, ScopeBy, ScopeByError, Unauthorized, DEFAULT_LEEWAY,
};
use serde_json::{json, Value};

const ISSUER: &str = "https://issuer.example";
const AUDIENCE: &str = "mcp-gateway";

/// A fixed clock far in the past: tokens valid at `NOW` are long expired by the system clock, so
/// these tests fail if anything reads the system clock instead of the `now` passed in.
fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_000_000_000)
}

fn secs(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn read_fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap()
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

fn bearer(token: &str) -> HeaderMap {
    headers(&[("authorization", &format!("Bearer {token}"))])
}

/// Claims valid at `now()`: issued by ISSUER for AUDIENCE, expiring in 10 minutes.
fn claims() -> Value {
    json!({
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice",
        "exp": secs(now()) + 600,
        "iat": secs(now()),
    })
}

fn sign(alg: Algorithm, kid: Option<&str>, claims: &Value, key: &EncodingKey) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

fn hmac(secret: &[u8]) -> EncodingKey {
    EncodingKey::from_secret(secret).unwrap()
}

fn rsa_signer() -> EncodingKey {
    EncodingKey::from_rsa_pem(&read_fixture("rsa_private.pem")).unwrap()
}

fn ec_signer() -> EncodingKey {
    EncodingKey::from_ec_pem(&read_fixture("ec_private.pem")).unwrap()
}

fn ec_other_signer() -> EncodingKey {
    EncodingKey::from_ec_pem(&read_fixture("ec_other_private.pem")).unwrap()
}

fn jwt_scope(key_file: &str) -> ScopeBy {
    let config = JwtConfig::from_files(&fixture(key_file), ISSUER, AUDIENCE).unwrap();
    ScopeBy::jwt(config).unwrap()
}

fn principal(scope: &ScopeBy, headers: &HeaderMap) -> Result<Principal, Unauthorized> {
    scope.principal(headers, now())
}

#[track_caller]
fn assert_refused(result: Result<Principal, Unauthorized>, reason: &str) {
    let refusal = result.expect_err("refused");
    assert_eq!(refusal.reason(), reason);
    assert!(refusal.is_invalid_credentials(), "{refusal:?}");
    assert_eq!(
        refusal.www_authenticate(),
        format!(r#"Bearer error="invalid_token", error_description="{reason}""#).as_str()
    );
}

#[test]
fn none_is_one_principal_for_everyone() {
    let scope = "none".parse::<ScopeBy>().unwrap();
    let anonymous = principal(&scope, &HeaderMap::new()).unwrap();
    assert_eq!(anonymous.as_str(), "none");
    assert_eq!(principal(&scope, &bearer("abc")).unwrap(), anonymous);
    assert_eq!(scope.to_string(), "none");
}

#[test]
fn header_mode_takes_the_proxy_header() {
    let scope = "header:X-Auth-User".parse::<ScopeBy>().unwrap();
    assert_eq!(scope.to_string(), "header:x-auth-user");
    let alice = principal(&scope, &headers(&[("x-auth-user", "alice")])).unwrap();
    assert_eq!(alice.as_str(), "header:alice");
    let bob = principal(&scope, &headers(&[("X-Auth-User", " bob ")])).unwrap();
    assert_eq!(bob.as_str(), "header:bob");

    let missing = principal(&scope, &bearer("abc")).unwrap_err();
    assert_eq!(missing.reason(), "missing identity header");
    assert_eq!(missing.www_authenticate(), "Bearer");
    assert!(principal(&scope, &headers(&[("x-auth-user", "  ")])).is_err());
    assert!(principal(
        &scope,
        &headers(&[("x-auth-user", "alice"), ("x-auth-user", "bob")])
    )
    .is_err());
    let mut non_ascii = HeaderMap::new();
    non_ascii.insert(
        "x-auth-user",
        HeaderValue::from_bytes("zoë".as_bytes()).unwrap(),
    );
    assert!(principal(&scope, &non_ascii).is_err());
}

#[test]
fn bearer_mode_hashes_the_token() {
    let scope = "bearer".parse::<ScopeBy>().unwrap();
    let first = principal(&scope, &bearer("token-one")).unwrap();
    let again = principal(&scope, &headers(&[("authorization", "bearer token-one")])).unwrap();
    let second = principal(&scope, &bearer("token-two")).unwrap();
    assert_eq!(first, again, "same token, same principal");
    assert_ne!(first, second, "different tokens, different principals");
    // bearer: + hex SHA-256 of the token, never the token itself.
    assert_eq!(
        principal(&scope, &bearer("abc")).unwrap().as_str(),
        "bearer:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert!(!first.as_str().contains("token-one"));

    let missing = principal(&scope, &HeaderMap::new()).unwrap_err();
    assert_eq!(missing.reason(), "missing bearer token");
    assert_eq!(missing.www_authenticate(), "Bearer");
    assert!(!missing.is_invalid_credentials());
    let basic = principal(&scope, &headers(&[("authorization", "Basic YTpi")])).unwrap_err();
    assert_eq!(basic.www_authenticate(), "Bearer");
    assert_refused(
        principal(&scope, &headers(&[("authorization", "Bearer ")])),
        "empty bearer token",
    );
    assert_refused(
        principal(&scope, &headers(&[("authorization", "Bearer a b")])),
        "malformed bearer token",
    );
    assert_refused(
        principal(
            &scope,
            &headers(&[("authorization", "Bearer a"), ("authorization", "Bearer b")]),
        ),
        "repeated Authorization header",
    );
}

#[test]
fn principals_of_different_modes_never_collide() {
    let token = sign(Algorithm::ES256, None, &claims(), &ec_signer());
    let request = headers(&[
        ("authorization", &format!("Bearer {token}")),
        ("x-user", &token),
    ]);
    let principals: Vec<String> = [
        "none".parse::<ScopeBy>().unwrap(),
        "header:x-user".parse::<ScopeBy>().unwrap(),
        "bearer".parse::<ScopeBy>().unwrap(),
        jwt_scope("ec_public.pem"),
    ]
    .iter()
    .map(|scope| principal(scope, &request).unwrap().to_string())
    .collect();
    let distinct: std::collections::HashSet<_> = principals.iter().collect();
    assert_eq!(distinct.len(), 4, "{principals:?}");
}

#[test]
fn parse_refuses_bad_specs() {
    assert!(matches!(
        "tenant".parse::<ScopeBy>(),
        Err(ScopeByError::UnknownMode(_))
    ));
    assert!(matches!(
        "header:".parse::<ScopeBy>(),
        Err(ScopeByError::InvalidHeaderName(_))
    ));
    assert!(matches!(
        "header:bad name".parse::<ScopeBy>(),
        Err(ScopeByError::InvalidHeaderName(_))
    ));
    assert!(matches!(
        "header:Authorization".parse::<ScopeBy>(),
        Err(ScopeByError::CredentialHeader(_))
    ));
    assert!(matches!(
        "jwt".parse::<ScopeBy>(),
        Err(ScopeByError::JwtConfigMissing)
    ));
    // A JWT configuration given with another mode is refused by the command line
    // (mcp-idem's scope_args), which reads the options together.
    let config = JwtConfig::from_files(&fixture("ec_public.pem"), ISSUER, AUDIENCE).unwrap();
    let no_issuer = JwtConfig::new(config.key().clone(), "", AUDIENCE);
    assert!(matches!(
        ScopeBy::jwt(no_issuer),
        Err(ScopeByError::EmptyIssuer)
    ));
    let no_audience = JwtConfig::new(config.key().clone(), ISSUER, "");
    assert!(matches!(
        ScopeBy::jwt(no_audience),
        Err(ScopeByError::EmptyAudience)
    ));
}

#[test]
fn jwt_rs256_es256_and_eddsa_tokens_validate() {
    let rsa = jwt_scope("rsa_public.pem");
    let token = sign(Algorithm::RS256, None, &claims(), &rsa_signer());
    let alice = principal(&rsa, &bearer(&token)).unwrap();
    assert_eq!(alice.as_str(), r#"jwt:["https://issuer.example","alice"]"#);
    let pss = sign(Algorithm::PS256, None, &claims(), &rsa_signer());
    assert_eq!(principal(&rsa, &bearer(&pss)).unwrap(), alice);

    let ec = jwt_scope("ec_public.pem");
    let token = sign(Algorithm::ES256, Some("any-kid"), &claims(), &ec_signer());
    assert_eq!(principal(&ec, &bearer(&token)).unwrap(), alice);

    let ed = jwt_scope("ed25519_public.pem");
    let signer = EncodingKey::from_ed_pem(&read_fixture("ed25519_private.pem")).unwrap();
    let token = sign(Algorithm::EdDSA, None, &claims(), &signer);
    assert_eq!(principal(&ed, &bearer(&token)).unwrap(), alice);

    // A token for another subject is another principal; iss/sub pairs cannot be confused.
    let mut bob = claims();
    bob["sub"] = json!("bob");
    let token = sign(Algorithm::ES256, None, &bob, &ec_signer());
    assert_ne!(principal(&ec, &bearer(&token)).unwrap(), alice);
}

#[test]
fn jwt_time_claims_use_the_given_clock() {
    let ec = jwt_scope("ec_public.pem");
    let mut expired = claims();
    expired["exp"] = json!(secs(now()) - DEFAULT_LEEWAY.as_secs() - 1);
    let token = sign(Algorithm::ES256, None, &expired, &ec_signer());
    assert_refused(principal(&ec, &bearer(&token)), "token expired");
    // Within the leeway, still accepted.
    let mut skewed = claims();
    skewed["exp"] = json!(secs(now()) - 5);
    let token = sign(Algorithm::ES256, None, &skewed, &ec_signer());
    assert!(principal(&ec, &bearer(&token)).is_ok());
    // The same token, judged at a later `now`, has expired.
    let later = now() + Duration::from_secs(3600);
    let fresh = sign(Algorithm::ES256, None, &claims(), &ec_signer());
    assert!(principal(&ec, &bearer(&fresh)).is_ok());
    assert_refused(ec.principal(&bearer(&fresh), later), "token expired");

    let mut early = claims();
    early["nbf"] = json!(secs(now()) + 120);
    let token = sign(Algorithm::ES256, None, &early, &ec_signer());
    assert_refused(principal(&ec, &bearer(&token)), "token not yet valid");
    assert!(ec
        .principal(&bearer(&token), now() + Duration::from_secs(120))
        .is_ok());

    let mut no_exp = claims();
    no_exp.as_object_mut().unwrap().remove("exp");
    let token = sign(Algorithm::ES256, None, &no_exp, &ec_signer());
    assert_refused(principal(&ec, &bearer(&token)), "token has no exp");

    let strict = JwtConfig::from_files(&fixture("ec_public.pem"), ISSUER, AUDIENCE)
        .unwrap()
        .with_leeway(Duration::ZERO);
    let strict = ScopeBy::jwt(strict).unwrap();
    let token = sign(Algorithm::ES256, None, &skewed, &ec_signer());
    assert_refused(principal(&strict, &bearer(&token)), "token expired");
}

#[test]
fn jwt_for_another_issuer_or_audience_or_without_sub_is_refused() {
    let ec = jwt_scope("ec_public.pem");
    let refused = |mutate: &dyn Fn(&mut Value), reason: &str| {
        let mut claims = claims();
        mutate(&mut claims);
        let token = sign(Algorithm::ES256, None, &claims, &ec_signer());
        assert_refused(principal(&ec, &bearer(&token)), reason);
    };
    refused(
        &|c| c["iss"] = json!("https://evil.example"),
        "wrong issuer",
    );
    refused(&|c| c["aud"] = json!("another-service"), "wrong audience");
    refused(&|c| c["aud"] = json!(["a", "b"]), "wrong audience");
    refused(
        &|c| {
            c.as_object_mut().unwrap().remove("aud");
        },
        "token has no aud",
    );
    refused(
        &|c| {
            c.as_object_mut().unwrap().remove("sub");
        },
        "token has no sub",
    );
    refused(&|c| c["sub"] = json!(""), "token has no sub");

    // One of several audiences is enough.
    let mut multi = claims();
    multi["aud"] = json!(["other", AUDIENCE]);
    let token = sign(Algorithm::ES256, None, &multi, &ec_signer());
    assert!(principal(&ec, &bearer(&token)).is_ok());
}

#[test]
fn jwt_with_a_wrong_signature_is_refused() {
    let ec = jwt_scope("ec_public.pem");
    let token = sign(Algorithm::ES256, None, &claims(), &ec_other_signer());
    assert_refused(principal(&ec, &bearer(&token)), "invalid signature");

    // A valid token whose claims were edited after signing.
    let token = sign(Algorithm::ES256, None, &claims(), &ec_signer());
    let mut parts: Vec<&str> = token.split('.').collect();
    let mut forged = claims();
    forged["sub"] = json!("mallory");
    let payload = URL_SAFE_NO_PAD.encode(forged.to_string());
    parts[1] = &payload;
    assert_refused(
        principal(&ec, &bearer(&parts.join("."))),
        "invalid signature",
    );

    assert_refused(principal(&ec, &bearer("a.b.c")), "malformed token");
    assert_refused(principal(&ec, &bearer("opaque-token")), "malformed token");
    assert!(principal(&ec, &HeaderMap::new()).is_err());
}

#[test]
fn hs256_signed_with_the_public_key_is_refused() {
    // The classic algorithm confusion: the attacker signs with HMAC, using the public key's
    // bytes as the secret, hoping the verifier uses the configured key with the token's alg.
    for public in ["rsa_public.pem", "ec_public.pem", "ed25519_public.pem"] {
        let scope = jwt_scope(public);
        let secret = hmac(&read_fixture(public));
        let token = sign(Algorithm::HS256, None, &claims(), &secret);
        assert_refused(principal(&scope, &bearer(&token)), "algorithm not allowed");
    }
    // RS256 with an EC key: the key type fixes the algorithms.
    let ec = jwt_scope("ec_public.pem");
    let token = sign(Algorithm::RS256, None, &claims(), &rsa_signer());
    assert_refused(principal(&ec, &bearer(&token)), "algorithm not allowed");
}

#[test]
fn alg_none_is_refused() {
    let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims().to_string());
    for token in [
        format!("{header}.{payload}."),
        format!("{header}.{payload}.c2ln"),
    ] {
        for key in ["rsa_public.pem", "ec_public.pem"] {
            let scope = jwt_scope(key);
            assert!(principal(&scope, &bearer(&token)).is_err());
        }
    }
    let scope = jwt_scope("ec_public.pem");
    let token = format!("{header}.{payload}.c2ln");
    assert_refused(principal(&scope, &bearer(&token)), "algorithm not allowed");
    // "crit" extensions are not understood, so such tokens are refused.
    let crit = URL_SAFE_NO_PAD.encode(r#"{"alg":"ES256","crit":["exp"],"exp":1}"#);
    assert_refused(
        principal(&scope, &bearer(&format!("{crit}.{payload}.c2ln"))),
        "unsupported critical header",
    );
}

#[test]
fn hmac_secret_accepts_hs256_only() {
    let secret = b"0123456789abcdef0123456789abcdef";
    let scope = ScopeBy::jwt(JwtConfig::new(
        JwtKey::hmac_secret(secret).unwrap(),
        ISSUER,
        AUDIENCE,
    ))
    .unwrap();
    let token = sign(Algorithm::HS256, None, &claims(), &hmac(secret));
    assert!(principal(&scope, &bearer(&token)).is_ok());
    let token = sign(Algorithm::RS256, None, &claims(), &rsa_signer());
    assert_refused(principal(&scope, &bearer(&token)), "algorithm not allowed");
    let wrong = sign(
        Algorithm::HS256,
        None,
        &claims(),
        &hmac(b"another secret, also 32 bytes long"),
    );
    assert_refused(principal(&scope, &bearer(&wrong)), "invalid signature");

    assert!(matches!(
        JwtKey::hmac_secret(b"short"),
        Err(JwtKeyError::ShortSecret { len: 5 })
    ));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret");
    std::fs::write(&path, b"0123456789abcdef0123456789abcdef\n").unwrap();
    let loaded = ScopeBy::jwt(JwtConfig::new(
        JwtKey::load_hmac_secret(&path).unwrap(),
        ISSUER,
        AUDIENCE,
    ))
    .unwrap();
    let token = sign(Algorithm::HS256, None, &claims(), &hmac(secret));
    assert!(principal(&loaded, &bearer(&token)).is_ok());
}

/// A JWK of the public half of `signer`, with `kid`.
fn jwk(signer: &EncodingKey, alg: Algorithm, kid: &str) -> Jwk {
    let mut jwk = Jwk::from_encoding_key(signer, alg).unwrap();
    jwk.common.key_id = Some(kid.to_owned());
    jwk
}

fn write_jwks(dir: &Path, set: &Value) -> PathBuf {
    let path = dir.join("jwks.json");
    std::fs::write(&path, serde_json::to_vec_pretty(set).unwrap()).unwrap();
    path
}

#[test]
fn jwks_selects_the_key_by_kid() {
    let set = JwkSet {
        keys: vec![
            jwk(&ec_signer(), Algorithm::ES256, "ec-1"),
            jwk(&ec_other_signer(), Algorithm::ES256, "ec-2"),
            jwk(&rsa_signer(), Algorithm::RS256, "rsa-1"),
        ],
    };
    let mut set = serde_json::to_value(&set).unwrap();
    // Keys this crate cannot use are skipped, not fatal.
    set["keys"]
        .as_array_mut()
        .unwrap()
        .push(json!({"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"}));
    set["keys"]
        .as_array_mut()
        .unwrap()
        .push(json!({"kty": "XYZ", "kid": "future"}));
    let dir = tempfile::tempdir().unwrap();
    let config = JwtConfig::from_files(&write_jwks(dir.path(), &set), ISSUER, AUDIENCE).unwrap();
    assert_eq!(config.key().len(), 3);
    let scope = ScopeBy::jwt(config).unwrap();

    let by_ec2 = sign(
        Algorithm::ES256,
        Some("ec-2"),
        &claims(),
        &ec_other_signer(),
    );
    let alice = principal(&scope, &bearer(&by_ec2)).unwrap();
    assert_eq!(alice.as_str(), r#"jwt:["https://issuer.example","alice"]"#);
    let by_ec1 = sign(Algorithm::ES256, Some("ec-1"), &claims(), &ec_signer());
    assert_eq!(principal(&scope, &bearer(&by_ec1)).unwrap(), alice);
    let by_rsa = sign(Algorithm::RS256, Some("rsa-1"), &claims(), &rsa_signer());
    assert_eq!(principal(&scope, &bearer(&by_rsa)).unwrap(), alice);

    // Signed by ec-2 but naming ec-1: ec-1 is the only key tried.
    let mislabelled = sign(
        Algorithm::ES256,
        Some("ec-1"),
        &claims(),
        &ec_other_signer(),
    );
    assert_refused(
        principal(&scope, &bearer(&mislabelled)),
        "invalid signature",
    );
    let unknown = sign(Algorithm::ES256, Some("ec-9"), &claims(), &ec_signer());
    assert_refused(principal(&scope, &bearer(&unknown)), "unknown key id");
    let no_kid = sign(Algorithm::ES256, None, &claims(), &ec_signer());
    assert_refused(principal(&scope, &bearer(&no_kid)), "token has no key id");
    // The JWK's "alg" binds the key: RS256 key, PS256 token.
    let pss = sign(Algorithm::PS256, Some("rsa-1"), &claims(), &rsa_signer());
    assert_refused(principal(&scope, &bearer(&pss)), "algorithm not allowed");
    // The symmetric key in the set was skipped: no HS256 with kid "hmac".
    let hs = sign(Algorithm::HS256, Some("hmac"), &claims(), &hmac(b"secret"));
    assert_refused(principal(&scope, &bearer(&hs)), "unknown key id");
}

#[test]
fn a_jwks_with_one_key_accepts_tokens_without_kid() {
    let set = JwkSet {
        keys: vec![jwk(&ec_signer(), Algorithm::ES256, "only")],
    };
    let dir = tempfile::tempdir().unwrap();
    let path = write_jwks(dir.path(), &serde_json::to_value(&set).unwrap());
    let scope = ScopeBy::jwt(JwtConfig::from_files(&path, ISSUER, AUDIENCE).unwrap()).unwrap();
    let token = sign(Algorithm::ES256, None, &claims(), &ec_signer());
    assert!(principal(&scope, &bearer(&token)).is_ok());
}

#[test]
fn key_files_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let load = |name: &str, content: Option<&[u8]>| {
        let path = dir.path().join(name);
        if let Some(content) = content {
            std::fs::write(&path, content).unwrap();
        }
        let err = JwtKey::load(&path).unwrap_err();
        let JwtKeyError::InFile { path: at, source } = err else {
            panic!("no file context: {err:?}");
        };
        assert_eq!(at, path);
        *source
    };
    assert!(matches!(load("missing.pem", None), JwtKeyError::Read(_)));
    assert!(matches!(
        load("garbage", Some(b"hello")),
        JwtKeyError::NotAKey
    ));
    assert!(matches!(
        load("private.pem", Some(&read_fixture("ec_private.pem"))),
        JwtKeyError::PrivateKey
    ));
    assert!(matches!(
        load(
            "cert.pem",
            Some(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
        ),
        JwtKeyError::UnsupportedPem(_)
    ));
    assert!(matches!(
        load(
            "broken.pem",
            Some(b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
        ),
        JwtKeyError::InvalidKey
    ));
    assert!(matches!(
        load("bad.json", Some(b"{\"keys\": 3}")),
        JwtKeyError::Jwks(_)
    ));
    assert!(matches!(
        load(
            "empty.json",
            Some(br#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}, {"kty": "EC", "use": "enc", "crv": "P-256", "x": "AA", "y": "AA"}]}"#)
        ),
        JwtKeyError::NoUsableKeys
    ));

    // The message names the file and the problem.
    let err = JwtKey::load(&dir.path().join("private.pem")).unwrap_err();
    let chain = format!(
        "{err}: {}",
        std::error::Error::source(&err).map_or(String::new(), |s| s.to_string())
    );
    assert!(chain.contains("private.pem"), "{chain}");
    assert!(chain.contains("private key"), "{chain}");
}

#[test]
fn a_weak_rsa_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rsa1024.pem");
    // A 1024-bit RSA public key (SPKI), generated with openssl for this test.
    std::fs::write(&path, RSA_1024_PUBLIC).unwrap();
    let err = JwtKey::load(&path).unwrap_err();
    let JwtKeyError::InFile { source, .. } = err else {
        panic!("{err:?}")
    };
    assert!(
        matches!(*source, JwtKeyError::WeakRsaKey { bits: 1024 }),
        "{source:?}"
    );
}

const RSA_1024_PUBLIC: &str = include_str!("../fixtures/rsa1024_public.pem");
