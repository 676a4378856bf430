//! Feeds `N` events into a core machine and exits: a fixed workload for instruction counting
//! (`valgrind --tool=callgrind`), where setup cost cancels out between two values of `N`.
//!
//! `cargo run --release -p vvm-core --example core_events -- renewal 100000`
//! `cargo run --release -p vvm-core --example core_events -- running 100000`
//! `cargo run --release -p vvm-core --example core_events -- lifecycle 100000`

use std::process::ExitCode;
use std::time::Duration;

use vvm_core::*;

#[path = "../../benches/workloads/mod.rs"]
mod workloads;

use workloads::{full_lifecycle, store_op, timer};

/// `events / 2` renewals (timer + confirmed reply) of one lease.
fn renewal(events: u64) -> Option<u64> {
    let lease = LeaseConfig::new(Duration::from_secs(20)).ok()?;
    let mut machine = Leadership::new(lease, Incarnation(1));
    let mut out = Effects::new();
    let start = Instant::ZERO;
    machine.handle(
        &LeaseEvent::Acquire {
            now: start,
            slot: Slot(1),
        },
        &mut out,
    );
    let op = store_op(&out)?;
    out.clear();
    machine.handle(
        &LeaseEvent::Reply {
            now: start,
            op,
            reply: Reply::Written(Revision(1)),
        },
        &mut out,
    );
    let mut next = timer(&out)?;
    for round in 1..=events / 2 {
        let now = Instant::from_nanos(round * 5_000_000_000);
        out.clear();
        machine.handle(&LeaseEvent::Timer { now, timer: next }, &mut out);
        let op = store_op(&out)?;
        out.clear();
        machine.handle(
            &LeaseEvent::Reply {
                now,
                op,
                reply: Reply::Written(Revision(round + 1)),
            },
            &mut out,
        );
        next = timer(&out)?;
    }
    machine.token().map(|token| token.revision.0)
}

/// `events / 2` renewals (timer + confirmed reply) of a running VVM: the steady state of the
/// runtime's driver, every event passing through the lifecycle into the leadership.
fn running(events: u64) -> Option<u64> {
    let config = VvmConfig::builder("10.0.0.1:7000").build().ok()?;
    let mut vvm = Lifecycle::new(&config, Incarnation(1));
    let mut out = Effects::new();
    let start = Instant::ZERO;
    vvm.handle(&VvmEvent::Launch { now: start }, &mut out);
    let op = store_op(&out)?;
    out.clear();
    let written = Reply::Written(Revision(1));
    vvm.handle(
        &VvmEvent::Reply {
            now: start,
            op,
            reply: written,
        },
        &mut out,
    );
    let mut next = timer(&out)?;
    out.clear();
    vvm.handle(&VvmEvent::ServicesStarted { now: start }, &mut out);
    for round in 1..=events / 2 {
        let now = Instant::from_nanos(round * 5_000_000_000);
        out.clear();
        vvm.handle(&VvmEvent::Timer { now, timer: next }, &mut out);
        let op = store_op(&out)?;
        out.clear();
        let reply = Reply::Written(Revision(round + 1));
        vvm.handle(&VvmEvent::Reply { now, op, reply }, &mut out);
        next = timer(&out)?;
    }
    vvm.token().map(|token| token.revision.0)
}

/// `events / 6` whole lifecycles (launch, won, services up, shutdown, services down, released).
fn lifecycle(events: u64) -> Option<u64> {
    let config = VvmConfig::builder("10.0.0.1:7000").build().ok()?;
    let mut done = 0;
    for _ in 0..events / 6 {
        done += u64::from(full_lifecycle(&config)?.phase() == Phase::Shutdown);
    }
    Some(done)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let events: Option<u64> = args.get(2).and_then(|n| n.parse().ok());
    let result = match (args.get(1).map(String::as_str), events) {
        (Some("renewal"), Some(n)) => renewal(n),
        (Some("lifecycle"), Some(n)) => lifecycle(n),
        (Some("running"), Some(n)) => running(n),
        _ => {
            eprintln!("usage: core_events renewal|running|lifecycle EVENTS");
            return ExitCode::from(2);
        }
    };
    match result {
        Some(value) => {
            println!("{value}");
            ExitCode::SUCCESS
        }
        None => {
            eprintln!("the machine did not behave as the workload expects");
            ExitCode::FAILURE
        }
    }
}
