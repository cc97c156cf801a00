//! The wrapped MCP server's process: started so that it never outlives `wrap`, and stopped in the
//! order the MCP stdio transport gives (close its input, wait, SIGTERM, wait, SIGKILL).
//!
//! - On Linux the server is started through `mcp-idem exec-server` (a hidden subcommand: this very
//!   binary, re-executed): it sets the parent-death signal to SIGKILL (`prctl(PR_SET_PDEATHSIG)`),
//!   checks that `wrap` is still its parent (it may have died before), then executes the server,
//!   which keeps the setting. So the server is killed when `wrap` dies, even by SIGKILL. The signal
//!   is tied to the thread that started the child: `wrap` starts it from its main thread, which
//!   lives as long as the process. It reaches the server's process only: processes the server
//!   starts itself (`npx` starting `node`) see their input close and are on their own.
//! - Elsewhere there is no such mechanism (macOS has no parent-death signal): when `wrap` dies, its
//!   end of the server's input and output closes, which is what the server sees; a server that
//!   keeps running after its input ends outlives a killed `wrap`.
//! - On Unix the server gets a process group of its own, so that a signal a client sends to
//!   `wrap`'s whole group (the Python SDK does) reaches `wrap` only: `wrap` then stops the server
//!   itself, after the calls in flight are answered. SIGTERM and SIGKILL go to the server's group,
//!   so they reach what it started too.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::AsyncWrite;
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::oneshot;

/// How long the server gets to exit once its input is closed, and again after SIGTERM (the Python
/// SDK's stdio client waits as long).
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// The running server.
#[derive(Debug)]
pub(super) struct Server {
    child: Child,
}

/// Starts `command` (program and arguments) with piped stdin and stdout; stderr is `wrap`'s.
pub(super) fn spawn(command: &[String]) -> anyhow::Result<(Server, ChildStdin, ChildStdout)> {
    let (program, args) = command.split_first().context("no command to run")?;
    // `_binary` keeps the launcher's descriptor open until the child has been started.
    let (mut child, _binary) = launcher(program, args)?;
    child
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    #[cfg(unix)]
    child.process_group(0);
    // tokio forks from the calling thread: `wrap`'s main thread (its runtime has one thread), which
    // the parent-death signal is tied to.
    let mut child = child
        .spawn()
        .with_context(|| format!("cannot start {program:?}"))?;
    let stdin = child.stdin.take().context("child stdin")?;
    let stdout = child.stdout.take().context("child stdout")?;
    Ok((Server { child }, stdin, stdout))
}

/// The command that runs the server: through `mcp-idem exec-server` on Linux, with the open file
/// of this binary that the command executes (keep it open until the command has been spawned).
#[cfg(target_os = "linux")]
fn launcher(
    program: &str,
    args: &[String],
) -> anyhow::Result<(tokio::process::Command, std::fs::File)> {
    use std::os::fd::AsRawFd;
    let path = find_program(program)
        .with_context(|| format!("cannot start {program:?}: no such executable file"))?;
    // The running binary, even if its file was replaced since: opened here and executed through
    // its descriptor, which the child inherits until its `execve` (the descriptor is close-on-exec).
    // Executing `/proc/self/exe` in the child would do the same, except under valgrind, where that
    // path names valgrind's own tool while opening it yields the program being run.
    let binary = std::fs::File::open("/proc/self/exe").context("cannot open /proc/self/exe")?;
    let mut command = tokio::process::Command::new(format!("/proc/self/fd/{}", binary.as_raw_fd()));
    command
        .arg("exec-server")
        .arg("--parent")
        .arg(std::process::id().to_string())
        .arg("--path")
        .arg(path)
        .arg("--")
        .arg(program)
        .args(args);
    Ok((command, binary))
}

#[cfg(not(target_os = "linux"))]
fn launcher(program: &str, args: &[String]) -> anyhow::Result<(tokio::process::Command, ())> {
    let mut command = tokio::process::Command::new(program);
    command.args(args);
    Ok((command, ()))
}

/// Where `execvp` would find `program`: itself when it names a path, else the first executable
/// file of that name in a `PATH` directory (`/bin:/usr/bin` without `PATH`).
#[cfg(target_os = "linux")]
fn find_program(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.is_empty() {
        return None;
    }
    if program.contains('/') {
        let path = PathBuf::from(program);
        return executable(&path).then_some(path);
    }
    let dirs = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    std::env::split_paths(&dirs)
        .map(|dir| dir.join(program))
        .find(|path| executable(path))
}

impl Server {
    /// Waits for the server to exit; once `input_closed` fires (the proxy closed the server's
    /// input, or dropped it), gives it [`EXIT_WAIT`], then sends SIGTERM, gives it as long again,
    /// then sends SIGKILL.
    pub(super) async fn wait_or_stop(
        &mut self,
        input_closed: oneshot::Receiver<()>,
    ) -> io::Result<ExitStatus> {
        tokio::select! {
            status = self.child.wait() => return status,
            _ = input_closed => {}
        }
        if let Ok(status) = tokio::time::timeout(EXIT_WAIT, self.child.wait()).await {
            return status;
        }
        tracing::info!(
            "the MCP server did not exit within {EXIT_WAIT:?} of its input closing; sending SIGTERM"
        );
        self.terminate();
        if let Ok(status) = tokio::time::timeout(EXIT_WAIT, self.child.wait()).await {
            return status;
        }
        tracing::warn!("the MCP server did not exit within {EXIT_WAIT:?} of SIGTERM; killing it");
        self.kill();
        self.child.wait().await
    }

    /// SIGTERM to the server's process group.
    #[cfg(unix)]
    fn terminate(&mut self) {
        self.signal_group(nix::sys::signal::Signal::SIGTERM);
    }

    #[cfg(not(unix))]
    fn terminate(&mut self) {}

    /// SIGKILL to the server's process group (and to the server, should that fail).
    fn kill(&mut self) {
        #[cfg(unix)]
        self.signal_group(nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.start_kill();
    }

    #[cfg(unix)]
    fn signal_group(&self, signal: nix::sys::signal::Signal) {
        let Some(pid) = self.child.id().and_then(|pid| i32::try_from(pid).ok()) else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(pid);
        // The server leads its own group (`process_group(0)`), whose id is its pid.
        if let Err(err) = nix::sys::signal::killpg(pid, signal) {
            tracing::debug!(error = %err, "cannot signal the server's process group");
            let _ = nix::sys::signal::kill(pid, signal);
        }
    }
}

/// The server's input, as the proxy writes it; when it is dropped (the proxy closed it), the
/// server's stop begins.
pub(super) struct ServerInput {
    inner: ChildStdin,
    closed: Option<oneshot::Sender<()>>,
}

impl ServerInput {
    pub(super) fn new(inner: ChildStdin, closed: oneshot::Sender<()>) -> Self {
        Self {
            inner,
            closed: Some(closed),
        }
    }
}

impl Drop for ServerInput {
    fn drop(&mut self) {
        if let Some(closed) = self.closed.take() {
            let _ = closed.send(());
        }
    }
}

impl AsyncWrite for ServerInput {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// `mcp-idem exec-server --parent PID --path PATH -- PROGRAM [ARGS...]` (hidden): what `wrap` runs
/// to start its server on Linux. Sets the parent-death signal, checks the parent, then executes
/// PATH with PROGRAM and ARGS as its arguments (this process becomes the server).
#[derive(Debug, clap::Args)]
pub(crate) struct ExecServerArgs {
    /// The pid of the `wrap` that started this process.
    #[arg(long)]
    parent: u32,
    /// The executable to run.
    #[arg(long)]
    path: PathBuf,
    /// Its arguments, the program name first.
    #[arg(last = true, required = true)]
    argv: Vec<String>,
}

impl ExecServerArgs {
    pub(crate) fn exec(self) -> anyhow::Result<std::process::ExitCode> {
        exec_server(self)
    }
}

#[cfg(target_os = "linux")]
fn exec_server(args: ExecServerArgs) -> anyhow::Result<std::process::ExitCode> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .context("cannot set the parent-death signal")?;
    // `wrap` may have died between starting this process and the line above: then this process
    // has been handed to another parent and the signal will never come.
    if u32::try_from(nix::unistd::getppid().as_raw()).ok() != Some(args.parent) {
        return Ok(std::process::ExitCode::from(1));
    }
    let path = CString::new(args.path.as_os_str().as_bytes()).context("a NUL in the path")?;
    let argv = args
        .argv
        .iter()
        .map(|arg| CString::new(arg.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .context("a NUL in an argument")?;
    let err = match nix::unistd::execv(&path, &argv) {
        Ok(never) => match never {},
        Err(err) => err,
    };
    eprintln!(
        "mcp-idem wrap: cannot start {:?}: {err}",
        args.argv.first().map(String::as_str).unwrap_or_default()
    );
    Ok(std::process::ExitCode::from(127))
}

#[cfg(not(target_os = "linux"))]
fn exec_server(_: ExecServerArgs) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("exec-server is only used on Linux")
}
