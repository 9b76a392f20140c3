/* Facts about the guest reported in `ready`. */
#include "agent.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>

/* /sys/kernel/vmcoreinfo holds "%lx %x\n": the note's physical address and size, in hex
 * without 0x. */
int parse_vmcoreinfo(const char *text, uint64_t *paddr, uint64_t *size)
{
	char extra;
	unsigned long long a, s;
	if (strchr(text, '-'))
		return -1;
	if (sscanf(text, "%llx %llx %c", &a, &s, &extra) != 2)
		return -1;
	if (s == 0 || s > (1u << 20))
		return -1;
	*paddr = a;
	*size = s;
	return 0;
}

/* Finds "<field>: N kB" at the start of a line of /proc/meminfo. */
int parse_meminfo(const char *text, const char *field, uint64_t *kib)
{
	size_t n = strlen(field);
	unsigned long long v;
	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		if (strncmp(p, field, n) != 0 || p[n] != ':')
			continue;
		if (sscanf(p + n + 1, " %llu kB", &v) != 1)
			return -1;
		*kib = v;
		return 0;
	}
	return -1;
}

int parse_param_u64(const char *text, uint64_t *v)
{
	char extra;
	unsigned long long x;
	if (strchr(text, '-') || sscanf(text, "%llu %c", &x, &extra) != 1)
		return -1;
	*v = x;
	return 0;
}

/* The ring's address and size, as rebound_evict publishes them; none when the module is
 * absent or says nothing sensible (a ring is at least a page, at most 4 MiB). */
static void evict_ring(struct sysinfo_facts *f)
{
	const char *dir = "/sys/module/rebound_evict/parameters/";
	char path[128], buf[64];
	uint64_t gpa, bytes;
	snprintf(path, sizeof(path), "%sring_gpa", dir);
	if (read_small_file(path, buf, sizeof(buf)) <= 0 || parse_param_u64(buf, &gpa) < 0)
		return;
	snprintf(path, sizeof(path), "%sring_bytes", dir);
	if (read_small_file(path, buf, sizeof(buf)) <= 0 || parse_param_u64(buf, &bytes) < 0)
		return;
	if (bytes < 4096 || bytes > (4u << 20) || gpa % 4096)
		return;
	f->evict_ring_gpa = gpa;
	f->evict_ring_bytes = bytes;
}

void sysinfo_collect(struct sysinfo_facts *f)
{
	struct utsname u;
	char buf[4096];
	memset(f, 0, sizeof(*f));
	if (uname(&u) == 0)
		snprintf(f->kernel_release, sizeof(f->kernel_release), "%s", u.release);
	if (read_small_file("/proc/meminfo", buf, sizeof(buf)) > 0)
		parse_meminfo(buf, "MemTotal", &f->mem_total_kib);
	if (read_small_file("/sys/kernel/vmcoreinfo", buf, sizeof(buf)) > 0 &&
	    parse_vmcoreinfo(buf, &f->vmcoreinfo_paddr, &f->vmcoreinfo_size) == 0)
		f->has_vmcoreinfo = 1;
	evict_ring(f);
}
