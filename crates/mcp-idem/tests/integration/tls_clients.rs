//! `mcp-idem check` and `mcp-idem call` over `https://`, on the library's one HTTP client: both
//! reach `mcp-idem proxy` behind a TLS listener whose certificate a CA made in the test signed,
//! trusting it with `--ca-cert`; without it the unknown issuer is refused with a clear error and
//! nothing runs. The demo server's ledger counts the charges.

use std::process::{Command, Output};

use serde_json::Value;

use crate::check::{witness_options, Run, CHARGES_OF_A_PASSING_RUN};
use crate::support::bridge_sessions::{TestCa, TlsFront};
use crate::support::common::ledger_lines;
use crate::support::http::{ledger_in, HttpDemo, Proxy};

const EXE: &str = env!("CARGO_BIN_EXE_mcp-idem");

/// The demo server behind `proxy` (memory store) behind a TLS listener of a test CA.
struct ProxyOverTls {
    dir: tempfile::TempDir,
    ca: TestCa,
    front: TlsFront,
    _proxy: Proxy,
    _server: HttpDemo,
}

impl ProxyOverTls {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let server = HttpDemo::spawn(&ledger_in(&dir), &[]);
        let proxy = Proxy::spawn(&server.base_url(), &["--store", "memory"]);
        let authority = proxy
            .url
            .trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .to_owned();
        let ca = TestCa::new(dir.path());
        let front = TlsFront::start(&ca, &authority);
        assert!(front.url.starts_with("https://"), "{}", front.url);
        Self {
            dir,
            ca,
            front,
            _proxy: proxy,
            _server: server,
        }
    }

    fn ca_pem(&self) -> &str {
        self.ca.ca_pem.to_str().unwrap()
    }

    fn charges(&self) -> Vec<Value> {
        ledger_lines(&ledger_in(&self.dir))
    }

    /// Asserts that the client reached the listener and refused its certificate.
    fn assert_refused(&self, stderr: &str) {
        let stderr = stderr.to_lowercase();
        assert!(
            stderr.contains("certificate") && stderr.contains("unknownissuer"),
            "not a clear TLS error: {stderr}"
        );
        assert_eq!(self.front.handshakes(), 0);
        self.front.wait_for_a_failed_handshake();
        assert!(self.charges().is_empty());
    }
}

/// `mcp-idem SUBCOMMAND ARGS`, without a CA from the environment.
fn mcp_idem(subcommand: &str, args: &[&str]) -> Output {
    let output = Command::new(EXE)
        .arg(subcommand)
        .args(args)
        .env("MCP_IDEM_LOG", "error")
        .env_remove("MCP_IDEM_CA_CERT")
        .output()
        .expect("run mcp-idem");
    eprintln!(
        "mcp-idem {subcommand} {args:?} -> {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn check_passes_the_proxy_over_https_with_its_ca() {
    let tls = ProxyOverTls::start();
    let run = Run::new(
        &witness_options(),
        &["--url", &tls.front.url, "--ca-cert", tls.ca_pem()],
    );
    run.assert_outcome(&[], &["mrtr.continuation"]);
    assert_eq!(run.code(), Some(0));
    assert_eq!(
        tls.charges().len(),
        CHARGES_OF_A_PASSING_RUN,
        "{:#}",
        run.report
    );
    assert!(tls.front.handshakes() >= 1);
}

#[test]
fn call_charges_once_over_https_with_the_ca() {
    let tls = ProxyOverTls::start();
    let call = || {
        mcp_idem(
            "call",
            &[
                "--url",
                &tls.front.url,
                "--ca-cert",
                tls.ca_pem(),
                "--tool",
                "charge_payment",
                "--args",
                r#"{"amount": 4200, "currency": "usd"}"#,
                "--key",
                "over-tls",
                "--json",
            ],
        )
    };
    let first = call();
    assert_eq!(first.status.code(), Some(0));
    let again = call();
    assert_eq!(again.status.code(), Some(0));
    let result = |output: &Output| {
        let json: Value = serde_json::from_slice(&output.stdout).expect("--json output");
        json["result"].clone()
    };
    assert_eq!(result(&first), result(&again), "the retry is a replay");
    let charges = tls.charges();
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(
        result(&first)["structuredContent"]["chargeId"],
        charges[0]["chargeId"]
    );
    assert!(tls.front.handshakes() >= 2);
}

#[test]
fn without_the_ca_check_and_call_refuse_the_unknown_issuer() {
    let tls = ProxyOverTls::start();

    let call = mcp_idem(
        "call",
        &[
            "--url",
            &tls.front.url,
            "--tool",
            "charge_payment",
            "--args",
            r#"{"amount": 1, "currency": "usd"}"#,
            "--json",
        ],
    );
    assert_eq!(call.status.code(), Some(2));
    let json: Value = serde_json::from_slice(&call.stdout).expect("--json output");
    assert_eq!(json["failure"]["type"], "connect", "{json}");
    assert_eq!(json["failure"]["mayHaveRun"], false, "{json}");
    assert_eq!(json["failure"]["gaveUp"], "final", "not retried: {json}");
    tls.assert_refused(&String::from_utf8_lossy(&call.stderr));

    let mut check_args = witness_options();
    check_args.retain(|arg| arg != "--json");
    check_args.extend(["--url".to_owned(), tls.front.url.clone()]);
    let check_args: Vec<&str> = check_args.iter().map(String::as_str).collect();
    let check = mcp_idem("check", &check_args);
    assert_eq!(check.status.code(), Some(2));
    tls.assert_refused(&String::from_utf8_lossy(&check.stderr));
}
