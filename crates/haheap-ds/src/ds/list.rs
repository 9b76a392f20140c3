//! Singly linked list with a header node (Weiss `list.c`): insert after the header,
//! delete after `FindPrevious`. Kept as a set: insert first looks the key up.

use crate::region::{check_key, Checker, Region, NIL};
use crate::{DsError, Kind, Structure, TxMem};

const KEY: usize = 0;
const NEXT: usize = 1;
const WORDS: usize = 2;
const ID: u64 = 12;

/// The `list` structure.
pub struct List;

impl Structure for List {
    fn name() -> &'static str {
        "list"
    }
    fn kind() -> Kind {
        Kind::Set
    }
    fn init(m: &mut dyn TxMem) -> Result<(), DsError> {
        let r = Region::format(m, ID, WORDS, 0)?;
        let head = r.alloc(m)?;
        r.set(m, head, KEY, 0);
        r.set(m, head, NEXT, NIL);
        r.set_root(m, head);
        Ok(())
    }
    fn insert(m: &mut dyn TxMem, key: u64) -> Result<bool, DsError> {
        check_key(key)?;
        let r = Region::open(m, ID, WORDS)?;
        let head = r.root(m);
        let mut p = r.get(m, head, NEXT);
        while p != NIL {
            if r.get(m, p, KEY) == key {
                return Ok(false);
            }
            p = r.get(m, p, NEXT);
        }
        let n = r.alloc(m)?;
        r.set(m, n, KEY, key);
        let first = r.get(m, head, NEXT);
        r.set(m, n, NEXT, first);
        r.set(m, head, NEXT, n);
        Ok(true)
    }
    fn delete(m: &mut dyn TxMem, key: u64) -> Result<Option<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        let mut prev = r.root(m);
        loop {
            let p = r.get(m, prev, NEXT);
            if p == NIL {
                return Ok(None);
            }
            if r.get(m, p, KEY) == key {
                let next = r.get(m, p, NEXT);
                r.set(m, prev, NEXT, next);
                r.free(m, p);
                return Ok(Some(key));
            }
            prev = p;
        }
    }
    fn check(m: &dyn TxMem) -> Result<Vec<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        let mut chk = Checker::new(Self::name(), m, &r)?;
        let head = r.root(m);
        chk.visit(head, "header")?;
        let mut keys = Vec::new();
        let mut p = r.get(m, head, NEXT);
        while p != NIL {
            chk.visit(p, "list link")?;
            keys.push(r.get(m, p, KEY));
            p = r.get(m, p, NEXT);
        }
        chk.finish()?;
        keys.sort_unstable();
        if keys.windows(2).any(|w| w[0] == w[1]) {
            return Err(chk.err("a key is stored twice"));
        }
        Ok(keys)
    }
}
