//! Workloads shared by the criterion benchmark (`benches/core.rs`) and the instruction-counting
//! driver (`core/examples/core_events.rs`), so that both measure exactly the same event sequences.

use vvm_core::*;

/// The store operation among `out`, if any.
pub fn store_op(out: &Effects) -> Option<OpId> {
    out.iter().find_map(|e| match *e {
        Effect::Insert { op, .. }
        | Effect::CompareAndSwap { op, .. }
        | Effect::CompareAndDelete { op, .. }
        | Effect::Get { op, .. } => Some(op),
        _ => None,
    })
}

/// The timer set among `out`, if any.
pub fn timer(out: &Effects) -> Option<TimerId> {
    out.iter().find_map(|e| match *e {
        Effect::SetTimer { timer, .. } => Some(timer),
        _ => None,
    })
}

/// Provide, launch, win slot 1, services up, shut down, release: 6 events. `None` when the
/// machine does not behave as the workload expects.
pub fn full_lifecycle(config: &VvmConfig) -> Option<Lifecycle> {
    let mut vvm = Lifecycle::new(config, Incarnation(1));
    let mut out = Effects::new();
    let now = Instant::from_nanos(1);
    vvm.handle(&VvmEvent::Launch { now }, &mut out);
    let op = store_op(&out)?;
    out.clear();
    let reply = Reply::Written(Revision(1));
    vvm.handle(&VvmEvent::Reply { now, op, reply }, &mut out);
    out.clear();
    vvm.handle(&VvmEvent::ServicesStarted { now }, &mut out);
    out.clear();
    vvm.handle(&VvmEvent::Shutdown { now }, &mut out);
    out.clear();
    vvm.handle(&VvmEvent::ServicesStopped { now, clean: true }, &mut out);
    let op = store_op(&out)?;
    out.clear();
    let reply = Reply::Deleted;
    vvm.handle(&VvmEvent::Reply { now, op, reply }, &mut out);
    Some(vvm)
}
