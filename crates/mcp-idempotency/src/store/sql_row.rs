//! The row codec of the SQL stores (SQLite and PostgreSQL): which columns hold a record, how a
//! record's values are written to them, and how a row is read back, with every check that makes a
//! row corrupt. A record is never altered on the way: a value the codec cannot return as it was
//! stored (a negative time, a missing column, a fingerprint of the wrong length, an unknown outcome
//! kind, an owner and an outcome at once) is reported as [`CorruptRecord`].
//!
//! Both stores keep the same columns with the same meaning:
//!
//! | column | holds |
//! | --- | --- |
//! | `fingerprint` | the 32 fingerprint bytes |
//! | `tool_name` | the tool's name |
//! | `owner`, `lease_expires_at` | the fencing token (the `u64` bit for bit as a signed integer) and lease deadline, while in progress; `NULL` once completed |
//! | `outcome_kind`, `outcome_body`, `completed_at` | the outcome, byte for byte, once completed; `NULL` while in progress |
//! | `created_at`, `expires_at` | the caller's milliseconds since the epoch, never a database clock |
//! | `trace` | the claiming call's trace ([`TraceLink::stored`]), or `NULL`; a value that cannot be read is ignored, never corrupt |

use crate::fingerprint::Fingerprint;
use crate::key::IdempotencyKey;
use crate::record::{
    CorruptRecord, FencingToken, Outcome, Record, RecordId, RecordState, Scope, TraceLink,
};
use crate::store::ClaimRequest;
use crate::time::Timestamp;

/// The columns of a record, in the order [`decode`] reads them (a macro, so that SQLite's
/// statements can be `concat!`ed at compile time).
macro_rules! record_columns {
    () => {
        "fingerprint, tool_name, owner, lease_expires_at, outcome_kind, outcome_body, \
         completed_at, created_at, expires_at, trace"
    };
}
#[cfg(feature = "sqlite")]
pub(crate) use record_columns;

/// [`record_columns!`] as a constant.
pub(crate) const RECORD_COLUMNS: &str = record_columns!();

/// `SELECT` of the record id's columns and then [`RECORD_COLUMNS`] from `table`: what
/// [`decode_listed`] reads.
pub(crate) fn listed_select(table: &str) -> String {
    format!("SELECT namespace, principal, key, {RECORD_COLUMNS} FROM {table}")
}

/// One row as the SQL driver returns it: column `i` as a value of the asked type, `Ok(None)` for
/// SQL `NULL`, and `Err` (the driver's reason) when the column holds another type.
pub(crate) trait SqlRow {
    fn blob(&self, i: usize) -> Result<Option<Vec<u8>>, String>;
    fn text(&self, i: usize) -> Result<Option<String>, String>;
    fn integer(&self, i: usize) -> Result<Option<i64>, String>;
}

/// Times are stored as signed milliseconds; instants past year 292 million are clamped (no
/// deadline or retention comes near it).
pub(crate) fn sql_time(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

/// Fencing tokens are `u64`, stored as signed 64-bit integers bit for bit.
pub(crate) fn sql_token(token: FencingToken) -> i64 {
    i64::from_ne_bytes(token.as_u64().to_ne_bytes())
}

/// The token [`sql_token`] stored.
fn token_from_sql(owner: i64) -> FencingToken {
    FencingToken::from_u64(u64::from_ne_bytes(owner.to_ne_bytes()))
}

/// The values of the columns a claim writes, in the order of parameters 1 to 9 of both stores'
/// claim statements: namespace, principal, key, fingerprint, tool name, owner, lease deadline,
/// `now` (the creation time) and expiry; and the trace, parameter 10.
pub(crate) struct ClaimColumns<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) principal: &'a str,
    pub(crate) key: &'a str,
    pub(crate) fingerprint: &'a [u8],
    pub(crate) tool_name: &'a str,
    pub(crate) owner: i64,
    pub(crate) lease_expires_at: i64,
    pub(crate) now: i64,
    pub(crate) expires_at: i64,
    pub(crate) trace: Option<String>,
}

impl<'a> ClaimColumns<'a> {
    pub(crate) fn of(req: &'a ClaimRequest) -> Self {
        Self {
            namespace: req.id.scope.namespace(),
            principal: req.id.scope.principal(),
            key: req.id.key.as_str(),
            fingerprint: &req.fingerprint.as_bytes()[..],
            tool_name: &req.tool_name,
            owner: sql_token(req.owner),
            lease_expires_at: sql_time(req.lease_expires_at),
            now: sql_time(req.now),
            expires_at: sql_time(req.expires_at),
            trace: req.trace.map(|trace| trace.stored(req.now)),
        }
    }
}

/// The id a listed row's first three columns (namespace, principal, key) hold.
fn stored_id(row: &impl SqlRow) -> Result<RecordId, CorruptRecord> {
    let part = |i: usize, name: &str| -> Result<String, CorruptRecord> {
        match row.text(i) {
            Ok(Some(text)) => Ok(text),
            Ok(None) => Err(CorruptRecord(format!("missing {name} of a listed record"))),
            Err(why) => Err(CorruptRecord(format!(
                "unreadable {name} of a listed record: {why}"
            ))),
        }
    };
    let key = part(2, "key")?;
    let key = IdempotencyKey::from_stored(&key)
        .map_err(|err| CorruptRecord(format!("stored key {key:?}: {err}")))?;
    Ok(RecordId {
        scope: Scope::new(part(0, "namespace")?, part(1, "principal")?),
        key,
    })
}

/// Reads a record from a row of [`listed_select`]: its id, then [`RECORD_COLUMNS`].
pub(crate) fn decode_listed(row: &impl SqlRow) -> Result<Record, CorruptRecord> {
    let id = stored_id(row)?;
    decode(&id, row, 3)
}

/// Reads the record `id` from `row`'s columns `at..at + 10` ([`RECORD_COLUMNS`]).
pub(crate) fn decode(id: &RecordId, row: &impl SqlRow, at: usize) -> Result<Record, CorruptRecord> {
    let corrupt = |what: &str| CorruptRecord(format!("{what} of {:?}", id.key));
    let unreadable = |name: &str, why: String| corrupt(&format!("unreadable {name} ({why})"));
    let missing = |name: &str| corrupt(&format!("missing {name}"));
    let text = |i: usize, name: &str| row.text(at + i).map_err(|why| unreadable(name, why));
    let int = |i: usize, name: &str| row.integer(at + i).map_err(|why| unreadable(name, why));
    let time = |i: usize, name: &str| -> Result<Timestamp, CorruptRecord> {
        let millis = int(i, name)?.ok_or_else(|| missing(name))?;
        u64::try_from(millis)
            .map(Timestamp::from_millis)
            .map_err(|_| corrupt(&format!("negative {name} {millis}")))
    };

    let fingerprint: [u8; 32] = row
        .blob(at)
        .map_err(|why| unreadable("fingerprint", why))?
        .ok_or_else(|| missing("fingerprint"))?
        .try_into()
        .map_err(|bytes: Vec<u8>| corrupt(&format!("fingerprint of {} bytes", bytes.len())))?;
    let state = match (int(2, "owner")?, text(4, "outcome kind")?) {
        (Some(owner), None) => RecordState::InProgress {
            owner: token_from_sql(owner),
            lease_expires_at: time(3, "lease deadline")?,
        },
        (None, Some(kind)) => RecordState::Completed {
            outcome: Outcome::from_parts(
                kind.parse()?,
                text(5, "outcome body")?.ok_or_else(|| missing("outcome body"))?,
            )?,
            completed_at: time(6, "completion time")?,
        },
        (Some(_), Some(_)) => return Err(corrupt("both an owner and an outcome")),
        (None, None) => return Err(corrupt("neither an owner nor an outcome")),
    };
    let created_at = time(7, "creation time")?;
    Ok(Record {
        id: id.clone(),
        fingerprint: Fingerprint::from_bytes(fingerprint),
        tool_name: text(1, "tool name")?.ok_or_else(|| missing("tool name"))?,
        state,
        created_at,
        expires_at: time(8, "expiry")?,
        trace: TraceLink::from_stored(row.text(at + 9).ok().flatten().as_deref(), created_at),
    })
}

#[cfg(feature = "sqlite")]
impl SqlRow for rusqlite::Row<'_> {
    fn blob(&self, i: usize) -> Result<Option<Vec<u8>>, String> {
        self.get(i).map_err(|err| err.to_string())
    }

    fn text(&self, i: usize) -> Result<Option<String>, String> {
        self.get(i).map_err(|err| err.to_string())
    }

    fn integer(&self, i: usize) -> Result<Option<i64>, String> {
        self.get(i).map_err(|err| err.to_string())
    }
}

#[cfg(feature = "postgres")]
impl SqlRow for tokio_postgres::Row {
    fn blob(&self, i: usize) -> Result<Option<Vec<u8>>, String> {
        self.try_get(i).map_err(|err| err.to_string())
    }

    fn text(&self, i: usize) -> Result<Option<String>, String> {
        self.try_get(i).map_err(|err| err.to_string())
    }

    fn integer(&self, i: usize) -> Result<Option<i64>, String> {
        self.try_get(i).map_err(|err| err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A column value, as a driver hands it over.
    #[derive(Clone, Debug)]
    enum Value {
        Null,
        Integer(i64),
        Text(&'static str),
        Blob(Vec<u8>),
    }

    /// A row of plain values: the codec on its own, without a driver.
    struct Values(Vec<Value>);

    impl Values {
        fn get<T>(
            &self,
            i: usize,
            pick: impl FnOnce(&Value) -> Option<T>,
        ) -> Result<Option<T>, String> {
            match self.0.get(i) {
                None => Err(format!("no column {i}")),
                Some(Value::Null) => Ok(None),
                Some(value) => pick(value)
                    .map(Some)
                    .ok_or_else(|| format!("column {i} holds {value:?}")),
            }
        }
    }

    impl SqlRow for Values {
        fn blob(&self, i: usize) -> Result<Option<Vec<u8>>, String> {
            self.get(i, |v| match v {
                Value::Blob(bytes) => Some(bytes.clone()),
                _ => None,
            })
        }

        fn text(&self, i: usize) -> Result<Option<String>, String> {
            self.get(i, |v| match v {
                Value::Text(text) => Some((*text).to_owned()),
                _ => None,
            })
        }

        fn integer(&self, i: usize) -> Result<Option<i64>, String> {
            self.get(i, |v| match v {
                Value::Integer(n) => Some(*n),
                _ => None,
            })
        }
    }

    fn id() -> RecordId {
        RecordId {
            scope: Scope::new("ns", "p"),
            key: IdempotencyKey::new("k", 255).unwrap(),
        }
    }

    /// A completed record's columns: fingerprint, tool, owner, lease, kind, body, done, created,
    /// expires.
    fn completed() -> Vec<Value> {
        use Value::*;
        vec![
            Blob(vec![7; 32]),
            Text("charge"),
            Null,
            Null,
            Text("success"),
            Text(r#"{"content":[]}"#),
            Integer(5),
            Integer(1),
            Integer(9),
        ]
    }

    /// An in-progress record's columns.
    fn in_progress() -> Vec<Value> {
        let mut columns = completed();
        columns[2] = Value::Integer(-1);
        columns[3] = Value::Integer(4);
        columns[4] = Value::Null;
        columns[5] = Value::Null;
        columns[6] = Value::Null;
        columns
    }

    fn decoded(columns: Vec<Value>) -> Result<Record, CorruptRecord> {
        decode(&id(), &Values(columns), 0)
    }

    #[test]
    fn decodes_what_the_stores_write() {
        let record = decoded(completed()).unwrap();
        assert_eq!(record.id, id());
        assert_eq!(record.fingerprint, Fingerprint::from_bytes([7; 32]));
        assert_eq!(record.tool_name, "charge");
        assert_eq!(
            record.state,
            RecordState::Completed {
                outcome: Outcome::Success(r#"{"content":[]}"#.into()),
                completed_at: Timestamp::from_millis(5),
            }
        );
        assert_eq!(record.created_at, Timestamp::from_millis(1));
        assert_eq!(record.expires_at, Timestamp::from_millis(9));

        // A token above i64::MAX is stored negative and comes back bit for bit.
        let record = decoded(in_progress()).unwrap();
        assert_eq!(
            record.state,
            RecordState::InProgress {
                owner: FencingToken::from_u64(u64::MAX),
                lease_expires_at: Timestamp::from_millis(4),
            }
        );
        for token in [0, 1, i64::MAX as u64, 1 << 63, u64::MAX] {
            let token = FencingToken::from_u64(token);
            assert_eq!(token_from_sql(sql_token(token)), token);
        }
    }

    #[test]
    fn a_negative_time_is_corrupt_not_clamped() {
        for (column, name) in [(3, "lease deadline"), (7, "creation time"), (8, "expiry")] {
            let mut columns = in_progress();
            columns[column] = Value::Integer(-5);
            let err = decoded(columns).unwrap_err();
            assert!(err.0.contains(&format!("negative {name} -5")), "{err}");
        }
        let mut columns = completed();
        columns[6] = Value::Integer(i64::MIN);
        let err = decoded(columns).unwrap_err();
        assert!(err.0.contains("negative completion time"), "{err}");
    }

    #[test]
    fn every_other_corruption_is_reported() {
        use Value::*;
        /// Starting from these columns, set this one to this value: the error names this.
        type Case = (fn() -> Vec<Value>, usize, Value, &'static str);
        let cases: Vec<Case> = vec![
            (completed, 0, Null, "missing fingerprint"),
            (completed, 0, Blob(vec![7; 31]), "fingerprint of 31 bytes"),
            (completed, 0, Text("fp"), "unreadable fingerprint"),
            (completed, 1, Null, "missing tool name"),
            (completed, 1, Integer(3), "unreadable tool name"),
            (completed, 2, Integer(3), "both an owner and an outcome"),
            (completed, 2, Text("3"), "unreadable owner"),
            (completed, 4, Null, "neither an owner nor an outcome"),
            (completed, 4, Text("bogus"), "bogus"),
            (completed, 5, Null, "missing outcome body"),
            (completed, 6, Null, "missing completion time"),
            (completed, 7, Text("1"), "unreadable creation time"),
            (completed, 8, Null, "missing expiry"),
            (in_progress, 3, Null, "missing lease deadline"),
        ];
        for (columns, column, value, needle) in cases {
            let mut columns = columns();
            columns[column] = value.clone();
            let err = decoded(columns).unwrap_err();
            assert!(err.0.contains(needle), "column {column} = {value:?}: {err}");
        }
        // A not-retained outcome's body is its size.
        let mut columns = completed();
        columns[4] = Text("not_retained");
        columns[5] = Text("twelve");
        assert!(decoded(columns).is_err());
        // Too few columns.
        let mut columns = completed();
        columns.truncate(8);
        assert!(decoded(columns).is_err());
    }

    #[test]
    fn listed_rows_carry_their_id() {
        use Value::*;
        let mut columns = vec![Text("ns"), Text("p"), Text("k")];
        columns.extend(completed());
        assert_eq!(decode_listed(&Values(columns.clone())).unwrap().id, id());
        columns[2] = Text("");
        let err = decode_listed(&Values(columns.clone())).unwrap_err();
        assert!(err.0.contains("stored key"), "{err}");
        columns[2] = Null;
        let err = decode_listed(&Values(columns)).unwrap_err();
        assert!(err.0.contains("missing key"), "{err}");
    }

    /// The same checks through a real SQLite row, whose columns hold whatever was written.
    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_rows_go_through_the_same_checks() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let read = |values: &str| -> Result<Record, CorruptRecord> {
            let sql = format!("WITH r({RECORD_COLUMNS}) AS (SELECT {values}) SELECT * FROM r");
            conn.query_row(&sql, [], |row| Ok(decode(&id(), row, 0)))
                .unwrap()
        };
        let good = "zeroblob(32), 'charge', 9, 4, NULL, NULL, NULL, 1, 9, NULL";
        assert!(read(good).is_ok());
        let err = read("zeroblob(32), 'charge', 9, 4, NULL, NULL, NULL, -1, 9, NULL").unwrap_err();
        assert!(err.0.contains("negative creation time -1"), "{err}");
        let err = read("zeroblob(32), 'charge', 9, '4', NULL, NULL, NULL, 1, 9, NULL").unwrap_err();
        assert!(err.0.contains("unreadable lease deadline"), "{err}");
        let err = read("zeroblob(32), 'charge', 9.5, 4, NULL, NULL, NULL, 1, 9, NULL").unwrap_err();
        assert!(err.0.contains("unreadable owner"), "{err}");
        let err = read("zeroblob(31), 'charge', 9, 4, NULL, NULL, NULL, 1, 9, NULL").unwrap_err();
        assert!(err.0.contains("fingerprint of 31 bytes"), "{err}");
        // A trace is read back when it is its record's; anything else there is ignored, never
        // corrupt (telemetry never makes a record unreadable).
        let traced = "zeroblob(32), 'charge', 9, 4, NULL, NULL, NULL, 1, 9, \
            '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 1'";
        let trace = read(traced).unwrap().trace.expect("the record's trace");
        assert_eq!(trace.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        for other in [
            "'00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 2'",
            "'junk'",
            "7",
        ] {
            let row = format!("zeroblob(32), 'charge', 9, 4, NULL, NULL, NULL, 1, 9, {other}");
            assert_eq!(read(&row).unwrap().trace, None, "{other}");
        }
    }
}
