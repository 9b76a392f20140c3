//! Empty: it exists so that the build-dependencies in `Cargo.toml` join the build.
fn main() {}
