//! `mcp_idempotency._native`: the Python face of [`mcp_idempotency::embedded`].
//!
//! Thin on purpose: a [`Gateway`] is an [`Embedded`] gateway opened from the user's options (as
//! JSON, `Settings::from_json`),
//! a [`Connection`] hands JSON-RPC messages (as text) to the library and answers with what to do
//! (`("forward" | "rewritten" | "respond" | "drop", message or None)`). Every decision, the
//! fingerprint and the store are the Rust crate's; the Python package
//! (`python/mcp_idempotency/__init__.py`) only carries messages between the SDK and here.
//!
//! A decision that needs no store round trip comes back at once, and so does one that waits on the
//! store under `store_io="inline"` (run on the caller's thread, without the GIL:
//! `mcp_idempotency::embedded::StoreIo`). Otherwise it runs
//! on this module's tokio runtime, never on the server's event loop, and comes back as a ticket:
//! its answer is queued in the loop's [`Completions`], which wakes the loop through a socket the
//! loop watches. The runtime's threads never take the GIL; the loop takes the answers with the GIL
//! it holds anyway (a future resolved from a runtime thread under the GIL cost about 70 µs a round
//! trip, against about 10 µs on Node: docs/benchmarks.md).

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use mcp_idempotency::embedded::{
    self, options, Answer, Embedded, Gateways, Settings, SetupError, Step,
};
use mcp_idempotency::interceptor::{CancelPolicy, META_KEY};
use mcp_idempotency::stdio::DEFAULT_SHUTDOWN_GRACE;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError};
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;

create_exception!(
    _native,
    IdempotencyError,
    PyException,
    "A gateway that cannot be set up (bad option, store URL that does not parse, store that \
     cannot be opened). `type` is the SEP-style error type, `code` the JSON-RPC code."
);

/// The runtime every store round trip of this process runs on, started at the first use.
static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();

/// The gateways this process opened, by namespace and options.
static GATEWAYS: Gateways = Gateways::new();

fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    RUNTIME
        .get_or_init(|| {
            // The library's logs on stderr, as `wrap`'s (`MCP_IDEM_LOG`), then the bindings'
            // one-worker runtime (`mcp_idempotency::embedded::runtime`).
            embedded::log_to_stderr();
            let runtime = embedded::runtime().map_err(|err| err.to_string())?;
            embedded::export_telemetry(runtime.handle());
            Ok(runtime)
        })
        .as_ref()
        .map_err(|err| PyOSError::new_err(format!("cannot start the tokio runtime: {err}")))
}

/// An answer handed back to Python: a step (`(action, message)`), or the responses owed at a
/// connection's close.
enum Ready {
    Step(Step),
    Responses(Vec<String>),
}

impl<'py> IntoPyObject<'py> for Ready {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Self::Step(step) => (step.action, step.message).into_bound_py_any(py),
            Self::Responses(responses) => responses.into_bound_py_any(py),
        }
    }
}

fn setup_error(py: Python<'_>, err: SetupError) -> PyErr {
    let exception = IdempotencyError::new_err(err.to_string());
    let value = exception.value(py);
    // Setting attributes on a fresh exception instance cannot fail.
    let _ = value.setattr("type", err.error_type());
    let _ = value.setattr("code", err.code());
    exception
}

/// The answers of store round trips for one asyncio loop. The loop watches [`fileno`]
/// (`loop.add_reader`) and calls [`take`] when it is readable.
///
/// [`fileno`]: Completions::fileno
/// [`take`]: Completions::take
#[pyclass(frozen, module = "mcp_idempotency._native")]
struct Completions {
    queue: Arc<Queue>,
    /// The end the loop watches.
    readable: UnixStream,
}

struct Queue {
    ready: Mutex<Vec<(u64, Ready)>>,
    next_ticket: AtomicU64,
    /// Written to when an answer lands in an empty queue.
    wake: UnixStream,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Vec<(u64, Ready)>> {
        self.ready.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, ticket: u64, answer: Ready) {
        let mut ready = self.lock();
        ready.push((ticket, answer));
        // One byte per batch: the loop takes every queued answer when it wakes.
        if ready.len() == 1 {
            // A full socket already holds a wake-up; nothing else can fail on a connected pair.
            let _ = (&self.wake).write(&[1]);
        }
    }
}

#[pymethods]
impl Completions {
    #[new]
    fn new() -> PyResult<Self> {
        let (readable, wake) =
            UnixStream::pair().map_err(|err| PyOSError::new_err(err.to_string()))?;
        readable
            .set_nonblocking(true)
            .and_then(|()| wake.set_nonblocking(true))
            .map_err(|err| PyOSError::new_err(err.to_string()))?;
        Ok(Self {
            queue: Arc::new(Queue {
                ready: Mutex::new(Vec::new()),
                next_ticket: AtomicU64::new(1),
                wake,
            }),
            readable,
        })
    }

    /// The descriptor that becomes readable when answers are queued.
    fn fileno(&self) -> i32 {
        self.readable.as_raw_fd()
    }

    /// The queued answers, `(ticket, answer)`, in the order they came.
    fn take<'py>(&self, py: Python<'py>) -> PyResult<Vec<(u64, Bound<'py, PyAny>)>> {
        // The wake-ups first: an answer queued after this writes a new one. A read that does not
        // fill the buffer emptied the socket (one system call, not a second to learn it is empty).
        let mut drained = [0u8; 64];
        loop {
            match (&self.readable).read(&mut drained) {
                Ok(n) if n == drained.len() => continue,
                Err(err) if err.kind() == ErrorKind::Interrupted => continue,
                _ => break,
            }
        }
        let ready = std::mem::take(&mut *self.queue.lock());
        ready
            .into_iter()
            .map(|(ticket, answer)| Ok((ticket, answer.into_pyobject(py)?)))
            .collect()
    }
}

/// The answer now when it is ready (or, under `store-io = inline`, once run here), else a ticket
/// whose answer `completions` will hold. Without the GIL: an inline decision may wait on the store.
fn answer<'py>(
    py: Python<'py>,
    completions: &Completions,
    connection: &embedded::Connection,
    future: impl std::future::Future<Output = Ready> + Send + 'static,
    may_wait: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let runtime = runtime()?;
    let decided = py.detach(|| {
        let _entered = runtime.enter();
        connection.answer(future, may_wait)
    });
    match decided {
        Answer::Ready(value) => value.into_pyobject(py),
        Answer::Pending(future) => {
            let ticket = completions
                .queue
                .next_ticket
                .fetch_add(1, Ordering::Relaxed);
            let queue = Arc::clone(&completions.queue);
            runtime.spawn(async move { queue.push(ticket, future.await) });
            ticket.into_bound_py_any(py)
        }
    }
}

/// A gateway in process: the store, the scope of its records and the interceptor's settings,
/// shared by every connection. Two are equal when they are the same gateway.
#[pyclass(frozen, eq, module = "mcp_idempotency._native")]
#[derive(PartialEq)]
struct Gateway {
    inner: Embedded,
}

#[pymethods]
impl Gateway {
    /// The gateway of the server named `server_name` with these options: the one this process
    /// opened before, or a new one (the store opened, the gateway started). `options` is a JSON
    /// object of option name (as the user spelled it: `after_crash`, `max_key_bytes`, …) to
    /// value, read by `mcp_idempotency::embedded::Settings::from_json`, whose errors name each
    /// option as given. Blocks until the store answers (without holding the GIL); raises
    /// `IdempotencyError` when it cannot be set up.
    #[staticmethod]
    #[pyo3(signature = (server_name, options))]
    fn open(py: Python<'_>, server_name: Option<&str>, options: &str) -> PyResult<Self> {
        let settings =
            Settings::from_json(server_name, options).map_err(|err| setup_error(py, err))?;
        let runtime = runtime()?;
        match py.detach(|| runtime.block_on(GATEWAYS.open(settings))) {
            Ok(inner) => Ok(Self { inner }),
            Err(err) => Err(setup_error(py, err)),
        }
    }

    /// A new connection (one request of the SDK's pipeline): `principal` overrides the
    /// gateway's for its records.
    #[pyo3(signature = (principal=None))]
    fn connect(&self, principal: Option<&str>) -> Connection {
        Connection {
            inner: Arc::new(self.inner.connect(principal)),
        }
    }

    /// Whether the suggested policies apply (`tools="suggested"`): `Connection.tools_request`
    /// is then asked before each `tools/call`.
    #[getter]
    fn lists_tools(&self) -> bool {
        self.inner.lists_tools()
    }

    /// Whether a claimed call runs to its end when the client cancels it (`cancel=absorb`).
    #[getter]
    fn absorbs_cancellations(&self) -> bool {
        self.inner.cancel_policy() == CancelPolicy::Absorb
    }
}

/// As the process exits: waits up to `SETTLE_GRACE_SECONDS`, in all, for the outcomes the
/// gateways still send again to their stores; returns how many are still pending.
#[pyfunction]
fn settle_at_exit(py: Python<'_>) -> usize {
    // No runtime: no gateway was opened, nothing to wait for.
    match RUNTIME.get() {
        Some(Ok(runtime)) => py.detach(|| runtime.block_on(GATEWAYS.settle_at_exit())),
        _ => 0,
    }
}

/// The `IdempotencyError` for option `name` (as the user spelled it) refused with `value` (as
/// Python shows it) for `reason`: the library's words, type and code.
#[pyfunction]
fn invalid_option(
    py: Python<'_>,
    name: &str,
    value: &str,
    reason: &str,
) -> Py<pyo3::exceptions::PyBaseException> {
    setup_error(
        py,
        SetupError::invalid_option(name, Some(value.to_owned()), reason),
    )
    .into_value(py)
}

/// One connection's interceptor state (see `mcp_idempotency::embedded::Connection`).
#[pyclass(frozen, module = "mcp_idempotency._native")]
struct Connection {
    inner: Arc<embedded::Connection>,
}

// The names of the library's `Connection` methods, which these carry.
#[allow(clippy::wrong_self_convention)]
#[pymethods]
impl Connection {
    /// Before `message` (a request from the client) is handed over, with `tools="suggested"`:
    /// the `tools/list` request to run on the server itself, whose answer goes to `from_server`,
    /// then ask again; `None`: hand `message` over (`embedded::Connection::tools_request`).
    fn tools_request(&self, message: &str) -> Option<String> {
        self.inner.tools_request(message)
    }

    /// What to do with a message from the client: `(action, message)`, or a ticket of
    /// `completions`.
    fn from_client<'py>(
        &self,
        py: Python<'py>,
        message: String,
        completions: &Completions,
    ) -> PyResult<Bound<'py, PyAny>> {
        let received = self.inner.receive(&message);
        let may_wait = received.may_wait();
        let connection = Arc::clone(&self.inner);
        let decided = async move { Ready::Step(connection.decide(received).await.into()) };
        answer(py, completions, &self.inner, decided, may_wait)
    }

    /// What to do with a message from the server: `(action, message)`, or a ticket of
    /// `completions`.
    fn from_server<'py>(
        &self,
        py: Python<'py>,
        message: String,
        completions: &Completions,
    ) -> PyResult<Bound<'py, PyAny>> {
        let connection = Arc::clone(&self.inner);
        let decided = async move { Ready::Step(connection.from_server(&message).await.into()) };
        answer(py, completions, &self.inner, decided, false)
    }

    /// Ends the connection: calls still running are recorded outcome-unknown. Returns the
    /// responses owed to the client for them (a list), or a ticket of `completions`.
    fn close<'py>(
        &self,
        py: Python<'py>,
        completions: &Completions,
    ) -> PyResult<Bound<'py, PyAny>> {
        let connection = Arc::clone(&self.inner);
        let closed = async move { Ready::Responses(connection.close().await) };
        answer(py, completions, &self.inner, closed, false)
    }
}

/// The default namespace of the server named `name`: the library's one rule
/// (`mcp_idempotency::default_scope::server_namespace`), as `wrap` applies it.
#[pyfunction]
fn server_namespace(name: &str) -> String {
    mcp_idempotency::default_scope::server_namespace(name)
}

/// The default principal of a request authenticated as the OAuth client `client_id`: the
/// library's one rule (`mcp_idempotency::default_scope::client_principal`).
#[pyfunction]
fn client_principal(client_id: &str) -> String {
    mcp_idempotency::default_scope::client_principal(client_id)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Gateway>()?;
    m.add_class::<Connection>()?;
    m.add_class::<Completions>()?;
    m.add("IdempotencyError", m.py().get_type::<IdempotencyError>())?;
    m.add_function(wrap_pyfunction!(settle_at_exit, m)?)?;
    m.add_function(wrap_pyfunction!(invalid_option, m)?)?;
    let names: Vec<&str> = options::every().map(|option| option.name).collect();
    m.add("OPTIONS", names)?;
    m.add("META_KEY", META_KEY)?;
    m.add("SETTLE_GRACE_SECONDS", DEFAULT_SHUTDOWN_GRACE.as_secs_f64())?;
    m.add_function(wrap_pyfunction!(server_namespace, m)?)?;
    m.add_function(wrap_pyfunction!(client_principal, m)?)?;
    Ok(())
}
