//! Choosing kernel modules: parsing `modules.dep` and closing a list of module names over
//! their dependencies, so the initramfs carries exactly what `modprobe` will need.

use std::collections::{BTreeMap, BTreeSet};

/// Errors reading `modules.dep` or resolving modules.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModulesError {
    #[error("modules.dep line {line}: {what}")]
    Malformed { line: usize, what: &'static str },
    #[error("modules.dep line {line}: module {path} is listed twice")]
    Duplicate { line: usize, path: String },
    #[error("modules.dep: {module} depends on {dep}, which has no entry of its own")]
    DanglingDep { module: String, dep: String },
    #[error("kernel module {0} is not in this kernel's modules.dep (and not built in)")]
    Missing(String),
}

/// A parsed `modules.dep`: module path (relative to `/lib/modules/<release>`) → its
/// dependencies' paths.
#[derive(Debug, Default)]
pub struct ModDeps {
    deps: BTreeMap<String, Vec<String>>,
    by_name: BTreeMap<String, String>,
}

/// The module name the kernel uses for a path: basename without `.ko[.xz|.zst|.gz]`, with
/// `-` as `_` (modprobe treats them alike).
pub fn module_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let stem = base.split(".ko").next().unwrap_or(base);
    stem.replace('-', "_")
}

fn valid_path(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && p.contains(".ko")
        && !p.split('/').any(|c| c.is_empty() || c == "." || c == "..")
}

impl ModDeps {
    /// Parses the text of `modules.dep` (`path: dep dep ...` per line).
    pub fn parse(text: &str) -> Result<ModDeps, ModulesError> {
        let mut m = ModDeps::default();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            if raw.trim().is_empty() {
                continue;
            }
            let (path, rest) = raw.split_once(':').ok_or(ModulesError::Malformed {
                line,
                what: "no ':' after the module path",
            })?;
            if !valid_path(path) {
                return Err(ModulesError::Malformed {
                    line,
                    what: "not a relative .ko path",
                });
            }
            let deps: Vec<String> = rest.split_whitespace().map(str::to_string).collect();
            if deps.iter().any(|d| !valid_path(d)) {
                return Err(ModulesError::Malformed {
                    line,
                    what: "a dependency is not a relative .ko path",
                });
            }
            if m.deps.insert(path.to_string(), deps).is_some() {
                return Err(ModulesError::Duplicate {
                    line,
                    path: path.to_string(),
                });
            }
            m.by_name.insert(module_name(path), path.to_string());
        }
        for (module, deps) in &m.deps {
            if let Some(d) = deps.iter().find(|d| !m.deps.contains_key(*d)) {
                return Err(ModulesError::DanglingDep {
                    module: module.clone(),
                    dep: d.clone(),
                });
            }
        }
        Ok(m)
    }

    /// Number of modules listed.
    pub fn len(&self) -> usize {
        self.deps.len()
    }

    /// Whether no module is listed.
    pub fn is_empty(&self) -> bool {
        self.deps.is_empty()
    }

    /// The paths of `names` and everything they depend on, sorted. A name found in
    /// `builtin` (module names compiled into the kernel) needs no file.
    pub fn closure(
        &self,
        names: &[&str],
        builtin: &BTreeSet<String>,
    ) -> Result<BTreeSet<String>, ModulesError> {
        let mut out = BTreeSet::new();
        let mut todo: Vec<String> = Vec::new();
        for n in names {
            let key = n.replace('-', "_");
            match self.by_name.get(&key) {
                Some(p) => todo.push(p.clone()),
                None if builtin.contains(&key) => {}
                None => return Err(ModulesError::Missing(n.to_string())),
            }
        }
        while let Some(p) = todo.pop() {
            if out.insert(p.clone()) {
                // Every dependency has an entry: parse() checked it.
                todo.extend(self.deps[&p].iter().cloned());
            }
        }
        Ok(out)
    }
}

/// Module names from `modules.builtin` (one path per line).
pub fn parse_builtin(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(module_name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio.ko:
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/misc/pvpanic/pvpanic-mmio.ko: kernel/drivers/misc/pvpanic/pvpanic.ko
kernel/drivers/misc/pvpanic/pvpanic.ko:
kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/mbcache.ko kernel/fs/jbd2/jbd2.ko
kernel/lib/crc16.ko:
kernel/fs/mbcache.ko:
kernel/fs/jbd2/jbd2.ko:
kernel/net/unused.ko.xz:
";

    #[test]
    fn closure_follows_dependencies() {
        let m = ModDeps::parse(DEP).unwrap();
        assert_eq!(m.len(), 11);
        let c = m
            .closure(&["virtio_pci", "pvpanic_mmio"], &BTreeSet::new())
            .unwrap();
        let v: Vec<&str> = c.iter().map(String::as_str).collect();
        assert_eq!(
            v,
            [
                "kernel/drivers/misc/pvpanic/pvpanic-mmio.ko",
                "kernel/drivers/misc/pvpanic/pvpanic.ko",
                "kernel/drivers/virtio/virtio.ko",
                "kernel/drivers/virtio/virtio_pci.ko",
                "kernel/drivers/virtio/virtio_pci_legacy_dev.ko",
                "kernel/drivers/virtio/virtio_ring.ko",
            ]
        );
        let e = m.closure(&["ext4"], &BTreeSet::new()).unwrap();
        assert_eq!(e.len(), 4);
    }

    #[test]
    fn names_normalise_dashes_and_compression() {
        assert_eq!(module_name("kernel/a/pvpanic-mmio.ko"), "pvpanic_mmio");
        assert_eq!(module_name("kernel/net/unused.ko.xz"), "unused");
        let m = ModDeps::parse(DEP).unwrap();
        assert_eq!(
            m.closure(&["pvpanic-mmio"], &BTreeSet::new())
                .unwrap()
                .len(),
            2
        );
        assert_eq!(m.closure(&["unused"], &BTreeSet::new()).unwrap().len(), 1);
    }

    #[test]
    fn builtin_and_missing() {
        let m = ModDeps::parse(DEP).unwrap();
        let builtin = parse_builtin("kernel/drivers/char/virtio_console.ko\n\n");
        assert!(m.closure(&["virtio_console"], &builtin).unwrap().is_empty());
        assert_eq!(
            m.closure(&["i6300esb"], &builtin).unwrap_err(),
            ModulesError::Missing("i6300esb".into())
        );
    }

    #[test]
    fn cycles_terminate() {
        let m = ModDeps::parse("a/x.ko: a/y.ko\na/y.ko: a/x.ko\n").unwrap();
        assert_eq!(m.closure(&["x"], &BTreeSet::new()).unwrap().len(), 2);
    }

    #[test]
    fn malformed_lines_are_refused() {
        let cases: &[(&str, &str)] = &[
            ("kernel/a.ko kernel/b.ko\n", "no ':'"),
            (": kernel/b.ko\n", "not a relative .ko path"),
            ("/abs/a.ko:\n", "not a relative .ko path"),
            ("kernel/../../etc/a.ko:\n", "not a relative .ko path"),
            ("kernel/readme.txt:\n", "not a relative .ko path"),
            ("kernel/a.ko: ../b.ko\n", "a dependency is not"),
            ("kernel/a.ko: kernel//b.ko\n", "a dependency is not"),
        ];
        for (text, want) in cases {
            let e = ModDeps::parse(text).unwrap_err().to_string();
            assert!(
                e.contains(want) && e.contains("line 1"),
                "{text:?} gave {e}"
            );
        }
    }

    #[test]
    fn truncated_and_duplicate_and_dangling() {
        // A file cut in the middle of a line loses the dependency's own entry.
        let cut = &DEP[..DEP
            .find("kernel/drivers/virtio/virtio_pci_legacy_dev.ko:")
            .unwrap()
            + 20];
        assert!(matches!(
            ModDeps::parse(cut),
            Err(ModulesError::Malformed { line: 2, .. })
        ));
        let trunc = "kernel/a.ko: kernel/b.ko\n";
        assert!(matches!(
            ModDeps::parse(trunc),
            Err(ModulesError::DanglingDep { .. })
        ));
        let dup = "kernel/a.ko:\nkernel/a.ko:\n";
        assert!(matches!(
            ModDeps::parse(dup),
            Err(ModulesError::Duplicate { line: 2, .. })
        ));
        assert!(ModDeps::parse("").unwrap().is_empty());
        let garbage = "\u{0}\u{1}binary\u{ff}";
        assert!(ModDeps::parse(garbage).is_err());
    }
}
