//! The `default` image built for tests: shared by this crate's build test and by the
//! runtime's boot tests and boot-time benchmark (`crates/vmm/tests/common`, which
//! includes this file), so every test boots the same image from the same place.

use std::path::{Path, PathBuf};
use std::process::Command;

use rebound_image::{BuildOptions, Image};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// Where the tests keep their image, across runs (so the package cache and the image
/// are reused when nothing changed).
pub fn image_home() -> PathBuf {
    option_env!("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/tmp"))
        .join("rebound-image-home")
}

/// The static agent, built with its Makefile.
pub fn agent() -> PathBuf {
    let dir = workspace_root().join("guest/agent");
    let st = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(&dir)
        .status()
        .unwrap_or_else(|e| {
            panic!("cannot run make: {e}; scripts/install-deps.sh installs make and gcc")
        });
    assert!(
        st.success(),
        "make -C guest/agent failed ({st}): it needs gcc, make and libc6-dev (scripts/install-deps.sh)"
    );
    dir.join("rebound-agent")
}

/// Builds the agent and the `default` image in `home`.
pub fn ensure_image(home: &Path) -> Image {
    // Tests run in parallel threads: one make and one build at a time.
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    let opts = BuildOptions {
        agent: agent(),
        force: false,
    };
    rebound_image::build(home, "default", &opts, &mut |l| eprintln!("image: {l}")).unwrap_or_else(
        |e| {
            let mut chain = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                chain.push_str(&format!(": {s}"));
                source = s.source();
            }
            panic!("building the default image in {}: {chain}", home.display())
        },
    )
}
