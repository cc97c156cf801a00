//! The `SELECT` behind [`Store::list`](super::Store::list) for the SQL stores: one builder, each
//! store spelling the placeholders and binding the parameters its own way.

use super::sql_row::sql_time;
use super::{ListFilter, StateFilter};
use crate::policy::DERIVED;
use crate::time::Timestamp;

/// A parameter of the statement.
pub(crate) enum SqlParam {
    Text(String),
    Integer(i64),
}

/// The records matching `filter`, latest expiry first, at most `limit`. `select` is `SELECT
/// <columns> FROM <table>`; `placeholder(n)` spells parameter `n` (from 1). Only the conditions
/// that are set appear, so that the planner can use the primary key for a scope and the
/// `expires_at` index for states and the order.
pub(crate) fn list_query(
    select: &str,
    filter: &ListFilter,
    now: Timestamp,
    limit: usize,
    placeholder: fn(usize) -> String,
) -> (String, Vec<SqlParam>) {
    let millis = |t: Timestamp| SqlParam::Integer(sql_time(t));
    let mut conditions = Vec::new();
    let mut params = Vec::new();
    let mut condition = |text: &str, param: SqlParam| {
        params.push(param);
        conditions.push(text.replace('?', &placeholder(params.len())));
    };
    if let Some(namespace) = &filter.namespace {
        condition("namespace = ?", SqlParam::Text(namespace.clone()));
    }
    if let Some(principal) = &filter.principal {
        condition("principal = ?", SqlParam::Text(principal.clone()));
    }
    if let Some(key) = &filter.key {
        condition("key = ?", SqlParam::Text(key.clone()));
    }
    match filter.state {
        Some(StateFilter::InProgress) => {
            condition("expires_at > ? AND owner IS NOT NULL", millis(now));
        }
        Some(StateFilter::Completed) => condition("expires_at > ? AND owner IS NULL", millis(now)),
        Some(StateFilter::Expired) => condition("expires_at <= ?", millis(now)),
        None => {}
    }
    if let Some(t) = filter.created_at_or_before {
        condition("created_at <= ?", millis(t));
    }
    if let Some(t) = filter.created_after {
        condition("created_at > ?", millis(t));
    }
    if !filter.sources.is_empty() {
        // A SEP key never begins with U+001F; the keys of every other source begin with its
        // prefix (U+001F, its name, `:`).
        let mut any = Vec::with_capacity(filter.sources.len());
        for source in &filter.sources {
            let (prefix, operator) = match source.stored_prefix() {
                // The SEP's keys: every key that does not begin with U+001F.
                sep if sep.is_empty() => (DERIVED.to_string(), "<>"),
                prefix => (prefix, "="),
            };
            let length = prefix.chars().count();
            params.push(SqlParam::Text(prefix));
            any.push(format!(
                "substr(key, 1, {length}) {operator} {}",
                placeholder(params.len())
            ));
        }
        conditions.push(format!("({})", any.join(" OR ")));
    }
    let mut text = select.to_owned();
    if !conditions.is_empty() {
        text.push_str(" WHERE ");
        text.push_str(&conditions.join(" AND "));
    }
    params.push(SqlParam::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
    text.push_str(" ORDER BY expires_at DESC LIMIT ");
    text.push_str(&placeholder(params.len()));
    (text, params)
}
