//! A record as a Redis hash: its fields, and decoding them with every corruption check (the
//! scripts write them).

use crate::fingerprint::Fingerprint;
use crate::record::{
    CorruptRecord, FencingToken, Outcome, Record, RecordId, RecordState, TraceLink,
};
use crate::time::Timestamp;

/// The fields of a record hash, in the order the scripts and `get` return them.
pub(super) const FIELDS: [&str; 10] = [
    "fp", "tool", "owner", "lease", "kind", "body", "done", "created", "expires", "trace",
];

/// Rebuilds a record from its hash fields, in [`FIELDS`] order. `None` if the record does not
/// exist (no field at all).
pub(super) fn decode(
    id: &RecordId,
    fields: Vec<Option<Vec<u8>>>,
) -> Result<Option<Record>, CorruptRecord> {
    if fields.iter().all(Option::is_none) {
        return Ok(None);
    }
    let corrupt = |what: &str| CorruptRecord(format!("{what} of Redis record {:?}", id.key));
    let Ok([fp, tool, owner, lease, kind, body, done, created, expires, trace]) =
        <[Option<Vec<u8>>; FIELDS.len()]>::try_from(fields)
    else {
        return Err(corrupt("field count"));
    };
    let text = |field: Option<Vec<u8>>, name: &str| -> Result<String, CorruptRecord> {
        let bytes = field.ok_or_else(|| corrupt(&format!("missing {name}")))?;
        String::from_utf8(bytes).map_err(|_| corrupt(&format!("non-UTF-8 {name}")))
    };
    let number = |field: Option<Vec<u8>>, name: &str| -> Result<u64, CorruptRecord> {
        text(field, name)?
            .parse()
            .map_err(|_| corrupt(&format!("malformed {name}")))
    };
    let time = |field: Option<Vec<u8>>, name: &str| number(field, name).map(Timestamp::from_millis);
    let fingerprint = fp
        .as_deref()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .map(Fingerprint::from_bytes)
        .ok_or_else(|| corrupt("fingerprint"))?;
    let state = match (owner, kind) {
        (owner @ Some(_), None) => RecordState::InProgress {
            owner: FencingToken::from_u64(number(owner, "owner")?),
            lease_expires_at: time(lease, "lease")?,
        },
        (None, kind @ Some(_)) => RecordState::Completed {
            outcome: Outcome::from_parts(text(kind, "kind")?.parse()?, text(body, "body")?)?,
            completed_at: time(done, "completion time")?,
        },
        _ => return Err(corrupt("state fields")),
    };
    let created_at = time(created, "creation time")?;
    let trace = trace.and_then(|bytes| String::from_utf8(bytes).ok());
    Ok(Some(Record {
        id: id.clone(),
        fingerprint,
        tool_name: text(tool, "tool")?,
        state,
        created_at,
        expires_at: time(expires, "expiry")?,
        trace: TraceLink::from_stored(trace.as_deref(), created_at),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::IdempotencyKey;
    use crate::record::Scope;

    fn id(namespace: &str, principal: &str, key: &str) -> RecordId {
        RecordId {
            scope: Scope::new(namespace, principal),
            key: IdempotencyKey::new(key, 255).unwrap(),
        }
    }

    #[test]
    fn records_decode_and_corruption_is_reported() {
        let id = id("ns", "p", "k");
        let field = |s: &str| Some(s.as_bytes().to_vec());
        let mut fields = vec![
            Some(vec![7; 32]),
            field("charge"),
            None,
            None,
            field("not_retained"),
            field("12"),
            field("5"),
            field("1"),
            field("9"),
            None,
        ];
        let record = decode(&id, fields.clone()).unwrap().unwrap();
        assert_eq!(
            record.state,
            RecordState::Completed {
                outcome: Outcome::NotRetained { size: 12 },
                completed_at: Timestamp::from_millis(5)
            }
        );
        assert_eq!(decode(&id, vec![None; 10]).unwrap(), None);
        fields[2] = field("3");
        assert!(decode(&id, fields.clone()).is_err(), "owner and outcome");
        fields[2] = None;
        fields[0] = Some(vec![7; 31]);
        assert!(decode(&id, fields.clone()).is_err(), "short fingerprint");
        fields[0] = Some(vec![7; 32]);
        fields[8] = field("soon");
        assert!(decode(&id, fields.clone()).is_err(), "malformed expiry");
    }
}
