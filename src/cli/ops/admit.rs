//! Admission of metrics-endpoint connections: at most [`CONNECTIONS_MAX`] open at once, and at
//! the cap the oldest connection still waiting for its request head is shed to make room.
//!
//! Why shed instead of refusing the newcomer: a crowd of idle or dribbling clients would
//! otherwise fill every place and keep a liveness probe out for as long as they like (each
//! reconnecting as soon as it is cut). A probe sends its whole request at once, so it leaves the
//! sheddable set within a round trip; the clients that hold places without a request are the
//! oldest and go first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// Most connections open at once. Each costs a task, a descriptor and at most
/// [`REQUEST_BYTES_MAX`](super::REQUEST_BYTES_MAX) of buffer.
pub const CONNECTIONS_MAX: usize = 64;

/// One open connection as the admission table sees it.
#[derive(Debug)]
struct Entry {
    /// Dropped (with the entry) to shed the connection; kept until the connection ends
    /// otherwise, since dropping it is the signal.
    _shed: oneshot::Sender<()>,
    /// Still waiting for its request head, so sheddable. An answer being written is never shed:
    /// it ends within its own deadline.
    waiting: bool,
}

/// The table of open connections, keyed by admission order (oldest first).
#[derive(Debug, Default)]
pub struct Admission {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    open: BTreeMap<u64, Entry>,
}

/// What admitting a connection gave: its place (released on drop) and the signal that it was
/// shed.
pub struct Admitted {
    /// The connection's place; dropping it frees the place.
    pub place: Place,
    /// Resolves (with an error) when the connection is shed.
    pub shed: oneshot::Receiver<()>,
}

/// A connection's place in the table; freed on drop.
pub struct Place {
    admission: Arc<Admission>,
    id: u64,
}

impl Admission {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // The table holds no invariant a panic could break half-way: keep using it.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a new connection, shedding the oldest one still waiting for its head when the
    /// table is full. `None` when every place is taken by an answer being written.
    pub fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let mut table = self.lock();
        if table.open.len() >= CONNECTIONS_MAX {
            let oldest_waiting = table
                .open
                .iter()
                .find(|(_, entry)| entry.waiting)
                .map(|(id, _)| *id)?;
            // Dropping the sender wakes the connection's task, which closes it.
            table.open.remove(&oldest_waiting);
            tracing::debug!("metrics endpoint: at the connection cap; shed the oldest idle one");
        }
        let id = table.next_id;
        table.next_id = table.next_id.wrapping_add(1);
        let (sender, shed) = oneshot::channel();
        table.open.insert(
            id,
            Entry {
                _shed: sender,
                waiting: true,
            },
        );
        Some(Admitted {
            place: Place {
                admission: self.clone(),
                id,
            },
            shed,
        })
    }

    /// How many connections hold a place.
    #[cfg(test)]
    fn open(&self) -> usize {
        self.lock().open.len()
    }
}

impl Place {
    /// The head is read: from now on the connection is answering and is not shed. Returns
    /// `false` when it was shed meanwhile (its place is gone; it should close).
    pub fn answering(&self) -> bool {
        let mut table = self.admission.lock();
        match table.open.get_mut(&self.id) {
            Some(entry) => {
                entry.waiting = false;
                true
            }
            None => false,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.admission.lock().open.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_oldest_waiting_connection_is_shed_and_answers_are_kept() {
        let admission = Arc::new(Admission::default());
        let mut admitted: Vec<Admitted> = (0..CONNECTIONS_MAX)
            .map(|_| admission.admit().unwrap())
            .collect();
        assert_eq!(admission.open(), CONNECTIONS_MAX);
        // The oldest is answering: the second oldest is shed for the newcomer.
        assert!(admitted[0].place.answering());
        let newcomer = admission.admit().unwrap();
        assert_eq!(admission.open(), CONNECTIONS_MAX);
        assert!(admitted[1].shed.try_recv().is_err());
        assert!(!admitted[1].place.answering());
        assert!(matches!(
            admitted[2].shed.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        // Every place answering: a newcomer is refused.
        for entry in admitted.iter().skip(2) {
            assert!(entry.place.answering());
        }
        assert!(newcomer.place.answering());
        assert!(admission.admit().is_none());
        // Places are freed on drop.
        admitted.clear();
        drop(newcomer);
        assert_eq!(admission.open(), 0);
    }
}
