//! A linked list kept in a `Heap`, one transaction per update.
//!
//! `cargo run -p haheap --example list [-- ENGINE [BACKUP]]`, ENGINE one of auto (default),
//! mprotect, uffd, scan, log; BACKUP e.g. `unix:/tmp/backup.sock` of a running
//! `rebound-ha backup`. Nodes are addressed by offset, so the list means the same thing in a
//! backup's replica or in a new primary after takeover.

use anyhow::{bail, Context};
use haheap::{BackupFailure, EngineKind, Heap, HeapConfig, ReplMode};

/// Root at offset 0: head, next free offset, count. Nodes (value, next) from offset 64.
const ROOT: usize = 0;
const FIRST_NODE: u64 = 64;
const NODE: u64 = 16;

struct List<'a> {
    heap: &'a mut Heap,
}

impl List<'_> {
    fn read(&self, off: u64) -> u64 {
        let o = off as usize;
        u64::from_le_bytes(self.heap.as_slice()[o..o + 8].try_into().expect("8 bytes"))
    }
    fn write(&mut self, off: u64, v: u64) -> anyhow::Result<()> {
        Ok(self.heap.write(off as usize, &v.to_le_bytes())?)
    }
    fn init(&mut self) -> anyhow::Result<()> {
        self.write(ROOT as u64, 0)?;
        self.write(ROOT as u64 + 8, FIRST_NODE)?;
        self.write(ROOT as u64 + 16, 0)
    }
    fn push(&mut self, value: u64) -> anyhow::Result<()> {
        let (head, free, count) = (self.read(0), self.read(8), self.read(16));
        if free + NODE > self.heap.len() as u64 {
            bail!("heap full");
        }
        self.write(free, value)?;
        self.write(free + 8, head)?;
        self.write(0, free)?;
        self.write(8, free + NODE)?;
        self.write(16, count + 1)
    }
    /// Unlinks the first node holding `value`; false if none does.
    fn remove(&mut self, value: u64) -> anyhow::Result<bool> {
        let (mut link, mut at) = (0u64, self.read(0));
        while at != 0 {
            if self.read(at) == value {
                let next = self.read(at + 8);
                self.write(link, next)?;
                let count = self.read(16);
                self.write(16, count - 1)?;
                return Ok(true);
            }
            (link, at) = (at + 8, self.read(at + 8));
        }
        Ok(false)
    }
    fn values(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut at = self.read(0);
        while at != 0 && out.len() <= self.heap.len() / NODE as usize {
            out.push(self.read(at));
            at = self.read(at + 8);
        }
        out
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let engine: EngineKind = args.get(1).map_or("auto", String::as_str).parse()?;
    let cfg = HeapConfig {
        size: 1 << 20,
        engine,
        backup: args.get(2).cloned(),
        mode: ReplMode::Sync,
        on_backup_failure: BackupFailure::Fail,
        spin: haheap::Spin::PRIMARY,
    };
    let mut heap = Heap::create(cfg).context("creating the heap")?;
    println!("engine {} ({})", heap.engine(), heap.engine_reason());

    heap.tstart()?;
    List { heap: &mut heap }.init()?;
    heap.tend()?;
    for v in 1..=10 {
        heap.tstart()?;
        List { heap: &mut heap }.push(v * 10)?;
        let st = heap.tend()?;
        println!(
            "insert {:>3}: tx {:>2}, {} page(s), {} bytes shipped",
            v * 10,
            st.tx_id,
            st.pages,
            st.bytes_shipped
        );
    }
    heap.tstart()?;
    let removed = List { heap: &mut heap }.remove(50)?;
    let st = heap.tend()?;
    println!(
        "remove  50: {removed}, tx {}, {} bytes shipped",
        st.tx_id, st.bytes_shipped
    );

    // An update that fails half-way is aborted: the list is as before it started.
    let before = List { heap: &mut heap }.values();
    heap.tstart()?;
    {
        let mut l = List { heap: &mut heap };
        l.remove(10)?;
        l.push(999)?;
    }
    heap.abort()?;
    let after = List { heap: &mut heap }.values();
    println!("aborted update left {} nodes: {:?}", after.len(), after);
    if after != before || after != [100, 90, 80, 70, 60, 40, 30, 20, 10] {
        bail!("list damaged: {after:?}");
    }
    let c = heap.counters();
    println!(
        "{} commits, {} aborts, {} bytes shipped in all",
        c.commits, c.aborts, c.bytes_shipped
    );
    Ok(())
}
