//! `rebound bench ha`: the HA heap benchmarks, which are their own binary.

/// Why the HA heap benchmarks did not run to success.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot find this executable's path")]
    Exe(#[source] std::io::Error),
    #[error("cannot run {}", .0.display())]
    Spawn(std::path::PathBuf, #[source] std::io::Error),
    #[error("{} failed ({status})", .prog.display())]
    Failed {
        prog: std::path::PathBuf,
        status: std::process::ExitStatus,
    },
}

/// `rebound bench ha ...`: the HA heap benchmarks live in their own binary, built
/// with the workspace; run it from next to this executable, else from PATH.
pub fn run(args: &[String]) -> Result<(), Error> {
    let exe = std::env::current_exe().map_err(Error::Exe)?;
    let sibling = exe.with_file_name("rebound-ha-bench");
    let prog = if sibling.is_file() {
        sibling
    } else {
        std::path::PathBuf::from("rebound-ha-bench")
    };
    let status = std::process::Command::new(&prog)
        .args(args)
        .status()
        .map_err(|e| Error::Spawn(prog.clone(), e))?;
    if !status.success() {
        return Err(Error::Failed { prog, status });
    }
    Ok(())
}
