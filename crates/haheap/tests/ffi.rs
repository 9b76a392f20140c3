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
