//! The thirteen structures and a registry to iterate over them by name.

mod aa;
mod avl;
mod binheap;
mod binomial;
mod bst;
mod dsl;
mod hashquad;
mod hashsep;
mod leftist;
mod list;
mod queue;
mod rbtree;
mod splay;

pub use aa::Aa;
pub use avl::Avl;
pub use binheap::BinHeap;
pub use binomial::Binomial;
pub use bst::Bst;
pub use dsl::Dsl;
pub use hashquad::HashQuad;
pub use hashsep::HashSep;
pub use leftist::Leftist;
pub use list::List;
pub use queue::Queue;
pub use rbtree::RedBlack;
pub use splay::Splay;

use crate::{DsError, Kind, Structure, TxMem};

/// A structure's operations as plain function pointers.
#[derive(Clone, Copy)]
pub struct Ds {
    /// Name as in the talk.
    pub name: &'static str,
    /// Behaviour of insert/delete.
    pub kind: Kind,
    /// See [`Structure::init`].
    pub init: fn(&mut dyn TxMem) -> Result<(), DsError>,
    /// See [`Structure::insert`].
    pub insert: fn(&mut dyn TxMem, u64) -> Result<bool, DsError>,
    /// See [`Structure::delete`].
    pub delete: fn(&mut dyn TxMem, u64) -> Result<Option<u64>, DsError>,
    /// See [`Structure::check`].
    pub check: fn(&dyn TxMem) -> Result<Vec<u64>, DsError>,
}

impl std::fmt::Debug for Ds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl Ds {
    /// The operations of `S`.
    pub fn of<S: Structure>() -> Ds {
        Ds {
            name: S::name(),
            kind: S::kind(),
            init: S::init,
            insert: S::insert,
            delete: S::delete,
            check: S::check,
        }
    }
}

/// All thirteen, in the order of the talk's table.
pub fn all() -> [Ds; 13] {
    [
        Ds::of::<Aa>(),
        Ds::of::<Avl>(),
        Ds::of::<Binomial>(),
        Ds::of::<Dsl>(),
        Ds::of::<HashQuad>(),
        Ds::of::<HashSep>(),
        Ds::of::<Leftist>(),
        Ds::of::<BinHeap>(),
        Ds::of::<RedBlack>(),
        Ds::of::<Splay>(),
        Ds::of::<Bst>(),
        Ds::of::<List>(),
        Ds::of::<Queue>(),
    ]
}

/// The structure called `name`.
pub fn by_name(name: &str) -> Option<Ds> {
    all().into_iter().find(|d| d.name == name)
}
