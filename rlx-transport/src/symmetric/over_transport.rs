//! [`Symmetric`]: [`SymmetricTransport`] over any two-sided [`Transport`].
//!
//! Requests and responses travel as ordinary messages on [`HEAP_SERVICE_TAG`]. For every peer
//! two threads run:
//!
//! - a *reader* that only drains the peer's heap messages: responses complete this rank's
//!   requests in the [`Completions`] table at once, requests are queued for the server;
//! - a *server* that applies the queued requests to the local heap in arrival order (which keeps
//!   per-pair ordering, and so `fence`) and sends the responses.
//!
//! Because the reader never sends, serving a get can never stall the receipt of the responses
//! this rank is waiting for: two ranks getting 256 MiB from each other at once both complete,
//! whatever the carrying transport does when its send buffers are full. The carrying transport
//! must only keep delivering messages while nobody receives them under other tags, which every
//! transport of the workspace does (messages land in an [`Inbox`](crate::Inbox)).
//!
//! Operations on this rank's own heap are applied directly by the calling thread.
//!
//! Limits, by design:
//! - One `Symmetric` per carrying transport: two would compete for the same heap tag.
//! - `2 × (world_size − 1)` threads per rank. Idle readers wake every 50 ms to notice a drop.
//! - The request queue between a reader and its server is not bounded beyond what the peer
//!   sends (each message is bounded by the carrying transport's frame cap). Bounding it would
//!   make a reader wait for its server, which is exactly the coupling that lets two ranks
//!   serving large gets to each other deadlock; the initiators' own flow (blocking puts, or
//!   `quiet` after a window of non-blocking ones) is what keeps it short.

use std::fmt;
use std::time::Duration;

use crate::symmetric::agreement::{Agreement, AgreementOp};
use crate::symmetric::alloc::{AllocRefusal, Allocator};
use crate::symmetric::handle::{GetHandle, HandleState, Pending, PutHandle};
use crate::symmetric::heap::{Cmp, SymmetricHeap};
use crate::symmetric::queue::RequestQueue;
use crate::symmetric::service::{self, Completions, OpKind, Outcome};
use crate::symmetric::wire::{self, Signal, SignalOp};
use crate::symmetric::{Region, SymmetricTransport};
use crate::sync::{Arc, AtomicBool, Mutex, MutexGuard, Ordering, lock, thread};
use crate::{CollectiveError, Result, TRANSPORT_GROUP, Tag, Transport};

/// The tag of heap requests and responses on the carrying transport (the transport's reserved
/// group, sequence 1; the default barrier uses sequence 0).
pub const HEAP_SERVICE_TAG: Tag = Tag::op(TRANSPORT_GROUP, 1, 0);

/// The tag of the agreement messages of `alloc` and `free` (the transport's reserved group,
/// sequence 2).
pub const HEAP_AGREEMENT_TAG: Tag = Tag::op(TRANSPORT_GROUP, 2, 0);

/// The largest data payload of one heap message unless [`Symmetric::with_max_chunk`] says
/// otherwise: large enough that per-message costs vanish, small enough to pipeline a large get
/// and to stay far below any transport's frame cap.
pub const DEFAULT_MAX_CHUNK: u64 = 8 << 20;

/// How often an idle reader looks at the stop flag; bounds how long dropping a [`Symmetric`]
/// takes.
const READER_POLL: Duration = Duration::from_millis(50);

struct Shared<T> {
    /// The caller's transport, shared with the caller (so `std`'s `Arc` in every build).
    inner: std::sync::Arc<T>,
    heap: SymmetricHeap,
    completions: Arc<Completions>,
    stop: AtomicBool,
    /// By peer: set once the peer's server has stopped for good after its stream ended, so
    /// nothing that peer sent can change this heap any more.
    served_to_end: Vec<AtomicBool>,
}

/// A [`SymmetricTransport`] made of any two-sided transport `T` and a heap of the same size on
/// every rank. It is also a [`Transport`] itself (delegating to `T`), whose `barrier` implies
/// `quiet`.
///
/// Create one per rank with [`Symmetric::new`] (each rank with the same heap size) or, in one
/// process, with [`MemTransport::fan_out_symmetric`](crate::MemTransport::fan_out_symmetric).
/// Dropping it stops the heap service (within about 50 ms) before the carrying transport is
/// released.
pub struct Symmetric<T: Transport + 'static> {
    shared: Arc<Shared<T>>,
    allocator: Mutex<Allocator>,
    /// Each peer's reader-to-server queue, closed on drop.
    queues: Vec<Arc<RequestQueue>>,
    threads: Vec<thread::JoinHandle<()>>,
    max_chunk: u64,
}

impl<T: Transport + 'static> fmt::Debug for Symmetric<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Symmetric")
            .field("rank", &self.shared.inner.rank())
            .field("world_size", &self.shared.inner.world_size())
            .field("heap_size", &self.shared.heap.size())
            .finish()
    }
}

impl<T: Transport + 'static> Symmetric<T> {
    /// Wraps `inner` with a zeroed heap of `heap_size` bytes and starts the heap service (two
    /// threads per peer). Local: ranks may create theirs in any order; the first `alloc`
    /// checks that every rank chose the same heap size. Transfers travel in chunks of
    /// [`DEFAULT_MAX_CHUNK`] bytes.
    pub fn new(inner: std::sync::Arc<T>, heap_size: u64) -> Result<Self> {
        Self::with_max_chunk(inner, heap_size, DEFAULT_MAX_CHUNK)
    }

    /// Like [`Symmetric::new`], with puts and gets split into messages of at most `max_chunk`
    /// data bytes: keep it under the carrying transport's frame cap. Chunks of one transfer are
    /// pipelined (a get's later chunks are read at the target while earlier ones travel) and
    /// keep the per-pair order. `InvalidArgument` when `max_chunk` is 0.
    pub fn with_max_chunk(
        inner: std::sync::Arc<T>,
        heap_size: u64,
        max_chunk: u64,
    ) -> Result<Self> {
        if max_chunk == 0 {
            return Err(CollectiveError::invalid(
                "the heap service's max_chunk must be at least one byte",
            ));
        }
        let rank = inner.rank();
        let world = inner.world_size();
        let shared = Arc::new(Shared {
            heap: SymmetricHeap::new(rank, heap_size)?,
            completions: Arc::new(Completions::new(rank)),
            stop: AtomicBool::new(false),
            served_to_end: (0..world).map(|_| AtomicBool::new(false)).collect(),
            inner,
        });
        let mut symmetric = Symmetric {
            shared,
            allocator: Mutex::new(Allocator::new(heap_size)),
            queues: Vec::new(),
            threads: Vec::new(),
            max_chunk,
        };
        for peer in (0..world).filter(|&p| p != rank) {
            let queue = Arc::new(RequestQueue::new());
            symmetric.queues.push(Arc::clone(&queue));
            let requests = Arc::clone(&queue);
            let reader_shared = Arc::clone(&symmetric.shared);
            let reader = thread::Builder::new()
                .name(format!("rlx-heap-read-{rank}-{peer}"))
                .spawn(move || read_loop(&reader_shared, peer, &queue))
                .map_err(|source| CollectiveError::Io {
                    peer: Some(peer),
                    source,
                })?;
            symmetric.threads.push(reader);
            let server_shared = Arc::clone(&symmetric.shared);
            let server = thread::Builder::new()
                .name(format!("rlx-heap-serve-{rank}-{peer}"))
                .spawn(move || {
                    serve_loop(&server_shared, peer, &requests);
                    if let Some(done) = server_shared.served_to_end.get(peer as usize) {
                        done.store(true, Ordering::Release);
                    }
                })
                .map_err(|source| CollectiveError::Io {
                    peer: Some(peer),
                    source,
                })?;
            symmetric.threads.push(server);
        }
        Ok(symmetric)
    }

    /// The carrying transport.
    pub fn inner(&self) -> &std::sync::Arc<T> {
        &self.shared.inner
    }

    fn check_rank(&self, rank: u32) -> Result<()> {
        let world_size = self.world_size();
        if rank >= world_size {
            return Err(CollectiveError::UnknownRank { rank, world_size });
        }
        Ok(())
    }

    fn is_self(&self, rank: u32) -> bool {
        rank == self.rank()
    }

    /// Registers a request to `rank` and sends its header (made from the request id) followed by
    /// `data`. A send that fails for good (a lost link) takes the link down; one refused for this
    /// call only (say, longer than the frame cap) just withdraws the request.
    fn send_request(
        &self,
        rank: u32,
        kind: OpKind,
        encode: impl FnOnce(u64) -> Vec<u8>,
        data: &[u8],
    ) -> Result<u64> {
        let completions = &self.shared.completions;
        let id = completions.begin(rank, kind)?;
        let header = encode(id);
        if let Err(err) = self
            .shared
            .inner
            .send_message(rank, HEAP_SERVICE_TAG, &[&header, data])
        {
            if err.is_fatal() {
                completions.fail_peer(rank, &err);
            }
            completions.cancel(rank, id);
            return Err(err);
        }
        Ok(id)
    }

    /// An empty set of requests in flight to `rank`, to be filled chunk by chunk.
    fn pending(&self, rank: u32) -> Pending {
        Pending {
            completions: Arc::clone(&self.shared.completions),
            peer: rank,
            ids: Vec::new(),
            next: 0,
            timeout: self.op_timeout(),
        }
    }

    /// The chunks of a transfer of `len` bytes as `(start, len)` pairs of at most
    /// `max_chunk` bytes each; always at least one, so that an empty put still carries its
    /// signal and its acknowledgement.
    fn chunks(&self, len: u64) -> impl Iterator<Item = (u64, u64)> + use<T> {
        let max = self.max_chunk;
        let count = len.div_ceil(max).max(1);
        (0..count).map(move |i| {
            let start = i * max;
            (start, (len - start).min(max))
        })
    }

    /// Checks a transfer that will be split against this rank's heap, which has the size of
    /// every rank's heap: a refused chunk must not follow chunks that were applied.
    fn check_split(&self, rank: u32, offset: u64, len: u64, signal: Option<Signal>) -> Result<()> {
        if len <= self.max_chunk {
            return Ok(());
        }
        let heap = &self.shared.heap;
        heap.check_range(offset, len)
            .and_then(|()| signal.map_or(Ok(()), |s| heap.check_word(s.offset)))
            .map_err(|fault| fault.into_error(rank))
    }

    /// Sends a put (optionally with a signal on its last chunk) in chunks.
    fn send_put(
        &self,
        rank: u32,
        offset: u64,
        data: &[u8],
        signal: Option<Signal>,
    ) -> Result<Pending> {
        self.check_split(rank, offset, data.len() as u64, signal)?;
        let mut pending = self.pending(rank);
        let chunks: Vec<(u64, u64)> = self.chunks(data.len() as u64).collect();
        let last = chunks.len() - 1;
        for (i, (start, len)) in chunks.into_iter().enumerate() {
            let bytes = &data[start as usize..(start + len) as usize];
            let at = offset + start;
            let id = match signal.filter(|_| i == last) {
                Some(signal) => self.send_request(
                    rank,
                    OpKind::Put,
                    |id| wire::encode_put_signal_header(id, at, signal).to_vec(),
                    bytes,
                )?,
                None => self.send_request(
                    rank,
                    OpKind::Put,
                    |id| wire::encode_put_header(id, at).to_vec(),
                    bytes,
                )?,
            };
            pending.ids.push(id);
        }
        Ok(pending)
    }

    /// Sends the chunked requests of a get of `len` bytes.
    fn send_get(&self, rank: u32, offset: u64, len: u64) -> Result<Pending> {
        self.check_split(rank, offset, len, None)?;
        let mut pending = self.pending(rank);
        for (start, part) in self.chunks(len) {
            let at = offset + start;
            let id = self.send_request(
                rank,
                OpKind::Get { len: part },
                |id| wire::encode_get(id, at, part).to_vec(),
                &[],
            )?;
            pending.ids.push(id);
        }
        Ok(pending)
    }

    fn atomic(&self, rank: u32, offset: u64, encode: impl FnOnce(u64) -> Vec<u8>) -> Result<u64> {
        let id = self.send_request(rank, OpKind::Atomic, encode, &[])?;
        match self
            .shared
            .completions
            .wait(rank, id, "atomic", self.op_timeout())?
        {
            Outcome::Value(value) => Ok(value),
            other => Err(CollectiveError::protocol(
                Some(rank),
                format!("atomic at offset {offset} answered with {other:?}"),
            )),
        }
    }

    /// Sends this rank's view of a collective heap operation to every peer and checks theirs.
    fn agree(&self, view: Agreement) -> Result<()> {
        let rank = self.rank();
        let world = self.world_size();
        let message = view.encode();
        for peer in (0..world).filter(|&p| p != rank) {
            self.shared
                .inner
                .send_message(peer, HEAP_AGREEMENT_TAG, &[&message])?;
        }
        let timeout = self.op_timeout();
        let mut first_error = None;
        for peer in (0..world).filter(|&p| p != rank) {
            let bytes = self
                .shared
                .inner
                .recv_message(peer, HEAP_AGREEMENT_TAG, timeout)?
                .ok_or(CollectiveError::Timeout {
                    peer: Some(peer),
                    op: view.op_name(),
                    after: timeout,
                })?;
            let theirs = Agreement::decode(peer, &bytes)?;
            if first_error.is_none() {
                first_error = view.disagreement(peer, &theirs);
            }
        }
        match first_error {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    fn allocator(&self) -> MutexGuard<'_, Allocator> {
        lock(&self.allocator)
    }
}

impl<T: Transport + 'static> Symmetric<T> {
    /// The carrying transport, to which every two-sided call goes (`as_transport.rs`).
    pub(super) fn carrier(&self) -> &T {
        &self.shared.inner
    }

    /// Fails every request this rank waits on, and every wait on its heap, with `Aborted`.
    pub(super) fn abort_heap(&self) {
        self.shared.completions.abort();
        self.shared.heap.abort();
    }
}

impl<T: Transport + 'static> Drop for Symmetric<T> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for queue in &self.queues {
            queue.close();
        }
        for thread in self.threads.drain(..) {
            // A service thread that panicked has nothing left to clean up; the join result only
            // says whether it did.
            let _ = thread.join();
        }
    }
}

/// Drains the heap messages of `peer`: responses complete requests, requests go to the server.
fn read_loop<T: Transport>(shared: &Shared<T>, peer: u32, queue: &RequestQueue) {
    while !shared.stop.load(Ordering::Relaxed) {
        match shared
            .inner
            .recv_message(peer, HEAP_SERVICE_TAG, READER_POLL)
        {
            Ok(None) => {}
            Ok(Some(bytes)) => {
                if wire::is_request(&bytes) {
                    if !queue.push(bytes) {
                        return;
                    }
                } else if shared.completions.complete(peer, bytes).is_err() {
                    // `complete` marked the link down; nothing from this peer is trusted now,
                    // not even the requests still queued.
                    queue.close();
                    return;
                }
            }
            Err(err) => {
                // The peer's stream is over (it left, or its link failed): its earlier
                // requests are still applied, because a peer that finished its part and left
                // may have put data its neighbour has yet to see.
                shared.completions.fail_peer(peer, &err);
                queue.end();
                return;
            }
        }
    }
}

/// Applies `peer`'s requests in arrival order and answers them. Once an answer cannot be
/// sent the peer is gone, but the requests it sent before still are applied (unanswered).
fn serve_loop<T: Transport>(shared: &Shared<T>, peer: u32, requests: &RequestQueue) {
    let mut answering = true;
    while let Some(bytes) = requests.pop() {
        let reply = match wire::decode(peer, &bytes) {
            Ok(wire::Message::Request(request)) => service::serve(&shared.heap, &request),
            Ok(wire::Message::Response(_)) => {
                let err = CollectiveError::protocol(Some(peer), "response routed as a request");
                shared.completions.fail_peer(peer, &err);
                return;
            }
            Err(err) => {
                shared.completions.fail_peer(peer, &err);
                return;
            }
        };
        if !answering {
            continue;
        }
        if let Err(err) = shared.inner.send_message(peer, HEAP_SERVICE_TAG, &[&reply]) {
            shared.completions.fail_peer(peer, &err);
            answering = false;
        }
    }
}

impl<T: Transport + 'static> SymmetricTransport for Symmetric<T> {
    type PutHandle = PutHandle;
    type GetHandle = GetHandle;

    fn heap(&self) -> &SymmetricHeap {
        &self.shared.heap
    }

    fn alloc(&self, len: u64) -> Result<Region> {
        let mut allocator = self.allocator();
        let local = allocator.alloc(len);
        if let Ok(region) = &local {
            self.shared.heap.zero(region.offset, region.len)?;
        }
        let view = Agreement {
            op: AgreementOp::Alloc,
            heap_size: allocator.heap_size(),
            len,
            outcome: local.map(|r| r.offset),
        };
        let agreed = self.agree(view);
        match (agreed, local) {
            (Ok(()), Ok(region)) => Ok(region),
            (Ok(()), Err(refusal)) => Err(view.refusal_error(refusal)),
            (Err(err), local) => {
                if let Ok(region) = local {
                    // Nobody else may use this region, so this rank gives it back too. The
                    // region was just allocated, so freeing it cannot be refused.
                    let _ = allocator.free(region);
                }
                Err(err)
            }
        }
    }

    fn free(&self, region: Region) -> Result<()> {
        self.quiet()?;
        let mut allocator = self.allocator();
        let local = if allocator.contains(region) {
            Ok(region.offset)
        } else {
            Err(AllocRefusal::NotAllocated)
        };
        let view = Agreement {
            op: AgreementOp::Free,
            heap_size: allocator.heap_size(),
            len: region.len,
            outcome: local,
        };
        self.agree(view)?;
        allocator
            .free(region)
            .map_err(|refusal| view.refusal_error(refusal))
    }

    fn put_nbi(&self, rank: u32, offset: u64, data: &[u8]) -> Result<PutHandle> {
        self.check_rank(rank)?;
        if self.is_self(rank) {
            let result = self.shared.heap.write(offset, data);
            return Ok(PutHandle {
                state: HandleState::Ready(result),
            });
        }
        Ok(PutHandle {
            state: HandleState::Pending(self.send_put(rank, offset, data, None)?),
        })
    }

    fn put_signal_nbi(
        &self,
        rank: u32,
        offset: u64,
        data: &[u8],
        signal: Signal,
    ) -> Result<PutHandle> {
        self.check_rank(rank)?;
        if self.is_self(rank) {
            let heap = &self.shared.heap;
            // The same checks and order as the service: both ranges first, data before signal.
            let result = heap
                .check_range(offset, data.len() as u64)
                .and_then(|()| heap.check_word(signal.offset))
                .and_then(|()| heap.try_write(offset, data))
                .and_then(|()| match signal.op {
                    SignalOp::Set => heap.try_store_u64(signal.offset, signal.value),
                    SignalOp::Add => heap.try_fetch_add(signal.offset, signal.value).map(|_| ()),
                })
                .map_err(|fault| fault.into_error(rank));
            return Ok(PutHandle {
                state: HandleState::Ready(result),
            });
        }
        Ok(PutHandle {
            state: HandleState::Pending(self.send_put(rank, offset, data, Some(signal))?),
        })
    }

    fn get_nbi(&self, rank: u32, offset: u64, len: u64) -> Result<GetHandle> {
        self.check_rank(rank)?;
        if self.is_self(rank) {
            let heap = &self.shared.heap;
            let result = heap
                .check_range(offset, len)
                .map_err(|fault| fault.into_error(rank))
                .and_then(|()| {
                    // The range check bounds `len` by the heap size, which fits in memory.
                    let mut out = vec![0u8; len as usize];
                    heap.read(offset, &mut out)?;
                    Ok(out)
                });
            return Ok(GetHandle {
                state: HandleState::Ready(result),
                len,
            });
        }
        Ok(GetHandle {
            state: HandleState::Pending(self.send_get(rank, offset, len)?),
            len,
        })
    }

    /// Overridden so that the bytes are copied once, from each chunk's response into `buf`.
    fn get(&self, rank: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_rank(rank)?;
        if self.is_self(rank) {
            return self.shared.heap.read(offset, buf);
        }
        let len = buf.len() as u64;
        let mut pending = self.send_get(rank, offset, len)?;
        let mut rest: &mut [u8] = buf;
        pending.wait_each("get", |outcome| match outcome {
            // `Completions::complete` checked each chunk's length against its request, and the
            // chunks add up to `buf.len()`.
            Outcome::Data(payload) if payload.bytes().len() <= rest.len() => {
                let (dst, tail) = std::mem::take(&mut rest).split_at_mut(payload.bytes().len());
                dst.copy_from_slice(payload.bytes());
                rest = tail;
                Ok(())
            }
            other => Err(CollectiveError::protocol(
                Some(rank),
                format!("get of {len} bytes at offset {offset} answered with {other:?}"),
            )),
        })
    }

    fn fetch_add(&self, rank: u32, offset: u64, value: u64) -> Result<u64> {
        self.check_rank(rank)?;
        if self.is_self(rank) {
            return self.shared.heap.fetch_add(offset, value);
        }
        self.atomic(rank, offset, |id| {
            wire::encode_fetch_add(id, offset, value).to_vec()
        })
    }

    fn compare_swap(&self, rank: u32, offset: u64, expected: u64, new: u64) -> Result<u64> {
        self.check_rank(rank)?;
        if self.is_self(rank) {
            return self.shared.heap.compare_swap(offset, expected, new);
        }
        self.atomic(rank, offset, |id| {
            wire::encode_compare_swap(id, offset, expected, new).to_vec()
        })
    }

    /// Puts to one target travel on one FIFO link and are applied by one server thread in
    /// arrival order, so the order a fence asks for already holds; the fence only reports a
    /// link that went down or an abort, so that the caller does not build on lost puts.
    fn fence(&self) -> Result<()> {
        let rank = self.rank();
        for peer in (0..self.world_size()).filter(|&p| p != rank) {
            self.shared.completions.check_link(peer)?;
        }
        Ok(())
    }

    fn quiet(&self) -> Result<()> {
        self.shared.completions.quiet(self.op_timeout())
    }

    fn wait_until(&self, offset: u64, cmp: Cmp, value: u64, timeout: Duration) -> Result<u64> {
        self.shared.heap.wait_until(offset, cmp, value, timeout)
    }

    fn source_finished(&self, rank: u32) -> bool {
        self.shared
            .served_to_end
            .get(rank as usize)
            .is_some_and(|done| done.load(Ordering::Acquire))
    }
}
