//! The background task's handle and its cooperative stop.
//!
//! A task is never cut off in the middle of a storage write: a write dropped half-way may still
//! land later (a remote store that got the request applies it), after a new actualizer read the
//! stored offset. So a task is *asked* to stop; it stops at its next wait or read, but lets a
//! write call in flight return first (bounded by the call's timeout). A new task starts working
//! only once its predecessor has ended. Only a crash (drop) or a shutdown past its budget aborts.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The task was asked to stop: someone else (a newer actualization, or shutdown) owns the
/// backlog from now on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stopped;

/// Asks one task to stop. Set once, never reset: a cancellation token, which cannot be
/// un-cancelled; clones share it (the worker's handle keeps one, the task another).
#[derive(Clone, Debug, Default)]
pub(crate) struct Stop {
    token: CancellationToken,
}

impl Stop {
    /// Asks the task to stop and wakes it where it waits.
    pub(crate) fn stop(&self) {
        self.token.cancel();
    }

    /// Whether the task was asked to stop.
    pub(crate) fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Runs `work` unless the task is asked to stop first, in which case `work` is dropped.
    /// Only for what may be dropped half-way without a trace: reads, replays, sleeps, waits.
    ///
    /// Biased to the stop: when the stop and the end of `work` are both seen in one poll, the
    /// result is [`Stopped`], so that a stopped task takes no further step on a result it got
    /// after its successor took over. (`CancellationToken::run_until_cancelled` is biased the
    /// other way after its first poll, hence the `select!`.)
    pub(crate) async fn unless_stopped<T>(
        &self,
        work: impl Future<Output = T>,
    ) -> Result<T, Stopped> {
        tokio::select! {
            biased;
            () = self.token.cancelled() => Err(Stopped),
            done = work => Ok(done),
        }
    }
}

/// The handle of one background task and its stop. Dropping it aborts the task (a crash, as
/// far as storage can tell); a task aborted while waiting for its predecessor drops, and so
/// aborts, that predecessor too.
#[derive(Debug)]
pub(crate) struct Worker {
    handle: JoinHandle<()>,
    stop: Stop,
}

impl Worker {
    /// Spawns `task`, which is handed the stop it must obey.
    pub(crate) fn spawn<F, T>(runtime: &tokio::runtime::Handle, task: T) -> Worker
    where
        T: FnOnce(Stop) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let stop = Stop::default();
        let handle = runtime.spawn(task(stop.clone()));
        Worker { handle, stop }
    }

    /// Asks the task to stop at its next safe point.
    pub(crate) fn stop(&self) {
        self.stop.stop();
    }

    /// Whether the task has ended.
    pub(crate) fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits until the task ended, at most `limit`; then it is aborted. `true` when it ended by
    /// itself.
    pub(crate) async fn join_within(mut self, limit: Duration) -> bool {
        tokio::time::timeout(limit, &mut self.handle).await.is_ok()
    }

    /// As [`join_within`](Self::join_within), up to `deadline`.
    pub(crate) async fn join_until(mut self, deadline: tokio::time::Instant) -> bool {
        tokio::time::timeout_at(deadline, &mut self.handle)
            .await
            .is_ok()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // A no-op once the task ended.
        self.handle.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stop_drops_waits_but_a_task_decides_when_it_ends() {
        let runtime = tokio::runtime::Handle::current();
        let (wrote, written) = tokio::sync::oneshot::channel();
        let worker = Worker::spawn(&runtime, |stop| async move {
            // A "write" that is not cut short, then a wait that is.
            tokio::time::sleep(Duration::from_millis(30)).await;
            let _ = wrote.send(stop.is_stopped());
            let waited = stop.unless_stopped(std::future::pending::<()>()).await;
            assert_eq!(waited, Err(Stopped));
        });
        worker.stop();
        assert!(!worker.is_finished());
        assert!(worker.join_within(Duration::from_secs(5)).await);
        assert_eq!(written.await, Ok(true), "the write ran to its end");
    }

    #[tokio::test]
    async fn a_stop_before_the_work_runs_drops_it_unpolled() {
        let stop = Stop::default();
        stop.stop();
        stop.stop();
        assert!(stop.is_stopped(), "a second stop changes nothing");
        assert_eq!(stop.unless_stopped(async { 1 }).await, Err(Stopped));
        assert!(stop.clone().is_stopped(), "a clone shares the stop");
    }

    #[test]
    fn a_stop_seen_with_the_end_of_the_work_wins() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::task::{Context, Poll, Waker};

        let stop = Stop::default();
        let done = AtomicBool::new(false);
        let work = std::future::poll_fn(|_| match done.load(Ordering::SeqCst) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        });
        let waiting = stop.unless_stopped(work);
        let mut waiting = std::pin::pin!(waiting);
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(waiting.as_mut().poll(&mut cx), Poll::Pending);
        // Between two polls the work ends and the task is asked to stop.
        done.store(true, Ordering::SeqCst);
        stop.stop();
        assert_eq!(waiting.as_mut().poll(&mut cx), Poll::Ready(Err(Stopped)));
    }

    #[tokio::test]
    async fn a_worker_that_does_not_end_in_time_is_aborted() {
        let runtime = tokio::runtime::Handle::current();
        let worker = Worker::spawn(&runtime, |_stop| std::future::pending::<()>());
        worker.stop();
        assert!(!worker.join_within(Duration::from_millis(10)).await);
    }
}
