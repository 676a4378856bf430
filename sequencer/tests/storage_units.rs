//! The sequence storage suite, run on every adapter: the storage contract, and a sequencer
//! over the storage across restarts and a crash.

use std::ops::ControlFlow;

use vvm_sequencer::engine::{Number, NumberKey, PLogOffset, Params, SeqId, SeqValue, WsId, WsKind};
use vvm_sequencer::storages::memory::MemorySeqStorage;
use vvm_sequencer::{SeqConfig, SeqStorage, Sequencer};

fn sv(ws: u64, seq: u16, n: u64) -> SeqValue {
    SeqValue {
        key: NumberKey {
            ws_id: WsId(ws),
            seq_id: SeqId(seq),
        },
        value: Number(n),
    }
}

type Append = Box<
    dyn Fn(PLogOffset, Vec<SeqValue>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
>;

/// What every storage must do; `append` writes a PLog event.
async fn contract<St: SeqStorage>(s: &St, append: Append) {
    assert_eq!(s.read_next_plog_offset().await.unwrap(), PLogOffset(1));
    assert_eq!(
        s.read_numbers(WsId(1), &[SeqId(1)]).await.unwrap(),
        vec![Number(0)]
    );
    s.write_values_and_next_plog_offset(&[sv(1, 1, 10), sv(1, 2, u64::MAX)], PLogOffset(9))
        .await
        .unwrap();
    // Lower values and offset arrive late: nothing decreases.
    s.write_values_and_next_plog_offset(&[sv(1, 1, 7), sv(1, 2, 5)], PLogOffset(4))
        .await
        .unwrap();
    assert_eq!(
        s.read_numbers(WsId(1), &[SeqId(2), SeqId(1), SeqId(3)])
            .await
            .unwrap(),
        vec![Number(u64::MAX), Number(10), Number(0)]
    );
    assert_eq!(s.read_next_plog_offset().await.unwrap(), PLogOffset(9));
    s.write_values_and_next_plog_offset(&[], PLogOffset(12))
        .await
        .unwrap();
    assert_eq!(s.read_next_plog_offset().await.unwrap(), PLogOffset(12));

    for o in 1..=2_100u64 {
        append(PLogOffset(o), vec![sv(o, 1, o), sv(o, 1, o - 1)]).await;
    }
    let mut seen = Vec::new();
    s.actualize_from_plog(PLogOffset(5), &mut |o, values| {
        assert_eq!(values.len(), 2);
        assert_eq!(values[0].value.0, o.0);
        seen.push(o.0);
        ControlFlow::Continue(())
    })
    .await
    .unwrap();
    assert_eq!(
        seen,
        (5..=2_100).collect::<Vec<_>>(),
        "in order, across pages"
    );
    let mut fed = 0;
    s.actualize_from_plog(PLogOffset(1), &mut |_, _| {
        fed += 1;
        if fed == 3 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })
    .await
    .unwrap();
    assert_eq!(fed, 3, "a break stops the replay");
}

/// Three lives of a sequencer over the storage `open` gives (each time over the same data);
/// the second ends in a crash. Numbers continue across each restart.
async fn continues_across_restarts<St: SeqStorage>(open: impl Fn() -> St, append: Append) {
    let params = Params::builder()
        .sequence(WsKind(1), SeqId(1), Number(1_000))
        .build()
        .unwrap();
    let mut expected = 1_000u64;
    for life in 0..3 {
        let mut seq = Sequencer::new(params.clone(), open(), SeqConfig::default())
            .unwrap()
            .ready()
            .await;
        for _ in 0..20 {
            let mut tx = seq.start(WsKind(1), WsId(7)).unwrap();
            let n = tx.next(SeqId(1)).await.unwrap();
            assert_eq!(n, Number(expected), "life {life}");
            expected += 1;
            append(tx.offset(), vec![sv(7, 1, n.0)]).await;
            seq = tx.flush();
        }
        if life == 1 {
            drop(seq); // crash: whatever the flusher had not written is replayed
        } else {
            seq.shutdown().await.unwrap();
        }
    }
}

fn memory_plog(s: &MemorySeqStorage) -> Append {
    let plog = s.clone();
    Box::new(move |o, v| {
        let plog = plog.clone();
        Box::pin(async move { plog.append_event(o, &v).unwrap() })
    })
}

// covers: Seq.StoredNeverDecreases
#[tokio::test]
async fn the_memory_storage_keeps_the_contract() {
    let s = MemorySeqStorage::default();
    contract(&s, memory_plog(&s)).await;
}

// covers: Seq.Gapless
#[tokio::test]
async fn numbers_continue_across_restarts_on_the_memory_storage() {
    let s = MemorySeqStorage::default();
    continues_across_restarts(|| s.clone(), memory_plog(&s)).await;
}

#[cfg(feature = "txkv")]
mod txkv {
    use super::*;
    use vvm_adapters::txkv::{KvFault, MemoryKv};
    use vvm_sequencer::storages::txkv::{TxKvSeqStorage, TxSeqError};
    use vvm_sequencer::SeqStorageError;

    type Storage = TxKvSeqStorage<MemoryKv>;

    fn plog(s: &Storage) -> Append {
        let plog = s.clone();
        Box::new(move |o, v| {
            let plog = plog.clone();
            Box::pin(async move { plog.append_event(o, &v).await.unwrap() })
        })
    }

    // covers: Seq.StoredNeverDecreases, Seq.TxKvStorage
    #[tokio::test]
    async fn the_txkv_storage_keeps_the_contract() {
        let s = TxKvSeqStorage::new(MemoryKv::new(), PLogOffset(1));
        contract(&s, plog(&s)).await;
        assert_eq!(
            s.append_event(PLogOffset(1), &[]).await,
            Err(TxSeqError::OffsetTaken(PLogOffset(1)))
        );
        // The same event again is another call, so another writer: refused as well (a call's
        // own retry after an unknown outcome is inside the call; tests/storages.rs).
        assert_eq!(
            s.append_event(PLogOffset(1), &[sv(1, 1, 1), sv(1, 1, 0)])
                .await,
            Err(TxSeqError::OffsetTaken(PLogOffset(1)))
        );
    }

    // covers: Seq.Gapless, Seq.TxKvStorage
    #[tokio::test]
    async fn numbers_continue_across_restarts_on_the_txkv_storage() {
        let kv = MemoryKv::new();
        let s = TxKvSeqStorage::new(kv.clone(), PLogOffset(1));
        continues_across_restarts(|| TxKvSeqStorage::new(kv.clone(), PLogOffset(1)), plog(&s))
            .await;
    }

    // covers: Seq.TxKvStorage
    #[tokio::test]
    async fn a_write_is_one_transaction_that_conflicts_and_unknown_outcomes_do_not_break() {
        let kv = MemoryKv::new();
        let s = TxKvSeqStorage::new(kv.clone(), PLogOffset(1));
        let commits = kv.commits();
        s.write_values_and_next_plog_offset(&[sv(1, 1, 5), sv(2, 1, 6)], PLogOffset(2))
            .await
            .unwrap();
        assert_eq!(kv.commits(), commits + 1, "values and offset in one commit");

        // A failed commit leaves none of the values and not the offset.
        assert!(kv.inject(KvFault::Fail));
        let err = s
            .write_values_and_next_plog_offset(&[sv(1, 1, 9), sv(3, 1, 9)], PLogOffset(3))
            .await
            .unwrap_err();
        assert!(matches!(err, SeqStorageError::Failed { .. }), "{err}");
        let numbers = |ws| {
            let s = &s;
            async move { s.read_numbers(WsId(ws), &[SeqId(1)]).await.unwrap() }
        };
        assert_eq!(numbers(1).await, vec![Number(5)]);
        assert_eq!(numbers(3).await, vec![Number(0)]);
        assert_eq!(s.read_next_plog_offset().await.unwrap(), PLogOffset(2));

        // Conflicts and unknown outcomes run the write again: merged by maximum, it lands once.
        for fault in [
            KvFault::Conflict,
            KvFault::UnknownApplied,
            KvFault::UnknownNotApplied,
        ] {
            assert!(kv.inject(fault));
        }
        s.write_values_and_next_plog_offset(&[sv(1, 1, 9), sv(3, 1, 9)], PLogOffset(3))
            .await
            .unwrap();
        assert_eq!(numbers(1).await, vec![Number(9)]);
        assert_eq!(numbers(3).await, vec![Number(9)]);
        assert_eq!(s.read_next_plog_offset().await.unwrap(), PLogOffset(3));
    }

    // covers: Seq.TxKvStorage
    #[tokio::test]
    async fn damaged_values_are_corrupt_and_the_plog_skips_gaps_up_to_its_end() {
        let kv = MemoryKv::new();
        let s = TxKvSeqStorage::new(kv.clone(), PLogOffset(1));
        for o in [2u64, 5, 3] {
            s.append_event(PLogOffset(o), &[sv(1, 1, o)]).await.unwrap();
        }
        let mut seen = Vec::new();
        s.actualize_from_plog(PLogOffset(1), &mut |o, _| {
            seen.push(o.0);
            ControlFlow::Continue(())
        })
        .await
        .unwrap();
        assert_eq!(seen, vec![2, 3, 5]);

        assert!(kv.put(b"vvm/seq/o", b"short"));
        assert!(matches!(
            s.read_next_plog_offset().await,
            Err(SeqStorageError::Corrupt { .. })
        ));
        // Another prefix is another sequencer's storage.
        let other = TxKvSeqStorage::with_prefix(kv, PLogOffset(7), b"other/".to_vec()).unwrap();
        assert_eq!(other.read_next_plog_offset().await.unwrap(), PLogOffset(7));
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use std::path::PathBuf;
    use vvm_sequencer::storages::sqlite::{Durability, SqliteSeqError, SqliteSeqStorage};

    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str) -> Self {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            TempFile(std::env::temp_dir().join(format!(
                "vvm-seq-{name}-{}-{nanos}.sqlite",
                std::process::id()
            )))
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            for suffix in ["", "-wal", "-shm"] {
                let mut p = self.0.clone().into_os_string();
                p.push(suffix);
                let _ = std::fs::remove_file(p);
            }
        }
    }

    // covers: Seq.StoredNeverDecreases
    #[tokio::test]
    async fn the_sqlite_storage_keeps_the_contract() {
        let file = TempFile::new("contract");
        let s = SqliteSeqStorage::open(&file.0, PLogOffset(1), Durability::Normal).unwrap();
        let plog = s.clone();
        contract(
            &s,
            Box::new(move |o, v| {
                let plog = plog.clone();
                Box::pin(async move { plog.append_event(o, &v).await.unwrap() })
            }),
        )
        .await;
        assert!(matches!(
            s.append_event(PLogOffset(1), &[]).await,
            Err(SqliteSeqError::OffsetTaken(PLogOffset(1)))
        ));
    }

    // covers: Seq.SqliteAtomic
    #[tokio::test]
    async fn a_write_that_fails_at_the_offset_leaves_no_values_behind() {
        let file = TempFile::new("atomic");
        let s = SqliteSeqStorage::open(&file.0, PLogOffset(1), Durability::Full).unwrap();
        s.write_values_and_next_plog_offset(&[sv(1, 1, 5)], PLogOffset(2))
            .await
            .unwrap();
        // Make the offset statement fail: the values written before it in the same
        // transaction must roll back with it.
        let other = rusqlite::Connection::open(&file.0).unwrap();
        other
            .execute_batch(
                "CREATE TRIGGER no_offset BEFORE UPDATE ON seq_offset
                 BEGIN SELECT RAISE(ABORT, 'offset refused'); END;",
            )
            .unwrap();
        let err = s
            .write_values_and_next_plog_offset(&[sv(1, 1, 9), sv(2, 1, 9)], PLogOffset(3))
            .await
            .unwrap_err();
        // The SQLite error is kept whole below the storage error.
        let chain = vvm_runtime::ErrorChain(&err).to_string();
        assert!(chain.contains("offset refused"), "{chain}");
        let vvm_sequencer::SeqStorageError::Failed { source } = &err else {
            panic!("{chain}")
        };
        assert!(source.find::<rusqlite::Error>().is_some(), "{chain}");
        assert_eq!(
            s.read_numbers(WsId(1), &[SeqId(1)]).await.unwrap(),
            vec![Number(5)]
        );
        assert_eq!(
            s.read_numbers(WsId(2), &[SeqId(1)]).await.unwrap(),
            vec![Number(0)]
        );
        assert_eq!(s.read_next_plog_offset().await.unwrap(), PLogOffset(2));
    }

    // covers: Seq.Gapless
    #[tokio::test]
    async fn numbers_continue_across_a_restart_on_the_same_file() {
        let file = TempFile::new("restart");
        let open = || SqliteSeqStorage::open(&file.0, PLogOffset(1), Durability::Normal).unwrap();
        let plog = open();
        continues_across_restarts(
            open,
            Box::new(move |o, v| {
                let plog = plog.clone();
                Box::pin(async move { plog.append_event(o, &v).await.unwrap() })
            }),
        )
        .await;
    }
}
