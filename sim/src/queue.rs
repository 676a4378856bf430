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

/// A place in the order of the events of one instant, taken by [`EventQueue::reserve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(u64);

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
    /// out first, then those pushed (or reserved) first.
    pub fn push(&mut self, at_ns: u64, rank: u8, event: E) {
        let ticket = self.reserve();
        self.push_reserved(at_ns, rank, ticket, event);
    }

    /// Takes the place in the order of one instant that an event pushed now would get, for an
    /// event that may be pushed later ([`push_reserved`](Self::push_reserved)) or never: a run
    /// that decides later whether an event is needed stays the run that pushed it at once.
    pub fn reserve(&mut self) -> Ticket {
        self.seq += 1;
        Ticket(self.seq)
    }

    /// Queues `event` at `at_ns` in the place `ticket` reserved. Pushed no later than `at_ns`,
    /// it comes out exactly when it would have had it been pushed when the ticket was taken.
    pub fn push_reserved(&mut self, at_ns: u64, rank: u8, ticket: Ticket, event: E) {
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
        self.heap.push(Reverse((at_ns, rank, ticket.0, index)));
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
        // A reserved place keeps its order among events pushed after it.
        let early = queue.reserve();
        queue.push(7, 1, "pushed after the reservation");
        queue.push_reserved(7, 1, early, "reserved first");
        assert_eq!(queue.pop(), Some((7, "reserved first")));
    }
}
