//! The one place this crate meets the image builder (`rebound-image`).

use std::path::{Path, PathBuf};

use serde::Serialize;

pub use rebound_image::Error as ImagesError;

/// The parts of an image a VM boots from.
#[derive(Debug, Clone, Serialize)]
pub struct ImageBoot {
    pub name: String,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub disk: PathBuf,
    pub append: String,
    pub kernel_release: String,
}

impl From<rebound_image::Image> for ImageBoot {
    fn from(i: rebound_image::Image) -> Self {
        ImageBoot {
            name: i.name,
            kernel: i.kernel,
            initrd: i.initrd,
            disk: i.disk,
            append: i.append,
            kernel_release: i.kernel_release,
        }
    }
}

/// One built image, as listed.
#[derive(Debug, Clone, Serialize)]
pub struct ImageEntry {
    pub name: String,
    pub kernel_release: String,
    pub size_bytes: u64,
    pub built_at: String,
    pub dir: PathBuf,
}

/// Opens a built image.
pub fn open(home: &Path, name: &str) -> Result<ImageBoot, ImagesError> {
    rebound_image::open(home, name).map(ImageBoot::from)
}

/// Builds (or reuses) an image; `progress` gets one line per step.
pub fn build(
    home: &Path,
    name: &str,
    agent: &Path,
    force: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<ImageBoot, ImagesError> {
    let opts = rebound_image::BuildOptions {
        agent: agent.to_path_buf(),
        force,
    };
    rebound_image::build(home, name, &opts, progress).map(ImageBoot::from)
}

/// All built images.
pub fn list(home: &Path) -> Result<Vec<ImageEntry>, ImagesError> {
    Ok(rebound_image::list(home)?
        .into_iter()
        .map(|i| ImageEntry {
            name: i.name,
            kernel_release: i.kernel_release,
            size_bytes: i.size_bytes,
            built_at: i.built_at,
            dir: i.dir,
        })
        .collect())
}
