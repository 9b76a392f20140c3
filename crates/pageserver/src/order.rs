//! Which pages a restore sends before the guest's first instruction, which after,
//! in what order, and which page the one discard the stream needs names. Pure: the
//! mode, the snapshot's trace and the image's data pages in, an [`Order`] out.

use serde::{Deserialize, Serialize};

/// What goes ahead of the start (HotRestore's modes on the page server).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ahead {
    /// Nothing: every page the guest touches is a request. The pushing of the rest
    /// waits `quiet_s` after the start, so the requests are the guest's true first
    /// touches (the exact trace).
    Nothing,
    /// The first `n` pages of the trace (the whole trace for working-set).
    Trace(usize),
    /// Every data page of the image (eager).
    All,
}

/// The order of one restore's pages (page numbers of the guest's main RAM block).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Order {
    /// Sent before the devices load, in this order.
    pub ahead: Vec<u64>,
    /// Pushed after the devices load, behind the guest's requests, in this order:
    /// the rest of the trace in first-access order, then every other data page in
    /// file order, then the image's holes (as zero pages).
    pub rest: Vec<u64>,
    /// The page the stream's one discard names (QEMU 7.2 needs one before LISTEN):
    /// never sent before the devices load.
    pub discard: u64,
}

/// Orders a restore of an image of `pages` pages whose data pages are those set in
/// `data`, with the snapshot's `trace` (main-block page numbers, first-access
/// order; pages past the end are ignored). `fafl`: the rest of the trace goes
/// before the rest of the image (else the image in file order only).
pub fn order(ahead: Ahead, trace: &[u64], data: &[bool], fafl: bool) -> Order {
    let pages = data.len() as u64;
    let mut sent = vec![false; data.len()];
    let mut take = |p: u64, out: &mut Vec<u64>| {
        if p < pages && !std::mem::replace(&mut sent[p as usize], true) {
            out.push(p);
        }
    };
    let mut first = Vec::new();
    match ahead {
        Ahead::Nothing => {}
        Ahead::Trace(n) => trace.iter().take(n).for_each(|&p| take(p, &mut first)),
        Ahead::All => (0..pages)
            .filter(|&p| data[p as usize])
            .for_each(|p| take(p, &mut first)),
    }
    let mut rest = Vec::new();
    if fafl {
        trace.iter().for_each(|&p| take(p, &mut rest));
    }
    (0..pages)
        .filter(|&p| data[p as usize])
        .for_each(|p| take(p, &mut rest));
    // The holes last, as zero pages: every page must be in place before the
    // stream ends. QEMU 7.2's destination ends postcopy under its big lock, so a
    // device model holding that lock and touching a page never sent would wait
    // for it forever.
    (0..pages).for_each(|p| take(p, &mut rest));
    // What goes ahead is all in place before the first instruction, so its order
    // does not matter: by address, read in runs (HotRestore 5.2), not page by page
    // in the trace's scattered order.
    first.sort_unstable();
    // The discard: a page the rest sends anyway, else the last page sent ahead,
    // moved behind the start.
    let discard = match rest.first() {
        Some(&p) => p,
        None => {
            let p = first.pop().unwrap_or(0);
            rest.push(p);
            p
        }
    };
    Order {
        ahead: first,
        rest,
        discard,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(bits: &str) -> Vec<bool> {
        bits.chars().map(|c| c == '1').collect()
    }

    #[test]
    fn elastic_sends_the_trace_head_ahead_then_its_tail_then_the_image_in_file_order() {
        let d = data("11101111");
        let o = order(Ahead::Trace(2), &[5, 1, 7, 3, 1, 99], &d, true);
        // By address: read in one pass.
        assert_eq!(o.ahead, vec![1, 5]);
        // Page 3 is a hole the trace names (the guest touched it): it goes with
        // the trace; the image's other holes go last.
        assert_eq!(o.rest, vec![7, 3, 0, 2, 4, 6]);
        assert_eq!(o.discard, 7);
        let o = order(Ahead::Trace(2), &[5, 1, 7], &d, false);
        assert_eq!(o.rest, vec![0, 2, 4, 6, 7, 3]);
    }

    #[test]
    fn lazy_sends_nothing_ahead_and_holes_go_last() {
        let o = order(Ahead::Nothing, &[], &data("0110"), true);
        assert!(o.ahead.is_empty());
        assert_eq!(o.rest, vec![1, 2, 0, 3]);
        assert_eq!(o.discard, 1);
    }

    #[test]
    fn eager_discards_a_hole_or_else_moves_its_last_page_behind_the_start() {
        let o = order(Ahead::All, &[2, 0], &data("1011"), true);
        assert_eq!(o.ahead, vec![0, 2, 3]);
        assert_eq!(o.rest, vec![1]);
        assert_eq!(o.discard, 1);
        let o = order(Ahead::All, &[], &data("111"), true);
        assert_eq!(o.ahead, vec![0, 1]);
        assert_eq!(o.rest, vec![2]);
        assert_eq!(o.discard, 2);
        // An image of nothing but holes still gets its discard.
        let o = order(Ahead::All, &[], &data("00"), true);
        assert_eq!((o.ahead.len(), o.rest, o.discard), (0, vec![0, 1], 0));
    }
}
