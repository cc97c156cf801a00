//! Statement parameters with their PostgreSQL types, for unnamed statements.
//!
//! Every statement is sent as an unnamed statement with its parameter types spelled out
//! (tokio-postgres' `query_typed` and `execute_typed`): parse, bind and execute travel together,
//! in one round trip, and nothing outlives the statement on the server. That is what lets the
//! store work through PgBouncer in transaction pooling mode, where consecutive statements of one
//! client may run on different server connections, so a named prepared statement made on one is
//! unknown on the next. The same statements are sent whether or not a pooler is in front: one
//! code path. The cost is that the server parses and plans each statement every time; for the two
//! statements every executed call runs (the claim and the completion) that cost more than running
//! them, so those two are PL/pgSQL functions (see `sql::CLAIM_FUNCTION`), whose plans the server
//! keeps per connection, and the statements sent are only their calls, cheap to plan.

use tokio_postgres::types::{ToSql, Type};

/// A Rust value the store sends as a parameter, and the PostgreSQL type it is sent as.
pub(super) trait Param: ToSql + Sync {
    /// The PostgreSQL type of the parameter.
    const TYPE: Type;
}

impl Param for &str {
    const TYPE: Type = Type::TEXT;
}

impl Param for String {
    const TYPE: Type = Type::TEXT;
}

impl Param for &[u8] {
    const TYPE: Type = Type::BYTEA;
}

impl Param for i16 {
    const TYPE: Type = Type::INT2;
}

impl Param for i32 {
    const TYPE: Type = Type::INT4;
}

impl Param for i64 {
    const TYPE: Type = Type::INT8;
}

impl Param for Vec<i64> {
    const TYPE: Type = Type::INT8_ARRAY;
}

impl Param for Vec<i16> {
    const TYPE: Type = Type::INT2_ARRAY;
}

impl Param for Vec<&str> {
    const TYPE: Type = Type::TEXT_ARRAY;
}

impl Param for Vec<&[u8]> {
    const TYPE: Type = Type::BYTEA_ARRAY;
}

impl Param for Option<String> {
    const TYPE: Type = Type::TEXT;
}

impl Param for Vec<Option<&str>> {
    const TYPE: Type = Type::TEXT_ARRAY;
}

/// A parameter as `query_typed` takes it.
pub(super) type Typed<'a> = (&'a (dyn ToSql + Sync), Type);

/// `value` with its type.
pub(super) fn typed<P: Param>(value: &P) -> Typed<'_> {
    (value, P::TYPE)
}

/// `[typed(&a), typed(&b), …]`: the parameters of one statement.
macro_rules! params {
    ($($value:expr),* $(,)?) => {
        [$($crate::store::postgres::params::typed(&$value)),*]
    };
}

pub(super) use params;
