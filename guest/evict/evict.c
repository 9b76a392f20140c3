// SPDX-License-Identifier: GPL-2.0
/*
 * rebound_evict: tells the host which page-cache pages the guest lets go, so a
 * hypervisor exclusive cache (Hcache, ATC'07 section 3) can admit what is evicted
 * and forget what is released. Every page the tracepoint
 * mm_filemap_delete_from_page_cache reports becomes one notice in a ring of
 * physically contiguous guest pages the host reads through the guest RAM file; the
 * ring's guest physical address and size are the read-only parameters ring_gpa and
 * ring_bytes (/sys/module/rebound_evict/parameters/).
 *
 * The tracepoint fires for reclaim, invalidation and truncation alike. A notice is
 * "released" when the page's data is provably no longer the file's:
 *  - the inode has no links left (deleted file, its pages go at the final iput);
 *  - the page lies wholly past i_size (truncate sets i_size before it drops pages);
 *  - the folio is dirty or under writeback (its bytes are not the disk's).
 * Everything else is "evicted" (reclaim, drop_caches, fadvise, invalidation before
 * direct I/O, and hole punching, which the tracepoint cannot tell apart). The host
 * still checks each evicted page's content against a hash of its block, and a block
 * freed by a punch is written before it holds other data (that write invalidates the
 * host's copy), so calling a release an eviction can cost a refusal or a wasted cache
 * slot, never wrong data. (The dirty test rarely fires: truncation cancels the dirty
 * bit before it deletes the folio, which is why the i_size test is there.)
 * Pages of filesystems without a block device (tmpfs, ramfs, proc) are skipped.
 *
 * The probe runs under the mapping's i_pages lock with IRQs off, possibly on several
 * CPUs at once: it only reserves a slot with an atomic increment, copies and stores.
 * The page is still the file's while the probe runs (the lock is held), so the copy is
 * the page's content at eviction.
 */
#include <linux/atomic.h>
#include <linux/fs.h>
#include <linux/gfp.h>
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pagemap.h>
#include <linux/pfn.h>
#include <linux/random.h>
#include <linux/string.h>
#include <linux/tracepoint.h>

#include "ring.h"

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Rebound: page-cache eviction notices for the host's exclusive cache");

static unsigned int slots = 1024; /* 4 MiB of copies: ~17 ms of heavy reclaim under TCG */
module_param(slots, uint, 0444);
MODULE_PARM_DESC(slots, "notices with a page copy the ring holds (0: notices only, 1-65536)");

static unsigned int order = 8; /* slots=0: 1 MiB, ~65k notices, about 1 s of heavy reclaim */
module_param(order, uint, 0444);
MODULE_PARM_DESC(order, "with slots=0, the ring's size as a page allocation order (1-10)");

/*
 * Tests only: a guest whose notices cannot be trusted, for the host's checks to meet
 * (init passes rebound.evict_misbehave=N). Around every Nth eviction the module also
 * writes a notice naming that page with random bytes as its copy, one naming it with
 * its neighbour page's bytes, one for a page the guest does not have, and the real one
 * twice (a replay); halfway between two of those it drops a real notice (lost).
 */
static unsigned int misbehave;
module_param(misbehave, uint, 0444);
MODULE_PARM_DESC(misbehave, "tests only: every Nth eviction, forged, duplicated and dropped notices (0: never)");

static unsigned long ring_gpa;
module_param(ring_gpa, ulong, 0444);
MODULE_PARM_DESC(ring_gpa, "guest physical address of the ring (read-only)");

static unsigned long ring_bytes;
module_param(ring_bytes, ulong, 0444);
MODULE_PARM_DESC(ring_bytes, "bytes of the ring (read-only)");

struct ring_header {
	u64 magic;
	u32 version;
	u32 entry_size;
	u64 capacity;
	atomic64_t head;
	u32 slot_bytes;
	u32 chunk_slots;
	u32 chunks;
	u32 entries_off;
	u64 reserved[2];
	u64 chunk_gpa[RING_MAX_CHUNKS];
};

static_assert(offsetof(struct ring_header, chunk_gpa) == RING_HEADER);
static_assert(sizeof(struct ring_header) <= RING_ENTRIES_OFF);
static_assert(sizeof(struct evict_entry) == 16);

static unsigned int ring_order;
static struct page *ring_pages;
static struct ring_header *hdr;
static struct evict_entry *entries;
static u64 capacity;
static unsigned int chunk_order;
static struct page *chunk[RING_MAX_CHUNKS];
static struct tracepoint *tp;

/* Chunks of copies are order-10 allocations at most (4 MiB), always available at boot. */
#define MAX_ORDER_COPY 10

/* A notice for pfn; an eviction's copy comes from src (a page), or else the page. */
static void push_from(unsigned long pfn, u64 kind, const void *src)
{
	u64 n = atomic64_inc_return(&hdr->head);
	u64 s = (n - 1) % capacity;
	struct evict_entry *e = &entries[s];

	WRITE_ONCE(e->seq, 0);
	smp_wmb();
	if (slots && kind == KIND_EVICTED) {
		u64 per = hdr->chunk_slots;
		char *slot = page_address(chunk[s / per]) + (s % per) * PAGE_SIZE;

		copy_page(slot, src ? src : page_address(pfn_to_page(pfn)));
	}
	WRITE_ONCE(e->info, (u64)pfn | kind << KIND_SHIFT);
	smp_wmb();
	WRITE_ONCE(e->seq, n);
}

static void push(unsigned long pfn, u64 kind)
{
	push_from(pfn, kind, NULL);
}

static void *junk; /* a page of random bytes (misbehave) */
static atomic64_t evictions;

/* misbehave: what an untrustworthy guest might write around the eviction of pfn;
 * returns whether the real notice is dropped instead. */
static bool misbehave_at(unsigned long pfn)
{
	u64 k = atomic64_inc_return(&evictions);
	unsigned long next = pfn + 1;

	if (misbehave > 1 && k % misbehave == misbehave / 2)
		return true;
	if (k % misbehave)
		return false;
	push_from(pfn, KIND_EVICTED, junk);
	if (pfn_valid(next) && !PageReserved(pfn_to_page(next)) && !PageHighMem(pfn_to_page(next)))
		push_from(pfn, KIND_EVICTED, page_address(pfn_to_page(next)));
	/* Far past any RAM this guest has (pfn 2^34: 64 TiB). */
	push_from(pfn | 1UL << 34, KIND_EVICTED, junk);
	push(pfn, KIND_EVICTED);
	return false; /* and the real one follows: a duplicate */
}

static bool released(struct folio *folio, struct inode *inode)
{
	if (folio_test_dirty(folio) || folio_test_writeback(folio))
		return true;
	if (S_ISBLK(inode->i_mode))
		return false;
	if (inode->i_nlink == 0)
		return true;
	return (loff_t)folio->index << PAGE_SHIFT >= i_size_read(inode);
}

static void probe(void *data, struct folio *folio)
{
	struct address_space *mapping = folio->mapping;
	struct inode *inode;
	unsigned long pfn, i, nr;
	u64 kind;

	if (!mapping || !mapping->host)
		return;
	inode = mapping->host;
	if (!S_ISBLK(inode->i_mode) && !inode->i_sb->s_bdev)
		return;
	kind = released(folio, inode) ? KIND_RELEASED : KIND_EVICTED;
	pfn = folio_pfn(folio);
	nr = folio_nr_pages(folio);
	for (i = 0; i < nr; i++) {
		if (misbehave && kind == KIND_EVICTED && misbehave_at(pfn + i))
			continue;
		push(pfn + i, kind);
	}
}

static void find_tp(struct tracepoint *t, void *priv)
{
	if (!strcmp(t->name, "mm_filemap_delete_from_page_cache"))
		tp = t;
}

static void free_ring(void)
{
	unsigned int i;

	for (i = 0; i < RING_MAX_CHUNKS; i++)
		if (chunk[i])
			__free_pages(chunk[i], chunk_order);
	if (ring_pages)
		__free_pages(ring_pages, ring_order);
}

/* The header page with the entries, and with slots the chunks of page copies. */
static int alloc_ring(void)
{
	const gfp_t gfp = GFP_KERNEL | __GFP_ZERO | __GFP_NOWARN;
	unsigned int per, i;

	if (slots > RING_MAX_CHUNKS * (PAGE_SIZE << MAX_ORDER_COPY) / PAGE_SIZE) {
		pr_err("rebound_evict: slots %u is over %lu\n", slots,
		       RING_MAX_CHUNKS * (PAGE_SIZE << MAX_ORDER_COPY) / PAGE_SIZE);
		return -EINVAL;
	}
	if (!slots && (order < 1 || order > 10)) {
		pr_err("rebound_evict: order %u is not 1-10\n", order);
		return -EINVAL;
	}
	ring_order = slots ? get_order(RING_ENTRIES_OFF + slots * sizeof(struct evict_entry)) :
			     order;
	ring_pages = alloc_pages(gfp, ring_order);
	if (!ring_pages)
		return -ENOMEM;
	hdr = page_address(ring_pages);
	entries = (struct evict_entry *)((char *)hdr + RING_ENTRIES_OFF);
	ring_bytes = PAGE_SIZE << ring_order;
	capacity = slots ? slots : (ring_bytes - RING_ENTRIES_OFF) / sizeof(struct evict_entry);
	hdr->version = RING_VERSION;
	hdr->entry_size = sizeof(struct evict_entry);
	hdr->capacity = capacity;
	hdr->entries_off = RING_ENTRIES_OFF;
	if (slots) {
		chunk_order = min_t(unsigned int, MAX_ORDER_COPY, get_order(slots * PAGE_SIZE));
		per = (PAGE_SIZE << chunk_order) / PAGE_SIZE;
		hdr->slot_bytes = PAGE_SIZE;
		hdr->chunk_slots = per;
		hdr->chunks = DIV_ROUND_UP(slots, per);
		for (i = 0; i < hdr->chunks; i++) {
			chunk[i] = alloc_pages(gfp, chunk_order);
			if (!chunk[i])
				return -ENOMEM;
			hdr->chunk_gpa[i] = PFN_PHYS(page_to_pfn(chunk[i]));
		}
	}
	atomic64_set(&hdr->head, 0);
	/* The magic last: a host that sees it sees a whole header. */
	smp_wmb();
	WRITE_ONCE(hdr->magic, RING_MAGIC);
	ring_gpa = PFN_PHYS(page_to_pfn(ring_pages));
	return 0;
}

static int __init evict_init(void)
{
	int err;

	for_each_kernel_tracepoint(find_tp, NULL);
	if (!tp) {
		pr_err("rebound_evict: no tracepoint mm_filemap_delete_from_page_cache\n");
		return -ENOENT;
	}
	if (misbehave) {
		junk = (void *)get_zeroed_page(GFP_KERNEL);
		if (!junk)
			return -ENOMEM;
		get_random_bytes(junk, PAGE_SIZE);
		pr_warn("rebound_evict: misbehaving on purpose every %u evictions (tests only)\n",
			misbehave);
	}
	err = alloc_ring();
	if (!err)
		err = tracepoint_probe_register(tp, probe, NULL);
	if (err) {
		free_ring();
		free_page((unsigned long)junk);
		return err;
	}
	pr_info("rebound_evict: ring at %#lx, %lu bytes, %llu notices, %u page copies\n", ring_gpa,
		ring_bytes, capacity, slots);
	return 0;
}

static void __exit evict_exit(void)
{
	tracepoint_probe_unregister(tp, probe, NULL);
	tracepoint_synchronize_unregister();
	WRITE_ONCE(hdr->magic, 0);
	free_ring();
	free_page((unsigned long)junk);
}

module_init(evict_init);
module_exit(evict_exit);
