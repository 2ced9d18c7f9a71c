//! The Raft log and state machine storage (`gpuctld::raft`) against openraft's own
//! storage test suite: votes, appends, truncation, purges, committed ids, membership
//! and snapshots, each on a fresh sled database.

use gpuctld::raft::{LogStore, Machine, TypeConfig};
use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};

struct Sled;

impl StoreBuilder<TypeConfig, LogStore, Machine, tempfile::TempDir> for Sled {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, Machine), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("a temporary dir");
        let db = sled::open(dir.path()).expect("a sled database");
        let log = LogStore::open(&db).expect("the log's trees");
        let machine = Machine::open(1, &db, gpuctl_core::Config::default()).expect("a machine");
        Ok((dir, log, machine))
    }
}

#[test]
fn the_storage_passes_openrafts_suite() {
    Suite::test_all(Sled).expect("openraft's storage suite");
}
