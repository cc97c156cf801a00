pub(crate) mod call;
pub(crate) mod check;
pub(crate) mod demo;
pub(crate) mod demo_server;
mod demo_server_http;
pub(crate) mod engine_args;
pub(crate) mod proxy;
pub(crate) mod scope_args;
pub(crate) mod wrap;
