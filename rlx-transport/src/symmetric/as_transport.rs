//! [`Symmetric`] as a two-sided [`Transport`] itself, through [`Delegate`]: every call goes to
//! the carrying transport, except `abort`, which also fails the heap's waits, `barrier`, which
//! quiets this rank's puts first, `symmetric`, which is the heap itself, and `admission`,
//! which a heap refuses.

use crate::symmetric::{Symmetric, SymmetricTransport};
use crate::{Admission, Delegate, Result, Transport};

impl<T: Transport + 'static> Delegate for Symmetric<T> {
    fn inner(&self) -> &dyn Transport {
        self.carrier()
    }

    fn abort(&self) {
        self.abort_heap();
        self.carrier().abort();
    }

    /// This transport is its own heap: code holding only a `dyn Transport` reaches the
    /// one-sided operations through this.
    fn symmetric(&self) -> Option<&dyn crate::symmetric::SymmetricOps> {
        Some(self)
    }

    /// None: the grown world's transport would be the carrier's successor, without this
    /// heap, whose regions every rank allocated alike; a heap is fixed for its world's life.
    fn admission(&self) -> Option<&dyn Admission> {
        None
    }

    /// Quiets this rank's puts, then runs the carrying transport's barrier: when it returns on
    /// any rank, every rank's puts from before the barrier have been applied.
    fn barrier(&self) -> Result<()> {
        self.quiet()?;
        self.carrier().barrier()
    }
}
