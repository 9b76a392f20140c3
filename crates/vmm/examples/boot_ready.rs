//! Boot-time benchmark: boots the `default` image N times under QEMU and prints, per run,
//! the wall time from spawning QEMU to the agent's `ready`, the guest's uptime at `ready`,
//! and when init started (from the serial log), then the median.
//!
//! cargo run --release -p rebound-vmm --example boot_ready -- [RUNS] [WORKLOAD] [HOME]
//! (HOME defaults to the integration tests' image home under target/tmp.)

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{ensure_image, image_home, is_type, Guest, Result};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let runs: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(5);
    let workload = args.get(2).cloned().unwrap_or_else(|| "web".into());
    let home = args.get(3).map(PathBuf::from).unwrap_or_else(image_home);
    let img = ensure_image(&home);
    println!(
        "image {} kernel {} ({})",
        img.name,
        img.kernel_release,
        img.kernel.display()
    );
    let (mut walls, mut uptimes, mut cpus) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        let mut g = Guest::boot(&img, &format!("rebound.workload={workload}"), 256)?;
        let mut agent = g.agent(std::time::Instant::now() + Duration::from_secs(30))?;
        let ready = agent
            .wait_for(Duration::from_secs(60), "ready", |v| is_type(v, "ready"))
            .map_err(|e| format!("no ready: {e}"))?;
        let wall = g.spawned.elapsed().as_secs_f64();
        let cpu = g.cpu_seconds()?;
        let uptime = ready["uptime_ms"].as_f64().unwrap_or(f64::NAN) / 1000.0;
        let serial = g.serial();
        let init_at = serial
            .lines()
            .find_map(|l| l.split("up at ").nth(1))
            .and_then(|r| r.split('s').next())
            .unwrap_or("?")
            .to_string();
        println!(
            "run {}: spawn->ready {wall:.2} s wall, {cpu:.2} s QEMU CPU; guest uptime at ready {uptime:.2} s; init started at {init_at} s",
            i + 1
        );
        walls.push(wall);
        uptimes.push(uptime);
        cpus.push(cpu);
    }
    println!(
        "median of {runs}: spawn->ready {:.2} s wall, {:.2} s QEMU CPU, guest uptime at ready {:.2} s (workload {workload})",
        median(&mut walls),
        median(&mut cpus),
        median(&mut uptimes)
    );
    Ok(())
}
