//! Sequencer costs: `next` on the cached path with 80 000 keys in use, a whole transaction
//! (start + 2 × next + flush, storage excluded), and the replay rate of an actualization.
//!
//! Run: `cargo bench --bench sequencer`. Allocations per call are checked by
//! `sequencer/tests/alloc.rs` (zero in the steady state).
//!
//! Instructions per call: with `SEQ_CALLGRIND_ITERS=<n>` set, the binary skips criterion and
//! runs `n` cached `next` calls, then `n` transactions, each loop in its own function, so that
//! `valgrind --tool=callgrind --toggle-collect='sequencer::callgrind_*'` counts only them
//! (divide the collected instructions by `n`; see `BENCHMARKS.md`).

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use vvm_sequencer::engine::{
    Number, NumberKey, PLogOffset, Params, SeqId, SeqValue, WsId, WsKind, UNFLUSHED_EVENTS_LIMIT,
    UNFLUSHED_KEYS_LIMIT,
};
use vvm_sequencer::storages::memory::MemorySeqStorage;
use vvm_sequencer::{Idle, InTx, SeqConfig, Sequencer};

const KIND: WsKind = WsKind(1);
const WORKSPACES: u64 = 40_000; // × 2 sequences = 80 000 keys
const HOT: u64 = 64;
/// Transactions timed between two drains of the backlog (below its event limit).
const CHUNK: u64 = 100_000;

struct NoWake;

impl Wake for NoWake {
    fn wake(self: Arc<Self>) {}
}

/// A waker that does nothing, made once per measurement (outside the timed loop).
fn no_wake() -> Waker {
    Waker::from(Arc::new(NoWake))
}

/// Polls a future that must be ready at once (the cached path never waits). Inlined into the
/// timed loop, as an `.await` is into the caller's own future.
#[inline(always)]
fn now<F: Future>(cx: &mut Context<'_>, f: F) -> F::Output {
    match pin!(f).poll(cx) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the cached path waited"),
    }
}

fn params(cache: usize) -> Params {
    Params::builder()
        .sequence(KIND, SeqId(1), Number(1))
        .sequence(KIND, SeqId(2), Number(1))
        .cache_capacity(cache)
        .unflushed_keys_max(UNFLUSHED_KEYS_LIMIT)
        .unflushed_events_max(UNFLUSHED_EVENTS_LIMIT)
        .build()
        .expect("valid params")
}

/// A sequencer with 80 000 keys cached, everything flushed.
fn loaded(rt: &tokio::runtime::Runtime) -> Sequencer<Idle, MemorySeqStorage> {
    let _enter = rt.enter();
    rt.block_on(async {
        let mut seq = Sequencer::new(
            params(100_000),
            MemorySeqStorage::default(),
            SeqConfig::default(),
        )
        .expect("sequencer")
        .ready()
        .await;
        for ws in 0..WORKSPACES {
            let mut tx = seq.start(KIND, WsId(ws)).expect("start");
            tx.next(SeqId(1)).await.expect("next");
            tx.next(SeqId(2)).await.expect("next");
            seq = tx.flush();
        }
        drain(&seq).await;
        seq
    })
}

async fn drain(seq: &Sequencer<Idle, MemorySeqStorage>) {
    for _ in 0..10_000 {
        let s = seq.status();
        if s.unflushed_keys == 0 && s.unflushed_events == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("backlog never drained");
}

fn next_cached(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let seq = loaded(&rt);
    let mut tx = seq.start(KIND, WsId(7)).expect("start");
    let mut g = c.benchmark_group("sequencer");
    g.throughput(Throughput::Elements(1));
    let mut flip = 0u16;
    let waker = no_wake();
    let mut cx = Context::from_waker(&waker);
    g.bench_function("next_cached_80k_keys", |b| {
        b.iter(|| {
            flip ^= 1;
            black_box(now(&mut cx, tx.next(SeqId(1 + flip))).expect("next"))
        })
    });
    g.finish();
    let seq = tx.flush();
    let _enter = rt.enter();
    rt.block_on(seq.shutdown()).expect("shutdown");
}

fn transaction(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let mut seq = Some(loaded(&rt));
    let mut g = c.benchmark_group("sequencer");
    g.throughput(Throughput::Elements(1));
    let mut i = 0u64;
    let waker = no_wake();
    let mut cx = Context::from_waker(&waker);
    g.bench_function("transaction_start_2next_flush", |b| {
        b.iter_custom(|iters| {
            let mut s = seq.take().expect("sequencer");
            let mut took = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let chunk = left.min(CHUNK);
                left -= chunk;
                let started = Instant::now();
                for _ in 0..chunk {
                    let mut tx = s.start(KIND, WsId(i % HOT)).expect("start");
                    i += 1;
                    black_box(now(&mut cx, tx.next(SeqId(1))).expect("next"));
                    black_box(now(&mut cx, tx.next(SeqId(2))).expect("next"));
                    s = tx.flush();
                }
                took += started.elapsed();
                // Storage excluded: the flusher catches up outside the timed loop.
                rt.block_on(drain(&s));
            }
            seq = Some(s);
            took
        })
    });
    g.finish();
    let _enter = rt.enter();
    rt.block_on(seq.take().expect("sequencer").shutdown())
        .expect("shutdown");
}

const REPLAY_EVENTS: u64 = 100_000;

fn replay(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let defaults = Params::builder()
        .sequence(KIND, SeqId(1), Number(1))
        .sequence(KIND, SeqId(2), Number(1))
        .build()
        .expect("params");
    let mut g = c.benchmark_group("sequencer");
    g.sample_size(10);
    g.throughput(Throughput::Elements(REPLAY_EVENTS));
    g.bench_function("replay_100k_events_default_limits", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let storage = MemorySeqStorage::new(PLogOffset(1));
                for o in 1..=REPLAY_EVENTS {
                    let ws = WsId(o % 1_000);
                    let v = |seq, n| SeqValue {
                        key: NumberKey {
                            ws_id: ws,
                            seq_id: SeqId(seq),
                        },
                        value: Number(n),
                    };
                    storage
                        .append_event(PLogOffset(o), &[v(1, o), v(2, o)])
                        .expect("append");
                }
                let _enter = rt.enter();
                let started = Instant::now();
                let seq = rt.block_on(
                    Sequencer::new(defaults.clone(), storage, SeqConfig::default())
                        .expect("sequencer")
                        .ready(),
                );
                total += started.elapsed();
                let tx = seq.start(KIND, WsId(1)).expect("actualized");
                assert_eq!(tx.offset(), PLogOffset(REPLAY_EVENTS + 1));
                rt.block_on(tx.flush().shutdown()).expect("shutdown");
            }
            total
        })
    });
    g.finish();
}

/// The loop of `next_cached_80k_keys`, uninlined so that callgrind can count it alone.
#[inline(never)]
fn callgrind_next(cx: &mut Context<'_>, tx: &mut Sequencer<InTx, MemorySeqStorage>, iters: u64) {
    let mut flip = 0u16;
    for _ in 0..iters {
        flip ^= 1;
        black_box(now(cx, tx.next(SeqId(1 + flip))).expect("next"));
    }
}

/// The loop of `transaction_start_2next_flush` (one chunk), uninlined for callgrind.
#[inline(never)]
fn callgrind_transaction(
    cx: &mut Context<'_>,
    mut s: Sequencer<Idle, MemorySeqStorage>,
    iters: u64,
) -> Sequencer<Idle, MemorySeqStorage> {
    for i in 0..iters {
        let mut tx = s.start(KIND, WsId(i % HOT)).expect("start");
        black_box(now(cx, tx.next(SeqId(1))).expect("next"));
        black_box(now(cx, tx.next(SeqId(2))).expect("next"));
        s = tx.flush();
    }
    s
}

/// Runs both loops `iters` times each, outside criterion (see the module docs).
fn callgrind(iters: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let seq = loaded(&rt);
    let waker = no_wake();
    let mut cx = Context::from_waker(&waker);
    let mut tx = seq.start(KIND, WsId(7)).expect("start");
    callgrind_next(&mut cx, &mut tx, iters);
    let seq = tx.flush();
    rt.block_on(drain(&seq));
    // Within one chunk: the backlog's event limit is never reached.
    let seq = callgrind_transaction(&mut cx, seq, iters.min(CHUNK));
    rt.block_on(drain(&seq));
    let _enter = rt.enter();
    rt.block_on(seq.shutdown()).expect("shutdown");
}

criterion_group!(benches, next_cached, transaction, replay);

fn main() {
    if let Some(iters) = std::env::var("SEQ_CALLGRIND_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        callgrind(iters);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
