//! `rebound`: thin entry point. Parses, runs, and maps errors to exit codes.

use std::process::ExitCode;

use clap::Parser;
use rebound::cli::Cli;

fn main() -> ExitCode {
    // Everything Rebound and its children (QEMU) create is the user's alone.
    rebound_vmm::private::restrict_umask();
    // Logs go to stderr (the daemon's to `reboundd.log`); RUST_LOG picks the levels
    // (policy: docs/logging.md).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            eprintln!("{}", one_line(&e.render().to_string()));
            return ExitCode::from(2);
        }
    };
    if let Err(e) = rebound::cli::before_runtime(&cli) {
        eprintln!("error: {}", rebound_errors::chain(e.as_ref()));
        return ExitCode::FAILURE;
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(rebound::cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", rebound_errors::chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Clap's error as one line: its first line already starts with "error: "; one that
/// ends in a colon lists what it means on the indented lines after it (the missing
/// arguments), which are joined on.
fn one_line(text: &str) -> String {
    let mut lines = text.lines();
    let first = lines
        .next()
        .unwrap_or("error: invalid arguments")
        .trim_end();
    if !first.ends_with(':') {
        return first.to_string();
    }
    let listed: Vec<&str> = lines
        .take_while(|l| l.starts_with(char::is_whitespace) && !l.trim().is_empty())
        .map(str::trim)
        .collect();
    format!("{first} {}", listed.join(", "))
}

#[cfg(test)]
mod tests {
    #[test]
    fn clap_errors_become_one_line_naming_what_is_missing() {
        let text = "error: the following required arguments were not provided:\n  <--host-cache <HOST_CACHE>|--size <SIZE>>\n\nUsage: rebound vm memory <NAME>\n";
        assert_eq!(
            super::one_line(text),
            "error: the following required arguments were not provided: <--host-cache <HOST_CACHE>|--size <SIZE>>"
        );
        assert_eq!(
            super::one_line("error: unexpected argument '--x' found\n\n  tip: ...\n"),
            "error: unexpected argument '--x' found"
        );
    }
}
