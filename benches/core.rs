//! Transition cost of the pure machines: steady-state renewals of `Leadership`, and a whole
//! `Lifecycle` from provide to shutdown. Reported per event (`Throughput::Elements`).
//!
//! Run: `cargo bench --bench core`. Instructions per event: `bash scripts/callgrind-core.sh`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use vvm_core::*;

mod workloads;

use workloads::{full_lifecycle, store_op, timer};

fn renewals(c: &mut Criterion) {
    let lease = LeaseConfig::new(Duration::from_secs(20)).unwrap();
    let mut machine = Leadership::new(lease, Incarnation(1));
    let mut out = Effects::new();
    let mut now_ns: u64 = 0;
    machine.handle(
        &LeaseEvent::Acquire {
            now: Instant::from_nanos(now_ns),
            slot: Slot(1),
        },
        &mut out,
    );
    let op = store_op(&out).expect("a store operation");
    out.clear();
    machine.handle(
        &LeaseEvent::Reply {
            now: Instant::from_nanos(now_ns),
            op,
            reply: Reply::Written(Revision(1)),
        },
        &mut out,
    );
    let mut next_timer = timer(&out).expect("a timer");
    let mut revision = 1;

    let mut group = c.benchmark_group("leadership");
    group.throughput(Throughput::Elements(2));
    group.bench_function("renewal (timer + confirmed reply)", |b| {
        b.iter(|| {
            now_ns += 5_000_000_000;
            revision += 1;
            let now = Instant::from_nanos(now_ns);
            out.clear();
            machine.handle(
                black_box(&LeaseEvent::Timer {
                    now,
                    timer: next_timer,
                }),
                &mut out,
            );
            let op = store_op(&out).expect("a store operation");
            out.clear();
            machine.handle(
                black_box(&LeaseEvent::Reply {
                    now,
                    op,
                    reply: Reply::Written(Revision(revision)),
                }),
                &mut out,
            );
            next_timer = timer(&out).expect("a timer");
        })
    });
    group.finish();
}

fn lifecycle(c: &mut Criterion) {
    let config = VvmConfig::builder("10.0.0.1:7000").build().unwrap();
    let mut group = c.benchmark_group("lifecycle");
    group.throughput(Throughput::Elements(6));
    group.bench_function("provide→launch→lead→shutdown (6 events)", |b| {
        b.iter(|| {
            let vvm = full_lifecycle(black_box(&config)).expect("the workload's life");
            assert_eq!(vvm.phase(), Phase::Shutdown);
            vvm
        })
    });
    group.finish();
}

/// A session kept alive with `holdings` attached: the cost of a keepalive must not depend on it.
fn session_keepalives(c: &mut Criterion) {
    let lease = LeaseConfig::new(Duration::from_secs(20)).unwrap();
    let mut group = c.benchmark_group("session");
    group.throughput(Throughput::Elements(2));
    for holdings in [0_u32, 100_000] {
        let mut session = Session::new(lease, Incarnation(1));
        session.reserve_holdings(holdings);
        let mut out = SessionEffects::new();
        let mut now_ns: u64 = 0;
        let op_of = |out: &SessionEffects| {
            out.iter().find_map(|effect| match *effect {
                SessionEffect::Create { op, .. } | SessionEffect::KeepAlive { op, .. } => Some(op),
                _ => None,
            })
        };
        let timer_of = |out: &SessionEffects| {
            out.iter().find_map(|effect| match *effect {
                SessionEffect::SetTimer { timer, .. } => Some(timer),
                _ => None,
            })
        };
        session.handle(
            &SessionEvent::Open {
                now: Instant::from_nanos(now_ns),
            },
            &mut out,
        );
        let op = op_of(&out).expect("a create");
        out.clear();
        session.handle(
            &SessionEvent::Reply {
                now: Instant::from_nanos(now_ns),
                op,
                reply: Reply::Written(Revision(1)),
            },
            &mut out,
        );
        let mut next_timer = timer_of(&out).expect("a timer");
        for holding in 0..holdings {
            out.clear();
            session.handle(
                &SessionEvent::Attach {
                    now: Instant::from_nanos(now_ns),
                    holding: HoldingId(holding),
                },
                &mut out,
            );
        }
        assert_eq!(session.holdings(), holdings);
        let mut revision = 1;
        group.bench_function(
            format!("keepalive (timer + confirmed reply), {holdings} holdings"),
            |b| {
                b.iter(|| {
                    now_ns += 5_000_000_000;
                    revision += 1;
                    let now = Instant::from_nanos(now_ns);
                    out.clear();
                    session.handle(
                        black_box(&SessionEvent::Timer {
                            now,
                            timer: next_timer,
                        }),
                        &mut out,
                    );
                    let op = op_of(&out).expect("a keepalive");
                    out.clear();
                    session.handle(
                        black_box(&SessionEvent::Reply {
                            now,
                            op,
                            reply: Reply::Written(Revision(revision)),
                        }),
                        &mut out,
                    );
                    next_timer = timer_of(&out).expect("a timer");
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, renewals, lifecycle, session_keepalives);
criterion_main!(benches);
