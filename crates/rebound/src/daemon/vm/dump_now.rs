//! `rebound vm dump`: a dump of a VM that still has its QEMU (running, paused or
//! crashed and kept), by Rebound's writer or, as the stock baseline, by QEMU's own
//! `dump-guest-memory`. A running guest is paused for the dump and resumed after.

use std::path::PathBuf;
use std::time::Instant;

use rebound_api::{
    Compress, CrashPolicy, DumpEngine, DumpFormat, DumpRequest, DumpResult, OnCrash, VmState,
};

use super::owner::Owner;
use crate::daemon::error::OpError;

impl Owner {
    pub(super) async fn dump_now(&mut self, req: DumpRequest) -> Result<DumpResult, OpError> {
        let rec = self.vm.record();
        // The same rules as a crash policy's dump options.
        CrashPolicy {
            on_crash: OnCrash::Dump,
            dump_format: req.format,
            compress: req.compress,
            filter: req.filter.clone(),
            ..CrashPolicy::default()
        }
        .validate(rec.spec.memory_mib)?;
        let out = PathBuf::from(&req.out);
        if !out.is_absolute() || out.file_name().is_none() {
            return Err(OpError::BadRequest(format!(
                "dump path {:?} must be an absolute file path",
                req.out
            )));
        }
        if out.symlink_metadata().is_ok() {
            return Err(OpError::BadRequest(format!(
                "{} already exists: a dump never replaces a file",
                out.display()
            )));
        }
        let parent = out.parent().unwrap_or(std::path::Path::new("/"));
        if !parent.is_dir() {
            return Err(OpError::BadRequest(format!(
                "dump directory {} does not exist",
                parent.display()
            )));
        }
        let q = match (&self.qmp, rec.state) {
            (Some(q), VmState::Running | VmState::Paused | VmState::Panicked) => q.clone(),
            _ => {
                return Err(OpError::WrongState(
                    self.vm.name.clone(),
                    rec.state,
                    "only a VM with its QEMU (running, paused or panicked) can be dumped now",
                ))
            }
        };
        if req.engine == DumpEngine::Qemu
            && (!req.filter.is_empty() || req.compress == Compress::Zstd)
        {
            return Err(OpError::BadRequest(
                "QEMU's dump filters nothing and compresses only with zlib".into(),
            ));
        }
        let was_running = rec.state == VmState::Running;
        let t0 = Instant::now();
        if was_running {
            q.execute("stop", None).await?;
        }
        let r = match req.engine {
            DumpEngine::Qemu => self.qemu_dump(&q, &req, &out).await,
            DumpEngine::Rebound => self.rebound_dump(&req, &out).await,
        };
        let paused_s = if was_running {
            let s = t0.elapsed().as_secs_f64();
            q.execute("cont", None).await?;
            s
        } else {
            0.0
        };
        let mut r = r?;
        r.paused_s = paused_s;
        if let Some(m) = req.mode {
            rebound_vmm::private::apply_mode(&out, Some(m))
                .map_err(|e| OpError::Io(format!("cannot set the mode of {}", out.display()), e))?;
        }
        Ok(r)
    }

    async fn qemu_dump(
        &self,
        q: &rebound_vmm::qmp::Qmp,
        req: &DumpRequest,
        out: &std::path::Path,
    ) -> Result<DumpResult, OpError> {
        let t0 = Instant::now();
        let partial = rebound_dump::write::partial_path(out);
        // QEMU creates the file itself: create it private first, it writes into it.
        rebound_vmm::private::create_file(&partial, false)
            .map_err(|e| OpError::Io(format!("cannot create {}", partial.display()), e))?;
        let format = match (req.format, req.compress) {
            (DumpFormat::Elf, _) => "elf",
            (DumpFormat::Kdump, _) => "kdump-zlib",
        };
        // Detached, and followed with query-dump: a large dump outlasts any one QMP
        // command's timeout, and its progress feeds the progress bar.
        let args = serde_json::json!({"paging": false, "format": format, "detach": true,
            "protocol": format!("file:{}", partial.display())});
        if let Err(e) = self.follow_qemu_dump(q, args).await {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
        // Durable, as ours: the same bar for both.
        let f = std::fs::File::open(&partial)
            .map_err(|e| OpError::Io(format!("cannot open {}", partial.display()), e))?;
        f.sync_all()
            .map_err(|e| OpError::Io(format!("cannot flush {}", partial.display()), e))?;
        rebound_dump::write::rename_noreplace(&partial, out)
            .map_err(|e| OpError::Io(format!("cannot rename to {}", out.display()), e))?;
        let bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(DumpResult {
            path: out.display().to_string(),
            engine: DumpEngine::Qemu,
            format: req.format,
            bytes,
            io_bytes: rebound_vmm::process::allocated_bytes(out).unwrap_or(bytes),
            seconds: t0.elapsed().as_secs_f64(),
            paused_s: 0.0,
            pages_written: 0,
            pages_skipped: Default::default(),
            notes: vec!["written by QEMU's dump-guest-memory".into()],
        })
    }

    /// Starts QEMU's detached dump and polls `query-dump` until it completes.
    async fn follow_qemu_dump(
        &self,
        q: &rebound_vmm::qmp::Qmp,
        args: serde_json::Value,
    ) -> Result<(), OpError> {
        q.execute("dump-guest-memory", Some(args)).await?;
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let v = q.execute("query-dump", None).await?;
            let done = v["completed"].as_u64().unwrap_or(0);
            let total = v["total"].as_u64().unwrap_or(0);
            match v["status"].as_str() {
                Some("completed") => {
                    self.vm.set_progress(None);
                    return Ok(());
                }
                Some("active") | Some("none") => self.vm.set_progress(Some((done, total))),
                _ => {
                    self.vm.set_progress(None);
                    let status = v["status"].to_string();
                    return Err(OpError::DumpFailed(super::dump::DumpError::Qemu(status)));
                }
            }
        }
    }

    async fn rebound_dump(
        &self,
        req: &DumpRequest,
        out: &std::path::Path,
    ) -> Result<DumpResult, OpError> {
        let t0 = Instant::now();
        let rec = self.vm.record();
        let notes_dir = self.vm.run.path().to_path_buf();
        let cpu_notes = self.save_cpu_notes(&notes_dir).await;
        let job = super::dump::DumpJob {
            earlier: Vec::new(),
            rate: Default::default(),
            ram: self.vm.run.ram(),
            memory_mib: rec.spec.memory_mib,
            out: out.to_path_buf(),
            cpu_notes,
            format: req.format,
            compress: req.compress,
            filter: req.filter.clone(),
            chunk_mib: 128.min(rec.spec.memory_mib),
            vmcoreinfo: rec.vmcoreinfo,
            release: false,
        };
        let vm = self.vm.clone();
        let total = rec.spec.memory_mib << 20;
        let done = tokio::task::spawn_blocking(move || {
            let mut show = |covered: u64| vm.set_progress(Some((covered, total)));
            let r = super::dump::write(&job, None, &mut show);
            vm.set_progress(None);
            r.map(|d| (d, job))
        })
        .await
        .map_err(|e| OpError::Broken(Box::new(e)))?
        .map_err(OpError::DumpFailed)?;
        let (d, job) = done;
        if let Some(p) = &job.cpu_notes {
            let _ = std::fs::remove_file(p);
        }
        Ok(DumpResult {
            path: out.display().to_string(),
            engine: DumpEngine::Rebound,
            format: req.format,
            bytes: d.bytes,
            io_bytes: d.io_bytes,
            seconds: t0.elapsed().as_secs_f64(),
            paused_s: 0.0,
            pages_written: d.pages_written,
            pages_skipped: d.pages_skipped,
            notes: d.notes,
        })
    }
}
