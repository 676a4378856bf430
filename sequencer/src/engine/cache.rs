//! A least-recently-used map from [`NumberKey`] to the last number issued, of fixed capacity.
//!
//! All memory is taken at construction: the nodes live in one vector linked by indices, and the
//! index map is sized so that it never has to grow (see [`Cache::new`]). Lookups, updates and
//! evictions therefore never allocate.

use std::collections::HashMap;

use super::types::{KeyBuildHasher, Number, NumberKey};

/// No node. Never a valid index (the capacity stays below it), so `nodes.get(NIL)` is `None`:
/// one check covers both "no neighbour" and the bounds.
const NIL: u32 = u32::MAX;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Node {
    key: NumberKey,
    last: Number,
    prev: u32,
    next: u32,
}

/// The cache of last issued numbers. Most recently used first.
#[derive(Clone, Debug)]
pub struct Cache {
    index: HashMap<NumberKey, u32, KeyBuildHasher>,
    nodes: Vec<Node>,
    head: u32,
    tail: u32,
    capacity: usize,
}

impl PartialEq for Cache {
    fn eq(&self, other: &Self) -> bool {
        self.capacity == other.capacity && self.iter().eq(other.iter())
    }
}

impl Eq for Cache {}

impl Cache {
    /// A cache of at most `capacity` keys (at least 1, at most `u32::MAX - 1`).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, (NIL - 1) as usize);
        // Twice the capacity: the map then always rehashes in place when deletions have used up
        // its free slots, instead of reallocating (it reallocates only when more than half full).
        let index = HashMap::with_capacity_and_hasher(
            capacity.saturating_mul(2),
            KeyBuildHasher::default(),
        );
        Cache {
            index,
            nodes: Vec::with_capacity(capacity),
            head: NIL,
            tail: NIL,
            capacity,
        }
    }

    /// How many keys are cached.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The most keys kept.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The cached value of `key` without marking it used.
    pub fn peek(&self, key: &NumberKey) -> Option<Number> {
        self.index
            .get(key)
            .and_then(|&i| self.nodes.get(i as usize))
            .map(|n| n.last)
    }

    /// The cached value of `key`, marked most recently used, for reading and updating.
    #[inline]
    pub fn get_mut(&mut self, key: &NumberKey) -> Option<&mut Number> {
        self.get_mut_slot(key).map(|(_, last)| last)
    }

    /// As [`get_mut`](Self::get_mut), with the slot `key` occupies (see
    /// [`get_mut_at`](Self::get_mut_at)).
    #[inline]
    pub(crate) fn get_mut_slot(&mut self, key: &NumberKey) -> Option<(u32, &mut Number)> {
        let i = *self.index.get(key)?;
        self.touch(i);
        self.nodes.get_mut(i as usize).map(|n| (i, &mut n.last))
    }

    /// As [`get_mut`](Self::get_mut) without hashing, when `key` is still in `slot` (a slot an
    /// earlier call returned for it); `None` when it is not there (any more), whether or not it
    /// is cached elsewhere.
    #[inline]
    pub(crate) fn get_mut_at(&mut self, slot: u32, key: &NumberKey) -> Option<&mut Number> {
        // Every node below `len` holds a cached key, each key in one node only: a node holding
        // `key` is its entry.
        let node = self.nodes.get(slot as usize)?;
        if node.key != *key {
            return None;
        }
        if self.head != slot {
            let (prev, next) = (node.prev, node.next);
            self.unlink_between(prev, next);
            self.link_front(slot);
        }
        self.nodes.get_mut(slot as usize).map(|n| &mut n.last)
    }

    /// Sets `key` to `last` and marks it most recently used; evicts the least recently used
    /// key when full.
    #[inline]
    pub fn put(&mut self, key: NumberKey, last: Number) {
        self.put_slot(key, last);
    }

    /// As [`put`](Self::put); returns the slot `key` now occupies.
    pub(crate) fn put_slot(&mut self, key: NumberKey, last: Number) -> u32 {
        if let Some((i, v)) = self.get_mut_slot(&key) {
            *v = last;
            return i;
        }
        let i = if self.nodes.len() < self.capacity {
            self.nodes.push(Node {
                key,
                last,
                prev: NIL,
                next: NIL,
            });
            (self.nodes.len() - 1) as u32
        } else {
            let victim = self.tail;
            self.unlink(victim);
            let node = &mut self.nodes[victim as usize];
            self.index.remove(&node.key);
            node.key = key;
            node.last = last;
            victim
        };
        self.index.insert(key, i);
        self.link_front(i);
        debug_assert!(
            self.index.len() == self.nodes.len(),
            "index and nodes agree"
        );
        i
    }

    /// Forgets everything; keeps the memory.
    pub fn clear(&mut self) {
        self.index.clear();
        self.nodes.clear();
        self.head = NIL;
        self.tail = NIL;
    }

    /// Keys and values, most recently used first.
    pub fn iter(&self) -> impl Iterator<Item = (NumberKey, Number)> + '_ {
        let mut at = self.head;
        core::iter::from_fn(move || {
            let node = self.nodes.get(at as usize)?;
            at = node.next;
            Some((node.key, node.last))
        })
    }

    /// Marks node `i` (a linked node) most recently used.
    #[inline]
    fn touch(&mut self, i: u32) {
        if self.head != i {
            self.unlink(i);
            self.link_front(i);
        }
    }

    #[inline]
    fn unlink(&mut self, i: u32) {
        if let Some(&Node { prev, next, .. }) = self.nodes.get(i as usize) {
            self.unlink_between(prev, next);
        }
    }

    /// Links `prev` and `next`, the neighbours of a node being taken out of the list.
    #[inline]
    fn unlink_between(&mut self, prev: u32, next: u32) {
        match self.nodes.get_mut(prev as usize) {
            Some(p) => p.next = next,
            None => self.head = next, // prev is NIL
        }
        match self.nodes.get_mut(next as usize) {
            Some(n) => n.prev = prev,
            None => self.tail = prev, // next is NIL
        }
    }

    #[inline]
    fn link_front(&mut self, i: u32) {
        let old = self.head;
        if let Some(n) = self.nodes.get_mut(i as usize) {
            n.prev = NIL;
            n.next = old;
        }
        match self.nodes.get_mut(old as usize) {
            Some(o) => o.prev = i,
            None => self.tail = i, // old is NIL: the list was empty
        }
        self.head = i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::types::{SeqId, WsId};

    fn k(ws: u64) -> NumberKey {
        NumberKey {
            ws_id: WsId(ws),
            seq_id: SeqId(1),
        }
    }

    #[test]
    fn the_least_recently_used_key_is_evicted_first() {
        let mut c = Cache::new(3);
        c.put(k(1), Number(10));
        c.put(k(2), Number(20));
        c.put(k(3), Number(30));
        assert_eq!(c.get_mut(&k(1)).copied(), Some(Number(10)));
        c.put(k(4), Number(40));
        assert_eq!(c.peek(&k(2)), None, "2 was least recently used");
        let order: Vec<_> = c.iter().map(|(key, _)| key.ws_id.0).collect();
        assert_eq!(order, vec![4, 1, 3]);
        c.put(k(3), Number(31));
        assert_eq!(c.iter().next(), Some((k(3), Number(31))));
        assert_eq!(c.len(), 3);
        c.clear();
        assert!(c.is_empty());
        assert_eq!(c.peek(&k(3)), None);
    }

    #[test]
    fn a_slot_answers_only_for_the_key_it_still_holds() {
        let mut c = Cache::new(2);
        let s1 = c.put_slot(k(1), Number(10));
        let s2 = c.put_slot(k(2), Number(20));
        assert_eq!(c.get_mut_at(s1, &k(1)).copied(), Some(Number(10)));
        assert_eq!(c.get_mut_at(s1, &k(2)), None, "k(2) lives elsewhere");
        // k(2) is now least recently used: k(3) takes its slot.
        assert_eq!(c.put_slot(k(3), Number(30)), s2);
        assert_eq!(c.get_mut_at(s2, &k(2)), None, "evicted");
        *c.get_mut_at(s2, &k(3)).unwrap() = Number(31);
        let order: Vec<_> = c.iter().collect();
        assert_eq!(order, vec![(k(3), Number(31)), (k(1), Number(10))]);
        assert_eq!(c.get_mut_at(7, &k(1)), None, "no such slot");
        c.clear();
        assert_eq!(c.get_mut_at(s1, &k(1)), None, "cleared");
    }

    #[test]
    fn a_cache_of_one_keeps_only_the_last_key() {
        let mut c = Cache::new(1);
        c.put(k(1), Number(1));
        c.put(k(2), Number(2));
        assert_eq!(c.peek(&k(1)), None);
        assert_eq!(c.peek(&k(2)), Some(Number(2)));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn churn_through_many_keys_keeps_list_and_index_consistent() {
        let mut c = Cache::new(64);
        for i in 0..10_000u64 {
            c.put(k(i % 97), Number(i));
            if i % 3 == 0 {
                let _ = c.get_mut(&k(i % 89));
            }
        }
        assert_eq!(c.len(), 64);
        assert_eq!(c.iter().count(), 64);
        for (key, v) in c.iter() {
            assert_eq!(c.peek(&key), Some(v));
        }
    }
}
