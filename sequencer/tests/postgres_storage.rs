//! The sequencer's transactional storage on a real PostgreSQL server started by the test
//! (`test-support/src/postgres.rs` of the workspace): numbers stored through the PostgreSQL mapping
//! are recovered by a sequencer of another process (its own connections). Skipped (one line)
//! without PostgreSQL installed; under CI it fails instead.

use vvm_test_support::postgres as postgres_support;
mod support;

use postgres_support::PgServer;
use support::{key, A, KIND};
use vvm_adapters::postgres::{PgConfig, PgKv};
use vvm_adapters::txkv::TxOptions;
use vvm_sequencer::engine::{Number, PLogOffset, Params, SeqValue, WsId};
use vvm_sequencer::storages::txkv::PgSeqStorage;
use vvm_sequencer::{SeqConfig, Sequencer};

fn config() -> SeqConfig {
    SeqConfig {
        call_timeout_ms: 5_000,
        replay_call_timeout_ms: 5_000,
        replay_page_events: 1_000,
        retries_max: 2,
        backoff_initial_ms: 1,
        backoff_max_ms: 5,
        shutdown_timeout_ms: 5_000,
    }
}

async fn storage(server: &PgServer) -> PgSeqStorage {
    let config = PgConfig::new("127.0.0.1", server.port(), "vvm", "postgres")
        .and_then(|config| config.schema("sequencer"))
        .expect("the configuration is valid");
    let kv = PgKv::connect(config, &TxOptions::default())
        .await
        .expect("the store opens");
    PgSeqStorage::new(kv, PLogOffset(1))
}

// covers: Seq.Gapless
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbers_stored_on_postgres_are_recovered_by_another_process() {
    let Some(server) =
        PgServer::start("numbers_stored_on_postgres_are_recovered_by_another_process")
    else {
        return;
    };
    let params = Params::builder()
        .sequence(KIND, A, Number(1))
        .build()
        .unwrap();
    let first = storage(&server).await;
    let mut seq = Sequencer::new(params.clone(), first.clone(), config())
        .unwrap()
        .ready()
        .await;
    for n in 1..=5 {
        let mut tx = seq.start(KIND, WsId(1)).unwrap();
        assert_eq!(tx.next(A).await.unwrap(), Number(n));
        let values = [SeqValue {
            key: key(1, A),
            value: Number(n),
        }];
        first.append_event(tx.offset(), &values).await.unwrap();
        seq = tx.flush();
    }
    seq.shutdown().await.unwrap();

    let second = storage(&server).await;
    let seq = Sequencer::new(params, second, config())
        .unwrap()
        .ready()
        .await;
    let mut tx = seq.start(KIND, WsId(1)).unwrap();
    assert_eq!(tx.offset(), PLogOffset(6));
    assert_eq!(tx.next(A).await.unwrap(), Number(6));
}
