//! `rebound image ...`: build and list guest images (runs locally, no daemon).

use std::path::{Path, PathBuf};

use anyhow::Context;

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
        ImageCmd::Webset {
            out,
            files,
            file_size,
            io_size,
            json,
        } => webset(&out, files, file_size, io_size, json),
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

fn webset(out: &Path, files: u64, file_size: u64, io_size: u64, json: bool) -> anyhow::Result<()> {
    use rebound_image::webset::{self, WebsetShape};
    let shape = WebsetShape {
        files,
        file_size,
        io_size,
    };
    let tools = rebound_image::Tools::check()?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // The scratch tree sits beside the image (same filesystem, same privacy) and goes
    // when done, whatever happens.
    struct Scratch(PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let scratch = Scratch(parent.join(format!(".webset-{}", std::process::id())));
    rebound_vmm::private::create_dir_all(&scratch.0)
        .with_context(|| format!("cannot make a scratch directory in {}", parent.display()))?;
    let mut last = std::time::Instant::now();
    let mut progress = |i: u64| {
        if !json && (i == files || last.elapsed().as_millis() >= 500) {
            last = std::time::Instant::now();
            eprint!("\rwriting files {i}/{files}");
            if i == files {
                eprintln!();
            }
        }
    };
    webset::make(&tools, shape, &scratch.0, out, &mut progress)?;
    let bytes = std::fs::metadata(out)?.len();
    if json {
        println!(
            "{}",
            serde_json::json!({"out": out, "files": files, "file_size": file_size,
                "io_size": io_size, "image_bytes": bytes})
        );
    } else {
        println!(
            "file set {}: {files} files of {file_size} bytes{}, image {} MiB",
            out.display(),
            if io_size > 0 {
                format!(" and io.bin of {io_size} bytes")
            } else {
                String::new()
            },
            bytes >> 20
        );
    }
    Ok(())
}
