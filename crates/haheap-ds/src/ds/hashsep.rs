//! Separate chaining (Weiss `hashsep.c`): a fixed prime number of buckets, each a list
//! inserted at its head. The book gives each bucket a header cell; here the bucket
//! array in the table area holds the heads directly.

use super::hashquad::next_prime;
use crate::region::{check_key, Checker, Region, HEADER_LEN, NIL};
use crate::{DsError, Kind, Structure, TxMem};

const KEY: usize = 0;
const NEXT: usize = 1;
const WORDS: usize = 2;
const ID: u64 = 6;
const BUCKETS: usize = 0; // aux word

/// The `hashsepchain` structure.
pub struct HashSep;

fn bucket(m: &dyn TxMem, r: &Region, key: u64) -> usize {
    (key % r.aux(m, BUCKETS)) as usize
}

impl Structure for HashSep {
    fn name() -> &'static str {
        "hashsepchain"
    }
    fn kind() -> Kind {
        Kind::Set
    }
    fn init(m: &mut dyn TxMem) -> Result<(), DsError> {
        // One bucket word per node slot: a full table has load factor about one.
        let space = m.len().saturating_sub(HEADER_LEN + 128);
        let mut buckets = next_prime((space / 26).max(7) as u64);
        while buckets > 7 && buckets as usize * 8 > space / 3 {
            buckets = next_prime(buckets / 2);
        }
        let r = Region::format(m, ID, WORDS, buckets as usize)?;
        r.set_aux(m, BUCKETS, buckets);
        r.zero_table(m, 0, buckets as usize);
        Ok(())
    }
    fn insert(m: &mut dyn TxMem, key: u64) -> Result<bool, DsError> {
        check_key(key)?;
        let r = Region::open(m, ID, WORDS)?;
        let b = bucket(m, &r, key);
        let head = r.table(m, b);
        let mut p = head;
        while p != NIL {
            if r.get(m, p, KEY) == key {
                return Ok(false);
            }
            p = r.get(m, p, NEXT);
        }
        let n = r.alloc(m)?;
        r.set(m, n, NEXT, head);
        r.set(m, n, KEY, key);
        r.set_table(m, b, n);
        Ok(true)
    }
    fn delete(m: &mut dyn TxMem, key: u64) -> Result<Option<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        let b = bucket(m, &r, key);
        let (mut prev, mut p) = (NIL, r.table(m, b));
        while p != NIL && r.get(m, p, KEY) != key {
            prev = p;
            p = r.get(m, p, NEXT);
        }
        if p == NIL {
            return Ok(None);
        }
        let next = r.get(m, p, NEXT);
        if prev == NIL {
            r.set_table(m, b, next);
        } else {
            r.set(m, prev, NEXT, next);
        }
        r.free(m, p);
        Ok(Some(key))
    }
    fn check(m: &dyn TxMem) -> Result<Vec<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        let mut chk = Checker::new(Self::name(), m, &r)?;
        let buckets = r.aux(m, BUCKETS);
        if buckets == 0 || buckets as usize > r.table_words {
            return Err(chk.err(format!(
                "{buckets} buckets in a table of {} words",
                r.table_words
            )));
        }
        let mut keys = Vec::new();
        for b in 0..buckets as usize {
            let mut p = r.table(m, b);
            while p != NIL {
                chk.visit(p, &format!("chain of bucket {b}"))?;
                let k = r.get(m, p, KEY);
                if k % buckets != b as u64 {
                    return Err(chk.err(format!("key {k} sits in bucket {b}")));
                }
                keys.push(k);
                p = r.get(m, p, NEXT);
            }
        }
        chk.finish()?;
        keys.sort_unstable();
        if keys.windows(2).any(|w| w[0] == w[1]) {
            return Err(chk.err("a key is stored twice"));
        }
        Ok(keys)
    }
}
