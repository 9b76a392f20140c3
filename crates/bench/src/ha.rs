//! `rebound bench ha`: the HA heap benchmarks, which are their own binary.

/// `rebound bench ha ...`: the HA heap benchmarks live in their own binary, built
/// with the workspace; run it from next to this executable, else from PATH.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let sibling = exe.with_file_name("rebound-ha-bench");
    let prog = if sibling.is_file() {
        sibling
    } else {
        std::path::PathBuf::from("rebound-ha-bench")
    };
    let status = std::process::Command::new(&prog)
        .args(args)
        .status()
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", prog.display()))?;
    if !status.success() {
        anyhow::bail!("{} failed ({status})", prog.display());
    }
    Ok(())
}
