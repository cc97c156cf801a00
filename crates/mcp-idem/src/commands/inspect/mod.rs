//! `mcp-idem inspect`: list, show, count, purge and delete the records of a store.
//!
//! The store does the filtering ([`Store::list`]); this module turns arguments into a
//! [`ListFilter`], asks before deleting, and prints tables or JSON ([`render`]).

mod render;

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, FromArgMatches, Subcommand, ValueEnum};
use mcp_idempotency::store::{self, ListFilter, StateFilter, Store, StoreUrl};
use mcp_idempotency::{KeySource, Record, RecordState, Timestamp};

use super::engine_args::store_url;

/// Exit status when no record matched, or a deletion was declined.
const EXIT_NOTHING: u8 = 1;

/// Most candidates `show` and `delete` name when a key exists in several scopes.
const MAX_CANDIDATES: usize = 20;

#[derive(Debug, Args)]
#[command(after_help = "\
Times are UTC (RFC 3339). --json prints one JSON document on stdout; its fields are described in \
docs/inspect.md.

Exit status:
  0  done
  1  no record matched (show, delete), or the deletion was declined
  2  error: the store cannot be opened, a usage error, an ambiguous key")]
pub(crate) struct InspectArgs {
    /// Record store: `sqlite:PATH`, `redis://…`, `redis-cluster://…` (TLS: `rediss://…`,
    /// `rediss-cluster://…`) or `postgres://…` [default:
    /// the SQLite file that
    /// `wrap` uses by default, e.g. ~/.local/share/mcp-idem/records.sqlite3].
    #[arg(long, env = "MCP_IDEM_STORE", value_name = "URL", global = true)]
    store: Option<String>,

    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,

    /// What to do; without one, `list` with its defaults.
    #[command(subcommand)]
    command: Option<InspectCommand>,
}

#[derive(Debug, Subcommand)]
enum InspectCommand {
    /// List records, latest expiry first (expired ones too, until purged). The default: `inspect`
    /// without a subcommand lists, as `inspect list` does.
    List(ListArgs),
    /// Show one record: its state, fingerprint, owner and lease, times, and stored outcome.
    Show(RecordArgs),
    /// Count records by state.
    Stats,
    /// Delete every record whose retention window has ended.
    Purge,
    /// Delete one record, whatever its state, so that a retry with its key runs the call again.
    ///
    /// Asks for confirmation on a terminal; without one, --yes is required.
    Delete(DeleteArgs),
}

#[derive(Debug, Args)]
struct ListArgs {
    #[command(flatten)]
    scope: ScopeFilter,

    /// Only this key, as `inspect` shows it (without a source's prefix); of any source unless
    /// `--source` says which.
    #[arg(long)]
    key: Option<String>,

    /// Only the record whose key has this digest (32 hex digits), as spans carry it
    /// (`mcp_idem.key.digest`) and `show` prints it. Looks through at most the 100,000 records
    /// the other options select.
    #[arg(long, value_name = "HEX")]
    key_digest: Option<String>,

    /// Only records claimed by a call of this trace (32 hex digits), as `show` prints it.
    /// Looks through at most the 100,000 records the other options select.
    #[arg(long, value_name = "HEX")]
    trace_id: Option<String>,

    #[command(flatten)]
    sources: SourceFilter,

    /// Only records in this state.
    #[arg(long, value_enum)]
    state: Option<StateArg>,

    /// Only records created at least this long ago, e.g. 1h, 30m, 2days.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,

    /// Only records created less than this long ago.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    newer_than: Option<Duration>,

    /// Most records to print.
    #[arg(long, value_name = "N", default_value_t = 50)]
    limit: usize,
}

impl ListArgs {
    /// `list` without options, with the defaults its options declare.
    fn defaults() -> Result<Self, clap::Error> {
        let command = Self::augment_args(clap::Command::new("list"));
        Self::from_arg_matches(&command.try_get_matches_from(["list"])?)
    }
}

/// The scope options of `list`, `show` and `delete`.
#[derive(Debug, Args)]
struct ScopeFilter {
    /// Only records of this namespace (`wrap` derives one from the server's command line, `proxy`
    /// from the upstream URL, unless given `--namespace`).
    #[arg(long)]
    namespace: Option<String>,

    /// Only records of this principal, as stored (with `--scope-by bearer`: the token's hash).
    #[arg(long)]
    principal: Option<String>,
}

/// The key-source option of `list`, `show` and `delete`.
#[derive(Debug, Args)]
struct SourceFilter {
    /// Only records whose key came from this source: `key-from`, `sep`, `meta`, `argument` or
    /// `window` (repeat it, or separate with commas, for several).
    #[arg(long = "source", value_name = "SOURCE", value_delimiter = ',', value_parser = parse_source)]
    sources: Vec<KeySource>,
}

fn parse_source(text: &str) -> Result<KeySource, String> {
    text.parse()
}

#[derive(Debug, Args)]
struct RecordArgs {
    /// The record's idempotency key, as `inspect` shows it (without a source's prefix).
    key: String,

    /// Needed when the key exists in several scopes.
    #[command(flatten)]
    scope: ScopeFilter,

    /// Needed when the key names records of several sources.
    #[command(flatten)]
    sources: SourceFilter,
}

#[derive(Debug, Args)]
struct DeleteArgs {
    #[command(flatten)]
    record: RecordArgs,

    /// Delete without asking (required when stdin is not a terminal).
    #[arg(long, short = 'y')]
    yes: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum StateArg {
    /// Live and running (or its owner died and the lease has not been taken over).
    InProgress,
    /// Live, with a recorded outcome.
    Completed,
    /// Past its retention window, not purged yet.
    Expired,
}

impl From<StateArg> for StateFilter {
    fn from(state: StateArg) -> Self {
        match state {
            StateArg::InProgress => Self::InProgress,
            StateArg::Completed => Self::Completed,
            StateArg::Expired => Self::Expired,
        }
    }
}

impl InspectArgs {
    pub(crate) fn exec(self) -> anyhow::Result<ExitCode> {
        if let Some(InspectCommand::Delete(DeleteArgs { yes: false, .. })) = &self.command {
            if !std::io::stdin().is_terminal() {
                bail!("refusing to delete without --yes: stdin is not a terminal to confirm on");
            }
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        runtime.block_on(self.run())
    }

    async fn run(self) -> anyhow::Result<ExitCode> {
        let url = self.store_url()?;
        let store = open_existing(&url).await?;
        let now = Timestamp::now();
        let out = Output { json: self.json };
        let command = match self.command {
            Some(command) => command,
            None => InspectCommand::List(ListArgs::defaults()?),
        };
        match command {
            InspectCommand::List(args) => list(&*store, &args, now, out).await,
            InspectCommand::Show(args) => show(&*store, &args, now, out).await,
            InspectCommand::Stats => {
                let stats = store.stats(now).await.context("cannot count records")?;
                let running = store
                    .list(
                        &ListFilter {
                            state: Some(StateFilter::InProgress),
                            ..ListFilter::default()
                        },
                        now,
                        usize::MAX,
                    )
                    .await
                    .context("cannot list records in progress")?;
                let lease_expired = running.iter().filter(|r| lease_ran_out(r, now)).count();
                out.print(render::stats(&url, stats, lease_expired as u64, out.json))
            }
            InspectCommand::Purge => {
                let purged = store
                    .purge_expired(now)
                    .await
                    .context("cannot purge expired records")?;
                out.print(render::purged(purged, out.json))
            }
            InspectCommand::Delete(args) => delete(&*store, &args, now, out).await,
        }
    }

    fn store_url(&self) -> anyhow::Result<StoreUrl> {
        store_url(self.store.as_deref())
    }
}

/// Opens the store at `url`, refusing to create a SQLite file (a mistyped path would otherwise
/// show an empty store) and the in-memory store (it lives inside the process that uses it).
async fn open_existing(url: &StoreUrl) -> anyhow::Result<Arc<dyn Store>> {
    match url {
        StoreUrl::Memory => {
            bail!("the memory store lives inside the process that uses it and cannot be inspected")
        }
        StoreUrl::Sqlite(path) if !path.exists() => {
            bail!(
                "no record store at {}: the file does not exist",
                path.display()
            )
        }
        _ => {}
    }
    store::open(url)
        .await
        .with_context(|| format!("cannot open the record store {url}"))
}

/// Where results go: stdout, as text or JSON.
#[derive(Clone, Copy)]
struct Output {
    json: bool,
}

impl Output {
    fn print(self, text: String) -> anyhow::Result<ExitCode> {
        let mut stdout = std::io::stdout().lock();
        match stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
        {
            Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
                Err(err).context("cannot write to stdout")
            }
            _ => Ok(ExitCode::SUCCESS),
        }
    }
}

fn lease_ran_out(record: &Record, now: Timestamp) -> bool {
    matches!(record.state, RecordState::InProgress { lease_expires_at, .. } if lease_expires_at <= now)
}

fn ago(now: Timestamp, duration: Duration) -> Timestamp {
    let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    Timestamp::from_millis(now.as_millis().saturating_sub(millis))
}

/// The records matching `filter` whose key reads `key` as `inspect` shows it (any key when
/// `None`), latest expiry first, at most `limit`.
///
/// A key as shown names up to one record per source in a scope (a SEP key `k` and a `_meta` key
/// `k` are two records; [`KeySource::stored_key`] makes each one's stored key), so a key is looked
/// up once per source the filter allows, and the answers are merged.
async fn matching(
    store: &dyn Store,
    filter: ListFilter,
    key: Option<&str>,
    now: Timestamp,
    limit: usize,
) -> Result<Vec<Record>, store::StoreError> {
    let Some(key) = key else {
        return store.list(&filter, now, limit).await;
    };
    let sources = match filter.sources.as_slice() {
        [] => KeySource::ALL.to_vec(),
        chosen => chosen.to_vec(),
    };
    let mut records = Vec::new();
    for source in sources {
        let one = ListFilter {
            key: Some(source.stored_key(key)),
            sources: vec![source],
            ..filter.clone()
        };
        records.extend(store.list(&one, now, limit).await?);
    }
    records.sort_by_key(|record| std::cmp::Reverse(record.expires_at));
    records.truncate(limit);
    Ok(records)
}

/// Most records `list --key-digest` and `--trace-id` look through (no store indexes either).
const SEARCHED_RECORDS: usize = 100_000;

async fn list(
    store: &dyn Store,
    args: &ListArgs,
    now: Timestamp,
    out: Output,
) -> anyhow::Result<ExitCode> {
    let filter = ListFilter {
        namespace: args.scope.namespace.clone(),
        principal: args.scope.principal.clone(),
        key: None,
        sources: args.sources.sources.clone(),
        state: args.state.map(StateFilter::from),
        created_at_or_before: args.older_than.map(|d| ago(now, d)),
        created_after: args.newer_than.map(|d| ago(now, d)),
    };
    let digest = args.key_digest.as_deref().map(str::to_ascii_lowercase);
    let trace_id = args.trace_id.as_deref().map(str::to_ascii_lowercase);
    let searched = digest.is_some() || trace_id.is_some();
    // One more than asked for tells whether the list was cut short.
    let wanted = match searched {
        true => SEARCHED_RECORDS,
        false => args.limit.saturating_add(1),
    };
    let mut records = matching(store, filter, args.key.as_deref(), now, wanted)
        .await
        .context("cannot list records")?;
    if searched {
        records.retain(|record| {
            digest.as_ref().is_none_or(|d| record.id.key.digest() == *d)
                && trace_id
                    .as_ref()
                    .is_none_or(|t| record.trace.is_some_and(|trace| trace.trace_id_hex() == *t))
        });
    }
    let truncated = records.len() > args.limit;
    records.truncate(args.limit);
    if truncated && !out.json {
        eprintln!(
            "mcp-idem: showing the first {} matching records; raise --limit to see more",
            args.limit
        );
    }
    out.print(render::list(&records, truncated, now, out.json))
}

/// The one record with `args.key` in the given scope, or why there is none.
async fn find(
    store: &dyn Store,
    args: &RecordArgs,
    now: Timestamp,
) -> anyhow::Result<Option<Record>> {
    let filter = ListFilter {
        namespace: args.scope.namespace.clone(),
        principal: args.scope.principal.clone(),
        sources: args.sources.sources.clone(),
        ..ListFilter::default()
    };
    let mut found = matching(store, filter, Some(&args.key), now, MAX_CANDIDATES + 1)
        .await
        .context("cannot look the record up")?;
    if found.len() > 1 {
        let first = found[0].id.key.source();
        let sources_differ = found.iter().any(|r| r.id.key.source() != first);
        let mut choices = String::new();
        for record in found.iter().take(MAX_CANDIDATES) {
            choices.push_str(&format!(
                "\n  --namespace {} --principal {}",
                render::shell_word(record.id.scope.namespace()),
                render::shell_word(record.id.scope.principal())
            ));
            if sources_differ {
                choices.push_str(&format!(" --source {}", record.id.key.source()));
            }
        }
        if found.len() > MAX_CANDIDATES {
            choices.push_str("\n  …");
        }
        let several = if sources_differ {
            "names records of several scopes or key sources"
        } else {
            "exists in several scopes"
        };
        bail!("key {:?} {several}; pick one with:{choices}", args.key);
    }
    Ok(found.pop())
}

fn not_found(args: &RecordArgs) -> ExitCode {
    let mut scope = String::new();
    if let Some(namespace) = &args.scope.namespace {
        scope.push_str(&format!(" in namespace {namespace:?}"));
    }
    if let Some(principal) = &args.scope.principal {
        scope.push_str(&format!(" for principal {principal:?}"));
    }
    if !args.sources.sources.is_empty() {
        let sources: Vec<&str> = args.sources.sources.iter().map(|s| s.as_str()).collect();
        scope.push_str(&format!(" from source {}", sources.join(", ")));
    }
    eprintln!("mcp-idem: no record with key {:?}{scope}", args.key);
    ExitCode::from(EXIT_NOTHING)
}

async fn show(
    store: &dyn Store,
    args: &RecordArgs,
    now: Timestamp,
    out: Output,
) -> anyhow::Result<ExitCode> {
    match find(store, args, now).await? {
        Some(record) => out.print(render::show(&record, now, out.json)),
        None => Ok(not_found(args)),
    }
}

async fn delete(
    store: &dyn Store,
    args: &DeleteArgs,
    now: Timestamp,
    out: Output,
) -> anyhow::Result<ExitCode> {
    let Some(record) = find(store, &args.record, now).await? else {
        return Ok(not_found(&args.record));
    };
    if !args.yes && !confirm(&record, now)? {
        eprintln!("mcp-idem: nothing deleted");
        return Ok(ExitCode::from(EXIT_NOTHING));
    }
    if !store
        .delete(&record.id)
        .await
        .context("cannot delete the record")?
    {
        eprintln!("mcp-idem: the record was already gone (purged or deleted meanwhile)");
        return Ok(ExitCode::from(EXIT_NOTHING));
    }
    if !out.json {
        eprintln!("mcp-idem: a retry with this key will run the call again");
    }
    out.print(render::deleted(&record, now, out.json))
}

/// Asks on the terminal whether to delete `record`.
fn confirm(record: &Record, now: Timestamp) -> anyhow::Result<bool> {
    eprint!(
        "{}Delete this record? A retry with its key will run the call again. [y/N] ",
        render::show(record, now, false)
    );
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .context("cannot read the answer")?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}
