/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The eviction-notice ring shared with the host (read through the guest RAM file).
 * Layout, little-endian, at the guest physical address the module publishes:
 *
 *   0  u64 magic     RING_MAGIC ("RBEVRING"); 0 once the module unloads
 *   8  u32 version   RING_VERSION
 *  12  u32 entry_size  sizeof(struct evict_entry) = 16
 *  16  u64 capacity  entries in the array
 *  24  u64 head      notices ever written (the last one's sequence number)
 *  32..63 reserved (0)
 *  64  struct evict_entry[capacity]
 *
 * Notice n (1-based) lives in entry (n - 1) % capacity. Its writer clears seq, writes
 * info, then writes seq = n, with write barriers in between: a reader that sees seq == n
 * before and after copying info has notice n whole; any other seq means the entry is
 * not written yet (older) or was overwritten (newer).
 */
#ifndef REBOUND_EVICT_RING_H
#define REBOUND_EVICT_RING_H

#define RING_MAGIC 0x474e495256454252ULL /* "RBEVRING" */
#define RING_VERSION 1
#define RING_HEADER 64

#define KIND_EVICTED 1ULL
#define KIND_RELEASED 2ULL
/* info = pfn | kind << KIND_SHIFT (pfns fit in 52 bits on x86-64). */
#define KIND_SHIFT 56

struct evict_entry {
	u64 seq;
	u64 info;
};

#endif
