//! The checked-in C header must match what cbindgen generates from src/ffi.rs.
//!
//! Why a checked-in header plus this test rather than a build.rs: C users and reviewers
//! see the header without building, a normal `cargo build` does not parse the crate a
//! second time or write into the source tree, and a drifted header fails here loudly.
//! Regenerate after changing the ABI: `HAHEAP_BLESS=1 cargo test -p haheap --test integration header::`.

use std::path::Path;

#[test]
fn header_matches_the_rust_abi() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen failed")
        .write(&mut generated);
    // cbindgen marks the end of its C++ guards with `//` comments, which C89 lacks.
    let generated = String::from_utf8(generated)
        .expect("UTF-8 header")
        .replace("#endif // __cplusplus", "#endif /* __cplusplus */")
        .replace("#endif  // __cplusplus", "#endif /* __cplusplus */")
        .replace("}  // extern \"C\"", "}  /* extern \"C\" */")
        .into_bytes();
    let text = String::from_utf8_lossy(&generated);
    let slashes = text.lines().find(|l| l.contains("//"));
    assert!(
        slashes.is_none(),
        "a `//` comment in the header breaks -std=c89: {slashes:?}"
    );
    let path = dir.join("include/haheap.h");
    if std::env::var_os("HAHEAP_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/haheap.h is out of date with src/ffi.rs; run HAHEAP_BLESS=1 cargo test -p haheap --test integration header::"
    );
}
