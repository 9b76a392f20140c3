//! A backend built with the cargo feature `check-faults`, for the stress test only: the
//! daemon runs it instead of `rebound blk serve` when `REBOUND_BLK_EXE` names it, with
//! the same arguments, and `REBOUND_BLK_SKIP_CHECK` turns one correctness check off
//! (`rebound_blk::faults`).

use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// `blk serve ...`, as the daemon calls `rebound`.
    #[command(subcommand)]
    Blk(Blk),
}

#[derive(Subcommand)]
enum Blk {
    Serve(rebound_blk::args::ServeArgs),
}

fn main() {
    let Cmd::Blk(Blk::Serve(a)) = Cli::parse().cmd;
    if let Err(e) = rebound_blk::serve(a.into()) {
        eprintln!("rebound-blk-faulty: {}", rebound_errors::chain(&e));
        std::process::exit(1);
    }
}
