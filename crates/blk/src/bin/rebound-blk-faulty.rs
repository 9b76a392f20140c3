//! A backend built with the cargo feature `check-faults`, for the stress test only: the
//! daemon runs it instead of `rebound blk serve` when `REBOUND_BLK_EXE` names it, with
//! the same arguments, and `REBOUND_BLK_SKIP_CHECK` turns one correctness check off
//! (`rebound_blk::faults`).

use std::path::PathBuf;

fn main() {
    let mut a = std::env::args().skip(1);
    if (a.next().as_deref(), a.next().as_deref()) != (Some("blk"), Some("serve")) {
        eprintln!("usage: rebound-blk-faulty blk serve --disk F --socket S [--control C] [--cache N] [--queues Q] [--serial S] [--exclusive] [--readonly] [--buffered]");
        std::process::exit(2);
    }
    let mut o = rebound_blk::Options {
        disk: PathBuf::new(),
        socket: PathBuf::new(),
        control: None,
        readonly: false,
        direct: true,
        cache_bytes: 0,
        exclusive: false,
        queues: 1,
        serial: String::new(),
    };
    while let Some(flag) = a.next() {
        let mut value = || {
            a.next().unwrap_or_else(|| {
                eprintln!("{flag} needs a value");
                std::process::exit(2)
            })
        };
        let num = |v: String| -> u64 {
            v.parse().unwrap_or_else(|_| {
                eprintln!("not a number: {v}");
                std::process::exit(2)
            })
        };
        match flag.as_str() {
            "--disk" => o.disk = value().into(),
            "--socket" => o.socket = value().into(),
            "--control" => o.control = Some(value().into()),
            "--cache" => o.cache_bytes = num(value()),
            "--queues" => o.queues = num(value()) as u16,
            "--serial" => o.serial = value(),
            "--exclusive" => o.exclusive = true,
            "--readonly" => o.readonly = true,
            "--buffered" => o.direct = false,
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    if let Err(e) = rebound_blk::serve(o) {
        eprintln!("rebound-blk-faulty: {e}");
        std::process::exit(1);
    }
}
