//! The write/page profile (the talk's table) counts what the structures really store.

use haheap_ds::stats::{profile, table};
use haheap_ds::{all, by_name};

#[test]
fn profile_of_every_structure_and_exact_counts_of_the_simple_ones() {
    let profiles: Vec<_> = all()
        .into_iter()
        .map(|ds| profile(ds, 4 << 20, 2000, 5, 4096).unwrap())
        .collect();
    println!("{}", table(&profiles));
    for p in &profiles {
        for o in [&p.insert, &p.delete] {
            assert!(
                o.writes.min >= 1 && o.pages.min >= 1,
                "{}: an operation stored nothing",
                p.name
            );
            assert!(
                o.pages.max <= o.writes.max,
                "{}: more pages than writes",
                p.name
            );
            assert!(
                o.bytes.avg >= 8.0 * o.writes.avg,
                "{}: u64 stores only",
                p.name
            );
        }
    }
    let get = |n: &str| *profiles.iter().find(|p| p.name == n).unwrap();
    // Allocation (bump or free-list pop: one header word) + the book's stores.
    let exact = [
        ("list", 4.0, 3.0),         // key, next, header.next | prev.next + free (2)
        ("hashsepchain", 4.0, 3.0), // next, key, bucket head | unlink + free (2)
        ("queue", 3.0, 2.0),        // size, rear, slot | size, front
    ];
    for (name, ins, del) in exact {
        let p = get(name);
        assert_eq!(
            (p.insert.writes.avg, p.delete.writes.avg),
            (ins, del),
            "{name}"
        );
        assert_eq!(
            (p.insert.writes.min, p.insert.writes.max),
            (ins as u64, ins as u64),
            "{name}"
        );
    }
    // Lazy deletion marks one cell and updates one counter.
    assert_eq!(get("hashquad").delete.writes.max, 2);
    // Rehashing makes the worst quadratic-probing insert far costlier than the average.
    assert!(get("hashquad").insert.writes.max > 100 * get("hashquad").insert.writes.avg as u64);
    assert!(by_name("nope").is_none());
}
