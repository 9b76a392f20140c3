/* Warm reboot, guest side (docs/agent-protocol.md, `cachelist` and `prefetch`).
 *
 * Before a reboot the host asks which pages of the files under /data are in the page
 * cache (mincore over a read-only mapping: nothing is read or faulted in). After the
 * boot it sends the list back and a child process reads those pages, so they come
 * from the host's block cache into the new kernel's page cache before and while the
 * service starts. The list only says what to read: the content always comes from the
 * disk, so a stale or wrong list costs time, never correctness.
 *
 * List text: one line per file (or per piece of a very fragmented file),
 * "START+COUNT,START+COUNT,... PATH\n", pages of 4 KiB, PATH relative to /data. Ranges
 * never hold a space, so the first space ends them and PATH may contain spaces. */
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define WARM_ROOT "/data"
#define PAGE 4096u
#define READ_CHUNK (1u << 20)

static struct {
	char *buf;
	size_t len;
	warm_emit_fn emit;
	void *arg;
	struct warm_counts n;
} cl;

static void cl_flush(int last)
{
	cl.buf[cl.len] = '\0';
	cl.emit(cl.buf, cl.len, last, cl.arg);
	cl.len = 0;
}

/* Appends `piece` to the current chunk, flushing it first when it would not fit. */
static void cl_put(const char *piece, size_t len)
{
	if (cl.len + len > WARM_CHUNK_MAX)
		cl_flush(0);
	memcpy(cl.buf + cl.len, piece, len);
	cl.len += len;
}

/* Ends a line of ranges (ll bytes in line, which has room) with its path, and queues it. */
static void cl_line(char *line, size_t ll, const char *rel, size_t rl)
{
	line[ll++] = ' ';
	memcpy(line + ll, rel, rl);
	ll += rl;
	line[ll++] = '\n';
	cl_put(line, ll);
}

/* Names the JSON writer would escape (or re-encode) cannot round-trip: skipped. */
static int plain_name(const char *p)
{
	for (; *p; p++) {
		unsigned char c = (unsigned char)*p;
		if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\')
			return 0;
	}
	return 1;
}

static int cl_file(const char *path, const struct stat *st, int type, struct FTW *f)
{
	(void)f;
	if (type != FTW_F || !S_ISREG(st->st_mode) || st->st_size == 0)
		return 0;
	const char *rel = path + strlen(WARM_ROOT);
	while (*rel == '/')
		rel++;
	size_t rl = strlen(rel);
	if (!rl || rl > WARM_PATH_MAX || !plain_name(rel)) {
		cl.n.skipped++;
		return 0;
	}
	int fd = open(path, O_RDONLY | O_NOATIME | O_CLOEXEC);
	if (fd < 0)
		fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		cl.n.skipped++;
		return 0;
	}
	size_t size = (size_t)st->st_size, pages = (size + PAGE - 1) / PAGE;
	void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	unsigned char *vec = malloc(pages);
	if (m == MAP_FAILED || !vec || mincore(m, size, vec) < 0) {
		cl.n.skipped++;
		if (m != MAP_FAILED)
			munmap(m, size);
		free(vec);
		return 0;
	}
	munmap(m, size);
	/* A line holds ranges and then the path; a file with more ranges than fit in one
	 * chunk is split into several lines naming it. */
	char line[WARM_CHUNK_MAX];
	size_t ll = 0, file_pages = 0;
	for (size_t i = 0; i < pages;) {
		if (!(vec[i] & 1)) {
			i++;
			continue;
		}
		size_t j = i;
		while (j < pages && (vec[j] & 1))
			j++;
		char r[48];
		int k = snprintf(r, sizeof(r), "%s%zu+%zu", ll ? "," : "", i, j - i);
		if (ll + (size_t)k + 1 + rl + 1 > sizeof(line)) {
			cl_line(line, ll, rel, rl);
			ll = 0;
			k = snprintf(r, sizeof(r), "%zu+%zu", i, j - i);
		}
		memcpy(line + ll, r, (size_t)k);
		ll += (size_t)k;
		file_pages += j - i;
		i = j;
	}
	free(vec);
	if (ll)
		cl_line(line, ll, rel, rl);
	if (file_pages) {
		cl.n.files++;
		cl.n.pages += file_pages;
	}
	return 0;
}

int warm_cachelist(warm_emit_fn emit, void *arg, struct warm_counts *counts)
{
	char *buf = malloc(WARM_CHUNK_MAX + 1);
	if (!buf)
		return -1;
	memset(&cl, 0, sizeof(cl));
	cl.buf = buf;
	cl.emit = emit;
	cl.arg = arg;
	/* FTW_PHYS: symlinks are not followed (they could lead out of /data). Mounts under
	 * /data are walked: every data disk mounted there is part of the cache to keep. */
	int rc = nftw(WARM_ROOT, cl_file, 32, FTW_PHYS);
	cl_flush(1);
	*counts = cl.n;
	free(buf);
	return rc < 0 ? -1 : 0;
}

/* A path from the host: relative, no "." or ".." segment, no empty segment. */
int warm_path_ok(const char *p)
{
	return *p && *p != '/' && path_segments_ok(p);
}

/* Parses "S+N,S+N,..." up to the first space; returns the number of ranges stored, or
 * -1 when the text is malformed. */
int warm_parse_ranges(const char *s, const char **rest, uint64_t (*out)[2], size_t cap)
{
	size_t n = 0;
	for (;;) {
		char *e;
		errno = 0;
		unsigned long long start = strtoull(s, &e, 10);
		if (e == s || *e != '+' || errno)
			return -1;
		s = e + 1;
		unsigned long long count = strtoull(s, &e, 10);
		if (e == s || errno || count == 0 || start + count < start)
			return -1;
		if (n == cap)
			return -1;
		out[n][0] = start;
		out[n][1] = count;
		n++;
		s = e;
		if (*s == ',') {
			s++;
			continue;
		}
		if (*s != ' ')
			return -1;
		*rest = s + 1;
		return (int)n;
	}
}

/* Reads pages [first, first + count) of `fd` once, so that they enter the page cache;
 * returns how many it read. (readahead(2) queues the reads without the copy to user
 * space, but measured no faster under emulation, where the guest kernel's work per
 * page dominates, and much slower beside a busy service.) */
static uint64_t read_range(int fd, uint64_t first, uint64_t count, char *buf)
{
	uint64_t off = first * PAGE, end = (first + count) * PAGE, pages = 0;
	while (off < end) {
		size_t want = end - off < READ_CHUNK ? (size_t)(end - off) : READ_CHUNK;
		ssize_t got = pread(fd, buf, want, (off_t)off);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			break; /* the file is shorter now: the rest is gone */
		pages += ((uint64_t)got + PAGE - 1) / PAGE;
		off += (uint64_t)got;
	}
	return pages;
}

/* Reads every listed page of the files under `root_path` into the page cache; the
 * list is in `list_path`. Ranges past a file's end now are left out. */
void warm_prefetch_at(const char *root_path, const char *list_path, struct warm_counts *n)
{
	memset(n, 0, sizeof(*n));
	FILE *f = fopen(list_path, "re");
	if (!f)
		return;
	static uint64_t ranges[WARM_CHUNK_MAX / 4][2];
	char *buf = malloc(READ_CHUNK);
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	int root = open(root_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	while (buf && root >= 0 && (len = getline(&line, &cap, f)) > 0) {
		if (line[len - 1] == '\n')
			line[--len] = '\0';
		const char *path;
		int k = warm_parse_ranges(line, &path, ranges, sizeof(ranges) / sizeof(ranges[0]));
		if (k < 0 || !warm_path_ok(path)) {
			n->skipped++;
			continue;
		}
		int fd = openat(root, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		struct stat st;
		if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
			n->missing++;
			if (fd >= 0)
				close(fd);
			continue;
		}
		n->files++;
		uint64_t pages = ((uint64_t)st.st_size + PAGE - 1) / PAGE;
		for (int r = 0; r < k; r++) {
			uint64_t first = ranges[r][0], end = first + ranges[r][1];
			if (end > pages)
				end = pages; /* the file is shorter now: the rest is gone */
			if (first < end)
				n->pages += read_range(fd, first, end - first, buf);
		}
		close(fd);
	}
	n->bytes = n->pages * PAGE;
	if (root >= 0)
		close(root);
	free(line);
	free(buf);
	fclose(f);
}

void warm_prefetch(const char *list_path, struct warm_counts *n)
{
	warm_prefetch_at(WARM_ROOT, list_path, n);
}
