//! A randomized check of the symmetric heap against a serial model, shared by the heap tests
//! over every transport: each rank issues random puts, gets and fetch-adds to random targets
//! and checks every get, its stripes and the counters against what its model predicts. Also the
//! small checks both heap test files share.

use std::time::Duration;

use rlx_transport::symmetric::{Cmp, Region, Signal, SymmetricTransport};
use rlx_transport::{CollectiveError, Result};

/// `Ok` when `condition` holds, else an `InvalidArgument` error saying `what` went wrong.
pub(crate) fn check(condition: bool, what: impl FnOnce() -> String) -> Result<()> {
    if condition {
        Ok(())
    } else {
        Err(CollectiveError::invalid(what()))
    }
}

/// Put-with-signal around the ring: every rank puts 64 bytes into its own slot of `slots` on
/// the next rank with a +1 on that rank's `flag`, waits for its own flag, and checks that the
/// previous rank's bytes are visible. Collective.
pub(crate) fn ring_put_signal<S: SymmetricTransport>(
    t: &S,
    slots: Region,
    flag: Region,
) -> Result<()> {
    let n = t.world_size();
    let me = t.rank();
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let data = [me as u8 + 1; 64];
    t.put_signal(
        next,
        slots.at(u64::from(me) * 64, 64)?,
        &data,
        Signal::add(flag.offset(), 1),
    )?;
    t.wait_until(flag.offset(), Cmp::Eq, 1, Duration::from_secs(60))?;
    let mut got = [0u8; 64];
    t.heap()
        .read(slots.at(u64::from(prev) * 64, 64)?, &mut got)?;
    check(got == [prev as u8 + 1; 64], || {
        format!("rank {me} saw {got:?} from rank {prev}")
    })
}

/// `ops` random operations from every rank: puts and gets on this rank's own stripe of every
/// target (so each rank can check its gets against its own model), fetch-adds on shared
/// counters whose final values every rank checks. Collective: every rank calls it.
pub(crate) fn random_operations<S: SymmetricTransport>(t: &S, ops: usize) -> Result<()> {
    const STRIPE: u64 = 1024;
    let n = t.world_size();
    let me = t.rank();
    let stripes = t.alloc(u64::from(n) * STRIPE)?;
    let counters = t.alloc(4 * 8)?;
    let mut state = 0x1234_5678_u64 ^ (u64::from(me) << 32);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut model = vec![vec![0u8; STRIPE as usize]; n as usize];
    let mut added = vec![0u64; n as usize * 4];
    for op in 0..ops {
        let target = (next() % u64::from(n)) as u32;
        let stripe = stripes.at(u64::from(me) * STRIPE, STRIPE)?;
        let len = 1 + next() % 100;
        let at = next() % (STRIPE - len + 1);
        let range = at as usize..(at + len) as usize;
        match next() % 3 {
            0 => {
                let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                drop(t.put_nbi(target, stripe + at, &bytes)?);
                model[target as usize][range].copy_from_slice(&bytes);
            }
            1 => {
                let mut got = vec![0u8; len as usize];
                t.get(target, stripe + at, &mut got)?;
                check(got == model[target as usize][range], || {
                    format!("rank {me} op {op}: get of {len} bytes at {at} from rank {target}")
                })?;
            }
            _ => {
                let k = next() % 4;
                let v = 1 + next() % 100;
                t.fetch_add(target, counters.offset() + 8 * k, v)?;
                added[target as usize * 4 + k as usize] += v;
            }
        }
    }
    t.barrier()?;
    for target in 0..n {
        let mut stripe = vec![0u8; STRIPE as usize];
        t.get(
            target,
            stripes.at(u64::from(me) * STRIPE, STRIPE)?,
            &mut stripe,
        )?;
        check(stripe == model[target as usize], || {
            format!("rank {me}'s stripe on rank {target} differs from its model")
        })?;
    }
    // Everyone's additions, exchanged, give the counters' expected values.
    let mine: Vec<u8> = added.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut expected = added.clone();
    for peer in (0..n).filter(|&p| p != me) {
        t.send_bytes(peer, 1, &mine)?;
    }
    for peer in (0..n).filter(|&p| p != me) {
        let theirs = t.recv_bytes(peer, 1)?;
        for (sum, chunk) in expected.iter_mut().zip(theirs.chunks_exact(8)) {
            *sum += u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        }
    }
    for k in 0..4u64 {
        let value = t.heap().load_u64(counters.offset() + 8 * k)?;
        let want = expected[me as usize * 4 + k as usize];
        check(value == want, || {
            format!("counter {k} of rank {me} is {value}, expected {want}")
        })?;
    }
    t.barrier()
}
