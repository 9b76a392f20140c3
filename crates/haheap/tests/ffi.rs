//! The C ABI: null pointers and bad arguments give error codes and a message, never a crash.

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use haheap::ffi::*;

fn last_error() -> String {
    // SAFETY: haheap_last_error returns a valid NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(haheap_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn null_and_bad_arguments_are_refused() {
    // SAFETY: every pointer passed is null, a valid C string, or a live out-pointer: the
    // calls under test must refuse nulls rather than dereference them.
    unsafe {
        let mut h: *mut HaHeap = null_mut();
        assert_eq!(
            haheap_create(4096, c"auto".as_ptr(), null(), 0, null_mut()),
            HAHEAP_ERR_NULL
        );
        assert!(last_error().contains("out is null"), "{}", last_error());
        assert_eq!(
            haheap_create(0, null(), null(), 0, &mut h),
            HAHEAP_ERR_INVALID
        );
        assert_eq!(
            haheap_create(4096, c"fastest".as_ptr(), null(), 0, &mut h),
            HAHEAP_ERR_INVALID
        );
        assert!(last_error().contains("unknown engine"), "{}", last_error());
        assert_eq!(
            haheap_create(4096, null(), null(), 0x80, &mut h),
            HAHEAP_ERR_INVALID
        );
        assert_eq!(haheap_takeover(null(), null(), 0, &mut h), HAHEAP_ERR_NULL);
        assert_eq!(
            haheap_takeover(null(), c"unix:/nonexistent".as_ptr(), 0, null_mut()),
            HAHEAP_ERR_NULL
        );
        assert!(h.is_null(), "a failed call wrote the out-pointer");

        assert_eq!(haheap_tstart(null_mut()), HAHEAP_ERR_NULL);
        assert_eq!(
            haheap_write(null_mut(), 0, c"x".as_ptr().cast(), 1),
            HAHEAP_ERR_NULL
        );
        assert_eq!(haheap_tend(null_mut(), null_mut()), HAHEAP_ERR_NULL);
        assert_eq!(haheap_abort(null_mut()), HAHEAP_ERR_NULL);
        assert_eq!(haheap_flush(null_mut()), HAHEAP_ERR_NULL);
        assert_eq!(haheap_destroy(null_mut()), HAHEAP_OK);
        assert!(haheap_base(null_mut()).is_null());
        assert_eq!(haheap_size(null()), 0);
        assert!(haheap_engine_name(null()).is_null());
        assert!(haheap_engine_reason(null()).is_null());

        assert_eq!(
            haheap_create(5000, c"log".as_ptr(), null(), 0, &mut h),
            HAHEAP_OK
        );
        assert_eq!(haheap_size(h), 8192);
        assert_eq!(CStr::from_ptr(haheap_engine_name(h)), c"log");
        assert_eq!(
            haheap_write(h, 0, c"x".as_ptr().cast(), 1),
            HAHEAP_ERR_NO_TRANSACTION
        );
        assert_eq!(haheap_tstart(h), HAHEAP_OK);
        assert_eq!(haheap_tstart(h), HAHEAP_ERR_NESTED);
        assert_eq!(haheap_write(h, 0, null(), 4), HAHEAP_ERR_NULL);
        assert_eq!(haheap_write(h, 0, null(), 0), HAHEAP_OK);
        assert_eq!(
            haheap_write(h, 8190, c"abc".as_ptr().cast(), 3),
            HAHEAP_ERR_OUT_OF_BOUNDS
        );
        assert_eq!(
            haheap_write(h, usize::MAX, c"abc".as_ptr().cast(), 3),
            HAHEAP_ERR_OUT_OF_BOUNDS
        );
        assert_eq!(haheap_write(h, 8189, c"abc".as_ptr().cast(), 3), HAHEAP_OK);
        let mut st = HaheapTxStats::default();
        assert_eq!(haheap_tend(h, &mut st), HAHEAP_OK);
        assert_eq!(
            (st.tx_id, st.pages, st.bytes_written_hint, st.bytes_shipped),
            (1, 1, 3, 3)
        );
        assert_eq!(
            std::slice::from_raw_parts(haheap_base(h).add(8189), 3),
            b"abc"
        );
        assert_eq!(haheap_tend(h, null_mut()), HAHEAP_ERR_NO_TRANSACTION);
        assert_eq!(haheap_destroy(h), HAHEAP_OK);
    }
}

#[test]
fn block_flag_and_its_timeout_are_checked() {
    // SAFETY: every pointer is null, a valid C string or a live out-pointer.
    unsafe {
        let mut h: *mut HaHeap = null_mut();
        let secs = |s: u32| s << HAHEAP_BLOCK_SECS_SHIFT;
        assert_eq!(
            haheap_create(4096, null(), null(), secs(5), &mut h),
            HAHEAP_ERR_INVALID
        );
        assert!(
            last_error().contains("without HAHEAP_FLAG_BLOCK"),
            "{}",
            last_error()
        );
        assert_eq!(
            haheap_create(4096, null(), null(), HAHEAP_FLAG_BLOCK | 0x40, &mut h),
            HAHEAP_ERR_INVALID
        );
        assert!(h.is_null());
        for flags in [
            HAHEAP_FLAG_BLOCK,
            HAHEAP_FLAG_BLOCK | secs(0xffff),
            HAHEAP_FLAG_BLOCK | HAHEAP_FLAG_ASYNC | secs(1),
            HAHEAP_FLAG_SPIN | HAHEAP_FLAG_ASYNC,
        ] {
            assert_eq!(
                haheap_create(4096, null(), null(), flags, &mut h),
                HAHEAP_OK
            );
            assert_eq!(haheap_destroy(h), HAHEAP_OK);
            h = null_mut();
        }
    }
}

/// HAHEAP_FLAG_BLOCK with a 1 s timeout: with the backup gone haheap_tend waits that long,
/// then reports the transaction in doubt; once the backup is back it completes.
#[test]
fn block_flag_waits_its_timeout_then_reports_in_doubt() {
    let dir = tempfile::tempdir().unwrap();
    let ep = format!("unix:{}", dir.path().join("b.sock").display());
    let start = || {
        let cfg = hareplica::BackupConfig::new(ep.parse().unwrap(), &dir.path().join("replica"));
        hareplica::BackupServer::bind(cfg).unwrap().0.spawn()
    };
    let b = start();
    let c_ep = std::ffi::CString::new(ep.clone()).unwrap();
    let flags = HAHEAP_FLAG_BLOCK | (1 << HAHEAP_BLOCK_SECS_SHIFT);
    // SAFETY: valid C strings, a live out-pointer, and `h` used on this thread only.
    unsafe {
        let mut h: *mut HaHeap = null_mut();
        assert_eq!(
            haheap_create(8192, c"scan".as_ptr(), c_ep.as_ptr(), flags, &mut h),
            HAHEAP_OK,
            "{}",
            last_error()
        );
        assert_eq!(haheap_tstart(h), HAHEAP_OK);
        assert_eq!(haheap_write(h, 0, c"one".as_ptr().cast(), 3), HAHEAP_OK);
        assert_eq!(haheap_tend(h, null_mut()), HAHEAP_OK);
        b.shutdown().unwrap();

        assert_eq!(haheap_tstart(h), HAHEAP_OK);
        assert_eq!(haheap_write(h, 4096, c"two".as_ptr().cast(), 3), HAHEAP_OK);
        let t0 = std::time::Instant::now();
        assert_eq!(haheap_tend(h, null_mut()), HAHEAP_ERR_IN_DOUBT);
        let waited = t0.elapsed();
        assert!(
            waited >= std::time::Duration::from_secs(1),
            "gave up after {waited:?}, before its 1 s timeout"
        );

        let b = start();
        let mut st = HaheapTxStats::default();
        assert_eq!(haheap_tend(h, &mut st), HAHEAP_OK, "{}", last_error());
        assert_eq!(st.tx_id, 2);
        let img = b.state().image;
        assert_eq!(b.state().last_tx, 2);
        assert_eq!((&img[..3], &img[4096..4099]), (&b"one"[..], &b"two"[..]));
        assert_eq!(haheap_destroy(h), HAHEAP_OK);
        b.shutdown().unwrap();
    }
}
