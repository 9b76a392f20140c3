//! Every guest page frame sorted the way makedumpfile's dump levels sort
//! them, so a dump can leave out what the user asked to leave out.
//!
//! # Classes (makedumpfile `-d` bits)
//! | bit | class | struct page test (in this order, first match wins) |
//! |-----|-------|-----------------------------------------------------|
//! |     | (skipped) | compound tail (`compound_head & 1`): keeps the class its head gave it, else kernel |
//! | 16  | [`PageClass::Free`] | not slab and `_mapcount == PAGE_BUDDY_MAPCOUNT_VALUE`, order `private < LENGTH(zone.free_area)`: `2^private` pages; or `_mapcount == PAGE_UNACCEPTED_MAPCOUNT_VALUE`: a max-order block |
//! | 2   | [`PageClass::Cache`] | cache page, `PG_private` clear, not anonymous |
//! | 4   | [`PageClass::CachePrivate`] | cache page with `PG_private`, not anonymous (bit 4 also drops bit 2's class) |
//! | 8   | [`PageClass::User`] | anonymous (`mapping & PAGE_MAPPING_ANON`, not slab) or a hugetlb head |
//! |     | [`PageClass::Hwpoison`] | `PG_hwpoison` |
//! |     | [`PageClass::Offline`] | not slab, `_mapcount == PAGE_OFFLINE_MAPCOUNT_VALUE` (balloon, virtio-mem, ...) |
//! |     | [`PageClass::Kernel`] | everything else |
//! | 1   | zero content | any page still dumped whose bytes are all zero |
//!
//! A cache page has `PG_lru`, or `PG_swapcache` with `PG_swapbacked` (when
//! the kernel has `PG_swapbacked`). A compound head (`flags & PG_head_mask`)
//! gives its class to its `2^order` pages; the order and the hugetlb mark
//! come from the first tail: `compound_order`/`compound_dtor` (4.16–6.5),
//! the low byte of `_flags_1` with `PG_hugetlb` (6.6–6.8), or with
//! `PAGE_HUGETLB_MAPCOUNT_VALUE` (6.9+). An order that is 64 or more or that
//! the head's pfn is not aligned to counts as 0. When a block reaches over
//! pages an earlier block already claimed, the earlier claim stands.
//! Pages of sections without a `mem_map` have no struct page: kernel.
//! This is makedumpfile's `__exclude_unnecessary_pages` (1.7.2, plus its
//! successors' rules for later kernels: the 6.6+ compound fields,
//! unaccepted pages, slab by `PAGE_SLAB_MAPCOUNT_VALUE` and slab pages never
//! anonymous, which on a 6.1 kernel change nothing), so the counts match
//! its report.
//!
//! Hwpoison and offline pages are left out at any level that reads struct
//! pages (any of bits 2–16, or always when the kernel has `PG_hwpoison`), as
//! makedumpfile does. Zero content is found for every page: from the
//! backing's holes (`SEEK_HOLE`) without reading, else by reading 4 MiB at a
//! time; whether it matters depends on the level ([`Classification::excluded`]).
//!
//! The struct page classes do not depend on the level, except in one case
//! only a corrupt mem_map makes: a free block reaching over pages whose own
//! struct pages say something else (makedumpfile, not asked for free pages,
//! would examine those pages one by one).
//!
//! Read a paused guest: a running one changes under the scan. The guest's
//! memory is untrusted: every value read from it is checked, every walk
//! ends within guest RAM, nothing is sized by it, and VMCOREINFO that cannot
//! describe the guest is an error ("dump unfiltered"), never a guess.

use std::ops::Range;

use crate::memmap::{need, MemMap, MemMapError, BATCH};
use crate::memory::{GuestMemory, MemoryError};
use crate::pagetable::{KernelPageTables, PageTableError};
use crate::source::PageSource;
use crate::vmcoreinfo::VmcoreInfo;

/// Errors classifying guest pages.
#[derive(Debug, thiserror::Error)]
pub enum ClassifyError {
    /// The `struct page` array cannot be located or read.
    #[error(transparent)]
    MemMap(#[from] MemMapError),
    /// The kernel page tables cannot be located.
    #[error("cannot locate the guest kernel's page tables")]
    PageTables(#[source] PageTableError),
    /// The kernel is too old for the struct page fields read here.
    #[error("kernel release {0:?} is older than 4.16 or unparsable; its compound page fields are not supported")]
    OldKernel(String),
    /// VMCOREINFO says nothing about where compound page orders are.
    #[error("VMCOREINFO has no compound page order (OFFSET(page.compound_order), NUMBER(PG_hugetlb) or NUMBER(PAGE_HUGETLB_MAPCOUNT_VALUE))")]
    NoCompoundOrder,
    /// A VMCOREINFO value is out of range.
    #[error("VMCOREINFO {key} is {value}, out of range")]
    BadValue { key: String, value: i64 },
    /// Reading page contents for zero pages failed.
    #[error("cannot read guest RAM to find zero pages")]
    Memory(#[from] MemoryError),
    /// A dump level outside 0..=31.
    #[error("dump level {0} is not in 0..=31")]
    BadLevel(u32),
}

/// What a page frame holds, by its `struct page`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum PageClass {
    /// Kernel data, or anything not recognised as another class (kept).
    Kernel = 0,
    /// Free in the buddy allocator (dump level bit 16).
    Free = 1,
    /// Page cache without `PG_private` (bit 2).
    Cache = 2,
    /// Page cache with `PG_private`, e.g. buffer heads (bit 4).
    CachePrivate = 3,
    /// Anonymous or hugetlbfs user memory (bit 8).
    User = 4,
    /// Hardware-poisoned.
    Hwpoison = 5,
    /// Logically offline (ballooned out, unplugged).
    Offline = 6,
}

impl PageClass {
    /// Every class, in discriminant order.
    pub const ALL: [PageClass; 7] = [
        PageClass::Kernel,
        PageClass::Free,
        PageClass::Cache,
        PageClass::CachePrivate,
        PageClass::User,
        PageClass::Hwpoison,
        PageClass::Offline,
    ];

    fn from_bits(b: u8) -> PageClass {
        PageClass::ALL[usize::from(b & CLASS_MASK).min(6)]
    }
}

/// makedumpfile's dump level: which classes a dump leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpLevel(u8);

impl DumpLevel {
    pub const ZERO: u8 = 1;
    pub const CACHE: u8 = 2;
    pub const CACHE_PRIVATE: u8 = 4;
    pub const USER: u8 = 8;
    pub const FREE: u8 = 16;
    /// `-d 31`: everything that can be left out.
    pub const ALL: DumpLevel = DumpLevel(31);

    /// A level from makedumpfile's `-d` number.
    pub fn new(bits: u32) -> Result<DumpLevel, ClassifyError> {
        u8::try_from(bits)
            .ok()
            .filter(|b| *b <= 31)
            .map(DumpLevel)
            .ok_or(ClassifyError::BadLevel(bits))
    }

    pub fn bits(self) -> u8 {
        self.0
    }

    fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
}

/// Pages per class. `zero` counts zero-content pages of every class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassCounts {
    pub kernel: u64,
    pub free: u64,
    pub cache: u64,
    pub cache_private: u64,
    pub user: u64,
    pub hwpoison: u64,
    pub offline: u64,
    /// Pages (of any class) whose content is all zero.
    pub zero: u64,
}

impl ClassCounts {
    fn add(&mut self, class: PageClass, n: u64) {
        *match class {
            PageClass::Kernel => &mut self.kernel,
            PageClass::Free => &mut self.free,
            PageClass::Cache => &mut self.cache,
            PageClass::CachePrivate => &mut self.cache_private,
            PageClass::User => &mut self.user,
            PageClass::Hwpoison => &mut self.hwpoison,
            PageClass::Offline => &mut self.offline,
        } += n;
    }

    /// All pages counted (zero pages are also in their class).
    pub fn total(&self) -> u64 {
        self.kernel
            + self.free
            + self.cache
            + self.cache_private
            + self.user
            + self.hwpoison
            + self.offline
    }
}

/// What a dump at one level leaves out, counted as makedumpfile's report
/// counts it ("Excluded pages"): a page in one bucket only, zero pages
/// being those left after the struct page classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExcludedCounts {
    /// "Pages filled with zero".
    pub zero: u64,
    /// "Non-private cache pages".
    pub cache: u64,
    /// "Private cache pages".
    pub cache_private: u64,
    /// "User process data pages".
    pub user: u64,
    /// "Free pages".
    pub free: u64,
    /// "Hwpoison pages".
    pub hwpoison: u64,
    /// "Offline pages".
    pub offline: u64,
    /// "Remaining pages": what the dump writes.
    pub remaining: u64,
}

/// Bits of a page's entry: the class in the low 3, zero content in bit 3.
const CLASS_MASK: u8 = 0b0111;
const ZERO_BIT: u8 = 0b1000;

/// One RAM range's pages, one nibble each.
#[derive(Debug, Clone)]
struct Span {
    first_pfn: u64,
    pages: u64,
    nibbles: Vec<u8>,
}

impl Span {
    fn get(&self, pfn: u64) -> u8 {
        let i = pfn - self.first_pfn;
        (self.nibbles[(i / 2) as usize] >> ((i % 2) * 4)) & 0xf
    }

    fn set(&mut self, pfn: u64, v: u8) {
        let i = pfn - self.first_pfn;
        let b = &mut self.nibbles[(i / 2) as usize];
        let shift = (i % 2) * 4;
        *b = (*b & !(0xf << shift)) | (v << shift);
    }

    fn pfns(&self) -> Range<u64> {
        self.first_pfn..self.first_pfn + self.pages
    }
}

/// Every page frame of guest RAM with its class and whether it is all zero
/// (half a byte per page).
#[derive(Debug, Clone)]
pub struct Classification {
    page_size: u64,
    spans: Vec<Span>,
    /// The kernel has `PG_hwpoison`: makedumpfile then always reads struct pages.
    hwpoison_known: bool,
}

impl Classification {
    /// Bytes per page frame.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    fn span(&self, pfn: u64) -> Option<&Span> {
        let i = self.spans.partition_point(|s| s.pfns().end <= pfn);
        self.spans.get(i).filter(|s| s.pfns().contains(&pfn))
    }

    /// The class of page frame `pfn`; `None` outside guest RAM.
    pub fn class(&self, pfn: u64) -> Option<PageClass> {
        self.span(pfn).map(|s| PageClass::from_bits(s.get(pfn)))
    }

    /// Whether page frame `pfn` is all zero; `None` outside guest RAM.
    pub fn is_zero(&self, pfn: u64) -> Option<bool> {
        self.span(pfn).map(|s| s.get(pfn) & ZERO_BIT != 0)
    }

    /// Every page frame of guest RAM with its entry, in order.
    fn entries(&self) -> impl Iterator<Item = (u64, u8)> + '_ {
        self.spans
            .iter()
            .flat_map(|s| s.pfns().map(move |pfn| (pfn, s.get(pfn))))
    }

    /// Pages per class, and zero pages.
    pub fn counts(&self) -> ClassCounts {
        let mut c = ClassCounts::default();
        for (_, e) in self.entries() {
            c.add(PageClass::from_bits(e), 1);
            c.zero += u64::from(e & ZERO_BIT != 0);
        }
        c
    }

    /// The pages a dump at `level` leaves out.
    pub fn excluded(&self, level: DumpLevel) -> Excluded<'_> {
        Excluded { of: self, level }
    }
}

/// A dump level applied to a [`Classification`]: what a dump writer skips.
#[derive(Debug, Clone, Copy)]
pub struct Excluded<'a> {
    of: &'a Classification,
    level: DumpLevel,
}

/// Why a page is left out, or `None` if it is dumped.
fn reason(level: DumpLevel, hwpoison_known: bool, entry: u8) -> Option<Reason> {
    let reads_structs = level.0 & 0b11110 != 0 || hwpoison_known;
    let class = PageClass::from_bits(entry);
    let by_class = match class {
        PageClass::Kernel => false,
        PageClass::Free => level.has(DumpLevel::FREE),
        PageClass::Cache => level.has(DumpLevel::CACHE) || level.has(DumpLevel::CACHE_PRIVATE),
        PageClass::CachePrivate => level.has(DumpLevel::CACHE_PRIVATE),
        PageClass::User => level.has(DumpLevel::USER),
        PageClass::Hwpoison | PageClass::Offline => reads_structs,
    };
    if by_class {
        Some(Reason::Class(class))
    } else if level.has(DumpLevel::ZERO) && entry & ZERO_BIT != 0 {
        Some(Reason::Zero)
    } else {
        None
    }
}

enum Reason {
    Class(PageClass),
    Zero,
}

impl Excluded<'_> {
    /// Whether the dump leaves out page frame `pfn` (`false` outside RAM).
    pub fn is_excluded(&self, pfn: u64) -> bool {
        self.of
            .span(pfn)
            .is_some_and(|s| reason(self.level, self.of.hwpoison_known, s.get(pfn)).is_some())
    }

    /// Whether the dump leaves out the page holding guest physical address `gpa`.
    pub fn is_excluded_gpa(&self, gpa: u64) -> bool {
        self.is_excluded(gpa / self.of.page_size)
    }

    /// Guest physical ranges the dump leaves out, sorted and merged.
    pub fn excluded_ranges(&self) -> Vec<Range<u64>> {
        let ps = self.of.page_size;
        let mut out: Vec<Range<u64>> = Vec::new();
        for (pfn, e) in self.of.entries() {
            if reason(self.level, self.of.hwpoison_known, e).is_none() {
                continue;
            }
            match out.last_mut() {
                Some(last) if last.end == pfn * ps => last.end += ps,
                _ => out.push(pfn * ps..(pfn + 1) * ps),
            }
        }
        out
    }

    /// The counts of makedumpfile's report for this level.
    pub fn counts(&self) -> ExcludedCounts {
        self.count(self.of.entries())
    }

    /// The counts over the pages of `gpas` only (e.g. what an ELF's PT_LOADs
    /// cover); pages outside guest RAM are not counted.
    pub fn counts_in(&self, gpas: &[Range<u64>]) -> ExcludedCounts {
        let ps = self.of.page_size;
        self.count(
            self.of
                .entries()
                .filter(|(pfn, _)| gpas.iter().any(|r| r.contains(&(pfn * ps)))),
        )
    }

    fn count(&self, entries: impl Iterator<Item = (u64, u8)>) -> ExcludedCounts {
        let (mut by_class, mut zero, mut remaining) = (ClassCounts::default(), 0, 0);
        for (_, e) in entries {
            match reason(self.level, self.of.hwpoison_known, e) {
                None => remaining += 1,
                Some(Reason::Zero) => zero += 1,
                Some(Reason::Class(class)) => by_class.add(class, 1),
            }
        }
        ExcludedCounts {
            zero,
            cache: by_class.cache,
            cache_private: by_class.cache_private,
            user: by_class.user,
            free: by_class.free,
            hwpoison: by_class.hwpoison,
            offline: by_class.offline,
            remaining,
        }
    }
}

/// Where the compound order and the hugetlb mark of a head are.
#[derive(Debug, Clone, Copy)]
enum Compound {
    /// 4.16–6.5: `page[1].compound_order` and `page[1].compound_dtor` (u8 each).
    Fields { order: u64, dtor: Option<u64> },
    /// 6.6–6.8: `page[1].flags` low byte, hugetlb if bit `PG_hugetlb` of it.
    FlagsBit { hugetlb_bit: u32 },
    /// 6.9+: `page[1].flags` low byte, hugetlb if the head's `_mapcount` is this.
    FlagsMapcount { hugetlb_mapcount: i32 },
}

/// The struct page layout and flag numbers, from VMCOREINFO.
#[derive(Debug, Clone)]
struct Rules {
    map: MemMap,
    flags: usize,
    mapcount: usize,
    mapping: usize,
    private: usize,
    compound_head: usize,
    compound: Compound,
    pg_lru: u32,
    pg_private: u32,
    pg_swapcache: u32,
    pg_swapbacked: Option<u32>,
    pg_slab: u32,
    pg_hwpoison: Option<u32>,
    head_mask: u64,
    buddy: i32,
    max_order: u64,
    offline: Option<i32>,
    unaccepted: Option<i32>,
    slab_mapcount: Option<i32>,
    hugetlb_dtor: Option<u64>,
}

/// `PAGE_MAPPING_ANON`.
const PAGE_MAPPING_ANON: u64 = 1;

/// `(major, minor)` of a release such as `6.1.0-56-amd64`.
fn release(osrelease: &str) -> Option<(u32, u32)> {
    let mut it = osrelease.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// `NUMBER(name)` as a `T`, if VMCOREINFO has it; a value out of `T`'s
/// range or not `valid` is an error.
fn number<T: TryFrom<i64>>(
    info: &VmcoreInfo,
    name: &str,
    valid: impl Fn(i64) -> bool,
) -> Result<Option<T>, ClassifyError> {
    let Some(value) = info.number(name) else {
        return Ok(None);
    };
    match T::try_from(value) {
        Ok(v) if valid(value) => Ok(Some(v)),
        _ => Err(ClassifyError::BadValue {
            key: format!("NUMBER({name})"),
            value,
        }),
    }
}

impl Rules {
    fn new(info: &VmcoreInfo) -> Result<Rules, ClassifyError> {
        let map = MemMap::from_vmcoreinfo(info)?;
        if release(&info.osrelease).is_none_or(|v| v < (4, 16)) {
            return Err(ClassifyError::OldKernel(info.osrelease.clone()));
        }
        let field = |name: &'static str, key: &'static str, len: u64| {
            let at = need(info.offset("page", name), key)?;
            map.check_field(key, at.saturating_add(len))?;
            Ok::<usize, MemMapError>(at as usize)
        };
        let flags = field("flags", "OFFSET(page.flags)", 8)?;
        let mapcount = field("_mapcount", "OFFSET(page._mapcount)", 4)?;
        let mapping = field("mapping", "OFFSET(page.mapping)", 8)?;
        let private = field("private", "OFFSET(page.private)", 8)?;
        let compound_head = field("compound_head", "OFFSET(page.compound_head)", 8)?;
        let bit = |name| number::<u32>(info, name, |v| v < 64);
        let mapcount_value = |name| number::<i32>(info, name, |_| true);
        let required_bit = |name, key| -> Result<u32, ClassifyError> { Ok(need(bit(name)?, key)?) };
        let compound = if let Some(v) = mapcount_value("PAGE_HUGETLB_MAPCOUNT_VALUE")? {
            Compound::FlagsMapcount {
                hugetlb_mapcount: v,
            }
        } else if let Some(b) = bit("PG_hugetlb")? {
            Compound::FlagsBit { hugetlb_bit: b }
        } else if let Some(order) = info.offset("page", "compound_order") {
            map.check_field("OFFSET(page.compound_order)", order + 1)?;
            let dtor = info.offset("page", "compound_dtor");
            if let Some(d) = dtor {
                map.check_field("OFFSET(page.compound_dtor)", d + 1)?;
            }
            Compound::Fields { order, dtor }
        } else {
            return Err(ClassifyError::NoCompoundOrder);
        };
        let head_mask = need(info.number("PG_head_mask"), "NUMBER(PG_head_mask)")? as u64;
        let max_order = need(info.length("zone.free_area"), "LENGTH(zone.free_area)")?;
        if !(1..=63).contains(&max_order) {
            return Err(ClassifyError::BadValue {
                key: "LENGTH(zone.free_area)".into(),
                value: max_order as i64,
            });
        }
        Ok(Rules {
            flags,
            mapcount,
            mapping,
            private,
            compound_head,
            compound,
            pg_lru: required_bit("PG_lru", "NUMBER(PG_lru)")?,
            pg_private: required_bit("PG_private", "NUMBER(PG_private)")?,
            pg_swapcache: required_bit("PG_swapcache", "NUMBER(PG_swapcache)")?,
            pg_swapbacked: bit("PG_swapbacked")?,
            pg_slab: required_bit("PG_slab", "NUMBER(PG_slab)")?,
            pg_hwpoison: bit("PG_hwpoison")?,
            head_mask,
            buddy: mapcount_value("PAGE_BUDDY_MAPCOUNT_VALUE")?
                .ok_or(MemMapError::Missing("NUMBER(PAGE_BUDDY_MAPCOUNT_VALUE)"))?,
            max_order,
            offline: mapcount_value("PAGE_OFFLINE_MAPCOUNT_VALUE")?,
            unaccepted: mapcount_value("PAGE_UNACCEPTED_MAPCOUNT_VALUE")?,
            slab_mapcount: mapcount_value("PAGE_SLAB_MAPCOUNT_VALUE")?,
            hugetlb_dtor: info.number("HUGETLB_PAGE_DTOR").map(|v| v as u64),
            map,
        })
    }

    /// What the struct page `s` (followed by `next`, its successor, if read)
    /// of page frame `pfn` says: `None` for a compound tail (left as it is),
    /// else the class and how many pages from `pfn` it covers.
    fn judge(&self, pfn: u64, s: &[u8], next: Option<&[u8]>) -> Option<(PageClass, u64)> {
        let flags = u64_at(s, self.flags);
        let mapcount = u32_at(s, self.mapcount) as i32;
        let mapping = u64_at(s, self.mapping);
        let test = |bit: u32| flags & (1u64 << bit) != 0;
        let slab = test(self.pg_slab) || self.slab_mapcount == Some(mapcount);
        if u64_at(s, self.compound_head) & 1 != 0 {
            return None;
        }
        let (order, hugetlb) = match next {
            Some(n) if flags & self.head_mask != 0 => self.compound(pfn, mapcount, n),
            _ => (0, false),
        };
        let pages = 1u64 << order;
        if !slab && mapcount == self.buddy {
            let order = u64_at(s, self.private);
            // makedumpfile warns and keeps a page with an impossible order.
            return Some(if order < self.max_order {
                (PageClass::Free, 1 << order)
            } else {
                (PageClass::Kernel, 1)
            });
        }
        if self.unaccepted == Some(mapcount) {
            return Some((PageClass::Free, 1 << (self.max_order - 1)));
        }
        let anon = mapping & PAGE_MAPPING_ANON != 0 && !slab;
        let cache =
            test(self.pg_lru) || (self.pg_swapbacked.is_none_or(test) && test(self.pg_swapcache));
        let class = if cache && !anon {
            if test(self.pg_private) {
                PageClass::CachePrivate
            } else {
                PageClass::Cache
            }
        } else if anon || hugetlb {
            PageClass::User
        } else if self.pg_hwpoison.is_some_and(test) {
            PageClass::Hwpoison
        } else if !slab && self.offline == Some(mapcount) {
            PageClass::Offline
        } else {
            PageClass::Kernel
        };
        Some((class, pages))
    }

    /// Order and hugetlb mark of a compound head, from its first tail `n`.
    fn compound(&self, pfn: u64, mapcount: i32, n: &[u8]) -> (u32, bool) {
        let (order, hugetlb) = match self.compound {
            Compound::Fields { order, dtor } => {
                let dtor = dtor.map(|d| u64::from(n[d as usize]));
                (
                    u64::from(n[order as usize]),
                    dtor.is_some() && dtor == self.hugetlb_dtor,
                )
            }
            Compound::FlagsBit { hugetlb_bit } => {
                let f1 = u64_at(n, self.flags);
                (f1 & 0xff, f1 & (1 << hugetlb_bit) != 0)
            }
            Compound::FlagsMapcount { hugetlb_mapcount } => {
                (u64_at(n, self.flags) & 0xff, mapcount == hugetlb_mapcount)
            }
        };
        if order >= 64 || pfn & ((1u64 << order) - 1) != 0 {
            return (0, hugetlb);
        }
        (order as u32, hugetlb)
    }
}

fn u64_at(s: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(s[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(s: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(s[at..at + 4].try_into().expect("4 bytes"))
}

/// Sorts every page frame of guest RAM (boot RAM and device memory) by its
/// `struct page`, and finds the all-zero ones. The guest should be paused.
pub fn classify<S: PageSource>(
    mem: &GuestMemory<S>,
    info: &VmcoreInfo,
) -> Result<Classification, ClassifyError> {
    let rules = Rules::new(info)?;
    let pt = KernelPageTables::from_vmcoreinfo(info).map_err(ClassifyError::PageTables)?;
    let ps = rules.map.page_size();
    let spans: Vec<Span> = mem
        .ram_ranges()
        .into_iter()
        .filter_map(|r| {
            let first_pfn = r.start.div_ceil(ps);
            let pages = (r.end / ps).checked_sub(first_pfn).filter(|&n| n > 0)?;
            Some(Span {
                first_pfn,
                pages,
                nibbles: vec![0; pages.div_ceil(2) as usize],
            })
        })
        .collect();
    let mut c = Classification {
        page_size: ps,
        spans,
        hwpoison_known: rules.pg_hwpoison.is_some(),
    };
    walk_struct_pages(mem, &pt, &rules, &mut c)?;
    find_zero_pages(mem, &mut c)?;
    Ok(c)
}

/// Gives `class` to the pages of `pfns` that are RAM and not yet claimed
/// (a page's first claim stands, as makedumpfile counts a page once).
fn claim(c: &mut Classification, pfns: Range<u64>, class: PageClass) {
    for s in &mut c.spans {
        let r = s.pfns();
        for pfn in pfns.start.max(r.start)..pfns.end.min(r.end) {
            if s.get(pfn) & CLASS_MASK == 0 {
                let v = s.get(pfn);
                s.set(pfn, v | class as u8);
            }
        }
    }
}

fn walk_struct_pages<S: PageSource>(
    mem: &GuestMemory<S>,
    pt: &KernelPageTables,
    rules: &Rules,
    c: &mut Classification,
) -> Result<(), ClassifyError> {
    let size = rules.map.struct_size() as usize;
    let mut buf = Vec::new();
    // Where the scan goes on after a block, if it ended in a section that
    // the next RAM range shares: (section, next pfn).
    let mut resume: Option<(u64, u64)> = None;
    let spans: Vec<Range<u64>> = c.spans.iter().map(Span::pfns).collect();
    for span in spans {
        rules
            .map
            .for_each_section(mem, pt, span, |section, pfns, mem_map| {
                let mut pfn = match resume {
                    Some((s, next)) if s == section => next.max(pfns.start),
                    _ => pfns.start,
                };
                while pfn < pfns.end {
                    let n = BATCH.min(pfns.end - pfn);
                    // One more struct page when there is one: a head's first tail.
                    let read_end = (pfn + n + 1).min(pfns.end);
                    rules
                        .map
                        .read_structs(mem, pt, mem_map, pfn..read_end, &mut buf)?;
                    let batch_end = pfn + n;
                    let base = pfn;
                    while pfn < batch_end {
                        let i = (pfn - base) as usize;
                        let s = &buf[i * size..][..size];
                        let next = buf.get((i + 1) * size..(i + 2) * size);
                        let Some((class, pages)) = rules.judge(pfn, s, next) else {
                            pfn += 1;
                            continue;
                        };
                        // makedumpfile moves past a block it leaves out, and
                        // looks at the pages of any other one by one.
                        if class == PageClass::Kernel {
                            pfn += 1;
                        } else {
                            claim(c, pfn..pfn.saturating_add(pages), class);
                            pfn = pfn.saturating_add(pages);
                        }
                    }
                }
                resume = Some((section, pfn));
                Ok::<(), ClassifyError>(())
            })?;
    }
    Ok(())
}

/// Bytes read at once when looking for zero pages.
const ZERO_CHUNK: u64 = 4 << 20;

/// Marks the all-zero pages: those in the backing's holes without reading,
/// the others by reading them.
fn find_zero_pages<S: PageSource>(
    mem: &GuestMemory<S>,
    c: &mut Classification,
) -> Result<(), ClassifyError> {
    let ps = c.page_size;
    let data = mem.data_ranges()?;
    let mut buf = Vec::new();
    for s in &mut c.spans {
        let r = s.pfns();
        for pfn in r.clone() {
            let v = s.get(pfn);
            s.set(pfn, v | ZERO_BIT);
        }
        for d in &data {
            let start = (d.start / ps).max(r.start);
            let end = d.end.div_ceil(ps).min(r.end);
            let mut pfn = start;
            while pfn < end {
                let n = (ZERO_CHUNK / ps).max(1).min(end - pfn);
                buf.resize((n * ps) as usize, 0);
                mem.read(pfn * ps, &mut buf)?;
                for (i, page) in buf.chunks_exact(ps as usize).enumerate() {
                    if !is_zero(page) {
                        let p = pfn + i as u64;
                        let v = s.get(p);
                        s.set(p, v & !ZERO_BIT);
                    }
                }
                pfn += n;
            }
        }
    }
    Ok(())
}

/// Whether `page` is all zero: 64-byte blocks OR-folded (vectorizes), with
/// an early exit per block.
pub fn is_zero(page: &[u8]) -> bool {
    let mut blocks = page.chunks_exact(64);
    let whole = blocks.all(|b| {
        b.chunks_exact(8).fold(0u64, |a, w| {
            a | u64::from_ne_bytes(w.try_into().expect("8 bytes"))
        }) == 0
    });
    whole && blocks.remainder().iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests;
