//! The etcd store's change feed (`LeaseStore::changed`, one etcd watch per waiting future) on a
//! real 3-member cluster on loopback: what wakes a waiter, what does not, and that a dropped
//! waiter leaves no watcher behind on the server.
//!
//! "Does not wake" is checked over a window of a few hundred milliseconds: long enough for etcd
//! to deliver the event on loopback many times over, short enough for the suite. Every wait
//! that must end is bounded generously (a loaded machine), never timed.

use vvm_test_support::etcd as etcd_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use etcd_support::{store, three};
use vvm_adapters::etcd::cluster::EtcdCluster;
use vvm_adapters::etcd::EtcdStore;
use vvm_core::{Incarnation, Slot};
use vvm_runtime::{Lease, LeaseStore, LeaseValue, SlotChange};

const TTL: Duration = Duration::from_secs(30);
/// Bound of every wait that must end (a loaded machine).
const WAKE_LIMIT: Duration = Duration::from_secs(20);
/// How long a feed must stay quiet when nothing qualifying happened.
const QUIET: Duration = Duration::from_millis(700);
const SLOT: Slot = Slot(1);

fn value(address: &str, incarnation: u64) -> LeaseValue {
    LeaseValue {
        address: address.into(),
        incarnation: Incarnation(incarnation),
        stopping: false,
    }
}

async fn insert(store: &EtcdStore, slot: Slot, value: &LeaseValue) -> Lease {
    let revision = store
        .insert_if_not_exists(slot, value, TTL)
        .await
        .expect("the insert runs")
        .expect("the slot is free");
    Lease {
        value: value.clone(),
        revision,
    }
}

/// Whether `feed` resolves within `limit`; it stays usable when it did not.
async fn resolves_within(feed: &mut SlotChange, limit: Duration) -> bool {
    tokio::time::timeout(limit, feed).await.is_ok()
}

/// A store whose feed starts from a known revision: one read of the slot.
async fn waiter(cluster: &EtcdCluster, prefix: &str) -> EtcdStore {
    let waiter = store(cluster, prefix).await;
    waiter.get(SLOT).await.expect("the waiter reads the slot");
    waiter
}

/// etcd's count of watchers (`etcd_debugging_mvcc_watcher_total`) on each running member, from
/// its metrics endpoint (served on the client port).
fn watchers(cluster: &EtcdCluster) -> Vec<Option<u64>> {
    cluster
        .endpoints()
        .iter()
        .map(|endpoint| {
            let mut stream = TcpStream::connect(endpoint).ok()?;
            stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            write!(stream, "GET /metrics HTTP/1.0\r\nHost: {endpoint}\r\n\r\n").ok()?;
            let mut text = String::new();
            stream.read_to_string(&mut text).ok()?;
            let line = text
                .lines()
                .find(|line| line.starts_with("etcd_debugging_mvcc_watcher_total "))?;
            line.split_whitespace()
                .nth(1)?
                .parse::<f64>()
                .ok()
                .map(|count| count as u64)
        })
        .collect()
}

fn total(counts: &[Option<u64>]) -> u64 {
    counts.iter().flatten().sum()
}

/// Waits until the cluster counts `expected` watchers in all, at most [`WAKE_LIMIT`].
async fn await_watchers(cluster: &EtcdCluster, expected: u64) -> Vec<Option<u64>> {
    let deadline = tokio::time::Instant::now() + WAKE_LIMIT;
    loop {
        let counts = watchers(cluster);
        if total(&counts) == expected {
            return counts;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cluster counts {counts:?} watchers, not {expected} in all"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// covers: Et.Feed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_wakes_the_waiter() {
    let Some(cluster) = three("a_deletion_wakes_the_waiter").await else {
        return;
    };
    let holder = store(&cluster, "feed-delete/").await;
    let held = insert(&holder, SLOT, &value("a", 1)).await;
    let waiter = waiter(&cluster, "feed-delete/").await;

    let mut feed = waiter.changed(&[SLOT]);
    assert!(
        !resolves_within(&mut feed, QUIET).await,
        "nothing changed yet"
    );
    assert!(holder.compare_and_delete(SLOT, &held).await.unwrap());
    assert!(
        resolves_within(&mut feed, WAKE_LIMIT).await,
        "a released record wakes the waiter"
    );
    // The next feed starts after the event that woke the last one, even if the waiter made no
    // call since (e.g. its calls failed): it is not woken by the same deletion again.
    let mut again = waiter.changed(&[SLOT]);
    assert!(
        !resolves_within(&mut again, QUIET).await,
        "a deletion wakes once"
    );

    // A deletion between the call and the first poll is not missed either.
    let held = insert(&holder, SLOT, &value("a", 1)).await;
    waiter.get(SLOT).await.unwrap();
    let feed = waiter.changed(&[SLOT]);
    assert!(holder.compare_and_delete(SLOT, &held).await.unwrap());
    assert!(
        tokio::time::timeout(WAKE_LIMIT, feed).await.is_ok(),
        "a deletion right after the call wakes the waiter"
    );
}

// covers: Et.Feed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_holder_wakes_and_a_renewal_by_the_same_holder_does_not() {
    let Some(cluster) =
        three("another_holder_wakes_and_a_renewal_by_the_same_holder_does_not").await
    else {
        return;
    };
    let holder = store(&cluster, "feed-holder/").await;
    let a = value("a", 1);
    let mut held = insert(&holder, SLOT, &a).await;
    // A record of a slot nobody waits for, between the watched keys in key order.
    let other = insert(&holder, Slot(10), &value("x", 9)).await;
    let waiter = waiter(&cluster, "feed-holder/").await;

    let mut feed = waiter.changed(&[SLOT, Slot(2)]);
    for _ in 0..3 {
        held.revision = holder
            .compare_and_swap(SLOT, &held, &a, TTL)
            .await
            .unwrap()
            .expect("the holder renews");
    }
    assert!(holder.compare_and_delete(Slot(10), &other).await.unwrap());
    assert!(
        !resolves_within(&mut feed, QUIET).await,
        "renewals by the same holder and changes of other slots do not wake"
    );

    let b = value("b", 2);
    holder
        .compare_and_swap(SLOT, &held, &b, TTL)
        .await
        .unwrap()
        .expect("the record passes to another holder");
    assert!(
        resolves_within(&mut feed, WAKE_LIMIT).await,
        "a record of another holder wakes the waiter"
    );
}

// covers: Et.Feed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_past_the_start_revision_wakes() {
    let Some(cluster) = three("a_compaction_past_the_start_revision_wakes").await else {
        return;
    };
    let holder = store(&cluster, "feed-compact/").await;
    insert(&holder, SLOT, &value("a", 1)).await;
    // The waiter's last answer is from before the compaction: its feed starts there.
    let waiter = waiter(&cluster, "feed-compact/").await;

    let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("a plain client connects");
    let mut last = 0;
    for n in 0..5 {
        let put = raw
            .put("elsewhere", format!("{n}"), None)
            .await
            .expect("a put");
        last = put.header().map_or(0, |header| header.revision());
    }
    raw.compact(last, None).await.expect("the compaction runs");

    let feed = waiter.changed(&[SLOT]);
    assert!(
        tokio::time::timeout(WAKE_LIMIT, feed).await.is_ok(),
        "a feed whose start was compacted away cannot tell what happened, so it wakes"
    );

    // Once the waiter has looked again, its next feed starts past the compaction and is quiet.
    waiter.get(SLOT).await.unwrap();
    let mut feed = waiter.changed(&[SLOT]);
    assert!(!resolves_within(&mut feed, QUIET).await);
}

// covers: Et.Feed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_feed_leaves_no_watcher_on_the_server() {
    let Some(cluster) = three("a_dropped_feed_leaves_no_watcher_on_the_server").await else {
        return;
    };
    let holder = store(&cluster, "feed-drop/").await;
    insert(&holder, SLOT, &value("a", 1)).await;
    let waiter = waiter(&cluster, "feed-drop/").await;
    let before = total(&await_watchers(&cluster, total(&watchers(&cluster))).await);

    let mut feeds: Vec<SlotChange> = (0..8).map(|_| waiter.changed(&[SLOT])).collect();
    for feed in &mut feeds {
        assert!(!resolves_within(feed, Duration::from_millis(50)).await);
    }
    await_watchers(&cluster, before + 8).await;
    drop(feeds);
    await_watchers(&cluster, before).await;
}

// covers: Et.Feed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_member_the_feed_watches_on_wakes_and_later_deletions_still_wake() {
    let Some(mut cluster) =
        three("killing_the_member_the_feed_watches_on_wakes_and_later_deletions_still_wake").await
    else {
        return;
    };
    let holder = store(&cluster, "feed-kill/").await;
    let held = insert(&holder, SLOT, &value("a", 1)).await;
    let waiter = waiter(&cluster, "feed-kill/").await;
    let before = watchers(&cluster);

    let mut feed = waiter.changed(&[SLOT]);
    assert!(!resolves_within(&mut feed, Duration::from_millis(50)).await);
    let after = await_watchers(&cluster, total(&before) + 1).await;
    let member = (0..cluster.len())
        .find(|&member| after[member].unwrap_or(0) > before[member].unwrap_or(0))
        .expect("one member has the new watcher");
    cluster.kill(member).expect("the member is killed");
    let woke = resolves_within(&mut feed, WAKE_LIMIT).await;
    assert!(
        woke,
        "the feed of a killed member wakes: the state is unknown"
    );

    // A feed set up after the loss watches on a surviving member, and a deletion wakes it.
    // A feed that ended at once (its watch went to the dead member) is replaced.
    let mut established = None;
    for _ in 0..20 {
        waiter.get(SLOT).await.ok();
        let mut feed = waiter.changed(&[SLOT]);
        if !resolves_within(&mut feed, QUIET).await {
            established = Some(feed);
            break;
        }
    }
    let mut feed = established.expect("a feed is established on a surviving member");
    let mut deleted = false;
    for _ in 0..20 {
        // An attempt with an unknown outcome may have deleted it already: read back.
        let done = match holder.compare_and_delete(SLOT, &held).await {
            Ok(true) => true,
            Ok(false) => holder.get(SLOT).await.is_ok_and(|lease| lease.is_none()),
            Err(_) => false,
        };
        if done {
            deleted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(deleted, "the surviving members delete the record");
    assert!(
        resolves_within(&mut feed, WAKE_LIMIT).await,
        "a deletion after the member loss wakes the waiter"
    );
}
