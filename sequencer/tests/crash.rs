//! Crash model: random transactions, flushes, actualizations, storage failures and crashes
//! against a reference model in which the PLog is the truth.
//!
//! The storage below persists a batch as the adapters do: values first (merged by maximum),
//! then the offset. Every storage write of the main line is forked: a copy of the world
//! crashes at each boundary of that write (before it, between values and offset, after it but
//! before the sequencer learnt of it; before and after a PLog append), recovers from what was
//! stored, and must then hand out exactly the highest committed number + 1 for every key.
//!
//! Besides the sequencer's own numbers, events may carry numbers below their key's highest (a
//! number committed before a sequence's initial value was raised, a singleton id): they are
//! replayed into the backlog while storage holds a higher number of the same key. And a write
//! may be slow: taken as a batch, landing in storage only later (before or after the next
//! actualization), so that `next` runs while its batch is neither stored nor acknowledged.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use vvm_sequencer::engine::*;

const KIND: WsKind = WsKind(1);
const WORKSPACES: u64 = 4;
const SEQS: [(SeqId, Number); 2] = [(SeqId(1), Number(1)), (SeqId(2), Number(1_000))];
/// Attempts per batch before the model's driver gives an actualization up.
const WRITE_ATTEMPTS_MAX: usize = 2;
const CRASH_POINTS_MIN: u64 = 100_000;

static CRASH_POINTS: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Boundary {
    BeforeWrite,
    BetweenValuesAndOffset,
    AfterWrite,
    BeforeAppend,
    AfterAppend,
}

const WRITE_BOUNDARIES: [Boundary; 3] = [
    Boundary::BeforeWrite,
    Boundary::BetweenValuesAndOffset,
    Boundary::AfterWrite,
];
const APPEND_BOUNDARIES: [Boundary; 2] = [Boundary::BeforeAppend, Boundary::AfterAppend];

#[derive(Debug)]
struct Crash;

#[derive(Clone, Debug, Default)]
struct Store {
    numbers: HashMap<NumberKey, Number>,
    next_offset: PLogOffset,
    plog: BTreeMap<PLogOffset, Vec<SeqValue>>,
}

impl Store {
    fn truth(&self, key: NumberKey) -> Number {
        self.plog
            .values()
            .flatten()
            .filter(|v| v.key == key)
            .map(|v| v.value)
            .max()
            .unwrap_or(Number(0))
    }

    /// Every event below the stored offset has its numbers stored.
    fn check_covered(&self) {
        for (offset, values) in self.plog.range(..self.next_offset) {
            for v in values {
                let stored = self.numbers.get(&v.key).copied().unwrap_or_default();
                assert!(
                    stored >= v.value,
                    "stored offset {:?} is ahead of event {offset:?}'s {v:?} (stored {stored:?})",
                    self.next_offset
                );
            }
        }
    }
}

#[derive(Clone, Debug)]
struct OpenTx {
    offset: PLogOffset,
    ws: WsId,
    issued: BTreeMap<SeqId, Number>,
}

/// A batch being written: taken, maybe landed in storage, not yet acknowledged.
#[derive(Clone, Debug)]
struct InFlight {
    ticket: BatchTicket,
    values: Vec<SeqValue>,
    landed: bool,
}

#[derive(Clone, Debug)]
struct World {
    params: Params,
    issuer: Issuer,
    backlog: Backlog,
    store: Store,
    tx: Option<OpenTx>,
    batch: Vec<SeqValue>,
    failing_writes: u8,
    in_flight: Option<InFlight>,
    plan: Option<Boundary>,
    fork: bool,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Start(u64),
    Next(usize),
    Commit,
    CommitUnknown,
    /// The open transaction's event also carries a number below the highest of one of its
    /// workspace's sequences (not used by the transaction); then the outcome is unknown
    /// (actualize), or the process crashes right after the append.
    CommitLow(usize, bool),
    Abort,
    Flush,
    /// A batch is taken; its write lands only at `Land` or `Ack` (or never, on a crash).
    FlushSlow,
    Land,
    Ack,
    FailWrites(u8),
    Crash,
    CrashInFlush(usize),
    CrashInCommit(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..WORKSPACES).prop_map(Op::Start),
        6 => (0..SEQS.len()).prop_map(Op::Next),
        4 => Just(Op::Commit),
        1 => Just(Op::CommitUnknown),
        2 => ((0..SEQS.len()), any::<bool>()).prop_map(|(i, crash)| Op::CommitLow(i, crash)),
        1 => Just(Op::Abort),
        3 => Just(Op::Flush),
        2 => Just(Op::FlushSlow),
        1 => Just(Op::Land),
        2 => Just(Op::Ack),
        1 => (1..4u8).prop_map(Op::FailWrites),
        1 => Just(Op::Crash),
        1 => (0..WRITE_BOUNDARIES.len()).prop_map(Op::CrashInFlush),
        1 => (0..APPEND_BOUNDARIES.len()).prop_map(Op::CrashInCommit),
    ]
}

impl World {
    fn new() -> Self {
        let mut b = Params::builder()
            .cache_capacity(3)
            .unflushed_keys_max(4)
            .unflushed_events_max(3);
        for (seq, initial) in SEQS {
            b = b.sequence(KIND, seq, initial);
        }
        let params = b.build().unwrap();
        let mut store = Store::default();
        // Numbers committed before the sequence's initial value was raised.
        store.plog.insert(
            PLogOffset(0),
            vec![SeqValue {
                key: NumberKey {
                    ws_id: WsId(0),
                    seq_id: SeqId(2),
                },
                value: Number(500),
            }],
        );
        let mut w = World {
            issuer: Issuer::new(params.clone()),
            backlog: Backlog::new(&params),
            params,
            store,
            tx: None,
            batch: Vec::new(),
            failing_writes: 0,
            in_flight: None,
            plan: None,
            fork: true,
        };
        w.actualize().unwrap();
        w
    }

    fn crash_here(&mut self, at: Boundary) -> Result<(), Crash> {
        if self.plan == Some(at) {
            self.plan = None;
            return Err(Crash);
        }
        Ok(())
    }

    fn forks<F: Fn(&mut World) -> Result<bool, Crash>>(&self, boundaries: &[Boundary], act: F) {
        if !self.fork {
            return;
        }
        for &b in boundaries {
            let mut w = self.clone();
            w.fork = false;
            w.plan = Some(b);
            match act(&mut w) {
                Err(Crash) => {
                    CRASH_POINTS.fetch_add(1, Ordering::Relaxed);
                    w.recover();
                }
                Ok(false) => return, // nothing would be written: no crash point here
                Ok(true) => panic!("planned crash at {b:?} did not happen"),
            }
        }
    }

    /// The flusher: one batch, written and acknowledged. `Ok(false)` when the write failed.
    fn write_batch(&mut self) -> Result<bool, Crash> {
        match self.flush_begin()? {
            None => Ok(true),
            Some(None) => Ok(false),
            Some(Some((ticket, values))) => {
                assert!(self.backlog.batch_written(ticket, &values));
                Ok(true)
            }
        }
    }

    /// Takes a batch and writes it; the acknowledgement comes later (the sequencer goes on
    /// meanwhile). `None`: nothing to write; `Some(None)`: the write failed.
    #[allow(clippy::type_complexity)]
    fn flush_begin(&mut self) -> Result<Option<Option<(BatchTicket, Vec<SeqValue>)>>, Crash> {
        if self.backlog.is_writing() || self.backlog.clone().take_batch(&mut Vec::new()).is_none() {
            return Ok(None);
        }
        self.forks(&WRITE_BOUNDARIES, |w| {
            w.flush_begin().map(|r| r.is_some_and(|r| r.is_some()))
        });
        let Some(ticket) = self.backlog.take_batch(&mut self.batch) else {
            return Ok(None);
        };
        if self.failing_writes > 0 {
            self.failing_writes -= 1;
            assert!(self.backlog.batch_failed(ticket));
            return Ok(Some(None));
        }
        self.crash_here(Boundary::BeforeWrite)?;
        for v in &self.batch {
            let slot = self.store.numbers.entry(v.key).or_default();
            *slot = (*slot).max(v.value);
        }
        self.crash_here(Boundary::BetweenValuesAndOffset)?;
        self.store.next_offset = self.store.next_offset.max(ticket.next_offset());
        self.store.check_covered();
        self.crash_here(Boundary::AfterWrite)?;
        Ok(Some(Some((ticket, self.batch.clone()))))
    }

    /// Takes a batch whose write lands later (`land`), as a slow storage's does.
    fn flush_slow(&mut self) {
        if self.in_flight.is_some() {
            return;
        }
        if let Some(ticket) = self.backlog.take_batch(&mut self.batch) {
            self.in_flight = Some(InFlight {
                ticket,
                values: self.batch.clone(),
                landed: false,
            });
        }
    }

    /// The slow write reaches storage (values, then the offset), maybe after an actualization
    /// that began since (its values are of committed events all the same). A failing storage
    /// fails it: the flusher learns so at once and the batch may be taken again.
    fn land(&mut self) -> Result<(), Crash> {
        let Some(w) = self.in_flight.as_ref().filter(|w| !w.landed) else {
            return Ok(());
        };
        let (ticket, values) = (w.ticket, w.values.clone());
        if self.failing_writes > 0 {
            self.failing_writes -= 1;
            self.in_flight = None;
            self.backlog.batch_failed(ticket);
            return Ok(());
        }
        self.forks(&WRITE_BOUNDARIES, |w| w.land().map(|()| true));
        self.crash_here(Boundary::BeforeWrite)?;
        for v in &values {
            let slot = self.store.numbers.entry(v.key).or_default();
            *slot = (*slot).max(v.value);
        }
        self.crash_here(Boundary::BetweenValuesAndOffset)?;
        self.store.next_offset = self.store.next_offset.max(ticket.next_offset());
        self.store.check_covered();
        self.crash_here(Boundary::AfterWrite)?;
        if let Some(w) = &mut self.in_flight {
            w.landed = true;
        }
        Ok(())
    }

    /// The flusher learns that its write landed (maybe after an actualization: then stale).
    fn flush_ack(&mut self) -> Result<(), Crash> {
        self.land()?;
        if let Some(w) = self.in_flight.take() {
            self.backlog.batch_written(w.ticket, &w.values);
        }
        Ok(())
    }

    fn actualize(&mut self) -> Result<(), Crash> {
        self.issuer.abort();
        self.tx = None;
        self.backlog.begin_actualization();
        self.backlog.loaded(self.store.next_offset).unwrap();
        loop {
            let from = self.backlog.replay_from().unwrap();
            let events: Vec<_> = self
                .store
                .plog
                .range(from..)
                .map(|(o, v)| (*o, v.clone()))
                .collect();
            let mut full = false;
            for (offset, values) in events {
                if self.backlog.replay(offset, &values).unwrap() == ReplayStep::Full {
                    full = true;
                    break;
                }
            }
            if !full {
                break;
            }
            let mut written = false;
            for _ in 0..WRITE_ATTEMPTS_MAX {
                if self.write_batch()? {
                    written = true;
                    break;
                }
            }
            if !written {
                self.backlog.actualization_failed();
                return Ok(());
            }
        }
        self.backlog.actualized().unwrap();
        Ok(())
    }

    fn recover(&mut self) {
        self.issuer = Issuer::new(self.params.clone());
        self.backlog = Backlog::new(&self.params);
        self.tx = None;
        self.plan = None;
        self.failing_writes = 0;
        self.in_flight = None;
        self.actualize()
            .expect("no crash is planned during recovery");
        self.probe();
    }

    /// After a recovery every key continues at the highest committed number + 1.
    fn probe(&self) {
        for ws in 0..WORKSPACES {
            let mut w = self.clone();
            w.fork = false;
            let mut started = false;
            for _ in 0..4 {
                w.start(WsId(ws)).unwrap();
                if w.tx.is_some() {
                    started = true;
                    break;
                }
            }
            assert!(
                started,
                "start stays refused after recovery: {:?}",
                w.backlog.phase()
            );
            for i in 0..SEQS.len() {
                w.next(i).unwrap();
                w.next(i).unwrap();
            }
        }
    }

    fn start(&mut self, ws: WsId) -> Result<(), Crash> {
        if self.tx.is_some() {
            return Ok(());
        }
        match self.backlog.admit() {
            Ok(offset) => {
                self.issuer.begin(KIND, ws).unwrap();
                self.tx = Some(OpenTx {
                    offset,
                    ws,
                    issued: BTreeMap::new(),
                });
            }
            Err(StartRefusal::Backlog { .. }) => {
                if self.in_flight.is_some() {
                    self.flush_ack()?;
                } else {
                    self.write_batch()?;
                }
            }
            Err(StartRefusal::ActualizationFailed) => self.actualize()?,
            Err(other) => panic!("start refused: {other}"),
        }
        Ok(())
    }

    fn next(&mut self, i: usize) -> Result<(), Crash> {
        let Some(tx) = &self.tx else { return Ok(()) };
        let (seq, initial) = SEQS[i];
        let key = NumberKey {
            ws_id: tx.ws,
            seq_id: seq,
        };
        let last = tx
            .issued
            .get(&seq)
            .copied()
            .unwrap_or_else(|| self.store.truth(key));
        // Computed here, not by the code under test: the highest number + 1, never below the
        // initial value.
        let expected = Number((last.0 + 1).max(initial.0));
        let got = match self.issuer.next_cached(seq).unwrap() {
            Some(n) => n,
            None => {
                // As the runtime does: the backlog's numbers of every sequence of the kind,
                // then storage's; the core takes the maximum.
                let seqs = self.issuer.kind_seqs().unwrap().to_vec();
                let mut pending = Vec::new();
                self.backlog.snapshot(tx.ws, &seqs, &mut pending);
                let stored: Vec<Number> = seqs
                    .iter()
                    .map(|&(seq_id, _)| {
                        let k = NumberKey {
                            ws_id: tx.ws,
                            seq_id,
                        };
                        self.store.numbers.get(&k).copied().unwrap_or_default()
                    })
                    .collect();
                self.issuer.next_from(seq, &pending, &stored).unwrap()
            }
        };
        assert_eq!(got, expected, "next({key:?})");
        if let Some(tx) = &mut self.tx {
            tx.issued.insert(seq, got);
        }
        Ok(())
    }

    /// Writes the open transaction's event with a number of sequence `i` below its key's
    /// highest (when the transaction did not use `i` and there is such a number); then the
    /// outcome is unknown (actualize), or the process crashes.
    fn commit_low(&mut self, i: usize, crash: bool) -> Result<(), Crash> {
        let Some(tx) = self.tx.clone() else {
            return Ok(());
        };
        let (seq, initial) = SEQS[i];
        let key = NumberKey {
            ws_id: tx.ws,
            seq_id: seq,
        };
        // Half of the highest number in use, or of the initial value: below both.
        let highest = self.store.truth(key).max(initial).0;
        let low = SeqValue {
            key,
            value: Number(highest / 2),
        };
        if tx.issued.contains_key(&seq) || low.value == Number(0) {
            return self.commit(false);
        }
        self.append(&tx, Some(low))?;
        if crash {
            return Err(Crash);
        }
        self.actualize()
    }

    /// Writes the open transaction's event to the PLog; then flush (`known`) or, when the
    /// writer could not tell whether it landed, actualize.
    fn commit(&mut self, known: bool) -> Result<(), Crash> {
        let Some(tx) = self.tx.clone() else {
            return Ok(());
        };
        self.forks(&APPEND_BOUNDARIES, |w| w.commit(known).map(|_| true));
        self.append(&tx, None)?;
        if known {
            let (ws, issued) = self.issuer.issued().unwrap();
            self.backlog.commit(tx.offset, ws, issued).unwrap();
            self.issuer.end().unwrap();
            self.tx = None;
            Ok(())
        } else {
            self.actualize()
        }
    }

    /// Appends the event of `tx` (its numbers, and `low`, a number below its key's highest).
    fn append(&mut self, tx: &OpenTx, low: Option<SeqValue>) -> Result<(), Crash> {
        self.crash_here(Boundary::BeforeAppend)?;
        assert!(
            !self.store.plog.contains_key(&tx.offset),
            "offset {:?} handed out twice",
            tx.offset
        );
        let values: Vec<SeqValue> = tx
            .issued
            .iter()
            .map(|(&seq_id, &value)| SeqValue {
                key: NumberKey {
                    ws_id: tx.ws,
                    seq_id,
                },
                value,
            })
            .collect();
        for v in &values {
            assert!(
                v.value > self.store.truth(v.key),
                "{v:?} does not increase its sequence"
            );
        }
        let mut values = values;
        values.extend(low);
        self.store.plog.insert(tx.offset, values);
        self.crash_here(Boundary::AfterAppend)
    }

    fn apply(&mut self, op: Op) {
        let result = match op {
            Op::Start(ws) => self.start(WsId(ws)),
            Op::Next(i) => self.next(i),
            Op::Commit => self.commit(true),
            Op::CommitUnknown => self.commit(false),
            Op::CommitLow(i, crash) => self.commit_low(i, crash),
            Op::Abort => self.actualize(),
            Op::Flush => {
                if self.in_flight.is_some() {
                    self.flush_ack()
                } else {
                    self.flush_begin().map(|r| {
                        self.in_flight = r.flatten().map(|(ticket, values)| InFlight {
                            ticket,
                            values,
                            landed: true,
                        })
                    })
                }
            }
            Op::FlushSlow => {
                self.flush_slow();
                Ok(())
            }
            Op::Land => self.land(),
            Op::Ack => self.flush_ack(),
            Op::FailWrites(n) => {
                self.failing_writes = n;
                Ok(())
            }
            Op::Crash => Err(Crash),
            Op::CrashInFlush(b) => {
                self.plan = Some(WRITE_BOUNDARIES[b]);
                self.flush_begin().map(|_| ())
            }
            Op::CrashInCommit(b) => {
                self.plan = Some(APPEND_BOUNDARIES[b]);
                self.commit(true)
            }
        };
        self.plan = None;
        if result.is_err() {
            CRASH_POINTS.fetch_add(1, Ordering::Relaxed);
            self.recover();
        }
    }
}

// covers: Seq.CrashModel, Seq.FlushAtomic, Seq.Gapless, Seq.InitialFloor
#[test]
fn numbers_stay_gapless_and_unique_across_crashes_at_every_write_boundary() {
    // Rounds of random cases until enough crash points were checked (override the minimum with
    // SEQ_CRASH_POINTS for longer runs); the round count is bounded so the test always ends.
    let points_min: u64 = std::env::var("SEQ_CRASH_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CRASH_POINTS_MIN);
    const CASES_PER_ROUND: u32 = 256;
    const ROUNDS_MAX: u32 = 1_000;
    let started = std::time::Instant::now();
    let mut cases = 0u32;
    for _ in 0..ROUNDS_MAX {
        if CRASH_POINTS.load(Ordering::Relaxed) >= points_min {
            break;
        }
        let mut runner = TestRunner::new(Config {
            cases: CASES_PER_ROUND,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&proptest::collection::vec(op(), 1..160), |ops| {
            let mut w = World::new();
            for op in ops {
                w.apply(op);
            }
            w.recover();
            Ok(())
        });
        if let Err(e) = result {
            panic!("{e}");
        }
        cases += CASES_PER_ROUND;
    }
    let points = CRASH_POINTS.load(Ordering::Relaxed);
    // Written past the test harness's capture on purpose: CI logs show the figure.
    let _ = writeln!(
        std::io::stderr(),
        "sequencer crash model: {points} crash points checked in {cases} cases, {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        points >= points_min,
        "only {points} crash points checked in {ROUNDS_MAX} rounds"
    );
}
