//! Builds the `default` image for real (Debian packages, static agent) and checks that a
//! second build with the same inputs reuses it and that it is listed. The runtime's boot
//! tests (`crates/vmm/tests/image_boot.rs`) boot this image under QEMU.

use crate::common;

use common::{agent, ensure_image, image_home};

#[test]
fn image_build_is_cached_and_listed() {
    let home = image_home();
    let img = ensure_image(&home);
    let manifest_before = std::fs::read(img.dir.join("manifest.json")).unwrap();
    let mut lines = Vec::new();
    let again = rebound_image::build(
        &home,
        "default",
        &rebound_image::BuildOptions {
            agent: agent(),
            force: false,
        },
        &mut |l| lines.push(l.to_string()),
    )
    .unwrap();
    assert_eq!(again, img);
    assert!(lines.iter().any(|l| l.contains("up to date")), "{lines:?}");
    assert_eq!(
        std::fs::read(img.dir.join("manifest.json")).unwrap(),
        manifest_before,
        "cached build rewrote the manifest"
    );
    let list = rebound_image::list(&home).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].name, "default");
    assert_eq!(list[0].kernel_release, img.kernel_release);
    assert!(list[0].size_bytes > 10 << 20, "{:?}", list[0]);
}
