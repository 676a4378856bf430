//! Every public way to hold a slot, driven through the same scenarios, written once: the memory
//! store, tokio's paused clock, a recording killer. The lease is 20 s for every way.
//!
//! The ways:
//!
//! - `lease`: a [`Vvm`] on a per-slot lease (`Vvm::provide` … `launch` … `shutdown`);
//! - `session`: a [`Vvm`] whose slot is a holding of its own session (`Vvm::provide_on_session`);
//! - `elections`: [`Elections`], the slot held on the handle's session, no services around it;
//! - `semaphore`: a [`Coordination`] semaphore of limit 1, its services run by
//!   `SemaphoreGrant::serve`.
//!
//! What the user sees as *acting*: the services running, for the three ways that run them (from
//! the start of a service until it is asked to stop or told of a loss); for `elections`, the
//! slot's tenure being `Held`. Every change of it is sampled ([`Stage`]): at each service start
//! and stop, at each change of the tenures, at each step of a scenario and every 100 ms between.
//! Two contenders acting at once is an overlap, and every scenario ends by finding none.
//!
//! Each contender sees the shared memory store through a wrapper of its own ([`Cut`]), so that
//! one of them can be cut off from the store (every call of it fails) while the other is not.
//!
//! | scenario | lease | session | elections | semaphore |
//! |---|---|---|---|---|
//! | 1. two contenders → one holds | waits in `launch` | waits in `launch` | the caller's loop of one-shot `acquire`s, woken by the change feed | queued `acquire` |
//! | 2. graceful release → the other holds | `shutdown` | `shutdown` | `release` | the stop of `serve` (releases after the services stopped) |
//! | 2b. the holder dropped without a release → the other holds | `Vvm<Launched>` dropped | `Vvm<Launched>` dropped | `Elections` dropped | the future of `serve` dropped |
//! | 3. holder cut off from the store → stops acting before its record could expire | the slot's record | the slot's holding record, which lives as long as the session's | the slot's holding record, as for `session` | the session's record |
//! | 4. the holding's record removed from outside → the holder stops, then the successor | the slot's record | the slot's holding record | the slot's holding record | the session's record: a grant is an owner entry of the semaphore's record, with no record of its own the memory store could remove |
//! | 5. an acquire given up leaves nothing held | `launch` dropped | `launch` dropped | the loop (and its `acquire`) dropped | `acquire` dropped |
//! | 6. fencing tokens rise across hand-offs | the record's revision | the holding's revision | the holding's revision | the semaphore's generation (slot 0) |

use vvm_test_support as common;

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::faulty::{Call, Fault, Faulty, Hook};
use common::{pass, TestKiller, LEASE};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use vvm_adapters::MemoryStore;
use vvm_core::{FencingToken, Incarnation, LeaseConfig, Slot, VvmConfig};
use vvm_runtime::{
    AcquireOptions, Coordination, CoordinationError, Elections, Launched, LeaseStore, LeaseValue,
    ServeError, ServeTimeouts, Service, ServiceContext, ServiceError, Services, SessionHandle,
    SessionStore, Tenure, Vvm,
};

/// The slot every slot-holding way holds.
const SLOT: Slot = Slot(1);
/// The semaphore of limit 1 the `semaphore` way holds.
const NAME: &str = "work";
/// How often the stage is sampled between the events that sample it anyway.
const TICK: Duration = Duration::from_millis(100);

/// A public way to hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Lease,
    Session,
    Elections,
    Semaphore,
}

/// Cuts one contender off the store: while set, every call it makes fails.
#[derive(Clone, Default)]
struct Cut(Arc<AtomicBool>);

impl Hook for Cut {
    fn fault(&self, _call: Call) -> Fault {
        match self.0.load(Ordering::SeqCst) {
            true => Fault::Fail,
            false => Fault::None,
        }
    }
}

type Store = Faulty<Cut>;

/// Whether one holder acts now, as its user sees it.
type Probe = Box<dyn Fn() -> bool + Send + Sync>;

struct Actor {
    name: String,
    probe: Probe,
    acting: bool,
    started: Option<Duration>,
    stopped: Option<Duration>,
}

struct StageState {
    begin: Instant,
    actors: Vec<Actor>,
    overlaps: Vec<String>,
}

/// Every holder of one scenario and when each acted, sampled at every change.
#[derive(Clone)]
struct Stage(Arc<Mutex<StageState>>);

impl Stage {
    /// A stage sampled every [`TICK`] besides the events that sample it.
    fn new() -> Stage {
        let stage = Stage(Arc::new(Mutex::new(StageState {
            begin: Instant::now(),
            actors: Vec::new(),
            overlaps: Vec::new(),
        })));
        let sampled = stage.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(TICK).await;
                sampled.check();
            }
        });
        stage
    }

    fn add(&self, name: String, probe: Probe) {
        self.0.lock().unwrap().actors.push(Actor {
            name,
            probe,
            acting: false,
            started: None,
            stopped: None,
        });
        self.check();
    }

    /// Samples every holder; two acting at once is an overlap.
    fn check(&self) {
        let mut state = self.0.lock().unwrap();
        let at = state.begin.elapsed();
        for actor in &mut state.actors {
            let acting = (actor.probe)();
            if acting && !actor.acting {
                actor.started.get_or_insert(at);
            }
            if !acting && actor.acting {
                actor.stopped = Some(at);
            }
            actor.acting = acting;
        }
        let acting: Vec<String> = state
            .actors
            .iter()
            .filter(|actor| actor.acting)
            .map(|actor| actor.name.clone())
            .collect();
        if acting.len() > 1 {
            state
                .overlaps
                .push(format!("at {at:?}: {acting:?} act at once"));
        }
    }

    /// The holders acting now.
    fn acting(&self) -> Vec<String> {
        self.check();
        let state = self.0.lock().unwrap();
        state
            .actors
            .iter()
            .filter(|actor| actor.acting)
            .map(|actor| actor.name.clone())
            .collect()
    }

    /// When `name` started acting, and when it stopped last (from the stage's beginning).
    fn span(&self, name: &str) -> (Option<Duration>, Option<Duration>) {
        self.check();
        let state = self.0.lock().unwrap();
        let actor = state
            .actors
            .iter()
            .find(|actor| actor.name == name)
            .expect("a holder of this stage");
        (actor.started, actor.stopped)
    }

    fn now(&self) -> Duration {
        self.0.lock().unwrap().begin.elapsed()
    }

    /// Fails the test if two holders ever acted at once.
    fn assert_no_overlap(&self, way: Way) {
        self.check();
        let overlaps = self.0.lock().unwrap().overlaps.clone();
        assert!(overlaps.is_empty(), "{way:?}: {overlaps:?}");
    }
}

/// Acts from its start until it is asked to stop or told of a loss.
struct Acts {
    acting: Arc<AtomicBool>,
    stage: Stage,
}

impl Service for Acts {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("acts")
    }

    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        self.acting.store(true, Ordering::SeqCst);
        self.stage.check();
        context.ready();
        let mut shutdown = context.shutdown();
        let mut lost = context.lost();
        let asked = tokio::select! {
            () = shutdown.requested() => true,
            () = lost.occurred() => false,
        };
        self.acting.store(false, Ordering::SeqCst);
        self.stage.check();
        if !asked {
            shutdown.requested().await;
        }
        Ok(())
    }
}

/// One process contending for the slot (or the semaphore) in one way.
struct Contender {
    way: Way,
    name: &'static str,
    n: u64,
    store: Store,
    stage: Stage,
    killer: TestKiller,
    holds: AtomicU64,
}

/// What a holder holds, by way.
enum Kind {
    Vvm(Vvm<Launched>),
    Elections(Elections),
    Grant {
        stop: oneshot::Sender<()>,
        serving: JoinHandle<Result<(), ServeError>>,
        coordination: Coordination<Store>,
    },
}

/// A holding: its fencing token, its name on the stage, and what holds it.
struct Held {
    token: FencingToken,
    actor: String,
    kind: Kind,
}

fn lease() -> LeaseConfig {
    LeaseConfig::new(LEASE).unwrap()
}

impl Contender {
    fn new(way: Way, name: &'static str, n: u64, memory: &MemoryStore, stage: &Stage) -> Self {
        Contender {
            way,
            name,
            n,
            store: Faulty {
                store: memory.clone(),
                hook: Cut::default(),
            },
            stage: stage.clone(),
            killer: TestKiller::new(),
            holds: AtomicU64::new(0),
        }
    }

    fn address(&self) -> String {
        format!("10.0.0.{}:7000", self.n)
    }

    /// Cuts the contender off the store, or joins it again.
    fn cut(&self, cut: bool) {
        self.store.hook.0.store(cut, Ordering::SeqCst);
    }

    /// A new holder's name on the stage and the flag its services set.
    fn actor(&self) -> String {
        let hold = self.holds.fetch_add(1, Ordering::SeqCst) + 1;
        format!("{}#{hold}", self.name)
    }

    fn acting_services(&self, actor: &str) -> Services {
        let acting = Arc::new(AtomicBool::new(false));
        let probe = acting.clone();
        self.stage.add(
            actor.to_owned(),
            Box::new(move || probe.load(Ordering::SeqCst)),
        );
        Services::new()
            .with(Acts {
                acting,
                stage: self.stage.clone(),
            })
            .unwrap()
    }

    /// Holds, waiting as long as it takes; returns once the holder acts.
    async fn hold(&self) -> Held {
        let actor = self.actor();
        let config = VvmConfig::builder(self.address())
            .slots(1)
            .lease(LEASE)
            .round_interval(Duration::from_secs(1))
            .acquire_forever()
            .build()
            .unwrap();
        let (token, kind) = match self.way {
            Way::Lease | Way::Session => {
                let services = self.acting_services(&actor);
                let provided = match self.way {
                    Way::Lease => Vvm::provide(config, self.store.clone(), services),
                    _ => Vvm::provide_on_session(config, self.store.clone(), services),
                };
                let vvm = provided
                    .unwrap()
                    .with_killer(self.killer.thread.clone())
                    .launch()
                    .await;
                let token = vvm.token().expect("launched: holds");
                (token, Kind::Vvm(vvm))
            }
            Way::Elections => {
                let elections = Elections::start(
                    self.store.clone(),
                    &self.address(),
                    lease(),
                    &self.killer.thread,
                )
                .unwrap();
                let tenures = elections.watch();
                self.stage.add(
                    actor.clone(),
                    Box::new(move || matches!(tenures.borrow().get(SLOT), Tenure::Held(_))),
                );
                let (mut changes, stage) = (elections.watch(), self.stage.clone());
                tokio::spawn(async move {
                    while changes.changed().await.is_ok() {
                        stage.check();
                    }
                });
                let token = loop {
                    // Created before the try, so that a change during it is not missed.
                    let change = self.store.store.changed(&[SLOT]);
                    if let Ok(token) = elections.acquire(SLOT).await {
                        break token;
                    }
                    tokio::select! {
                        () = change => {}
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                };
                (token, Kind::Elections(elections))
            }
            Way::Semaphore => {
                let hold = self.holds.load(Ordering::SeqCst);
                let value = LeaseValue::new(self.address(), Incarnation(self.n * 1_000 + hold));
                let session =
                    SessionHandle::open(self.store.clone(), lease(), value, &self.killer.thread)
                        .await
                        .expect("the session opens");
                let coordination = Coordination::new(session);
                match coordination.create(NAME, 1, Vec::new()).await {
                    // Made by another contender already.
                    Ok(()) | Err(CoordinationError::Refused(_)) => {}
                    Err(error) => panic!("{error}"),
                }
                let grant = coordination
                    .acquire(NAME, AcquireOptions::new(1))
                    .await
                    .unwrap()
                    .expect("no timeout: granted in the end");
                let token = grant.token();
                let services = self.acting_services(&actor);
                let (stop, stopped) = oneshot::channel::<()>();
                let serving =
                    tokio::spawn(grant.serve(services, ServeTimeouts::default(), async move {
                        let _ = stopped.await;
                    }));
                let kind = Kind::Grant {
                    stop,
                    serving,
                    coordination,
                };
                (token, kind)
            }
        };
        let held = Held { token, actor, kind };
        // The services may start a moment after the grant.
        for _ in 0..100 {
            if self.stage.acting().contains(&held.actor) {
                return held;
            }
            pass(Duration::from_millis(1)).await;
        }
        panic!("{:?}: {} holds but does not act", self.way, held.actor);
    }

    /// [`hold`](Self::hold) in a task of its own.
    fn contend(self: &Arc<Self>) -> JoinHandle<Held> {
        let contender = self.clone();
        tokio::spawn(async move { contender.hold().await })
    }

    /// Releases gracefully; the release must be clean.
    async fn release(&self, held: Held) {
        match held.kind {
            Kind::Vvm(vvm) => vvm.shutdown().await.expect("a clean shutdown"),
            Kind::Elections(elections) => {
                elections.release(SLOT).await.expect("released");
                elections.cleanup().await;
            }
            Kind::Grant {
                stop,
                serving,
                coordination,
            } => {
                let _ = stop.send(());
                serving.await.unwrap().expect("a clean stop and release");
                coordination.session().close().await.expect("closed");
            }
        }
        assert!(
            !self.stage.acting().contains(&held.actor),
            "{:?}: {} acts after its release",
            self.way,
            held.actor
        );
    }

    /// Ends a holder that lost its holding (whatever it reports: it lost).
    async fn end(&self, held: Held) {
        match held.kind {
            Kind::Vvm(vvm) => {
                let _ = vvm.shutdown().await;
            }
            Kind::Elections(elections) => {
                let _ = elections.release_all().await;
                elections.cleanup().await;
            }
            Kind::Grant { stop, serving, .. } => {
                let _ = stop.send(());
                let _ = serving.await.unwrap();
            }
        }
    }

    /// Removes the holding's record from outside, as an operator would.
    async fn remove_from_outside(&self, held: &Held) {
        let memory = &self.store.store;
        match &held.kind {
            Kind::Vvm(_) | Kind::Elections(_) => assert!(memory.delete(SLOT), "a live record"),
            Kind::Grant { coordination, .. } => {
                let key = coordination.session().key();
                let record = memory.get_session(key).await.unwrap().expect("live");
                assert!(memory.delete_session(key, record.revision).await.unwrap());
            }
        }
    }

    /// Whether the record that keeps the holding alive for everyone else is still live.
    async fn record_live(&self, held: &Held) -> bool {
        let memory = &self.store.store;
        match &held.kind {
            Kind::Vvm(_) | Kind::Elections(_) => memory
                .record(SLOT)
                .unwrap()
                .is_some_and(|record| record.value.address == self.address()),
            Kind::Grant { coordination, .. } => {
                let key = coordination.session().key();
                memory.get_session(key).await.unwrap().is_some()
            }
        }
    }
}

/// A scenario's stage, store and two contenders `a` and `b`.
fn cast(way: Way) -> (Stage, MemoryStore, Arc<Contender>, Arc<Contender>) {
    let (stage, memory) = (Stage::new(), MemoryStore::new());
    let a = Arc::new(Contender::new(way, "a", 1, &memory, &stage));
    let b = Arc::new(Contender::new(way, "b", 2, &memory, &stage));
    (stage, memory, a, b)
}

/// Waits up to `within` for a contending task to hold.
async fn holds_within(way: Way, task: JoinHandle<Held>, within: Duration) -> Held {
    tokio::time::timeout(within, task)
        .await
        .unwrap_or_else(|_| panic!("{way:?}: not held within {within:?}"))
        .unwrap()
}

/// Scenario 1: Two contenders: exactly one holds, the other waits; it holds once the first
/// released.
async fn two_contenders_one_holds(way: Way) {
    let (stage, _memory, a, b) = cast(way);
    let (first, second) = (a.contend(), b.contend());
    pass(LEASE / 4).await;
    assert_eq!(stage.acting().len(), 1, "{way:?}: {:?} act", stage.acting());
    assert!(
        first.is_finished() != second.is_finished(),
        "{way:?}: exactly one holds"
    );
    let (holder, waiting, holder_task, waiting_task) = match first.is_finished() {
        true => (&a, &b, first, second),
        false => (&b, &a, second, first),
    };
    let held = holder_task.await.unwrap();
    pass(LEASE).await;
    assert!(!waiting_task.is_finished(), "{way:?}: both hold");
    holder.release(held).await;
    let next = holds_within(way, waiting_task, LEASE / 4).await;
    waiting.release(next).await;
    stage.assert_no_overlap(way);
}

/// Scenario 2: A graceful release hands the holding to the waiting contender, never to both at
/// once, with a higher fencing token.
async fn a_release_hands_over_without_overlap(way: Way) {
    let (stage, _memory, a, b) = cast(way);
    let held = a.hold().await;
    let waiting = b.contend();
    pass(LEASE / 4).await;
    assert_eq!(stage.acting(), std::slice::from_ref(&held.actor), "{way:?}");
    let token = held.token;
    a.release(held).await;
    let next = holds_within(way, waiting, LEASE / 4).await;
    assert!(
        next.token.revision > token.revision,
        "{way:?}: {token} then {}",
        next.token
    );
    b.release(next).await;
    stage.assert_no_overlap(way);
}

/// Scenario 2b: A holder dropped without a release (its handle, or for a grant the future of
/// `serve`) hands over as a release does: in the background, never to both at once.
async fn a_dropped_holder_hands_over_without_overlap(way: Way) {
    let (stage, _memory, a, b) = cast(way);
    let held = a.hold().await;
    let (actor, token) = (held.actor.clone(), held.token);
    let waiting = b.contend();
    pass(LEASE / 4).await;
    if let Kind::Grant { serving, .. } = &held.kind {
        // The future of `serve` dropped, as by its caller's `select!` or timeout.
        serving.abort();
    }
    drop(held);
    let next = holds_within(way, waiting, LEASE / 4).await;
    assert!(
        !stage.acting().contains(&actor),
        "{way:?}: the dropped holder acts on"
    );
    assert!(
        next.token.revision > token.revision,
        "{way:?}: {token} then {}",
        next.token
    );
    b.release(next).await;
    stage.assert_no_overlap(way);
}

/// Scenario 3: A holder cut off from the store stops acting before the record that keeps it alive
/// for the others could expire; the waiting contender holds after that, with a higher token.
async fn a_holder_cut_off_stops_before_its_record_expires(way: Way) {
    let (stage, _memory, a, b) = cast(way);
    let held = a.hold().await;
    let waiting = b.contend();
    pass(LEASE / 4).await;
    a.cut(true);
    let cut_at = stage.now();
    let gone_at = loop {
        if !a.record_live(&held).await {
            break stage.now();
        }
        assert!(
            stage.now() - cut_at < LEASE * 2,
            "{way:?}: the record lives on"
        );
        pass(TICK).await;
    };
    let (_, stopped) = stage.span(&held.actor);
    let stopped = stopped.unwrap_or_else(|| panic!("{way:?}: still acts, its record expired"));
    assert!(
        stopped < gone_at,
        "{way:?}: stopped at {stopped:?}, the record expired at {gone_at:?}"
    );
    let next = holds_within(way, waiting, LEASE).await;
    assert!(
        next.token.revision > held.token.revision,
        "{way:?}: {} then {}",
        held.token,
        next.token
    );
    assert_eq!(stage.acting(), std::slice::from_ref(&next.actor), "{way:?}");
    a.cut(false);
    a.end(held).await;
    b.release(next).await;
    stage.assert_no_overlap(way);
}

/// Scenario 4: The holding's record removed from outside: the holder stops acting, and the waiting
/// contender acts only after it stopped.
async fn a_record_removed_from_outside_stops_the_holder_first(way: Way) {
    let (stage, _memory, a, b) = cast(way);
    let held = a.hold().await;
    let waiting = b.contend();
    pass(LEASE / 4).await;
    a.remove_from_outside(&held).await;
    let next = holds_within(way, waiting, LEASE * 2).await;
    let (_, stopped) = stage.span(&held.actor);
    let (started, _) = stage.span(&next.actor);
    let stopped = stopped.unwrap_or_else(|| panic!("{way:?}: the holder still acts"));
    assert!(
        stopped <= started.expect("acts"),
        "{way:?}: {stopped:?} / {started:?}"
    );
    assert!(
        next.token.revision > held.token.revision,
        "{way:?}: {} then {}",
        held.token,
        next.token
    );
    a.end(held).await;
    b.release(next).await;
    stage.assert_no_overlap(way);
}

/// Scenario 5: A caller that gives up its acquire — while waiting, or `yields` polls after the
/// holder released — leaves nothing held: a third contender holds at once.
async fn an_acquire_given_up_leaves_nothing_held(way: Way) {
    for yields in [None, Some(0), Some(1), Some(2), Some(4), Some(8), Some(16)] {
        let (stage, memory, a, b) = cast(way);
        let held = a.hold().await;
        let waiting = b.contend();
        pass(LEASE / 4).await;
        match yields {
            None => {
                waiting.abort();
                a.release(held).await;
            }
            Some(yields) => {
                let releasing = tokio::spawn({
                    let a = a.clone();
                    async move { a.release(held).await }
                });
                for _ in 0..yields {
                    tokio::task::yield_now().await;
                }
                waiting.abort();
                releasing.await.unwrap();
            }
        }
        // A hold that completed before the abort is dropped with the task: given up too.
        drop(waiting.await);
        let c = Arc::new(Contender::new(way, "c", 3, &memory, &stage));
        let third = c.contend();
        let next = holds_within(way, third, LEASE / 4).await;
        assert_eq!(
            stage.acting(),
            std::slice::from_ref(&next.actor),
            "{way:?}, {yields:?} yields"
        );
        c.release(next).await;
        stage.assert_no_overlap(way);
    }
}

/// Scenario 6: Fencing tokens rise strictly across every kind of hand-off: a release, a record
/// removed from outside, a holder cut off from the store.
async fn fencing_tokens_rise_across_hand_offs(way: Way) {
    let (stage, _memory, a, b) = cast(way);
    let mut tokens = Vec::new();
    let held = a.hold().await;
    tokens.push(held.token);
    let waiting = b.contend();
    pass(LEASE / 4).await;
    a.release(held).await;
    let held = holds_within(way, waiting, LEASE).await;
    tokens.push(held.token);

    let waiting = a.contend();
    pass(LEASE / 4).await;
    b.remove_from_outside(&held).await;
    let next = holds_within(way, waiting, LEASE * 2).await;
    tokens.push(next.token);
    b.end(held).await;

    let waiting = b.contend();
    pass(LEASE / 4).await;
    a.cut(true);
    let last = holds_within(way, waiting, LEASE * 2).await;
    tokens.push(last.token);
    a.cut(false);
    a.end(next).await;
    b.release(last).await;

    assert!(
        tokens
            .windows(2)
            .all(|pair| pair[0].revision < pair[1].revision),
        "{way:?}: {tokens:?}"
    );
    stage.assert_no_overlap(way);
}

/// The way a test function's name stands for.
fn way(name: &str) -> Way {
    match name {
        "lease" => Way::Lease,
        "session" => Way::Session,
        "elections" => Way::Elections,
        "semaphore" => Way::Semaphore,
        _ => unreachable!("a way of `every_way!`"),
    }
}

/// One test per way listed for a scenario, named after the way.
macro_rules! every_way {
    ($($scenario:ident: $($way:ident),+;)*) => {$(
        mod $scenario {
            $(
                #[tokio::test(start_paused = true)]
                async fn $way() {
                    super::$scenario(super::way(stringify!($way))).await;
                }
            )+
        }
    )*};
}

every_way! {
    // covers: Rt.WaysToHold
    two_contenders_one_holds: lease, session, elections, semaphore;
    // covers: Rt.WaysToHold
    a_release_hands_over_without_overlap: lease, session, elections, semaphore;
    // covers: Rt.WaysToHold
    a_dropped_holder_hands_over_without_overlap: lease, session, elections, semaphore;
    // covers: Rt.WaysToHold
    a_holder_cut_off_stops_before_its_record_expires: lease, session, elections, semaphore;
    // covers: Rt.WaysToHold
    a_record_removed_from_outside_stops_the_holder_first: lease, session, elections, semaphore;
    // covers: Rt.WaysToHold
    an_acquire_given_up_leaves_nothing_held: lease, session, elections, semaphore;
    // covers: Rt.WaysToHold
    fencing_tokens_rise_across_hand_offs: lease, session, elections, semaphore;
}
