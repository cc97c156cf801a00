//! The baseline for a stdio gateway: a minimal relay process, the bench binary itself started as
//! `<bench> --as-poll-relay PROGRAM ARGS...`. It starts the program with piped stdin and stdout and
//! copies bytes both ways in one `poll(2)` loop (read what is ready, write it all to the other
//! side), as a 30-line C relay would: no parsing, no buffering beyond one read, no runtime.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::process::{Command, Stdio};

/// The argument that turns the bench binary into the relay.
pub(crate) const RELAY_ARG: &str = "--as-poll-relay";

/// When this process was started as the relay, relays until the program's output ends and
/// returns its exit code; otherwise `None`.
pub(crate) fn run_if_relay() -> Option<std::process::ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(RELAY_ARG.as_ref()) {
        return None;
    }
    let program: Vec<OsString> = args.collect();
    Some(match relay(&program) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("poll relay: {err}");
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
