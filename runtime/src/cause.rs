//! Keeping the underlying error of a failure, and printing a whole chain of them.
//!
//! Errors of this workspace do not repeat their source in their own message: the message says
//! what failed, [`Error::source`] says why. [`Cause`] carries the why inside errors that must stay
//! `Clone + Eq` (they travel through watch channels and are compared in tests);
//! [`ErrorChain`] prints an error with all its causes, for logs and for a host's last line.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// The underlying error of a failed call — a store client's error, an I/O error, a task that
/// panicked — kept whole, so that [`Error::source`] walks to it and
/// [`downcast_ref`](Cause::downcast_ref) gets it back.
///
/// Cheap to clone (shared). Two causes are equal when they print the same chain: errors of
/// other crates are rarely comparable, and a cause is compared only to tell whether two
/// failures say the same.
///
/// ```
/// use vvm_runtime::{Cause, ErrorChain, StoreError};
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
/// let error = StoreError::Failed { source: Cause::new(io) };
/// assert_eq!(error.to_string(), "store operation failed, nothing written");
/// assert_eq!(
///     ErrorChain(&error).to_string(),
///     "store operation failed, nothing written: refused"
/// );
/// let StoreError::Failed { source } = &error else { unreachable!() };
/// let io = source.downcast_ref::<std::io::Error>().unwrap();
/// assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
/// ```
#[derive(Clone)]
pub struct Cause(Arc<dyn Error + Send + Sync + 'static>);

impl Cause {
    /// Keeps `error`.
    pub fn new(error: impl Error + Send + Sync + 'static) -> Cause {
        Cause(Arc::new(error))
    }

    /// The error kept.
    pub fn get(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.0
    }

    /// The error kept, if it is an `E`.
    pub fn downcast_ref<E: Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref::<E>()
    }

    /// The first error of type `E` in the chain that starts with the error kept.
    pub fn find<E: Error + 'static>(&self) -> Option<&E> {
        let mut next: Option<&(dyn Error + 'static)> = Some(&*self.0);
        while let Some(error) = next {
            if let Some(found) = error.downcast_ref::<E>() {
                return Some(found);
            }
            next = error.source();
        }
        None
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

// A `Cause` stands for the error it keeps: same message, same sources. It is not a level of its
// own in a chain.
impl Error for Cause {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Cause) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || ErrorChain(&*self.0).to_string() == ErrorChain(&*other.0).to_string()
    }
}

impl Eq for Cause {}

/// Prints an error and its causes on one line, `outer: inner: innermost`.
///
/// Use it wherever an error is shown to a person (logs, a host's last line): the errors of this
/// workspace leave their cause out of their own message. A cause whose text the level above
/// already quotes (errors of other crates sometimes include their source) is not printed twice.
/// At most [`ErrorChain::DEPTH_MAX`] levels are printed.
///
/// ```
/// use vvm_runtime::ErrorChain;
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("cannot open the store")]
/// struct Open(#[source] std::io::Error);
///
/// let error = Open(std::io::Error::other("disk on fire"));
/// assert_eq!(ErrorChain(&error).to_string(), "cannot open the store: disk on fire");
/// tracing::warn!(error = %ErrorChain(&error), "store not opened");
/// ```
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn Error + 'a));

impl ErrorChain<'_> {
    /// Most levels printed: a chain longer than this is cut (a cycle would never end).
    pub const DEPTH_MAX: usize = 16;
}

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut above = self.0.to_string();
        f.write_str(&above)?;
        let mut next = self.0.source();
        let mut depth = 1;
        while let Some(cause) = next {
            if depth == Self::DEPTH_MAX {
                return f.write_str(": …");
            }
            let text = cause.to_string();
            if !above.contains(&text) {
                write!(f, ": {text}")?;
            }
            above = text;
            next = cause.source();
            depth += 1;
        }
        Ok(())
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Cause);

    #[derive(Debug, thiserror::Error)]
    #[error("middle")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn a_cause_is_transparent_in_the_chain() {
        let error = Outer(Cause::new(Middle(std::io::Error::other("disk"))));
        assert_eq!(ErrorChain(&error).to_string(), "outer: middle: disk");
        let Outer(cause) = &error;
        assert!(cause.downcast_ref::<Middle>().is_some());
        assert!(cause.find::<std::io::Error>().is_some());
        assert!(cause.downcast_ref::<std::io::Error>().is_none());
    }

    #[test]
    fn causes_are_equal_when_they_say_the_same() {
        let a = Cause::new(std::io::Error::other("x"));
        let b = Cause::new(Middle(std::io::Error::other("x")));
        assert_eq!(a, a.clone());
        assert_eq!(a, Cause::new(std::io::Error::other("x")));
        assert_ne!(a, b);
        assert_ne!(a, Cause::new(std::io::Error::other("y")));
    }

    #[test]
    fn a_quoted_cause_is_not_printed_twice() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot open x.db: {0}")]
        struct Quoting(#[source] std::io::Error);
        let error = Quoting(std::io::Error::other("disk on fire"));
        assert_eq!(
            ErrorChain(&error).to_string(),
            "cannot open x.db: disk on fire"
        );
    }

    #[test]
    fn a_cycle_is_cut() {
        #[derive(Debug)]
        struct Loop;
        impl fmt::Display for Loop {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("loop")
            }
        }
        impl Error for Loop {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&Loop)
            }
        }
        // Every level says "loop", so only the first is printed, then the cut.
        assert_eq!(ErrorChain(&Loop).to_string(), "loop: …");
    }
}
