//! A least-recently-used map from [`NumberKey`] to the last number issued, of fixed capacity.
//!
//! All memory is taken at construction: the nodes live in one vector linked by indices, and the
//! index map is sized so that it never has to grow (see [`Cache::new`]). Lookups, updates and
//! evictions therefore never allocate.

use std::collections::HashMap;

use super::types::{KeyBuildHasher, Number, NumberKey};

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
        let i = *self.index.get(key)?;
        self.touch(i);
        self.nodes.get_mut(i as usize).map(|n| &mut n.last)
    }

    /// Sets `key` to `last` and marks it most recently used; evicts the least recently used
    /// key when full.
    pub fn put(&mut self, key: NumberKey, last: Number) {
        if let Some(v) = self.get_mut(&key) {
            *v = last;
            return;
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

    #[inline]
    fn touch(&mut self, i: u32) {
        if self.head != i {
            self.unlink(i);
            self.link_front(i);
        }
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let n = &self.nodes[i as usize];
            (n.prev, n.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.nodes[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.nodes[n as usize].prev = prev,
        }
    }

    fn link_front(&mut self, i: u32) {
        let old = self.head;
        {
            let n = &mut self.nodes[i as usize];
            n.prev = NIL;
            n.next = old;
        }
        match old {
            NIL => self.tail = i,
            o => self.nodes[o as usize].prev = i,
        }
        self.head = i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sequencer::types::{SeqId, WsId};

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
