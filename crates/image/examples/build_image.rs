//! Builds an image and prints each step with its time since the start.
//!
//! cargo run -p rebound-image --example build_image -- HOME [--force]

use std::path::PathBuf;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let home = PathBuf::from(
        args.get(1)
            .ok_or_else(|| anyhow::anyhow!("usage: build_image HOME [--force]"))?,
    );
    let force = args.iter().any(|a| a == "--force");
    let agent = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../guest/agent/rebound-agent");
    let t = Instant::now();
    let opts = rebound_image::BuildOptions { agent, force };
    let img = rebound_image::build(&home, "default", &opts, &mut |l| {
        println!("{:6.2}s {l}", t.elapsed().as_secs_f64())
    })?;
    println!(
        "{:6.2}s done: kernel {} initrd {}",
        t.elapsed().as_secs_f64(),
        img.kernel.display(),
        img.initrd.display()
    );
    Ok(())
}
