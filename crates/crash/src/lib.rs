//! One crash of a VM, decided without I/O: Vicover's concurrent core dump and
//! recovery as a state machine.
//!
//! The daemon feeds [`Crash`] what happened ([`Event`]: the crashed QEMU released, a
//! dump chunk durable, the dump finished, the recovery VM started or ready, a memory
//! plug done, ...) together with what it sees now ([`Seen`]: the instant, what the
//! crashed RAM and the VM's memory group hold), and carries out the [`Action`]s it
//! gets back in order: start the dump, start the recovery VM with N MiB, set the dump
//! and recovery I/O rates, plug memory, hold or release the budget, save the report,
//! finish. An action whose outcome the machine needs is answered with an event, fed
//! before the actions after it; [`Action::Then`] asks the daemon to look again
//! (after actions that change what it sees) and feed [`Event::Then`] back.
//!
//! All policy lives here (`policy.rs`): the I/O rate control and `auto`'s choice, the
//! memory budget, the recovery VM's minimum, growth and block rounding; and the report
//! (`rebound_api::CrashReport`) with its memory timeline.

mod machine;
pub mod policy;
mod resume;

pub use machine::{Action, Crash, CrashStart, DumpSummary, Event, Next, Seen, Step};
pub use policy::QEMU_FOOTPRINT_MIB;
pub use resume::{check_dump, unfinished_dump, DumpFile, DumpState, ResumeError, ResumeFacts};

#[cfg(test)]
mod tests;
