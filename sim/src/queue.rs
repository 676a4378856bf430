//! The queue of future events of a simulation, earliest first.
//!
//! The heap orders small keys (time, rank, sequence number, slab index) and the events wait in
//! a slab beside it: a key moves through the heap without its event, so an event costs the same
//! however large it is. Events of one instant come out by rank, then in the order they were
//! pushed, which is what makes a run a function of its seed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Future events of type `E`.
#[derive(Debug)]
pub struct EventQueue<E> {
    /// `(time, rank, sequence number, slab index)`, earliest first.
    heap: BinaryHeap<Reverse<(u64, u8, u64, u32)>>,
    slab: Vec<Option<E>>,
    free: Vec<u32>,
    seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            slab: Vec::new(),
            free: Vec::new(),
            seq: 0,
        }
    }
}

impl<E> EventQueue<E> {
    /// Queues `event` at `at_ns`; of the events of one instant, those of a lower `rank` come
    /// out first.
    pub fn push(&mut self, at_ns: u64, rank: u8, event: E) {
        self.seq += 1;
        let index = match self.free.pop() {
            Some(index) => {
                self.slab[index as usize] = Some(event);
                index
            }
            None => {
                self.slab.push(Some(event));
                u32::try_from(self.slab.len() - 1).expect("fewer than 2^32 events queued")
            }
        };
        self.heap.push(Reverse((at_ns, rank, self.seq, index)));
    }

    /// When the earliest event is due.
    pub fn next_at_ns(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((at_ns, ..))| *at_ns)
    }

    /// The earliest event and its time.
    pub fn pop(&mut self) -> Option<(u64, E)> {
        let Reverse((at_ns, _, _, index)) = self.heap.pop()?;
        let event = self.slab[index as usize].take().expect("a queued event");
        self.free.push(index);
        Some((at_ns, event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_then_rank_then_push_order() {
        let mut queue = EventQueue::default();
        queue.push(5, 1, "late");
        queue.push(3, 1, "b");
        queue.push(3, 1, "c");
        queue.push(3, 0, "a");
        assert_eq!(queue.next_at_ns(), Some(3));
        let order: Vec<_> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(order, [(3, "a"), (3, "b"), (3, "c"), (5, "late")]);
        queue.push(1, 0, "again");
        assert_eq!(queue.pop(), Some((1, "again")));
        assert_eq!(queue.slab.len(), 4, "slots are reused");
    }
}
