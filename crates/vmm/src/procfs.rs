//! What `/proc` says about a QEMU process.

/// A process's major page faults and bytes it read from storage so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoCounters {
    pub major_faults: u64,
    pub read_bytes: u64,
}

/// Process `pid`'s counters; `None` when it is gone or `/proc` hides them.
pub fn proc_counters(pid: u32) -> Option<IoCounters> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    parse(&stat, &io)
}

fn parse(stat: &str, io: &str) -> Option<IoCounters> {
    // Fields after the command name (which may hold spaces), from field 3 on.
    let rest = &stat[stat.rfind(')')? + 2..];
    let major_faults: u64 = rest.split_whitespace().nth(9)?.parse().ok()?;
    let read_bytes = io
        .lines()
        .find_map(|l| l.strip_prefix("read_bytes: "))
        .and_then(|v| v.trim().parse().ok())?;
    Some(IoCounters {
        major_faults,
        read_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parens_does_not_shift_the_fields() {
        let stat = "42 (qemu (x) y) S 1 42 42 0 -1 4194560 100 0 7 0 5 3";
        let io = "rchar: 10\nread_bytes: 8192\nwrite_bytes: 0\n";
        assert_eq!(
            parse(stat, io),
            Some(IoCounters {
                major_faults: 7,
                read_bytes: 8192
            })
        );
        assert_eq!(parse(stat, "rchar: 1\n"), None);
    }

    #[test]
    fn this_process_has_counters() {
        assert!(proc_counters(std::process::id()).is_some());
    }
}
