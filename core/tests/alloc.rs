//! Handling an event allocates nothing. A counting global allocator watches every heap
//! allocation of this test binary while the machines handle events (construction may allocate).
//!
//! No test harness (`harness = false`): libtest's own thread would block on its result channel —
//! which allocates — at a moment of the scheduler's choosing, inside the measured window on a
//! loaded machine. Here the measuring thread is the only thread of the process.
#![allow(unsafe_code)] // a GlobalAlloc implementation is unsafe by definition; it only counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use core::time::Duration;

use vvm_core::*;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter has no effect
// on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

fn ms(ms: u64) -> Instant {
    Instant::from_nanos(ms * 1_000_000)
}

/// Drives a lifecycle through launch, lead, `rounds` renewals (with a failure, a retry and an
/// unknown outcome every few rounds) and shutdown; returns the number of events handled.
fn full_life(vvm: &mut Lifecycle, out: &mut Effects, rounds: u64) -> u64 {
    let mut events = 0;
    let mut handle = |vvm: &mut Lifecycle, out: &mut Effects, event: VvmEvent| {
        out.clear();
        vvm.handle(&event, out);
        events += 1;
    };
    let op_of = |out: &Effects| {
        out.iter()
            .find_map(|e| match *e {
                Effect::Insert { op, .. }
                | Effect::CompareAndSwap { op, .. }
                | Effect::CompareAndDelete { op, .. }
                | Effect::Get { op, .. } => Some(op),
                _ => None,
            })
            .expect("a store operation")
    };
    let timer_of = |out: &Effects| {
        out.iter()
            .find_map(|e| match *e {
                Effect::SetTimer { timer, .. } => Some(timer),
                _ => None,
            })
            .expect("a timer")
    };
    let mut now = 0;
    handle(vvm, out, VvmEvent::Launch { now: ms(now) });
    let op = op_of(out);
    handle(
        vvm,
        out,
        VvmEvent::Reply {
            now: ms(now),
            op,
            reply: Reply::Written(Revision(1)),
        },
    );
    let mut timer = timer_of(out);
    handle(vvm, out, VvmEvent::ServicesStarted { now: ms(now) });
    for round in 0..rounds {
        now += 5_000;
        let revision = Revision(2 * round + 2);
        handle(
            vvm,
            out,
            VvmEvent::Timer {
                now: ms(now),
                timer,
            },
        );
        let op = op_of(out);
        match round % 4 {
            0 => {
                handle(
                    vvm,
                    out,
                    VvmEvent::Reply {
                        now: ms(now),
                        op,
                        reply: Reply::Failed,
                    },
                );
                let retry = timer_of(out);
                now += 1_000;
                handle(
                    vvm,
                    out,
                    VvmEvent::Timer {
                        now: ms(now),
                        timer: retry,
                    },
                );
                let op = op_of(out);
                handle(
                    vvm,
                    out,
                    VvmEvent::Reply {
                        now: ms(now),
                        op,
                        reply: Reply::Written(revision),
                    },
                );
            }
            1 => {
                handle(
                    vvm,
                    out,
                    VvmEvent::Reply {
                        now: ms(now),
                        op,
                        reply: Reply::Unknown,
                    },
                );
                let get = op_of(out);
                let record = Record {
                    incarnation: Incarnation(1),
                    revision,
                };
                handle(
                    vvm,
                    out,
                    VvmEvent::Reply {
                        now: ms(now),
                        op: get,
                        reply: Reply::Found(Some(record)),
                    },
                );
                // Read back as ours: swapped again after the backoff, and that swap is confirmed.
                let retry = timer_of(out);
                now += 1_000;
                handle(
                    vvm,
                    out,
                    VvmEvent::Timer {
                        now: ms(now),
                        timer: retry,
                    },
                );
                let swap = op_of(out);
                handle(
                    vvm,
                    out,
                    VvmEvent::Reply {
                        now: ms(now),
                        op: swap,
                        reply: Reply::Written(Revision(revision.0 + 1)),
                    },
                );
            }
            _ => handle(
                vvm,
                out,
                VvmEvent::Reply {
                    now: ms(now),
                    op,
                    reply: Reply::Written(revision),
                },
            ),
        }
        timer = timer_of(out);
    }
    handle(vvm, out, VvmEvent::Shutdown { now: ms(now) });
    handle(
        vvm,
        out,
        VvmEvent::ServicesStopped {
            now: ms(now),
            clean: true,
        },
    );
    let op = op_of(out);
    handle(
        vvm,
        out,
        VvmEvent::Reply {
            now: ms(now),
            op,
            reply: Reply::Deleted,
        },
    );
    assert_eq!(vvm.phase(), Phase::Shutdown);
    events
}

fn main() {
    handling_events_allocates_nothing();
    println!("test handling_events_allocates_nothing ... ok");
    session_events_allocate_nothing();
    println!("test session_events_allocate_nothing ... ok");
}

/// Drives a session through open, attaching `holdings`, `rounds` keepalives (a failure and an
/// unknown outcome every few rounds), a loss, the detaches, a new open and a close; returns the
/// number of events handled.
fn session_life(
    session: &mut Session,
    out: &mut SessionEffects,
    holdings: u32,
    rounds: u64,
) -> u64 {
    let mut events = 0;
    let mut handle = |session: &mut Session, out: &mut SessionEffects, event: SessionEvent| {
        out.clear();
        session.handle(&event, out);
        events += 1;
    };
    let op_of = |out: &SessionEffects| {
        out.iter()
            .find_map(|e| match *e {
                SessionEffect::Create { op, .. }
                | SessionEffect::KeepAlive { op, .. }
                | SessionEffect::Delete { op, .. }
                | SessionEffect::Get { op, .. } => Some(op),
                _ => None,
            })
            .expect("a store call")
    };
    let timer_of = |out: &SessionEffects| {
        out.iter()
            .find_map(|e| match *e {
                SessionEffect::SetTimer { timer, .. } => Some(timer),
                _ => None,
            })
            .expect("a timer")
    };
    let reply = |now: u64, op: OpId, reply: Reply| SessionEvent::Reply {
        now: ms(now),
        op,
        reply,
    };
    let mut now = 0;
    let mut revision = 1;
    for life in 0..2 {
        handle(session, out, SessionEvent::Open { now: ms(now) });
        let op = op_of(out);
        handle(
            session,
            out,
            reply(now, op, Reply::Written(Revision(revision))),
        );
        let mut timer = timer_of(out);
        for holding in 0..holdings {
            let holding = HoldingId(holding);
            handle(
                session,
                out,
                SessionEvent::Attach {
                    now: ms(now),
                    holding,
                },
            );
        }
        for round in 0..rounds {
            now += 5_000;
            revision += 2;
            handle(
                session,
                out,
                SessionEvent::Timer {
                    now: ms(now),
                    timer,
                },
            );
            let op = op_of(out);
            let last = Reply::Written(Revision(revision));
            match round % 3 {
                0 => {
                    handle(session, out, reply(now, op, Reply::Failed));
                    let retry = timer_of(out);
                    now += 1_000;
                    handle(
                        session,
                        out,
                        SessionEvent::Timer {
                            now: ms(now),
                            timer: retry,
                        },
                    );
                    let op = op_of(out);
                    handle(session, out, reply(now, op, last));
                }
                1 => {
                    handle(session, out, reply(now, op, Reply::Unknown));
                    let get = op_of(out);
                    handle(session, out, reply(now, get, Reply::Failed));
                    let retry = timer_of(out);
                    now += 1_000;
                    handle(
                        session,
                        out,
                        SessionEvent::Timer {
                            now: ms(now),
                            timer: retry,
                        },
                    );
                    let op = op_of(out);
                    handle(session, out, reply(now, op, last));
                }
                _ => handle(session, out, reply(now, op, last)),
            }
            timer = timer_of(out);
        }
        now += 5_000;
        handle(
            session,
            out,
            SessionEvent::Timer {
                now: ms(now),
                timer,
            },
        );
        let op = op_of(out);
        if life == 0 {
            handle(session, out, reply(now, op, Reply::Rejected));
            assert!(session.is_lost());
        } else {
            handle(
                session,
                out,
                reply(now, op, Reply::Written(Revision(revision + 1))),
            );
        }
        for holding in 0..holdings {
            let holding = HoldingId(holding);
            handle(
                session,
                out,
                SessionEvent::Detach {
                    now: ms(now),
                    holding,
                },
            );
        }
        revision += 10;
    }
    handle(session, out, SessionEvent::Close { now: ms(now) });
    let op = op_of(out);
    handle(session, out, reply(now, op, Reply::Deleted));
    assert!(session.is_closed());
    events
}

// covers: Session.NoAllocation
fn session_events_allocate_nothing() {
    let lease = LeaseConfig::new(Duration::from_secs(20)).unwrap();
    let mut session = Session::new(lease, Incarnation(1));
    let mut out = SessionEffects::new();
    // The holdings' room is made at set-up, as a runtime sizes it for what it expects.
    session.reserve_holdings(1_000);

    let before = allocations();
    let events = session_life(&mut session, &mut out, 1_000, 500);
    let allocated = allocations() - before;

    assert!(events > 5_000, "{events} events");
    assert_eq!(allocated, 0, "{allocated} allocations over {events} events");
}

// covers: Lease.NoAllocation
fn handling_events_allocates_nothing() {
    let config = VvmConfig::builder("10.0.0.1:7000")
        .lease(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut vvm = Lifecycle::new(&config, Incarnation(1));
    let mut out = Effects::new();

    let before = allocations();
    let events = full_life(&mut vvm, &mut out, 1_000);
    let allocated = allocations() - before;

    assert!(events > 2_000, "{events} events");
    assert_eq!(allocated, 0, "{allocated} allocations over {events} events");

    // The counter is live: an allocation in the same window is seen.
    let before = allocations();
    let boxed = Box::new(events);
    assert!(
        allocations() > before,
        "the counting allocator counts ({boxed})"
    );
}
