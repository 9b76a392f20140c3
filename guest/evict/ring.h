/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The eviction-notice ring shared with the host (read through guest memory).
 * Layout, version 2, little-endian, at the guest physical address the module publishes
 * (the "control" allocation, ring_bytes long):
 *
 *   0  u64 magic       RING_MAGIC ("RBEVRING"); 0 once the module unloads
 *   8  u32 version     RING_VERSION
 *  12  u32 entry_size  sizeof(struct evict_entry) = 16
 *  16  u64 capacity    entries in the array (and slots, when there are copies)
 *  24  u64 head        notices ever written (the last one's sequence number)
 *  32  u32 slot_bytes  4096: each eviction's page is copied into a slot; 0: no copies
 *  36  u32 chunk_slots slots per chunk (chunks are physically contiguous)
 *  40  u32 chunks      chunks of slots (at most RING_MAX_CHUNKS)
 *  44  u32 entries_off RING_ENTRIES_OFF
 *  48..63 reserved (0)
 *  64  u64 chunk_gpa[chunks]  guest physical address of each chunk
 *  RING_ENTRIES_OFF  struct evict_entry[capacity]
 *
 * Notice n (1-based) lives in entry (n - 1) % capacity, and its page copy in slot
 * s = (n - 1) % capacity, at chunk_gpa[s / chunk_slots] + (s % chunk_slots) * 4096.
 * Its writer clears seq, copies the page, writes info, then writes seq = n, with write
 * barriers in between: a reader that sees seq == n before and after copying info (and
 * the slot) has notice n whole; any other seq means the entry is not written yet
 * (older) or was overwritten (newer). The copy is the page as it was when the guest let
 * it go, so the host never depends on the page still holding it.
 */
#ifndef REBOUND_EVICT_RING_H
#define REBOUND_EVICT_RING_H

#define RING_MAGIC 0x474e495256454252ULL /* "RBEVRING" */
#define RING_VERSION 2
#define RING_HEADER 64
#define RING_MAX_CHUNKS 64
#define RING_ENTRIES_OFF 4096

#define KIND_EVICTED 1ULL
#define KIND_RELEASED 2ULL
/* info = pfn | kind << KIND_SHIFT (pfns fit in 52 bits on x86-64). */
#define KIND_SHIFT 56

struct evict_entry {
	u64 seq;
	u64 info;
};

#endif
