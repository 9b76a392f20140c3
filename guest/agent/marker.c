/* `marker`: lets the host find known bytes in guest RAM (tests of dumps and restores).
 * The page is mlocked and never freed, so its physical address stays valid. */
#include "agent.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096
#define MAX_MARKERS 4096
#define PM_PRESENT (1ULL << 63)
#define PM_PFN_MASK ((1ULL << 55) - 1)

static unsigned markers_placed;

int hex_decode(const char *hex, unsigned char *out, size_t cap, size_t *len)
{
	size_t n = strlen(hex);
	if (n % 2 || n / 2 > cap)
		return -1;
	for (size_t i = 0; i < n / 2; i++) {
		int hi = hex_nibble(hex[2 * i]), lo = hex_nibble(hex[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return -1;
		out[i] = (unsigned char)(hi << 4 | lo);
	}
	*len = n / 2;
	return 0;
}

int marker_place(const char *value_hex, uint64_t *paddr, size_t *len, char *err, size_t errlen)
{
	unsigned char bytes[PAGE];
	uint64_t entry;
	size_t n;
	if (hex_decode(value_hex, bytes, sizeof(bytes), &n) < 0 || n == 0) {
		snprintf(err, errlen, "marker value_hex must be 1..4096 bytes of hex digits");
		return -1;
	}
	if (markers_placed >= MAX_MARKERS) {
		snprintf(err, errlen, "too many markers (limit %d)", MAX_MARKERS);
		return -1;
	}
	unsigned char *page = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED) {
		snprintf(err, errlen, "marker: mmap failed: %m");
		return -1;
	}
	/* mlock faults the page in and pins it: the physical address cannot change. */
	if (mlock(page, PAGE) < 0) {
		snprintf(err, errlen, "marker: mlock failed: %m");
		munmap(page, PAGE);
		return -1;
	}
	memcpy(page, bytes, n);
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	off_t off = (off_t)((uintptr_t)page / PAGE) * 8;
	ssize_t got = fd < 0 ? -1 : pread(fd, &entry, sizeof(entry), off);
	if (fd >= 0)
		close(fd);
	if (got != (ssize_t)sizeof(entry) || !(entry & PM_PRESENT) || (entry & PM_PFN_MASK) == 0) {
		snprintf(err, errlen, "marker: /proc/self/pagemap gave no frame for the page");
		munlock(page, PAGE);
		munmap(page, PAGE);
		return -1;
	}
	markers_placed++;
	*paddr = (entry & PM_PFN_MASK) * PAGE;
	*len = n;
	return 0;
}
