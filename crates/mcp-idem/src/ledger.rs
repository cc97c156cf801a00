//! The demo server's ledger: one JSON line per executed charge.
//!
//! `mcp-idem demo-server` appends a [`Charge`] to the ledger every time `charge_payment` runs,
//! so counting lines counts executions: a call that the idempotency layer replays must not add a
//! line. Several server processes may share one file. Each line goes to the kernel in a single
//! `write(2)` on a descriptor opened with `O_APPEND`, so lines from concurrent writers never
//! interleave, and a line written before the tool answered survives a SIGKILL of the server (it
//! is in the page cache; the file is not fsynced, so a power loss may still lose it).
//!
//! A line cut short by a crash has no trailing newline; [`read`] ignores it, because the charge
//! it describes never completed.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::Number;

/// The environment variable that names the ledger when `--ledger` is not given.
pub(crate) const LEDGER_ENV: &str = "MCP_IDEM_LEDGER";

/// The file name of the default ledger, in the system temporary directory.
pub(crate) const DEFAULT_FILE_NAME: &str = "mcp-idem-demo-ledger.jsonl";

/// The ledger used when no path is given: `$MCP_IDEM_LEDGER` if set and not empty, else
/// [`DEFAULT_FILE_NAME`] in the system temporary directory.
pub(crate) fn default_path() -> PathBuf {
    match std::env::var_os(LEDGER_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => std::env::temp_dir().join(DEFAULT_FILE_NAME),
    }
}

/// One executed charge: a line of the ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Charge {
    /// `ch_` followed by 32 random hex digits: unique across processes and restarts.
    pub(crate) charge_id: String,
    /// The amount as the client sent it (as a `serde_json::Number`: integers keep every digit,
    /// decimals keep their shortest `f64` form).
    pub(crate) amount: Number,
    pub(crate) currency: String,
    /// The caller's identifier of the order this charge pays (`charge_payment`'s optional
    /// `order_id`), as given; left out of the line when the call had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) order_id: Option<String>,
    /// The server process that executed the charge.
    pub(crate) pid: u32,
    /// When the charge was executed, in milliseconds since the Unix epoch.
    pub(crate) unix_ms: u64,
}

impl Charge {
    /// A new charge with a fresh id, stamped with this process and the current time, for the
    /// order `order_id` if the caller named one.
    pub(crate) fn new(amount: Number, currency: String, order_id: Option<String>) -> Self {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| {
                u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
            });
        Self {
            charge_id: new_charge_id(),
            amount,
            currency,
            order_id,
            pid: std::process::id(),
            unix_ms,
        }
    }
}

/// `ch_` + 128 random bits in hex.
fn new_charge_id() -> String {
    format!("ch_{:032x}", rand::random::<u128>())
}

/// An open ledger file, shared by the tasks of one server process.
#[derive(Debug)]
pub(crate) struct Ledger {
    path: PathBuf,
    file: File,
}

impl Ledger {
    /// Opens `path` for appending, creating it if needed.
    pub(crate) fn open(path: &Path) -> anyhow::Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open the ledger {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one line. When this returns `Ok`, the line is in the kernel: it survives the death
    /// of this process.
    pub(crate) fn append(&self, charge: &Charge) -> io::Result<()> {
        let mut line = serde_json::to_vec(charge)?;
        line.push(b'\n');
        // `File` is unbuffered and `&File` is `Write`: one `write(2)` per line on an `O_APPEND`
        // descriptor, so concurrent appenders (tasks or processes) cannot interleave.
        (&self.file).write_all(&line)
    }
}

/// Reads every completed charge in the ledger at `path`, oldest first. A missing file is an
/// empty ledger.
pub(crate) fn read(path: &Path) -> anyhow::Result<Vec<Charge>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => {
            return Err(err).with_context(|| format!("cannot read the ledger {}", path.display()))
        }
    };
    // A last line without its newline was cut short by a crash: that write never completed.
    let complete = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    complete
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            serde_json::from_str(line).with_context(|| {
                format!(
                    "line {} of the ledger {} is not a charge",
                    index + 1,
                    path.display()
                )
            })
        })
        .collect()
}

/// What `get_balance` reports: the number of charges and the sum per currency.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Balance {
    pub(crate) charges: usize,
    /// Sum of the amounts per currency, in currency order.
    pub(crate) sums: BTreeMap<String, Number>,
}

/// Sums `charges` per currency, exactly for decimal amounts (see [`DecimalSum`]).
pub(crate) fn balance(charges: &[Charge]) -> Balance {
    let mut sums = BTreeMap::<&str, DecimalSum>::new();
    for charge in charges {
        sums.entry(&charge.currency)
            .or_default()
            .add(&charge.amount);
    }
    Balance {
        charges: charges.len(),
        sums: sums
            .into_iter()
            .map(|(currency, sum)| (currency.to_owned(), sum.to_number()))
            .collect(),
    }
}

/// A running sum of JSON numbers, exact as long as it fits `i128` at a common scale, so that
/// `0.1 + 0.2` reports `0.3`. Falls back to `f64` arithmetic otherwise.
#[derive(Debug, Clone)]
enum DecimalSum {
    /// `units / 10^scale`.
    Exact {
        units: i128,
        scale: u32,
    },
    Float(f64),
}

impl Default for DecimalSum {
    fn default() -> Self {
        Self::Exact { units: 0, scale: 0 }
    }
}

impl DecimalSum {
    fn add(&mut self, amount: &Number) {
        let exact = match (&*self, parse_decimal(&amount.to_string())) {
            (&Self::Exact { units, scale }, Some((other, other_scale))) => {
                let common = scale.max(other_scale);
                rescale(units, scale, common)
                    .zip(rescale(other, other_scale, common))
                    .and_then(|(left, right)| left.checked_add(right))
                    .map(|units| Self::Exact {
                        units,
                        scale: common,
                    })
            }
            _ => None,
        };
        *self = match exact {
            Some(sum) => sum,
            None => Self::Float(self.to_f64() + amount.as_f64().unwrap_or(f64::NAN)),
        };
    }

    fn to_f64(&self) -> f64 {
        match *self {
            // Only used once exactness is lost anyway.
            Self::Exact { units, scale } => units as f64 / 10f64.powi(scale as i32),
            Self::Float(value) => value,
        }
    }

    fn to_number(&self) -> Number {
        match *self {
            Self::Exact { units, scale } => {
                let digits = units.unsigned_abs().to_string();
                let sign = if units < 0 { "-" } else { "" };
                let scale = scale as usize;
                let text = if scale == 0 {
                    format!("{sign}{digits}")
                } else {
                    let padded = format!("{digits:0>width$}", width = scale + 1);
                    let (int, frac) = padded.split_at(padded.len() - scale);
                    let frac = frac.trim_end_matches('0');
                    if frac.is_empty() {
                        format!("{sign}{int}")
                    } else {
                        format!("{sign}{int}.{frac}")
                    }
                };
                text.parse().unwrap_or_else(|_| {
                    Number::from_f64(self.to_f64()).unwrap_or_else(|| Number::from(0))
                })
            }
            Self::Float(value) => Number::from_f64(value).unwrap_or_else(|| Number::from(0)),
        }
    }
}

/// `units * 10^(to - from)`, `None` on overflow.
fn rescale(units: i128, from: u32, to: u32) -> Option<i128> {
    10i128
        .checked_pow(to - from)
        .and_then(|factor| units.checked_mul(factor))
}

/// Parses JSON number text into `(units, scale)` with value `units / 10^scale`; `None` if it
/// does not fit.
fn parse_decimal(text: &str) -> Option<(i128, u32)> {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].parse::<i32>().ok()?),
        None => (text, 0),
    };
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, mantissa),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let mut units: i128 = digits.parse().ok()?;
    let mut scale = i64::try_from(frac.len()).ok()? - i64::from(exponent);
    if scale < 0 {
        units = units.checked_mul(10i128.checked_pow(u32::try_from(-scale).ok()?)?)?;
        scale = 0;
    }
    let scale = u32::try_from(scale).ok().filter(|scale| *scale <= 38)?;
    Some((if negative { -units } else { units }, scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(amount: &str, currency: &str) -> Charge {
        Charge::new(amount.parse().unwrap(), currency.to_owned(), None)
    }

    #[test]
    fn appended_lines_read_back_and_a_torn_last_line_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.jsonl");
        assert!(read(&path).unwrap().is_empty(), "a missing ledger is empty");
        let ledger = Ledger::open(&path).unwrap();
        let first = charge("100", "EUR");
        let second = charge("12.5", "USD");
        ledger.append(&first).unwrap();
        ledger.append(&second).unwrap();
        assert_eq!(read(&path).unwrap(), vec![first.clone(), second.clone()]);

        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(br#"{"chargeId":"ch_torn","amou"#)
            .unwrap();
        assert_eq!(read(&path).unwrap(), vec![first, second]);
    }

    #[test]
    fn an_order_id_is_written_only_when_the_call_named_one() {
        let plain: serde_json::Value = serde_json::to_value(charge("1", "EUR")).unwrap();
        assert!(plain.get("orderId").is_none(), "{plain}");
        let ordered = Charge::new(1.into(), "EUR".into(), Some("ord_1".into()));
        let line = serde_json::to_value(&ordered).unwrap();
        assert_eq!(line["orderId"], "ord_1");
        let back: Charge = serde_json::from_value(line).unwrap();
        assert_eq!(back, ordered);
    }

    #[test]
    fn charge_ids_are_distinct() {
        let ids: std::collections::HashSet<_> =
            (0..1000).map(|_| charge("1", "EUR").charge_id).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.iter().all(|id| id.starts_with("ch_") && id.len() == 35));
    }

    #[test]
    fn balance_sums_decimals_exactly_per_currency() {
        let charges = [
            charge("0.1", "EUR"),
            charge("0.2", "EUR"),
            charge("100", "USD"),
            charge("1e2", "USD"),
            charge("-0.5", "EUR"),
        ];
        let balance = balance(&charges);
        assert_eq!(balance.charges, 5);
        assert_eq!(balance.sums["EUR"].to_string(), "-0.2");
        assert_eq!(balance.sums["USD"].to_string(), "200");
    }

    #[test]
    fn huge_amounts_fall_back_to_floats() {
        let charges = [charge("1e300", "EUR"), charge("1", "EUR")];
        assert_eq!(balance(&charges).sums["EUR"].as_f64(), Some(1e300));
    }

    #[test]
    fn decimal_text_parses_to_units_and_scale() {
        assert_eq!(parse_decimal("12.50"), Some((1250, 2)));
        assert_eq!(parse_decimal("-3"), Some((-3, 0)));
        assert_eq!(parse_decimal("1.5e3"), Some((1500, 0)));
        assert_eq!(parse_decimal("25e-1"), Some((25, 1)));
        assert_eq!(parse_decimal("1e300"), None);
    }
}
