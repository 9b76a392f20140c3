//! The one place Rebound turns an error into text: `outer: inner: innermost`, on one line.
//!
//! Errors keep their sources (`#[source]`) all the way to the edge that prints them (a log
//! line, an API answer, the CLI's `error:` line); this is the printer every edge uses.
//! A source whose text its parent already shows (a `transparent`-style wrapper, or a
//! message that quotes its cause) is printed once, and line breaks inside a message
//! become spaces so that one error stays one line.

use std::error::Error;
use std::fmt;

/// `e` and its sources on one line, each text once.
pub fn chain(e: &dyn Error) -> String {
    Chain(e).to_string()
}

/// Displays as [`chain`] does, without building the string first (for `format!` and
/// `tracing` fields).
#[derive(Clone, Copy)]
pub struct Chain<'a>(pub &'a dyn Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = self.0.to_string();
        let mut cur = self.0.source();
        while let Some(s) = cur {
            let t = s.to_string();
            if !out.contains(&t) {
                out.push_str(": ");
                out.push_str(&t);
            }
            cur = s.source();
        }
        f.write_str(&out.replace('\n', " "))
    }
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Inner {
        #[error("cannot read /x")]
        Read(#[source] std::io::Error),
    }

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("snapshot refused")]
        Refused(#[source] Inner),
        #[error(transparent)]
        Same(Inner),
        #[error("two\nlines")]
        Lines,
    }

    fn io() -> std::io::Error {
        std::io::Error::from_raw_os_error(13)
    }

    #[test]
    fn every_source_is_printed_in_order() {
        let e = Outer::Refused(Inner::Read(io()));
        assert_eq!(
            chain(&e),
            "snapshot refused: cannot read /x: Permission denied (os error 13)"
        );
    }

    #[test]
    fn a_source_the_parent_already_shows_is_printed_once() {
        let e = Outer::Same(Inner::Read(io()));
        assert_eq!(chain(&e), "cannot read /x: Permission denied (os error 13)");
    }

    #[test]
    fn one_error_stays_one_line() {
        assert_eq!(chain(&Outer::Lines), "two lines");
        assert_eq!(format!("{}", Chain(&Outer::Lines)), "two lines");
    }
}
