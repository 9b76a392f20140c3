//! The fault trials' workload: transaction 1 formats the structure, transaction t > 1
//! applies operations derived only from (seed, t), so any prefix of transactions can be
//! replayed exactly, in another process, onto a plain buffer.

use anyhow::{anyhow, Result};
use haheap_ds::{Ds, SplitMix64, TxMem, VecMem};

/// Keys come from a small space so that set deletes hit.
const KEY_SPACE: u64 = 4096;

/// One operation: insert `key`, or delete it (heaps and queue: delete-min / dequeue).
#[derive(Debug, Clone, Copy)]
pub struct Op {
    pub insert: bool,
    pub key: u64,
}

/// The operations of transaction `tx` (> 1).
pub fn tx_ops(seed: u64, tx: u64, opt: usize) -> Vec<Op> {
    let mut r = SplitMix64::new(seed ^ tx.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..opt)
        .map(|_| Op {
            insert: r.below(100) < 60,
            key: r.below(KEY_SPACE),
        })
        .collect()
}

/// Applies transaction `tx` to `m`.
pub fn apply(m: &mut dyn TxMem, ds: Ds, seed: u64, tx: u64, opt: usize) -> Result<()> {
    if tx == 1 {
        return (ds.init)(m).map_err(|e| anyhow!("{}: init: {e}", ds.name));
    }
    for op in tx_ops(seed, tx, opt) {
        let r = if op.insert {
            (ds.insert)(m, op.key).map(|_| ())
        } else {
            (ds.delete)(m, op.key).map(|_| ())
        };
        r.map_err(|e| anyhow!("{}: tx {tx}: {e}", ds.name))?;
    }
    Ok(())
}

/// Replays transactions one by one onto a zeroed buffer of `len` bytes.
pub struct Replay {
    pub mem: VecMem,
    pub applied: u64,
    ds: Ds,
    seed: u64,
    opt: usize,
}

impl Replay {
    pub fn new(ds: Ds, len: usize, seed: u64, opt: usize) -> Replay {
        Replay {
            mem: VecMem::zeroed(len),
            applied: 0,
            ds,
            seed,
            opt,
        }
    }

    /// Applies transactions up to and including `tx`.
    pub fn advance_to(&mut self, tx: u64) -> Result<()> {
        while self.applied < tx {
            apply(
                &mut self.mem,
                self.ds,
                self.seed,
                self.applied + 1,
                self.opt,
            )?;
            self.applied += 1;
        }
        Ok(())
    }
}
