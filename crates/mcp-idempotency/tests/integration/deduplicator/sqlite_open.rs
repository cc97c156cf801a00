//! Opening a SQLite store where it cannot live: a clear error naming the file, and reopening keeps
//! the records.

use std::path::Path;

use mcp_idempotency::store::{SqliteStore, StoreError};

/// Opens `path`, expecting a clear error whose message names `named`.
async fn open_fails(path: &Path, named: &Path) -> StoreError {
    let err = match SqliteStore::open(path).await {
        Ok(store) => panic!("opened a store at {}", store.path().display()),
        Err(err) => err,
    };
    let message = err.to_string();
    assert!(
        message.contains(&named.display().to_string()),
        "error {message:?} should name {}",
        named.display()
    );
    assert!(err.is_unavailable(), "{err:?}");
    err
}

#[tokio::test]
async fn parent_is_a_regular_file() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let path = file.path().join("records.sqlite3");
    open_fails(&path, file.path()).await;
    let deeper = file.path().join("a/b/records.sqlite3");
    open_fails(&deeper, deeper.parent().unwrap()).await;
}

#[tokio::test]
async fn directory_cannot_be_created_under_proc() {
    let path = Path::new("/proc/mcp-idem-test-no-such-dir/records.sqlite3");
    open_fails(path, path.parent().unwrap()).await;
}

#[tokio::test]
async fn file_cannot_be_created_in_a_read_only_place() {
    // /proc/self exists but nobody, not even root, can create a file in it.
    let path = Path::new("/proc/self/mcp-idem-records.sqlite3");
    open_fails(path, path).await;
}

#[tokio::test]
async fn path_is_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    open_fails(dir.path(), dir.path()).await;
}

#[tokio::test]
async fn file_is_not_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("records.sqlite3");
    std::fs::write(
        &path,
        b"this is not a SQLite database, just some text; ".repeat(100),
    )
    .unwrap();
    open_fails(&path, &path).await;
    // The file is left alone.
    assert!(std::fs::read(&path).unwrap().starts_with(b"this is not"));
}

#[test]
fn open_blocking_outside_a_runtime_reports_the_same_errors() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let path = file.path().join("records.sqlite3");
    let err = SqliteStore::open_blocking(&path).unwrap_err();
    assert!(err.to_string().contains(&file.path().display().to_string()));
}

#[tokio::test]
async fn reopening_keeps_records() {
    use mcp_idempotency::{Deduplicator, EngineConfig, Outcome};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dirs/records.sqlite3");
    let claim = {
        let store = Arc::new(SqliteStore::open(&path).await.unwrap());
        assert_eq!(store.path(), path);
        let d = Deduplicator::new(EngineConfig::default(), store);
        let claim =
            super::execute(super::decide(&d, &super::scope(), super::TOOL, super::ARGS, "k").await);
        d.complete(&claim, Outcome::Success(super::RESULT.into()))
            .await
            .unwrap();
        claim
    };
    let d = Deduplicator::new(
        EngineConfig::default(),
        Arc::new(SqliteStore::open(&path).await.unwrap()),
    );
    assert_eq!(
        super::replay(super::decide(&d, &super::scope(), super::TOOL, super::ARGS, "k").await),
        super::Replay::Result(super::RESULT.into())
    );
    assert_eq!(
        d.complete(&claim, Outcome::Success("{}".into()))
            .await
            .unwrap(),
        mcp_idempotency::store::Fenced::NotOwner
    );
}
