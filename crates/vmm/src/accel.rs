//! Choosing the accelerator.
//!
//! `/dev/kvm` opening is not enough: on hosts whose KVM is the nested PVM flavour
//! (`/sys/module/kvm_pvm`) without `vmx`/`svm` in `/proc/cpuinfo`, standard guests hang
//! early in boot. `auto` picks KVM only when it can run a standard guest.

pub use rebound_api::Accel;
use rebound_api::AccelChoice;

/// Errors choosing an accelerator.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AccelError {
    #[error("--accel kvm requested but KVM is unusable here: {0}")]
    KvmUnusable(String),
}

/// What the host offers, gathered once so the decision is a pure function.
#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    /// Why `/dev/kvm` could not be opened read-write, if it could not.
    pub dev_kvm_error: Option<String>,
    /// `/sys/module/kvm_pvm` exists.
    pub kvm_pvm: bool,
    /// `/proc/cpuinfo` lists `vmx` or `svm`.
    pub cpu_virt: bool,
}

impl HostFacts {
    /// Probes this host.
    pub fn probe() -> Self {
        let dev_kvm_error = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .err()
            .map(|e| e.to_string());
        let kvm_pvm = std::path::Path::new("/sys/module/kvm_pvm").exists();
        let cpu_virt = std::fs::read_to_string("/proc/cpuinfo")
            .map(|s| cpuinfo_has_virt(&s))
            .unwrap_or(false);
        HostFacts {
            dev_kvm_error,
            kvm_pvm,
            cpu_virt,
        }
    }

    /// Why KVM cannot run a standard guest here, or `None` if it can.
    pub fn kvm_unusable_reason(&self) -> Option<String> {
        if let Some(e) = &self.dev_kvm_error {
            return Some(format!("/dev/kvm cannot be opened ({e})"));
        }
        if self.kvm_pvm && !self.cpu_virt {
            return Some(
                "host KVM is kvm_pvm (nested PVM) and the CPU lacks vmx/svm: standard guests hang"
                    .to_string(),
            );
        }
        if !self.cpu_virt {
            return Some("the CPU lacks vmx/svm".to_string());
        }
        None
    }
}

fn cpuinfo_has_virt(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
}

/// The chosen accelerator and, when it is not what a user might expect, why.
#[derive(Debug, Clone, PartialEq)]
pub struct AccelDecision {
    pub accel: Accel,
    pub reason: Option<String>,
}

/// Picks the accelerator for `choice` on a host described by `facts`.
pub fn choose(choice: AccelChoice, facts: &HostFacts) -> Result<AccelDecision, AccelError> {
    let unusable = facts.kvm_unusable_reason();
    match (choice, unusable) {
        (AccelChoice::Tcg, _) => Ok(AccelDecision {
            accel: Accel::Tcg,
            reason: Some("requested".to_string()),
        }),
        (AccelChoice::Kvm, Some(r)) => Err(AccelError::KvmUnusable(r)),
        (AccelChoice::Kvm, None) => Ok(AccelDecision {
            accel: Accel::Kvm,
            reason: Some("requested".to_string()),
        }),
        (AccelChoice::Auto, Some(r)) => Ok(AccelDecision {
            accel: Accel::Tcg,
            reason: Some(format!("auto: KVM unusable: {r}")),
        }),
        (AccelChoice::Auto, None) => Ok(AccelDecision {
            accel: Accel::Kvm,
            reason: Some("auto: KVM usable".to_string()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> HostFacts {
        HostFacts {
            dev_kvm_error: None,
            kvm_pvm: false,
            cpu_virt: true,
        }
    }

    #[test]
    fn auto_uses_kvm_when_usable() {
        assert_eq!(
            choose(AccelChoice::Auto, &good()).unwrap().accel,
            Accel::Kvm
        );
    }

    #[test]
    fn auto_avoids_pvm_kvm() {
        let f = HostFacts {
            kvm_pvm: true,
            cpu_virt: false,
            ..good()
        };
        let d = choose(AccelChoice::Auto, &f).unwrap();
        assert_eq!(d.accel, Accel::Tcg);
        assert!(d.reason.unwrap().contains("kvm_pvm"));
        assert!(matches!(
            choose(AccelChoice::Kvm, &f),
            Err(AccelError::KvmUnusable(_))
        ));
    }

    #[test]
    fn no_dev_kvm() {
        let f = HostFacts {
            dev_kvm_error: Some("No such file or directory".into()),
            ..good()
        };
        assert_eq!(choose(AccelChoice::Auto, &f).unwrap().accel, Accel::Tcg);
        assert_eq!(choose(AccelChoice::Tcg, &f).unwrap().accel, Accel::Tcg);
        assert!(choose(AccelChoice::Kvm, &f).is_err());
    }

    #[test]
    fn cpuinfo_flags() {
        assert!(cpuinfo_has_virt("flags\t\t: fpu vmx sse\n"));
        assert!(cpuinfo_has_virt("processor: 0\nflags : svm\n"));
        assert!(!cpuinfo_has_virt("flags : fpu vmxx sse\nvmx\n"));
        assert!(!cpuinfo_has_virt(""));
    }

    #[test]
    fn probe_reads_this_host() {
        // Each fact checked against the same source read another way.
        let f = HostFacts::probe();
        let grep = std::process::Command::new("grep")
            .args(["-qwE", "vmx|svm", "/proc/cpuinfo"])
            .status()
            .expect("grep runs");
        assert_eq!(f.cpu_virt, grep.success());
        assert_eq!(f.kvm_pvm, std::fs::metadata("/sys/module/kvm_pvm").is_ok());
        let opens = std::fs::File::options()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok();
        assert_eq!(f.dev_kvm_error.is_none(), opens);
        let d = choose(AccelChoice::Auto, &f).unwrap();
        match f.kvm_unusable_reason() {
            Some(r) => {
                assert_eq!(d.accel, Accel::Tcg);
                assert!(d.reason.unwrap().contains(&r));
            }
            None => assert_eq!(d.accel, Accel::Kvm),
        }
    }
}
