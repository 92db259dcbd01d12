//! The symmetric heap over [`MemTransport`]: put/get/atomics/signal semantics, errors that
//! return to the initiator, the mutual-get stress and random operations from four ranks
//! checked against a serial model.

#![cfg(not(rlx_loom))]

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rlx_transport::symmetric::{Cmp, Completion, DEFAULT_MAX_CHUNK, Signal, SymmetricTransport};
use rlx_transport::{CollectiveError, MemTransport, Result, Symmetric, Transport};

type Rank = Arc<Symmetric<MemTransport>>;

/// Runs `body` on every rank of a fresh world, one thread per rank, and returns the results in
/// rank order.
fn run<R: Send + 'static>(
    world: u32,
    heap_size: u64,
    body: impl Fn(Rank) -> Result<R> + Send + Sync + 'static,
) -> Vec<R> {
    run_chunked(world, heap_size, DEFAULT_MAX_CHUNK, body)
}

/// [`run`] with the heap service's transfers split into chunks of `max_chunk` bytes, so that
/// small tests reach the multi-chunk paths.
fn run_chunked<R: Send + 'static>(
    world: u32,
    heap_size: u64,
    max_chunk: u64,
    body: impl Fn(Rank) -> Result<R> + Send + Sync + 'static,
) -> Vec<R> {
    let ranks: Vec<Rank> = MemTransport::fan_out_with_timeout(world, Duration::from_secs(60))
        .into_iter()
        .map(|t| Symmetric::with_max_chunk(t, heap_size, max_chunk).map(Arc::new))
        .collect::<Result<_>>()
        .unwrap();
    let body = Arc::new(body);
    let threads: Vec<_> = ranks
        .into_iter()
        .map(|t| {
            let body = body.clone();
            thread::spawn(move || body(t))
        })
        .collect();
    threads
        .into_iter()
        .enumerate()
        .map(|(rank, t)| match t.join().unwrap() {
            Ok(r) => r,
            Err(err) => panic!("rank {rank} failed: {err}"),
        })
        .collect()
}

/// A small deterministic generator (splitmix64) so that the random test replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn put_get_atomics_and_signals_across_three_ranks() {
    let results = run(3, 1 << 16, |t| {
        let rank = t.rank();
        let n = t.world_size();
        let data = t.alloc(3 * 100)?;
        let counter = t.alloc(8)?;
        let flag = t.alloc(8)?;
        assert_eq!(data.offset(), 0);
        assert_eq!(counter.offset() % 64, 0);
        let next = (rank + 1) % n;
        // Each rank writes its own 100-byte slot on its right neighbour, unaligned on purpose.
        let slot = data.at(u64::from(rank) * 100, 100)?;
        let payload: Vec<u8> = (0..100).map(|i| (i as u8) ^ (rank as u8 * 31)).collect();
        t.put_signal(next, slot, &payload, Signal::add(flag.offset(), 1))?;
        // One signal arrives from the left neighbour.
        assert_eq!(
            t.wait_until(flag.offset(), Cmp::Eq, 1, Duration::from_secs(30))?,
            1
        );
        let prev = (rank + n - 1) % n;
        let mut got = vec![0u8; 100];
        t.heap().read(u64::from(prev) * 100, &mut got)?;
        let expected: Vec<u8> = (0..100).map(|i| (i as u8) ^ (prev as u8 * 31)).collect();
        assert_eq!(got, expected);
        // Reading back what this rank put on its neighbour sees the put.
        let mut back = vec![0u8; 100];
        t.get(next, slot, &mut back)?;
        assert_eq!(back, payload);
        // Everyone adds to rank 0's counter; the old values are distinct multiples of 1 + rank.
        let old = t.fetch_add(0, counter.offset(), 1)?;
        assert!(old < u64::from(n));
        t.barrier()?;
        let total = t.get_nbi(0, counter.offset(), 8)?.wait()?;
        assert_eq!(u64::from_le_bytes(total.try_into().unwrap()), u64::from(n));
        t.barrier()?;
        // Exactly one rank wins the compare-and-swap on rank 0's counter.
        let won = t.compare_swap(0, counter.offset(), u64::from(n), 100 + u64::from(rank))?
            == u64::from(n);
        t.barrier()?;
        let final_value = t.heap().load_u64(counter.offset())?;
        t.free(flag)?;
        t.free(counter)?;
        t.free(data)?;
        Ok((old, won, final_value))
    });
    let mut olds: Vec<u64> = results.iter().map(|r| r.0).collect();
    olds.sort_unstable();
    assert_eq!(olds, vec![0, 1, 2]);
    let winners: Vec<u32> = (0..3).filter(|&r| results[r as usize].1).collect();
    assert_eq!(winners.len(), 1);
    assert_eq!(results[0].2, 100 + u64::from(winners[0]));
}

#[test]
fn errors_return_to_the_initiator_and_change_nothing() {
    let heap_size = 4096u64;
    run(2, heap_size, move |t| {
        let region = t.alloc(64)?;
        t.barrier()?;
        if t.rank() == 0 {
            let err = t.put(1, heap_size - 4, &[1u8; 8]).unwrap_err();
            assert!(
                matches!(
                    err,
                    CollectiveError::OutOfBounds {
                        rank: 1,
                        offset,
                        len: 8,
                        heap_size: h
                    } if offset == heap_size - 4 && h == heap_size
                ),
                "{err}"
            );
            let mut buf = vec![0u8; 16];
            let err = t.get(1, u64::MAX - 3, &mut buf).unwrap_err();
            assert!(
                matches!(err, CollectiveError::OutOfBounds { rank: 1, .. }),
                "{err}"
            );
            let err = t
                .put_signal(1, region.offset(), b"x", Signal::set(heap_size, 1))
                .unwrap_err();
            assert!(
                matches!(err, CollectiveError::OutOfBounds { rank: 1, .. }),
                "{err}"
            );
            let err = t.fetch_add(1, region.offset() + 4, 1).unwrap_err();
            assert!(
                matches!(err, CollectiveError::InvalidArgument { .. }),
                "{err}"
            );
            let err = t.put(7, 0, b"x").unwrap_err();
            assert!(
                matches!(
                    err,
                    CollectiveError::UnknownRank {
                        rank: 7,
                        world_size: 2
                    }
                ),
                "{err}"
            );
            // A refused non-blocking put whose handle is dropped is reported by the next quiet.
            drop(t.put_nbi(1, heap_size, &[9u8])?);
            let err = t.quiet().unwrap_err();
            assert!(
                matches!(err, CollectiveError::OutOfBounds { rank: 1, .. }),
                "{err}"
            );
            t.quiet()?;
            // The group stays usable after errors of one call.
            t.put(1, region.offset(), b"fine")?;
        }
        t.barrier()?;
        if t.rank() == 1 {
            let mut all = vec![0u8; heap_size as usize];
            t.heap().read(0, &mut all)?;
            assert_eq!(&all[..4], b"fine");
            assert!(
                all[4..].iter().all(|&b| b == 0),
                "a refused put wrote into the heap"
            );
        }
        Ok(())
    });
}

#[test]
fn barrier_and_quiet_make_non_blocking_puts_visible() {
    run(4, 1 << 16, |t| {
        let n = t.world_size();
        let region = t.alloc(u64::from(n) * 1024)?;
        let me = t.rank();
        let mut handles = Vec::new();
        for target in 0..n {
            for chunk in 0..16u64 {
                let at = region.at(u64::from(me) * 1024 + chunk * 64, 64)?;
                handles.push(t.put_nbi(target, at, &[me as u8 + 1; 64])?);
            }
        }
        // Half the handles are waited, half dropped: the barrier covers both.
        for (i, h) in handles.into_iter().enumerate() {
            if i % 2 == 0 {
                h.wait()?;
            }
        }
        t.barrier()?;
        let mut all = vec![0u8; n as usize * 1024];
        t.heap().read(region.offset(), &mut all)?;
        for (source, block) in all.chunks(1024).enumerate() {
            assert!(
                block.iter().all(|&b| b == source as u8 + 1),
                "data of rank {source}"
            );
        }
        Ok(())
    });
}

#[test]
fn puts_before_a_signal_are_visible_with_it() {
    // 3000-byte chunks: each 8192-byte put travels in three, unaligned to the words.
    run_chunked(2, 1 << 20, 3000, |t| {
        let data = t.alloc(512 * 1024)?;
        let flag = t.alloc(8)?;
        if t.rank() == 0 {
            for i in 0..64u64 {
                t.put_nbi(1, data.at(i * 8192, 8192)?, &[i as u8; 8192])?;
            }
            t.fence()?;
            t.put_signal_nbi(1, data.offset(), &[], Signal::set(flag.offset(), 7))?;
        } else {
            t.wait_until(flag.offset(), Cmp::Eq, 7, Duration::from_secs(30))?;
            let mut all = vec![0u8; 512 * 1024];
            t.heap().read(data.offset(), &mut all)?;
            for (i, block) in all.chunks(8192).enumerate() {
                assert!(block.iter().all(|&b| b == i as u8), "block {i}");
            }
        }
        t.barrier()?;
        Ok(())
    });
}

/// Two ranks get a large region from each other at the same time; neither service may wait for
/// the other's reader. 1 MiB chunks: 64 requests in flight each way.
#[test]
fn mutual_large_gets_complete() {
    const LEN: u64 = 64 << 20;
    run_chunked(2, LEN + 4096, 1 << 20, |t| {
        let region = t.alloc(LEN)?;
        let me = t.rank() as u8;
        let pattern = |rank: u8, i: usize| (i as u8).wrapping_mul(13) ^ rank.wrapping_mul(101);
        let mine: Vec<u8> = (0..LEN as usize).map(|i| pattern(me, i)).collect();
        t.heap().write(region.offset(), &mine)?;
        drop(mine);
        t.barrier()?;
        let peer = 1 - t.rank();
        let handle = t.get_nbi(peer, region.offset(), LEN)?;
        let theirs = handle.wait()?;
        assert_eq!(theirs.len() as u64, LEN);
        let peer = peer as u8;
        assert!(
            theirs
                .iter()
                .enumerate()
                .all(|(i, &b)| b == pattern(peer, i)),
            "rank {me} got wrong bytes from rank {peer}"
        );
        t.barrier()?;
        Ok(())
    });
}

#[test]
fn ten_thousand_random_operations_match_a_model() {
    random_operations_match_a_model(DEFAULT_MAX_CHUNK);
}

/// The same operations with transfers split into chunks of 48 bytes (puts reach 200 bytes and
/// gets 300): chunks keep the per-pair order and land where they belong.
#[test]
fn ten_thousand_chunked_random_operations_match_a_model() {
    random_operations_match_a_model(48);
}

fn random_operations_match_a_model(max_chunk: u64) {
    const WORLD: u32 = 4;
    const STRIPE: u64 = 2048;
    const COUNTERS: u64 = 8;
    const OPS_PER_RANK: usize = 2500;
    let results = run_chunked(WORLD, 1 << 16, max_chunk, |t| {
        let n = t.world_size();
        let me = t.rank();
        // Every rank owns one stripe on every target: puts and gets there are deterministic,
        // while the counters are shared by everyone.
        let stripes = t.alloc(u64::from(n) * STRIPE)?;
        let counters = t.alloc(COUNTERS * 8)?;
        let mut rng = Rng(0x5EED ^ u64::from(me));
        let mut model = vec![vec![0u8; STRIPE as usize]; n as usize];
        let mut adds: Vec<(u32, u64, u64, u64)> = Vec::new();
        for op in 0..OPS_PER_RANK {
            let target = rng.below(u64::from(n)) as u32;
            let stripe = stripes.at(u64::from(me) * STRIPE, STRIPE)?;
            match rng.below(10) {
                0..=3 => {
                    let len = 1 + rng.below(200);
                    let at = rng.below(STRIPE - len + 1);
                    let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                    if rng.below(2) == 0 {
                        t.put(target, stripe + at, &bytes)?;
                    } else {
                        // Not waited: the ordering of the link still puts it before later gets.
                        drop(t.put_nbi(target, stripe + at, &bytes)?);
                    }
                    model[target as usize][at as usize..(at + len) as usize]
                        .copy_from_slice(&bytes);
                }
                4..=6 => {
                    let len = 1 + rng.below(300);
                    let at = rng.below(STRIPE - len + 1);
                    let mut got = vec![0u8; len as usize];
                    t.get(target, stripe + at, &mut got)?;
                    assert_eq!(
                        got,
                        model[target as usize][at as usize..(at + len) as usize],
                        "rank {me} op {op}: get of {len} bytes at {at} from rank {target}"
                    );
                }
                _ => {
                    let k = rng.below(COUNTERS);
                    let v = 1 + rng.below(1000);
                    let old = t.fetch_add(target, counters.offset() + 8 * k, v)?;
                    adds.push((target, k, old, v));
                }
            }
        }
        t.barrier()?;
        let mut heap = vec![0u8; (u64::from(n) * STRIPE + COUNTERS * 8) as usize];
        t.heap().read(
            stripes.offset(),
            &mut heap[..(u64::from(n) * STRIPE) as usize],
        )?;
        t.heap().read(
            counters.offset(),
            &mut heap[(u64::from(n) * STRIPE) as usize..],
        )?;
        t.barrier()?;
        Ok((model, adds, heap))
    });
    for (target, (_, _, heap)) in results.iter().enumerate() {
        for (source, (model, _, _)) in results.iter().enumerate() {
            let at = source * STRIPE as usize;
            assert_eq!(
                &heap[at..at + STRIPE as usize],
                &model[target][..],
                "stripe of rank {source} on rank {target}"
            );
        }
        for k in 0..COUNTERS {
            // Every fetch_add on this word, from every rank, in the order of its old values:
            // each must have seen exactly the sum of the ones before it (linearizability).
            let mut ops: Vec<(u64, u64)> = results
                .iter()
                .flat_map(|(_, adds, _)| adds.iter())
                .filter(|&&(t, kk, _, _)| t as usize == target && kk == k)
                .map(|&(_, _, old, v)| (old, v))
                .collect();
            ops.sort_unstable();
            let mut sum = 0u64;
            for (old, v) in ops {
                assert_eq!(old, sum, "counter {k} of rank {target}");
                sum += v;
            }
            let at = (u64::from(WORLD) * STRIPE + 8 * k) as usize;
            let word = u64::from_le_bytes(heap[at..at + 8].try_into().unwrap());
            assert_eq!(word, sum, "final value of counter {k} of rank {target}");
        }
    }
}

#[test]
fn collective_calls_must_agree() {
    let results = run(3, 4096, |t| {
        // Rank 2 asks for a different length: every rank fails and nothing stays allocated.
        let len = if t.rank() == 2 { 128 } else { 64 };
        let mismatch = t.alloc(len);
        let too_big = t.alloc(1 << 20);
        let after = t.alloc(64)?;
        Ok((mismatch.map_err(|e| e.to_string()), too_big.is_err(), after))
    });
    for (mismatch, too_big, after) in &results {
        let err = mismatch.as_ref().unwrap_err();
        assert!(err.contains("differ"), "{err}");
        assert!(*too_big);
        assert_eq!(after.offset(), 0);
    }
}

#[test]
fn different_heap_sizes_are_a_config_error() {
    let world = MemTransport::fan_out_with_timeout(2, Duration::from_secs(30));
    let threads: Vec<_> = world
        .into_iter()
        .map(|t| {
            thread::spawn(move || {
                let size = 4096 * (1 + u64::from(t.rank()));
                let s = Symmetric::new(t, size)?;
                s.alloc(64)
            })
        })
        .collect();
    for t in threads {
        let err = t.join().unwrap().unwrap_err();
        assert!(matches!(err, CollectiveError::Config { .. }), "{err}");
    }
}

#[test]
fn a_dropped_peer_fails_requests_instead_of_hanging() {
    let mut world = MemTransport::fan_out_symmetric(2, 4096).unwrap();
    let gone = world.pop().unwrap();
    let survivor = world.pop().unwrap();
    drop(gone);
    let err = survivor
        .get_nbi(1, 0, 8)
        .and_then(Completion::wait)
        .unwrap_err();
    assert!(
        matches!(err, CollectiveError::PeerLost { peer: 1, .. }),
        "{err}"
    );
    let err = survivor.put(1, 0, b"x").unwrap_err();
    assert!(
        matches!(err, CollectiveError::PeerLost { peer: 1, .. }),
        "{err}"
    );
}

/// A rank that puts and leaves at once (a ring neighbour that finished its part) still lands
/// its data: its target applies every request it sent before leaving, although the answers
/// can no longer be delivered, and says when nothing more from it can arrive. The target's
/// heap service starts only after the sender has gone, so every answer fails.
#[test]
fn a_peer_that_puts_and_leaves_still_lands_its_data() {
    let mut carriers = MemTransport::fan_out_with_timeout(2, Duration::from_secs(60));
    let target_carrier = carriers.pop().unwrap();
    let sender = Symmetric::with_max_chunk(carriers.pop().unwrap(), 4096, 64).unwrap();
    let data: Vec<u8> = (0..1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let handle = sender
        .put_signal_nbi(1, 0, &data, Signal::set(2048, 5))
        .unwrap();
    drop(handle);
    drop(sender);
    let target = Symmetric::with_max_chunk(target_carrier, 4096, 64).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !target.source_finished(0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the departed sender's requests were never all applied"
        );
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        target
            .wait_until(2048, Cmp::Eq, 5, Duration::ZERO)
            .expect("the signal of the departed sender's last chunk"),
        5
    );
    let mut landed = vec![0u8; data.len()];
    target.heap().read(0, &mut landed).unwrap();
    assert_eq!(landed, data, "all 16 chunks landed");
    assert!(!target.source_finished(1), "a rank is no source of its own");
}

#[test]
fn abort_wakes_a_waiter() {
    let world = MemTransport::fan_out_symmetric(2, 4096).unwrap();
    let waiter = world[0].clone();
    let t = thread::spawn(move || waiter.wait_until(0, Cmp::Eq, 1, Duration::from_secs(60)));
    thread::sleep(Duration::from_millis(20));
    world[0].abort();
    assert!(matches!(t.join().unwrap(), Err(CollectiveError::Aborted)));
    assert!(matches!(
        world[0].fetch_add(1, 0, 1),
        Err(CollectiveError::Aborted)
    ));
}

#[test]
fn a_world_of_one_works_locally() {
    let world = MemTransport::fan_out_symmetric(1, 256).unwrap();
    let t = &world[0];
    let region = t.alloc(16).unwrap();
    let flag = t.alloc(8).unwrap();
    t.put_signal(
        0,
        region.offset() + 3,
        b"solo",
        Signal::set(flag.offset(), 5),
    )
    .unwrap();
    assert_eq!(
        t.wait_until(flag.offset(), Cmp::Eq, 5, Duration::ZERO)
            .unwrap(),
        5
    );
    let mut got = [0u8; 4];
    t.get(0, region.offset() + 3, &mut got).unwrap();
    assert_eq!(&got, b"solo");
    assert_eq!(t.fetch_add(0, flag.offset(), 1).unwrap(), 5);
    assert_eq!(t.compare_swap(0, flag.offset(), 6, 9).unwrap(), 6);
    assert!(matches!(
        t.put(0, 250, &[0; 8]),
        Err(CollectiveError::OutOfBounds { rank: 0, .. })
    ));
    t.barrier().unwrap();
    t.free(region).unwrap();
    assert!(matches!(
        t.free(region),
        Err(CollectiveError::InvalidArgument { .. })
    ));
}

#[test]
fn a_chunked_transfer_is_checked_whole_and_signalled_last() {
    run_chunked(2, 4096, 100, |t| {
        let data = t.alloc(1024)?;
        let flag = t.alloc(8)?;
        if t.rank() == 0 {
            // Its first chunks would fit, its last would not: nothing may be written.
            let err = t.put(1, 4096 - 250, &[5u8; 300]).unwrap_err();
            assert!(
                matches!(
                    err,
                    CollectiveError::OutOfBounds {
                        rank: 1,
                        len: 300,
                        ..
                    }
                ),
                "{err}"
            );
            let err = t
                .put_signal(1, data.offset(), &[5u8; 300], Signal::set(4092, 1))
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    CollectiveError::OutOfBounds {
                        rank: 1,
                        offset: 4092,
                        ..
                    }
                ),
                "{err}"
            );
            let err = t
                .put_signal(
                    1,
                    data.offset(),
                    &[5u8; 300],
                    Signal::set(flag.offset() + 4, 1),
                )
                .unwrap_err();
            assert!(
                matches!(err, CollectiveError::InvalidArgument { .. }),
                "{err}"
            );
            let bytes: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
            t.put_signal(1, data.offset() + 7, &bytes, Signal::add(flag.offset(), 1))?;
            let back = t.get_nbi(1, data.offset() + 7, 1000)?.wait()?;
            assert_eq!(back, bytes);
        } else {
            t.wait_until(flag.offset(), Cmp::Eq, 1, Duration::from_secs(30))?;
            let mut got = vec![0u8; 1000];
            t.heap().read(data.offset() + 7, &mut got)?;
            assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
            let mut all = vec![0u8; 4096];
            t.heap().read(0, &mut all)?;
            assert!(
                all[1024 + 64..].iter().all(|&b| b == 0),
                "a refused chunk was applied"
            );
        }
        t.barrier()?;
        Ok(())
    });
}
