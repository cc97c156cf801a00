//! `mcp_idempotency._native`: the Python face of [`mcp_idempotency::embedded`].
//!
//! Thin on purpose: a [`Gateway`] is an [`Embedded`] gateway opened from `wrap`'s option names,
//! a [`Connection`] hands JSON-RPC messages (as text) to the library and answers with what to do
//! (`("forward" | "rewritten" | "respond" | "drop", message or None)`). Every decision, the
//! fingerprint and the store are the Rust crate's; the Python package
//! (`python/mcp_idempotency/__init__.py`) only carries messages between the SDK and here.
//!
//! A decision that needs no store round trip comes back at once; one that waits on the store
//! comes back as an awaitable whose I/O runs on the tokio runtime, never on the server's event
//! loop.

use std::sync::Arc;
use std::time::Duration;

use mcp_idempotency::embedded::{
    self, now_or_later, Answer, Embedded, FromClient, FromServer, Settings, SetupError,
};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;

create_exception!(
    _native,
    IdempotencyError,
    PyException,
    "A gateway that cannot be set up (bad option, store URL that does not parse, store that \
     cannot be opened). `type` is the SEP-style error type, `code` the JSON-RPC code."
);

/// What to do with a message, as Python sees it: the action and the message to send instead.
type Step = (&'static str, Option<String>);

fn client_step(action: FromClient) -> Step {
    match action {
        FromClient::Forward => ("forward", None),
        FromClient::ForwardRewritten(message) => ("rewritten", Some(message)),
        FromClient::Respond(message) => ("respond", Some(message)),
        FromClient::Drop => ("drop", None),
    }
}

fn server_step(action: FromServer) -> Step {
    match action {
        FromServer::Forward => ("forward", None),
        FromServer::ForwardRewritten(message) => ("rewritten", Some(message)),
        FromServer::Drop => ("drop", None),
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

/// The answer now (a tuple) when it is ready, else an awaitable of it run on the tokio runtime.
fn answer<'py, T>(
    py: Python<'py>,
    future: impl std::future::Future<Output = T> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let runtime = pyo3_async_runtimes::tokio::get_runtime();
    let _entered = runtime.enter();
    match now_or_later(future) {
        Answer::Ready(value) => Ok(value.into_bound_py_any(py)?),
        Answer::Pending(future) => {
            pyo3_async_runtimes::tokio::future_into_py(py, async move { Ok(future.await) })
        }
    }
}

/// A gateway in process: the store, the scope of its records and the interceptor's settings,
/// shared by every connection.
#[pyclass(frozen, module = "mcp_idempotency._native")]
struct Gateway {
    inner: Embedded,
}

#[pymethods]
impl Gateway {
    /// Opens the store and starts the gateway. `options` are `(name, value)` pairs of `wrap`'s
    /// option names (`store`, `retention`, `lease`, …). Blocks until the store answers (without
    /// holding the GIL); raises `IdempotencyError` when it cannot be set up.
    #[staticmethod]
    fn open(py: Python<'_>, namespace: String, options: Vec<(String, String)>) -> PyResult<Self> {
        let mut settings = Settings::new(namespace);
        for (name, value) in &options {
            settings
                .set(name, value)
                .map_err(|err| setup_error(py, err))?;
        }
        let runtime = pyo3_async_runtimes::tokio::get_runtime();
        match py.detach(|| runtime.block_on(settings.open())) {
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

    /// The namespace records are kept under.
    #[getter]
    fn namespace(&self) -> String {
        self.inner.scope().namespace().to_owned()
    }

    /// The principal records are kept under when a connection names none.
    #[getter]
    fn principal(&self) -> String {
        self.inner.scope().principal().to_owned()
    }

    /// Waits up to `grace` seconds for outcomes still being sent to the store in the background
    /// (call it before the process exits); returns how many are still pending.
    fn settle(&self, py: Python<'_>, grace: f64) -> usize {
        let grace = Duration::try_from_secs_f64(grace).unwrap_or_default();
        let runtime = pyo3_async_runtimes::tokio::get_runtime();
        py.detach(|| runtime.block_on(self.inner.settle(grace)))
    }
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
    /// What to do with a message from the client: `(action, message)`, or an awaitable of it.
    fn from_client<'py>(&self, py: Python<'py>, message: String) -> PyResult<Bound<'py, PyAny>> {
        let connection = Arc::clone(&self.inner);
        answer(py, async move {
            client_step(connection.from_client(&message).await)
        })
    }

    /// What to do with a message from the server: `(action, message)`, or an awaitable of it.
    fn from_server<'py>(&self, py: Python<'py>, message: String) -> PyResult<Bound<'py, PyAny>> {
        let connection = Arc::clone(&self.inner);
        answer(py, async move {
            server_step(connection.from_server(&message).await)
        })
    }

    /// Ends the connection: calls still running are recorded outcome-unknown. Returns (now or
    /// as an awaitable) the responses owed to the client for them.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let connection = Arc::clone(&self.inner);
        answer(py, async move { connection.close().await })
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Gateway>()?;
    m.add_class::<Connection>()?;
    m.add("IdempotencyError", m.py().get_type::<IdempotencyError>())?;
    m.add("OPTIONS", embedded::OPTIONS.to_vec())?;
    Ok(())
}
