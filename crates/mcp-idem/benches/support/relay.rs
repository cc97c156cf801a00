//! The baselines for a stdio gateway: relay processes, the bench binary itself started as
//! `<bench> --as-poll-relay PROGRAM ARGS...`, `--as-tokio-relay` or `--as-reading-relay`. Each
//! starts the program with piped stdin and stdout and copies what comes both ways.
//! - The poll relay copies bytes in one `poll(2)` loop (read what is ready, write it all to the
//!   other side), as a 30-line C relay would: no parsing, no buffering beyond one read, no runtime.
//! - The tokio relay is that relay written as `wrap` is: one thread of tokio's current-thread
//!   runtime, the client's stdio as non-blocking pipes (`rmcp::transport::stdio_pipes`), and each
//!   direction read line by line, each line written whole, but nothing parsed. It is the floor of a
//!   line gateway on tokio: `wrap`'s pass-through minus it is what inspecting each message costs.
//! - The reading relay is the tokio relay that also hands each message to the interceptor `wrap`
//!   uses, then forwards it as it came (it records nothing, so it does not add the capability to
//!   `initialize`'s answer). It is the floor of a gateway that reads every message, as SEP-3182 needs:
//!   each request's id tracked until it is answered, so that a keyed call cannot take an
//!   unanswered request's id. `wrap`'s pass-through minus it is `wrap`'s own structure (its tasks,
//!   the drain, the shared output).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::process::{Command, Stdio};

/// The argument that turns the bench binary into the poll relay.
pub(crate) const RELAY_ARG: &str = "--as-poll-relay";
/// The argument that turns the bench binary into the tokio relay.
pub(crate) const TOKIO_RELAY_ARG: &str = "--as-tokio-relay";
/// The argument that turns the bench binary into the reading relay.
pub(crate) const READING_RELAY_ARG: &str = "--as-reading-relay";

/// A relay: relays to the program and its arguments until the program's output ends.
type Relay = fn(&[OsString]) -> std::io::Result<()>;

/// When this process was started as a relay, relays until the program's output ends and returns
/// its exit code; otherwise `None`.
pub(crate) fn run_if_relay() -> Option<std::process::ExitCode> {
    let mut args = std::env::args_os().skip(1);
    let first = args.next();
    let (name, relay): (_, Relay) = match first.as_deref() {
        Some(arg) if arg == RELAY_ARG => ("poll relay", relay),
        Some(arg) if arg == TOKIO_RELAY_ARG => ("tokio relay", tokio_relay),
        Some(arg) if arg == READING_RELAY_ARG => ("reading relay", reading_relay),
        _ => return None,
    };
    let program: Vec<OsString> = args.collect();
    Some(match relay(&program) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{name}: {err}");
            std::process::ExitCode::FAILURE
        }
    })
}

#[cfg(unix)]
fn relay(program: &[OsString]) -> std::io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;

    let (name, args) = program
        .split_first()
        .ok_or_else(|| std::io::Error::other("no program to relay to"))?;
    let mut child = Command::new(name)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut to_child = child.stdin.take();
    let mut from_child = child.stdout.take().expect("piped stdout");
    // The raw descriptors, unbuffered: std's Stdin/Stdout would add a buffer and a lock.
    let mut input = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let mut output = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let (client_ready, child_ready) = {
            let client = input.as_fd();
            let child_out = from_child.as_fd();
            let mut fds = vec![PollFd::new(child_out, PollFlags::POLLIN)];
            if to_child.is_some() {
                fds.push(PollFd::new(client, PollFlags::POLLIN));
            }
            poll(&mut fds, PollTimeout::NONE)?;
            let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
            (fds.get(1).is_some_and(ready), ready(&fds[0]))
        };
        if child_ready {
            let n = from_child.read(&mut buf)?;
            if n == 0 {
                break;
            }
            output.write_all(&buf[..n])?;
        }
        if client_ready {
            let n = input.read(&mut buf)?;
            match (n, to_child.as_mut()) {
                // The client's EOF closes the program's input; its output is still relayed.
                (0, _) => to_child = None,
                (n, Some(stdin)) => stdin.write_all(&buf[..n])?,
                (_, None) => {}
            }
        }
    }
    drop(to_child);
    child.wait()?;
    Ok(())
}

#[cfg(not(unix))]
fn relay(_program: &[OsString]) -> std::io::Result<()> {
    Err(std::io::Error::other("the poll relay needs a Unix system"))
}

fn tokio_relay(program: &[OsString]) -> std::io::Result<()> {
    line_relay(program, |_| {}, |_| {})
}

fn reading_relay(program: &[OsString]) -> std::io::Result<()> {
    use mcp_idempotency::interceptor::Interceptor;

    let interceptor = std::cell::RefCell::new(Interceptor::<mcp_idempotency::Claim>::default());
    line_relay(
        program,
        |line| {
            if let Some(message) = message_text(line) {
                let _ = interceptor.borrow_mut().on_client_message(message);
            }
        },
        |line| {
            if let Some(message) = message_text(line) {
                let _ = interceptor.borrow_mut().on_server_message(message);
            }
        },
    )
}

/// The message in a line, without its line ending, as `wrap` hands it to the interceptor.
fn message_text(line: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(line)
        .ok()?
        .trim_end_matches(['\n', '\r']);
    (!text.trim().is_empty()).then_some(text)
}

/// Starts the program and relays line by line on tokio's current-thread runtime, each line from
/// the client passed to `up`, each line from the program to `down`, before it is written.
fn line_relay(
    program: &[OsString],
    up: impl FnMut(&[u8]),
    down: impl FnMut(&[u8]),
) -> std::io::Result<()> {
    let (name, args) = program
        .split_first()
        .ok_or_else(|| std::io::Error::other("no program to relay to"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut child = tokio::process::Command::new(name)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut to_child = child.stdin.take().expect("piped stdin");
        let from_child = child.stdout.take().expect("piped stdout");
        let (client_in, mut client_out) = rmcp::transport::stdio_pipes();
        let up = async {
            copy_lines(client_in, &mut to_child, up).await?;
            // The client's EOF closes the program's input; its output is still relayed.
            drop(to_child);
            Ok::<_, std::io::Error>(())
        };
        let (up, down) = tokio::join!(up, copy_lines(from_child, &mut client_out, down));
        up?;
        down?;
        child.wait().await?;
        Ok(())
    })
}

/// Copies `from` to `to` line by line, each line given to `on_line`, then written whole and
/// flushed, until `from` ends.
async fn copy_lines<R, W>(
    from: R,
    to: &mut W,
    mut on_line: impl FnMut(&[u8]),
) -> std::io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

    let mut lines = tokio::io::BufReader::new(from);
    let mut line = Vec::new();
    while lines.read_until(b'\n', &mut line).await? > 0 {
        on_line(&line);
        to.write_all(&line).await?;
        to.flush().await?;
        line.clear();
    }
    Ok(())
}
