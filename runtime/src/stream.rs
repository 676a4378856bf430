//! Change feeds as [`Stream`]s, written once: a feed's state moves into the future of one
//! `next` and comes back when it answers. A `next` whose caller gave up stays in flight and is
//! polled on by the following call (or by the stream), so no answer is lost to a dropped future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

pub use futures_core::Stream;

/// One `next` in flight: it owns the feed's state and gives it back with the answer; `None`
/// ends the feed.
pub(crate) type Step<T, O> = Pin<Box<dyn Future<Output = (T, Option<O>)> + Send>>;

/// A feed's state `T` and how to get its next answer `O` from it.
pub(crate) struct Pump<T, O> {
    idle: Option<T>,
    busy: Option<Step<T, O>>,
    step: fn(T) -> Step<T, O>,
}

impl<T, O> Pump<T, O> {
    pub(crate) fn new(state: T, step: fn(T) -> Step<T, O>) -> Self {
        Pump {
            idle: Some(state),
            busy: None,
            step,
        }
    }

    /// The state, unless a `next` holds it (one whose caller gave up before it answered).
    pub(crate) fn state(&self) -> Option<&T> {
        self.idle.as_ref()
    }

    /// The next answer; `Ready(None)` once the feed ended.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<O>> {
        if self.busy.is_none() {
            let Some(state) = self.idle.take() else {
                return Poll::Ready(None);
            };
            self.busy = Some((self.step)(state));
        }
        let Some(busy) = self.busy.as_mut() else {
            return Poll::Ready(None);
        };
        let Poll::Ready((state, answer)) = busy.as_mut().poll(cx) else {
            return Poll::Pending;
        };
        self.busy = None;
        // An ended feed drops its state: nothing is answered any more.
        if answer.is_some() {
            self.idle = Some(state);
        }
        Poll::Ready(answer)
    }

    /// [`poll_next`](Self::poll_next) as a future.
    pub(crate) async fn next(&mut self) -> Option<O> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(n: u32) -> Step<u32, u32> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            (n + 1, (n < 3).then_some(n))
        })
    }

    #[tokio::test]
    async fn answers_in_order_then_ends() {
        let mut pump = Pump::new(0, count);
        let mut answers = Vec::new();
        while let Some(n) = pump.next().await {
            answers.push(n);
        }
        assert_eq!(answers, [0, 1, 2]);
        assert_eq!(pump.next().await, None, "ended for good");
    }

    #[tokio::test]
    async fn a_next_dropped_in_flight_is_finished_by_the_following_one() {
        let mut pump = Pump::new(0, count);
        {
            let next = pump.next();
            tokio::pin!(next);
            let mut cx = Context::from_waker(std::task::Waker::noop());
            assert!(
                next.as_mut().poll(&mut cx).is_pending(),
                "the step yields once"
            );
        }
        assert!(pump.state().is_none(), "the state is in the step in flight");
        assert_eq!(
            pump.next().await,
            Some(0),
            "the answer of the dropped next is not lost"
        );
        assert_eq!(pump.state(), Some(&1));
    }
}
