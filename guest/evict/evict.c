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
 * CPUs at once: it only reserves a slot with an atomic increment and stores.
 */
#include <linux/atomic.h>
#include <linux/fs.h>
#include <linux/gfp.h>
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pagemap.h>
#include <linux/pfn.h>
#include <linux/string.h>
#include <linux/tracepoint.h>

#include "ring.h"

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Rebound: page-cache eviction notices for the host's exclusive cache");

static unsigned int order = 8; /* 1 MiB: ~65k notices, about 1 s of heavy reclaim */
module_param(order, uint, 0444);
MODULE_PARM_DESC(order, "ring size as a page allocation order (0-10)");

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
	u64 reserved[4];
};

static_assert(sizeof(struct ring_header) == RING_HEADER);
static_assert(sizeof(struct evict_entry) == 16);

static struct page *ring_pages;
static struct ring_header *hdr;
static struct evict_entry *entries;
static u64 capacity;
static struct tracepoint *tp;

static void push(unsigned long pfn, u64 kind)
{
	u64 n = atomic64_inc_return(&hdr->head);
	struct evict_entry *e = &entries[(n - 1) % capacity];

	WRITE_ONCE(e->seq, 0);
	smp_wmb();
	WRITE_ONCE(e->info, (u64)pfn | kind << KIND_SHIFT);
	smp_wmb();
	WRITE_ONCE(e->seq, n);
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
	for (i = 0; i < nr; i++)
		push(pfn + i, kind);
}

static void find_tp(struct tracepoint *t, void *priv)
{
	if (!strcmp(t->name, "mm_filemap_delete_from_page_cache"))
		tp = t;
}

static int __init evict_init(void)
{
	int err;

	if (order > 10) {
		pr_err("rebound_evict: order %u is over 10\n", order);
		return -EINVAL;
	}
	for_each_kernel_tracepoint(find_tp, NULL);
	if (!tp) {
		pr_err("rebound_evict: no tracepoint mm_filemap_delete_from_page_cache\n");
		return -ENOENT;
	}
	ring_pages = alloc_pages(GFP_KERNEL | __GFP_ZERO | __GFP_NOWARN, order);
	if (!ring_pages)
		return -ENOMEM;
	hdr = page_address(ring_pages);
	entries = (struct evict_entry *)((char *)hdr + RING_HEADER);
	ring_bytes = PAGE_SIZE << order;
	capacity = (ring_bytes - RING_HEADER) / sizeof(struct evict_entry);
	hdr->version = RING_VERSION;
	hdr->entry_size = sizeof(struct evict_entry);
	hdr->capacity = capacity;
	atomic64_set(&hdr->head, 0);
	/* The magic last: a host that sees it sees a whole header. */
	smp_wmb();
	WRITE_ONCE(hdr->magic, RING_MAGIC);
	ring_gpa = PFN_PHYS(page_to_pfn(ring_pages));

	err = tracepoint_probe_register(tp, probe, NULL);
	if (err) {
		__free_pages(ring_pages, order);
		return err;
	}
	pr_info("rebound_evict: ring at %#lx, %lu bytes, %llu notices\n", ring_gpa, ring_bytes,
		capacity);
	return 0;
}

static void __exit evict_exit(void)
{
	tracepoint_probe_unregister(tp, probe, NULL);
	tracepoint_synchronize_unregister();
	WRITE_ONCE(hdr->magic, 0);
	__free_pages(ring_pages, order);
}

module_init(evict_init);
module_exit(evict_exit);
