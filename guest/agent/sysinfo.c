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
}
