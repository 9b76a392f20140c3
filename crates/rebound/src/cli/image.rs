//! `rebound image ...`: build and list guest images (runs locally, no daemon).

use std::path::PathBuf;

use super::ImageCmd;
use rebound_vmm::images;
use rebound_vmm::paths::Paths;

/// The agent binary: `$REBOUND_AGENT`, else `guest/agent/rebound-agent` in the
/// source tree this binary was built from.
fn default_agent() -> PathBuf {
    if let Some(p) = std::env::var_os("REBOUND_AGENT") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../guest/agent/rebound-agent")
}

pub fn run(paths: &Paths, cmd: ImageCmd) -> anyhow::Result<()> {
    match cmd {
        ImageCmd::Build {
            name,
            force,
            agent,
            json,
        } => {
            let name = name.unwrap_or_else(|| "default".into());
            rebound_api::spec::validate_name(&name)?;
            let agent = agent.unwrap_or_else(default_agent);
            if !agent.is_file() {
                anyhow::bail!(
                    "guest agent {} not found: run `make -C guest/agent` or pass --agent",
                    agent.display()
                );
            }
            let mut progress = |line: &str| {
                if !json {
                    eprintln!("{line}");
                }
            };
            let img = images::build(&paths.home, &name, &agent, force, &mut progress)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&img)?);
            } else {
                println!(
                    "image {} ready: kernel {} ({})",
                    img.name,
                    img.kernel_release,
                    img.kernel.display()
                );
            }
            Ok(())
        }
        ImageCmd::List { json } => {
            let imgs = images::list(&paths.home)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&imgs)?);
            } else {
                println!("{:<16} {:<20} {:>10}  BUILT", "NAME", "KERNEL", "MiB");
                for i in imgs {
                    println!(
                        "{:<16} {:<20} {:>10.1}  {}",
                        i.name,
                        i.kernel_release,
                        i.size_bytes as f64 / 1048576.0,
                        i.built_at
                    );
                }
            }
            Ok(())
        }
    }
}
