//! Native collectives: a backend's own all-reduce, all-gather and reduce-scatter are used for
//! the world group when the backend supports the dtype and reduction, and never for a
//! sub-group or an unsupported combination.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rlx_collective::{
    CollectiveError, DType, MemTransport, NativeCollectives, NativeOp, ProcessGroup, ReduceKind,
    Result, Transport,
};

/// A `MemTransport` rank that claims native f32 Sum collectives and marks their output, so the
/// test can tell which path ran.
struct NativeMem {
    inner: Arc<MemTransport>,
    calls: AtomicUsize,
}

const MARK: u8 = 0x42;

impl NativeCollectives for NativeMem {
    fn supports(&self, _op: NativeOp, dtype: DType, reduce: Option<ReduceKind>) -> bool {
        dtype == DType::F32 && matches!(reduce, None | Some(ReduceKind::Sum))
    }

    fn all_reduce(&self, data: &mut [u8], _dtype: DType, _reduce: ReduceKind) -> Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        data.fill(MARK);
        Ok(())
    }

    fn all_gather(&self, _local: &[u8], out: &mut [u8], _dtype: DType) -> Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        out.fill(MARK);
        Ok(())
    }

    fn reduce_scatter(
        &self,
        _input: &[u8],
        out: &mut [u8],
        _dtype: DType,
        _reduce: ReduceKind,
    ) -> Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        out.fill(MARK);
        Ok(())
    }
}

/// Everything but the native collectives is the inner transport's.
impl rlx_collective::Delegate for NativeMem {
    fn inner(&self) -> &dyn Transport {
        &*self.inner
    }

    fn native_collectives(&self) -> Option<&dyn NativeCollectives> {
        Some(self)
    }
}

#[test]
fn native_collectives_serve_the_world_group_only() {
    let groups: Vec<(ProcessGroup, Arc<NativeMem>)> =
        MemTransport::fan_out_with_timeout(4, common::TEST_TIMEOUT)
            .into_iter()
            .map(|inner| {
                let t = Arc::new(NativeMem {
                    inner,
                    calls: AtomicUsize::new(0),
                });
                (ProcessGroup::new(Arc::clone(&t) as Arc<dyn Transport>), t)
            })
            .collect();
    let threads: Vec<_> = groups
        .into_iter()
        .map(|(group, native)| {
            std::thread::spawn(move || -> std::result::Result<(), CollectiveError> {
                // Supported: f32 Sum all-reduce, f32 all-gather, f32 Sum reduce-scatter of
                // equal blocks.
                let mut x = vec![1.0f32; 8];
                group.all_reduce(&mut x, ReduceKind::Sum)?;
                assert!(
                    x.iter()
                        .all(|v| v.to_bits() == u32::from_ne_bytes([MARK; 4]))
                );
                let g = group.all_gather(&[1.0f32, 2.0])?;
                assert_eq!(g.len(), 8);
                assert!(
                    g.iter()
                        .all(|v| v.to_bits() == u32::from_ne_bytes([MARK; 4]))
                );
                let block = group.reduce_scatter(&[1.0f32; 8], ReduceKind::Sum)?;
                assert_eq!(block.len(), 2);
                assert_eq!(native.calls.load(Ordering::SeqCst), 3);

                // Unsupported: Max, and f64; the group's own algorithms run.
                let mut y = vec![group.rank() as f32; 5];
                group.all_reduce(&mut y, ReduceKind::Max)?;
                assert_eq!(y, vec![3.0; 5]);
                let mut z: Vec<u8> = (0..3).flat_map(|_| 1.0f64.to_le_bytes()).collect();
                group.all_reduce_typed(&mut z, DType::F64, ReduceKind::Sum)?;
                assert_eq!(
                    z,
                    (0..3)
                        .flat_map(|_| 4.0f64.to_le_bytes())
                        .collect::<Vec<u8>>()
                );
                assert_eq!(native.calls.load(Ordering::SeqCst), 3);

                // A sub-group never uses the world's native collectives.
                let sub = group
                    .split(Some(group.rank() / 2), 0)?
                    .expect("every rank has a color");
                let mut w = vec![1.0f32; 6];
                sub.all_reduce(&mut w, ReduceKind::Sum)?;
                assert_eq!(w, vec![2.0; 6]);
                assert_eq!(native.calls.load(Ordering::SeqCst), 3);
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap().unwrap();
    }
}
