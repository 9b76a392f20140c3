//! Where the bytes of QEMU's RAM block appear in guest physical address space.
//!
//! On x86 PC machines QEMU backs all boot RAM with one RAM block (the
//! `memory-backend-file`/`memfd` given as `-machine ...,memory-backend=`) and
//! maps it into the guest with two aliases (`hw/i386/pc.c`, `pc_memory_init`):
//!
//! ```text
//! RAM block offset [0, below_4g)          -> GPA [0, below_4g)              "ram-below-4g"
//! RAM block offset [below_4g, ram_size)   -> GPA [4 GiB, 4 GiB + above_4g)  "ram-above-4g"
//! ```
//!
//! GPA `[below_4g, 4 GiB)` is the PCI hole: no RAM. How `below_4g` is chosen
//! differs between the two machine families and is reproduced here from QEMU
//! 7.2 (`hw/i386/pc_piix.c` `pc_init1` and `hw/i386/pc_q35.c` `pc_q35_init`);
//! every rule was also checked against `info mtree -f` of the installed QEMU
//! 7.2 (see the tests).
//!
//! The legacy VGA window and BIOS areas (`0xa0000..0x100000`) are RAM-block
//! bytes that the guest sees through overlays; this layout maps them 1:1 like
//! the rest of low RAM, as QEMU's own ELF dump does.
//!
//! Not modelled: QEMU 7.1+ moves the above-4G alias to 1 TiB for AMD guest CPUs
//! whose RAM would reach the HyperTransport hole (~1012 GiB); use
//! [`Layout::with_above_4g_start`] for such guests.

use std::ops::Range;

/// 4 GiB: where the above-4G RAM alias starts on PC machines.
pub const FOUR_GIB: u64 = 4 << 30;
const GIB: u64 = 1 << 30;
/// x86-64 physical addresses have at most 52 bits.
const MAX_PHYS: u64 = 1 << 52;

/// Errors building a layout.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    /// The low RAM part is larger than the RAM block.
    #[error("below-4G RAM size {below:#x} exceeds the RAM size {ram:#x}")]
    BelowExceedsRam { below: u64, ram: u64 },
    /// The low RAM part would reach into or past 4 GiB.
    #[error("below-4G RAM size {0:#x} exceeds 4 GiB")]
    BelowExceeds4g(u64),
    /// QEMU refuses `max-ram-below-4g` above 4 GiB.
    #[error("max-ram-below-4g {0:#x} exceeds 4 GiB")]
    MaxBelowExceeds4g(u64),
    /// The above-4G part must start at or after 4 GiB.
    #[error("above-4G RAM start {0:#x} is below 4 GiB")]
    AboveStartTooLow(u64),
    /// The above-4G part would end beyond x86-64's 52-bit physical addresses.
    #[error("above-4G RAM of {len:#x} bytes at {start:#x} exceeds 52-bit physical addresses")]
    AboveOverflows { start: u64, len: u64 },
    /// The machine type has no known RAM layout.
    #[error("unsupported machine type {0:?} (pc, pc-i440fx-*, q35 or pc-q35-* only)")]
    UnknownMachine(String),
    /// A machine option's value cannot be parsed.
    #[error("bad value {value:?} for machine option {option}")]
    BadOption { option: String, value: String },
}

/// One contiguous piece of RAM: `len` bytes at guest physical address `gpa`,
/// stored at `offset` in the RAM block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamRange {
    pub gpa: u64,
    pub offset: u64,
    pub len: u64,
}

impl RamRange {
    /// Guest physical addresses covered.
    pub fn gpa_range(&self) -> Range<u64> {
        self.gpa..self.gpa + self.len
    }

    /// RAM block offsets covered.
    pub fn offset_range(&self) -> Range<u64> {
        self.offset..self.offset + self.len
    }
}

/// Options of the `pc` (i440fx) machine that change the RAM split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcOptions {
    /// `-machine pc,max-ram-below-4g=N`; `None` means QEMU's default 0xe0000000.
    pub max_ram_below_4g: Option<u64>,
    /// `true` for `pc-i440fx-2.0` and newer (the 1 GiB-aligned split), `false` for 1.7 and older.
    pub gigabyte_align: bool,
}

impl Default for PcOptions {
    fn default() -> Self {
        PcOptions {
            max_ram_below_4g: None,
            gigabyte_align: true,
        }
    }
}

/// How a RAM block of `ram_size` bytes is placed in guest physical memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    ram_size: u64,
    below_4g: u64,
    above_4g_start: u64,
}

impl Layout {
    /// The `pc` machine of QEMU 7.2 (`pc-i440fx-7.2`) with default options.
    /// Fails only for RAM sizes beyond the physical address space.
    pub fn pc(ram_size: u64) -> Result<Layout, LayoutError> {
        Self::pc_with(ram_size, PcOptions::default())
    }

    /// The `pc` machine with explicit options; mirrors `pc_init1` in
    /// QEMU 7.2 `hw/i386/pc_piix.c`.
    pub fn pc_with(ram_size: u64, opts: PcOptions) -> Result<Layout, LayoutError> {
        let max_below = match opts.max_ram_below_4g {
            // QEMU treats 0 as "unset" too.
            None | Some(0) => 0xe000_0000,
            Some(m) if m > FOUR_GIB => return Err(LayoutError::MaxBelowExceeds4g(m)),
            Some(m) => m,
        };
        let mut lowmem = max_below;
        if ram_size >= max_below && opts.gigabyte_align {
            lowmem = lowmem.min(0xc000_0000);
        }
        Self::with_below_4g(ram_size, lowmem.min(ram_size))
    }

    /// The `q35` machine of QEMU 7.2 with default options.
    /// Fails only for RAM sizes beyond the physical address space.
    pub fn q35(ram_size: u64) -> Result<Layout, LayoutError> {
        Self::q35_with(ram_size, None)
    }

    /// The `q35` machine with `max-ram-below-4g`; mirrors `pc_q35_init` in
    /// QEMU 7.2 `hw/i386/pc_q35.c` (MMCONFIG takes 256 MiB more of the hole).
    pub fn q35_with(ram_size: u64, max_ram_below_4g: Option<u64>) -> Result<Layout, LayoutError> {
        let mut lowmem = if ram_size >= 0xb000_0000 {
            0x8000_0000
        } else {
            0xb000_0000
        };
        let max_below = match max_ram_below_4g {
            None | Some(0) => FOUR_GIB,
            Some(m) if m > FOUR_GIB => return Err(LayoutError::MaxBelowExceeds4g(m)),
            Some(m) => m,
        };
        lowmem = lowmem.min(max_below);
        Self::with_below_4g(ram_size, lowmem.min(ram_size))
    }

    /// The layout QEMU 7.2 gives a `-machine` argument such as
    /// `pc,memory-backend=ram,max-ram-below-4g=2G` or `pc-q35-7.2`.
    /// Options other than `type` and `max-ram-below-4g` do not move RAM and
    /// are ignored.
    pub fn from_machine(arg: &str, ram_size: u64) -> Result<Layout, LayoutError> {
        let mut machine = None;
        let mut max_below = None;
        for (i, item) in arg.split(',').enumerate() {
            match item.split_once('=') {
                None if i == 0 => machine = Some(item),
                Some(("type", v)) => machine = Some(v),
                Some(("max-ram-below-4g", v)) => {
                    max_below = Some(parse_qemu_size(v).ok_or_else(|| LayoutError::BadOption {
                        option: "max-ram-below-4g".into(),
                        value: v.into(),
                    })?)
                }
                _ => {}
            }
        }
        let machine = machine.unwrap_or_default();
        if machine == "q35" || machine.starts_with("pc-q35-") {
            return Self::q35_with(ram_size, max_below);
        }
        let version = match machine {
            "pc" => Some(""),
            m => m
                .strip_prefix("pc-i440fx-")
                .or_else(|| m.strip_prefix("pc-")),
        };
        let Some(version) =
            version.filter(|v| v.is_empty() || v.starts_with(|c: char| c.is_ascii_digit()))
        else {
            return Err(LayoutError::UnknownMachine(machine.to_string()));
        };
        // pc_piix.c: pc_i440fx_1_7_machine_options sets gigabyte_align = false
        // (and every older type inherits it); 2.0 and newer align.
        let gigabyte_align = !version.starts_with("1.");
        Self::pc_with(
            ram_size,
            PcOptions {
                max_ram_below_4g: max_below,
                gigabyte_align,
            },
        )
    }

    /// An explicit split: the first `below_4g` bytes at GPA 0, the rest at 4 GiB.
    pub fn with_below_4g(ram_size: u64, below_4g: u64) -> Result<Layout, LayoutError> {
        if below_4g > ram_size {
            return Err(LayoutError::BelowExceedsRam {
                below: below_4g,
                ram: ram_size,
            });
        }
        if below_4g > FOUR_GIB {
            return Err(LayoutError::BelowExceeds4g(below_4g));
        }
        Layout {
            ram_size,
            below_4g,
            above_4g_start: FOUR_GIB,
        }
        .checked()
    }

    /// Moves the above-4G part (e.g. to 1 TiB for large AMD guests).
    pub fn with_above_4g_start(self, start: u64) -> Result<Layout, LayoutError> {
        if start < FOUR_GIB {
            return Err(LayoutError::AboveStartTooLow(start));
        }
        Layout {
            above_4g_start: start,
            ..self
        }
        .checked()
    }

    fn checked(self) -> Result<Layout, LayoutError> {
        let len = self.above_4g_size();
        if self.above_4g_start.saturating_add(len) > MAX_PHYS {
            return Err(LayoutError::AboveOverflows {
                start: self.above_4g_start,
                len,
            });
        }
        Ok(self)
    }

    /// Size of the RAM block in bytes.
    pub fn ram_size(&self) -> u64 {
        self.ram_size
    }

    /// Bytes of RAM below the PCI hole (at GPA 0).
    pub fn below_4g_size(&self) -> u64 {
        self.below_4g
    }

    /// Bytes of RAM above 4 GiB.
    pub fn above_4g_size(&self) -> u64 {
        self.ram_size - self.below_4g
    }

    /// GPA where the above-4G part starts (4 GiB unless moved).
    pub fn above_4g_start(&self) -> u64 {
        self.above_4g_start
    }

    /// Where QEMU's device memory region (virtio-mem, pc-dimm) starts: the
    /// end of RAM above 4 GiB rounded up to 1 GiB (`pc_memory_init` in
    /// QEMU 7.2 `hw/i386/pc.c`, current machine types). The first device
    /// sits there; ask QEMU (`memaddr`/`addr` property) for the others.
    pub fn device_memory_base(&self) -> u64 {
        (self.above_4g_start + self.above_4g_size()).next_multiple_of(GIB)
    }

    /// The non-empty RAM ranges in increasing GPA (and offset) order.
    pub fn ranges(&self) -> impl Iterator<Item = RamRange> + '_ {
        let low = RamRange {
            gpa: 0,
            offset: 0,
            len: self.below_4g,
        };
        let high = RamRange {
            gpa: self.above_4g_start,
            offset: self.below_4g,
            len: self.above_4g_size(),
        };
        [low, high].into_iter().filter(|r| r.len > 0)
    }

    /// The RAM range holding `gpa`, if any.
    pub fn range_of_gpa(&self, gpa: u64) -> Option<RamRange> {
        self.ranges().find(|r| r.gpa_range().contains(&gpa))
    }

    /// RAM block offset of a guest physical address; `None` in the hole or past the end.
    pub fn gpa_to_offset(&self, gpa: u64) -> Option<u64> {
        self.range_of_gpa(gpa).map(|r| r.offset + (gpa - r.gpa))
    }

    /// Guest physical address of a RAM block offset; `None` past the end.
    pub fn offset_to_gpa(&self, offset: u64) -> Option<u64> {
        self.ranges()
            .find(|r| r.offset_range().contains(&offset))
            .map(|r| r.gpa + (offset - r.offset))
    }

    /// The GPA ranges holding RAM block offsets `offsets` (split at the hole).
    pub fn offsets_to_gpa_ranges(&self, offsets: Range<u64>) -> Vec<Range<u64>> {
        self.ranges()
            .filter_map(|r| {
                let start = offsets.start.max(r.offset);
                let end = offsets.end.min(r.offset + r.len);
                (start < end).then(|| r.gpa + (start - r.offset)..r.gpa + (end - r.offset))
            })
            .collect()
    }
}

/// A QEMU size option: an integer with an optional B/K/M/G/T suffix
/// (binary units, any case). QEMU's fractional forms ("1.5G") are refused.
fn parse_qemu_size(v: &str) -> Option<u64> {
    let (digits, shift) = match v.as_bytes().last()?.to_ascii_uppercase() {
        b'B' => (&v[..v.len() - 1], 0),
        b'K' => (&v[..v.len() - 1], 10),
        b'M' => (&v[..v.len() - 1], 20),
        b'G' => (&v[..v.len() - 1], 30),
        b'T' => (&v[..v.len() - 1], 40),
        _ => (v, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// `n` GiB.
pub const fn gib(n: u64) -> u64 {
    n * GIB
}

/// `n` MiB.
pub const fn mib(n: u64) -> u64 {
    n << 20
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(l: &Layout) -> (u64, u64) {
        (l.below_4g_size(), l.above_4g_size())
    }

    // Expected splits from the comment block in QEMU 7.2 hw/i386/pc_piix.c
    // (pc_init1) and confirmed with `info mtree -f` of qemu-system-x86_64 7.2.22:
    //   qemu -M pc-1.7 -m 4G                  -> 3584M low,  512M high
    //   qemu -M pc -m 4G                      -> 3072M low, 1024M high
    //   qemu -M pc,max-ram-below-4g=2G -m 4G  -> 2048M low, 2048M high
    //   qemu -M pc,max-ram-below-4g=4G -m 3968M -> 3968M low
    #[test]
    fn pc_examples_from_qemu_source() {
        let legacy = PcOptions {
            max_ram_below_4g: None,
            gigabyte_align: false,
        };
        assert_eq!(
            split(&Layout::pc_with(gib(4), legacy).unwrap()),
            (mib(3584), mib(512))
        );
        assert_eq!(split(&Layout::pc(gib(4)).unwrap()), (mib(3072), mib(1024)));
        let two_g = PcOptions {
            max_ram_below_4g: Some(gib(2)),
            ..PcOptions::default()
        };
        assert_eq!(
            split(&Layout::pc_with(gib(4), two_g).unwrap()),
            (mib(2048), mib(2048))
        );
        let four_g = PcOptions {
            max_ram_below_4g: Some(gib(4)),
            ..PcOptions::default()
        };
        assert_eq!(
            split(&Layout::pc_with(mib(3968), four_g).unwrap()),
            (mib(3968), 0)
        );
    }

    // pc_piix.c: the split only happens when ram_size >= max_ram_below_4g
    // (default 0xe0000000); then gigabyte_align caps lowmem at 0xc0000000.
    #[test]
    fn pc_boundary_at_0xe0000000() {
        assert_eq!(
            split(&Layout::pc(0xe000_0000 - 1).unwrap()),
            (0xe000_0000 - 1, 0)
        );
        assert_eq!(
            split(&Layout::pc(0xe000_0000).unwrap()),
            (0xc000_0000, 0x2000_0000)
        );
        assert_eq!(split(&Layout::pc(mib(256)).unwrap()), (mib(256), 0));
        // max-ram-below-4g above 3G with a large guest is still capped at 3G.
        let opts = PcOptions {
            max_ram_below_4g: Some(mib(3584)),
            ..PcOptions::default()
        };
        assert_eq!(
            split(&Layout::pc_with(gib(8), opts).unwrap()),
            (gib(3), gib(5))
        );
        // ...but a guest smaller than the limit keeps all RAM low.
        let opts = PcOptions {
            max_ram_below_4g: Some(gib(1)),
            ..PcOptions::default()
        };
        assert_eq!(
            split(&Layout::pc_with(mib(512), opts).unwrap()),
            (mib(512), 0)
        );
        let too_big = PcOptions {
            max_ram_below_4g: Some(gib(4) + 1),
            ..PcOptions::default()
        };
        assert_eq!(
            Layout::pc_with(gib(8), too_big),
            Err(LayoutError::MaxBelowExceeds4g(gib(4) + 1))
        );
    }

    // QEMU 7.2 hw/i386/pc_q35.c (pc_q35_init): lowmem = 0x80000000 when
    // ram_size >= 0xb0000000, else 0xb0000000; then min(lowmem, max-ram-below-4g).
    // Confirmed with `info mtree -f`: -m 2815M all low; -m 2816M 2G low + 768M high.
    #[test]
    fn q35_boundary_at_0xb0000000() {
        assert_eq!(
            split(&Layout::q35(0xb000_0000 - 1).unwrap()),
            (0xb000_0000 - 1, 0)
        );
        assert_eq!(
            split(&Layout::q35(0xb000_0000).unwrap()),
            (0x8000_0000, 0x3000_0000)
        );
        assert_eq!(split(&Layout::q35(gib(4)).unwrap()), (gib(2), gib(2)));
        assert_eq!(
            split(&Layout::q35_with(gib(4), Some(gib(1))).unwrap()),
            (gib(1), gib(3))
        );
        assert_eq!(split(&Layout::q35(mib(256)).unwrap()), (mib(256), 0));
    }

    // Each case was run as `qemu-system-x86_64 -machine ARG -m SIZE -S` (7.2.22)
    // and the pc.ram aliases read from `info mtree -f`.
    #[test]
    fn from_machine_argument_matches_qemu() {
        let cases: &[(&str, u64, (u64, u64))] = &[
            ("pc", gib(4), (gib(3), gib(1))),
            ("pc,memory-backend=ram,accel=tcg", mib(256), (mib(256), 0)),
            ("pc-i440fx-7.2", gib(4), (gib(3), gib(1))),
            ("pc-i440fx-2.0", gib(4), (gib(3), gib(1))),
            ("pc-i440fx-1.4", gib(4), (mib(3584), mib(512))),
            ("pc-1.7", gib(4), (mib(3584), mib(512))),
            (
                "pc-i440fx-1.7,max-ram-below-4g=2G",
                gib(4),
                (gib(2), gib(2)),
            ),
            ("pc,max-ram-below-4g=3G", gib(4), (gib(3), gib(1))),
            ("pc,max-ram-below-4g=2560M", gib(4), (mib(2560), mib(1536))),
            ("type=pc,max-ram-below-4g=4g", mib(3968), (mib(3968), 0)),
            ("q35", gib(4), (gib(2), gib(2))),
            ("pc-q35-2.4,accel=tcg", gib(4), (gib(2), gib(2))),
            ("pc-q35-7.2", mib(2815), (mib(2815), 0)),
            ("q35,max-ram-below-4g=1G", gib(4), (gib(1), gib(3))),
        ];
        for &(arg, ram, want) in cases {
            let l = Layout::from_machine(arg, ram).unwrap_or_else(|e| panic!("{arg}: {e}"));
            assert_eq!(split(&l), want, "{arg}");
        }
        for bad in ["microvm", "isapc", "", "pc-foo", "virt"] {
            let e = Layout::from_machine(bad, gib(1)).unwrap_err();
            assert!(matches!(e, LayoutError::UnknownMachine(_)), "{bad}: {e}");
        }
        for v in ["", "2X", "1.5G", "G", "-1G", "99999999999T"] {
            let e = Layout::from_machine(&format!("pc,max-ram-below-4g={v}"), gib(1)).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("bad value {v:?} for machine option max-ram-below-4g")
            );
        }
        let e = Layout::from_machine("pc,max-ram-below-4g=5G", gib(8)).unwrap_err();
        assert_eq!(e, LayoutError::MaxBelowExceeds4g(gib(5)));
    }

    #[test]
    fn offset_gpa_mapping_around_the_hole() {
        let l = Layout::pc(gib(5)).unwrap();
        assert_eq!(split(&l), (gib(3), gib(2)));
        assert_eq!(l.gpa_to_offset(0), Some(0));
        assert_eq!(l.gpa_to_offset(gib(3) - 1), Some(gib(3) - 1));
        assert_eq!(l.gpa_to_offset(gib(3)), None, "start of the PCI hole");
        assert_eq!(l.gpa_to_offset(gib(4) - 1), None, "end of the PCI hole");
        assert_eq!(l.gpa_to_offset(gib(4)), Some(gib(3)));
        assert_eq!(l.gpa_to_offset(gib(6) - 1), Some(gib(5) - 1));
        assert_eq!(l.gpa_to_offset(gib(6)), None, "past the end");
        assert_eq!(l.offset_to_gpa(gib(3) - 1), Some(gib(3) - 1));
        assert_eq!(l.offset_to_gpa(gib(3)), Some(gib(4)));
        assert_eq!(l.offset_to_gpa(gib(5) - 1), Some(gib(6) - 1));
        assert_eq!(l.offset_to_gpa(gib(5)), None);
        let ranges: Vec<_> = l.ranges().collect();
        assert_eq!(
            ranges,
            vec![
                RamRange {
                    gpa: 0,
                    offset: 0,
                    len: gib(3)
                },
                RamRange {
                    gpa: gib(4),
                    offset: gib(3),
                    len: gib(2)
                }
            ]
        );
        assert_eq!(
            l.offsets_to_gpa_ranges(gib(3) - 4096..gib(3) + 4096),
            vec![gib(3) - 4096..gib(3), gib(4)..gib(4) + 4096]
        );
        assert_eq!(l.offsets_to_gpa_ranges(gib(5)..gib(6)), vec![]);
    }

    // `info mtree -f` with `-m SIZE,maxmem=8G` and a 1G virtio-mem-pci device:
    // pc 512M -> 0x100000000, pc 3584M -> 0x140000000, pc 5G and q35 4G -> 0x180000000.
    #[test]
    fn device_memory_follows_ram_above_4g_rounded_to_a_gib() {
        let cases = [
            (Layout::pc(mib(512)), 0x1_0000_0000),
            (Layout::pc(mib(3584)), 0x1_4000_0000),
            (Layout::pc(gib(5)), 0x1_8000_0000),
            (Layout::q35(gib(4)), 0x1_8000_0000),
            (Layout::q35(mib(512)), 0x1_0000_0000),
        ];
        for (layout, base) in cases {
            let layout = layout.unwrap();
            assert_eq!(layout.device_memory_base(), base, "{layout:?}");
        }
    }

    #[test]
    fn small_guest_has_one_range_and_no_high_part() {
        let l = Layout::pc(mib(256)).unwrap();
        assert_eq!(l.ranges().count(), 1);
        assert_eq!(l.gpa_to_offset(mib(256)), None);
        assert_eq!(l.gpa_to_offset(FOUR_GIB), None);
        assert_eq!(Layout::pc(0).unwrap().ranges().count(), 0);
    }

    #[test]
    fn explicit_splits_are_validated() {
        assert_eq!(
            Layout::with_below_4g(gib(1), gib(2)),
            Err(LayoutError::BelowExceedsRam {
                below: gib(2),
                ram: gib(1)
            })
        );
        assert_eq!(
            Layout::with_below_4g(gib(8), gib(5)),
            Err(LayoutError::BelowExceeds4g(gib(5)))
        );
        let l = Layout::pc(gib(8)).unwrap();
        assert_eq!(
            l.with_above_4g_start(gib(3)),
            Err(LayoutError::AboveStartTooLow(gib(3)))
        );
        let moved = l.with_above_4g_start(1 << 40).unwrap();
        assert_eq!(moved.gpa_to_offset(1 << 40), Some(gib(3)));
        assert_eq!(moved.gpa_to_offset(gib(4)), None);
        assert!(matches!(
            l.with_above_4g_start(u64::MAX - 10),
            Err(LayoutError::AboveOverflows { .. })
        ));
        assert!(matches!(
            l.with_above_4g_start((1 << 52) - gib(4)),
            Err(LayoutError::AboveOverflows { .. })
        ));
        // Absurd sizes are errors, not panics.
        assert!(Layout::pc(u64::MAX).is_err());
        assert!(Layout::q35(u64::MAX).is_err());
        assert!(Layout::from_machine("pc", u64::MAX).is_err());
        let top = l.with_above_4g_start((1 << 52) - gib(5)).unwrap();
        assert_eq!(top.device_memory_base(), 1 << 52);
    }
}
