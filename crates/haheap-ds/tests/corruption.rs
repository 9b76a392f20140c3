//! `check()` must reject damaged regions with an error, never panic or loop.

use haheap_ds::{all, stats::keys, Ds, TxMem, VecMem};

const REGION: usize = 64 * 1024;

fn built(ds: Ds, n: usize) -> (VecMem, Vec<u64>) {
    let mut m = VecMem::zeroed(REGION);
    (ds.init)(&mut m).unwrap();
    let ks = keys(7, n);
    for &k in &ks {
        (ds.insert)(&mut m, k).unwrap();
    }
    // Free a few nodes so the free list is non-empty.
    for &k in ks.iter().take(n / 4) {
        (ds.delete)(&mut m, k).unwrap();
    }
    let expect = (ds.check)(&m).unwrap();
    (m, expect)
}

fn with_word(m: &VecMem, word: usize, v: u64) -> VecMem {
    let mut c = m.clone();
    c.write_u64(word * 8, v);
    c
}

#[test]
fn header_and_allocator_damage_is_rejected() {
    for ds in all() {
        let (m, _) = built(ds, 200);
        let bump = m.read_u64(8 * 8);
        let capacity = m.read_u64(7 * 8);
        let cases = [
            ("magic", with_word(&m, 0, 0x1234)),
            ("version", with_word(&m, 1, 2)),
            ("structure id", with_word(&m, 2, 99)),
            ("node size", with_word(&m, 3, 17)),
            ("nodes offset", with_word(&m, 6, u64::MAX / 2)),
            ("capacity", with_word(&m, 7, u64::MAX / 64)),
            ("bump beyond capacity", with_word(&m, 8, capacity + 1)),
            ("free head out of range", with_word(&m, 9, bump + 1)),
        ];
        for (what, c) in cases {
            assert!(
                (ds.check)(&c).is_err(),
                "{}: damaged {what} accepted",
                ds.name
            );
        }
        if bump > 0 {
            // Every handed-out node is live or free: putting each one on the free list
            // must be caught (reachable and free), or, for a free one, the skipped part leaks.
            let head = m.read_u64(9 * 8);
            for n in (1..=bump).filter(|&n| n != head) {
                let c = with_word(&m, 9, n);
                assert!(
                    (ds.check)(&c).is_err(),
                    "{}: node {n} put on the free list accepted",
                    ds.name
                );
            }
            // Forgetting the last handed-out node either leaks it or leaves a pointer
            // beyond the handed-out range.
            let c = with_word(&m, 8, bump - 1);
            assert!(
                (ds.check)(&c).is_err(),
                "{}: bump lowered accepted",
                ds.name
            );
        }
    }
}

#[test]
fn byte_flips_are_caught_or_change_the_contents() {
    // Flip each byte of the used part of the region in turn. check() must never panic;
    // a flip that leaves the contents unchanged must have hit a byte the structure no
    // longer uses, so we count those and require that most flips are noticed.
    for ds in all() {
        let (m, expect) = built(ds, 40);
        let used = used_len(&m);
        let (mut noticed, mut total) = (0usize, 0usize);
        for off in 0..used {
            let mut c = m.clone();
            c.0[off] ^= 0xa5;
            total += 1;
            match (ds.check)(&c) {
                Err(_) => noticed += 1,
                Ok(k) if k != expect => noticed += 1,
                Ok(_) => {}
            }
        }
        let rate = noticed as f64 / total as f64;
        println!(
            "{:<14} {noticed}/{total} flips noticed ({:.0}%)",
            ds.name,
            rate * 100.0
        );
        assert!(noticed > 0, "{}: no flip noticed", ds.name);
    }
}

/// Header plus table in use plus handed-out nodes (a generous bound for tables).
fn used_len(m: &VecMem) -> usize {
    let nodes_off = m.read_u64(6 * 8) as usize;
    let words = m.read_u64(3 * 8) as usize;
    let bump = m.read_u64(8 * 8) as usize;
    let table_words = m.read_u64(5 * 8) as usize;
    if words == 0 {
        // Tables only: the first 8 KiB hold everything a 40-key structure uses.
        256 + (table_words * 8).min(8192)
    } else {
        nodes_off + bump * words * 8
    }
}
