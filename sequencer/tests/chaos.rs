//! Random chaos through the sequencer's public API, on every storage: transactions on a few
//! workspaces (`start` → `next`* → append the event → `flush`), events whose outcome is unknown
//! (`actualize`), events that carry a number below their key's highest, storage faults of every
//! kind (failed writes, writes applied but reported failed, failed reads and replays), slow
//! writes, cancelled `next` calls, crashes (the sequencer dropped) and clean restarts, with a
//! tiny cache and tiny backlog limits. An oracle keeps the PLog's truth: every number `next`
//! hands out must be the highest committed number of its key + 1 (never below the initial
//! value), and every offset `start` hands out must be free.
//!
//! Budget: a fixed wall-clock time per storage (`SEQ_CHAOS_MS`, default 1 500 ms), seeds
//! 0, 1, 2, … in order; the runs and operations done are printed, and a failure names its
//! storage and seed (`SEQ_CHAOS_SEED` replays one).

mod support;

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use support::storages::{Kind, Place, Storage, KINDS};
use support::{key, KIND};
use vvm_sequencer::engine::{Number, NumberKey, PLogOffset, Params, SeqId, SeqValue, WsId};
use vvm_sequencer::{Idle, InTx, NextError, SeqConfig, Sequencer};

const SEQS: [SeqId; 2] = [SeqId(1), SeqId(2)];
const WORKSPACES: u64 = 3;
const OPS_PER_RUN: usize = 80;
const BUDGET_MS_DEFAULT: u64 = 1_500;

/// A small seeded generator (xorshift64*): any seed replays.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

fn config() -> SeqConfig {
    SeqConfig {
        call_timeout_ms: 1_000,
        replay_call_timeout_ms: 2_000,
        replay_page_events: 4,
        retries_max: 1,
        backoff_initial_ms: 1,
        backoff_max_ms: 2,
        shutdown_timeout_ms: 1_000,
    }
}

/// The PLog's truth, kept by the test: the highest committed number of each key, and the
/// offsets taken.
#[derive(Default)]
struct Oracle {
    highest: HashMap<NumberKey, Number>,
    offsets: Vec<PLogOffset>,
}

impl Oracle {
    fn commit(&mut self, offset: PLogOffset, values: &[SeqValue]) {
        assert!(
            !self.offsets.contains(&offset),
            "offset {offset:?} handed out twice"
        );
        self.offsets.push(offset);
        for v in values {
            let slot = self.highest.entry(v.key).or_default();
            *slot = (*slot).max(v.value);
        }
    }

    fn expected(&self, key: NumberKey, in_tx: Option<Number>, initial: Number) -> Number {
        let last = in_tx.unwrap_or_else(|| self.highest.get(&key).copied().unwrap_or_default());
        Number((last.0 + 1).max(initial.0))
    }
}

enum State {
    Idle(Sequencer<Idle, Storage>),
    InTx(Sequencer<InTx, Storage>, WsId, Vec<SeqValue>),
}

struct Run {
    place: Place,
    storage: Storage,
    params: Params,
    initials: [Number; 2],
    oracle: Oracle,
    rng: Rng,
    ops: u64,
}

impl Run {
    fn new(kind: Kind, seed: u64) -> Run {
        let mut rng = Rng::new(seed);
        let initials = [
            Number(if rng.below(2) == 0 { 1 } else { 200_001 }),
            Number(1 + rng.below(3)),
        ];
        let params = Params::builder()
            .sequence(KIND, SEQS[0], initials[0])
            .sequence(KIND, SEQS[1], initials[1])
            .cache_capacity(1 + rng.below(3) as usize)
            .unflushed_keys_max(1 + rng.below(4) as usize)
            .unflushed_events_max(1 + rng.below(4))
            .build()
            .unwrap();
        let place = Place::new(kind, "chaos");
        let storage = place.open();
        Run {
            place,
            storage,
            params,
            initials,
            oracle: Oracle::default(),
            rng,
            ops: 0,
        }
    }

    async fn sequencer(&mut self) -> Sequencer<Idle, Storage> {
        self.storage = self.place.open();
        Sequencer::new(self.params.clone(), self.storage.clone(), config())
            .unwrap()
            .ready()
            .await
    }

    /// Starts a transaction on a random workspace; a refusal must be transient, and is awaited.
    async fn start(&mut self, seq: Sequencer<Idle, Storage>) -> State {
        let ws = WsId(self.rng.below(WORKSPACES));
        match seq.start(KIND, ws) {
            Ok(tx) => {
                assert!(
                    !self.oracle.offsets.contains(&tx.offset()),
                    "start handed out the taken offset {:?}",
                    tx.offset()
                );
                State::InTx(tx, ws, Vec::new())
            }
            Err(busy) => {
                assert!(busy.reason.is_transient(), "{busy}");
                let seq = busy.into_idle();
                if self.rng.below(2) == 0 {
                    State::Idle(seq.ready().await)
                } else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    State::Idle(seq)
                }
            }
        }
    }

    /// `next` of a random sequence, checked against the oracle; maybe cancelled at its first
    /// wait. A storage error gives the event up.
    async fn next(
        &mut self,
        mut tx: Sequencer<InTx, Storage>,
        ws: WsId,
        mut values: Vec<SeqValue>,
    ) -> State {
        let i = self.rng.below(2) as usize;
        let (seq_id, initial) = (SEQS[i], self.initials[i]);
        let key = key(ws.0, seq_id);
        let cancel = self.rng.below(5) == 0;
        let result = if cancel {
            match tokio::time::timeout(Duration::ZERO, tx.next(seq_id)).await {
                Ok(result) => result,
                // Dropped at its first wait: nothing was handed out.
                Err(_) => return State::InTx(tx, ws, values),
            }
        } else {
            tx.next(seq_id).await
        };
        match result {
            Ok(n) => {
                let in_tx = values.iter().rev().find(|v| v.key == key).map(|v| v.value);
                let expected = self.oracle.expected(key, in_tx, initial);
                assert_eq!(n, expected, "next({key:?})");
                values.retain(|v| v.key != key);
                values.push(SeqValue { key, value: n });
                State::InTx(tx, ws, values)
            }
            Err(NextError::Storage(_)) => State::Idle(tx.actualize().idle()),
            Err(other) => panic!("next({key:?}): {other}"),
        }
    }

    /// Writes the event to the PLog (maybe with a number below a key's highest), then
    /// `flush`, or `actualize` as if the outcome were unknown, or crashes.
    async fn commit(
        &mut self,
        tx: Sequencer<InTx, Storage>,
        ws: WsId,
        mut values: Vec<SeqValue>,
    ) -> Option<State> {
        if self.rng.below(4) == 0 {
            let seq_id = SEQS[self.rng.below(2) as usize];
            let key = key(ws.0, seq_id);
            let highest = self.oracle.highest.get(&key).copied().unwrap_or_default();
            let low = Number(highest.0 / 2);
            if low.0 > 0 && !values.iter().any(|v| v.key == key) {
                values.push(SeqValue { key, value: low });
            }
        }
        let offset = tx.offset();
        self.storage.append(offset, &values).await.unwrap();
        self.oracle.commit(offset, &values);
        match self.rng.below(8) {
            0 => Some(State::Idle(tx.actualize().ready().await)),
            1 => {
                drop(tx); // a crash right after the append
                None
            }
            _ => Some(State::Idle(tx.flush())),
        }
    }

    fn inject(&mut self) {
        let faults = &self.storage.faults;
        let n = 1 + self.rng.below(3) as u32;
        match self.rng.below(5) {
            0 => faults.writes.store(n, Ordering::SeqCst),
            1 => faults.writes_after.store(n, Ordering::SeqCst),
            2 => faults.reads.store(n, Ordering::SeqCst),
            3 => faults.replays.store(n, Ordering::SeqCst),
            _ => self
                .storage
                .slow_writes(Duration::from_millis(self.rng.below(20))),
        }
    }

    async fn go(&mut self) {
        let mut state = Some(State::Idle(self.sequencer().await));
        for _ in 0..OPS_PER_RUN {
            self.ops += 1;
            let current = match state.take() {
                Some(s) => s,
                None => State::Idle(self.sequencer().await),
            };
            state = match (current, self.rng.below(12)) {
                (s, 0) => {
                    self.inject();
                    Some(s)
                }
                (State::Idle(seq), 1) => {
                    drop(seq); // a crash
                    None
                }
                (State::Idle(seq), 2) => {
                    let _ = seq.shutdown().await;
                    None
                }
                (State::Idle(seq), _) => Some(self.start(seq).await),
                (State::InTx(tx, _, _), 1) => {
                    drop(tx); // a crash inside a transaction: the event was never written
                    None
                }
                (State::InTx(tx, _, _), 2) => Some(State::Idle(tx.actualize().idle())),
                (State::InTx(tx, ws, values), 3..=6) => self.commit(tx, ws, values).await,
                (State::InTx(tx, ws, values), _) => Some(self.next(tx, ws, values).await),
            };
        }
        // Last: a clean life must continue every key of the truth.
        drop(state);
        self.storage.faults.writes.store(0, Ordering::SeqCst);
        self.storage.slow_writes(Duration::ZERO);
        let mut seq = self.sequencer().await;
        for ws in 0..WORKSPACES {
            let mut tx = loop {
                match seq.start(KIND, WsId(ws)) {
                    Ok(tx) => break tx,
                    Err(busy) => {
                        assert!(busy.reason.is_transient(), "{busy}");
                        seq = busy.into_idle().ready().await;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            };
            for (i, &seq_id) in SEQS.iter().enumerate() {
                let key = key(ws, seq_id);
                let expected = self.oracle.expected(key, None, self.initials[i]);
                assert_eq!(
                    tx.next(seq_id).await.unwrap(),
                    expected,
                    "last life {key:?}"
                );
            }
            seq = tx.actualize().ready().await;
        }
        let _ = seq.shutdown().await;
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

// covers: Seq.Chaos, Seq.Gapless, Seq.NextMax
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_chaos_through_the_public_api_keeps_numbers_gapless_on_every_storage() {
    let budget = Duration::from_millis(env_u64("SEQ_CHAOS_MS").unwrap_or(BUDGET_MS_DEFAULT));
    let only = env_u64("SEQ_CHAOS_SEED");
    for kind in KINDS {
        let started = Instant::now();
        let (mut runs, mut ops) = (0u64, 0u64);
        for seed in only.map_or(0..u64::MAX, |s| s..s + 1) {
            if only.is_none() && runs > 0 && started.elapsed() >= budget {
                break;
            }
            let mut run = Run::new(kind, seed);
            let outcome = tokio::spawn(async move {
                run.go().await;
                run.ops
            })
            .await;
            match outcome {
                Ok(n) => ops += n,
                Err(e) => panic!("{kind:?}, seed {seed} (SEQ_CHAOS_SEED={seed} replays it): {e}"),
            }
            runs += 1;
        }
        // Past the harness's capture on purpose: the figure shows in CI logs.
        let _ = writeln!(
            std::io::stderr(),
            "sequencer chaos on {kind:?}: {runs} runs, {ops} operations in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
}
