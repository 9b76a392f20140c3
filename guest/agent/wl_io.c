/* `io` workload (its file-set mode, rebound.io_files, is wl_files.c): sequential and random reads and writes over a file on the data disk
 * (/data/io.bin) or a whole block device (rebound.io_target=/dev/vdb), buffered or O_DIRECT, in phases (rebound.io=seqwrite,seqread,...);
 * after each phase it reports {"type":"io",...} with throughput and latency
 * percentiles. Every block written holds a pattern the host can recompute: the 64-bit
 * word j of the block at byte offset o is splitmix64(o / 8 + j) ^ version, where
 * version counts the write phases so far (0 for the first fill). */
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_SAMPLES (1 << 20)

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

void io_fill(void *buf, size_t len, uint64_t offset, uint64_t version)
{
	uint64_t *w = buf;
	for (size_t j = 0; j < len / 8; j++)
		w[j] = splitmix64(offset / 8 + j) ^ version;
}

uint32_t io_percentile(uint32_t *v, size_t n, unsigned pct)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), cmp_u32);
	size_t i = (n * pct + 99) / 100;
	return v[i == 0 ? 0 : i - 1];
}

struct phase {
	const char *name;
	int write, random;
};

static int phase_of(const char *name, struct phase *p)
{
	static const struct phase all[] = {
		{"seqread", 0, 0}, {"seqwrite", 1, 0}, {"randread", 0, 1}, {"randwrite", 1, 1}};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		if (strcmp(all[i].name, name) == 0) {
			*p = all[i];
			return 0;
		}
	return -1;
}

/* One phase: seq phases cover the file once (at least), random ones run for
 * io_seconds. Returns 0, or -1 after reporting an error. */
static int run_phase(struct wl_ctx *ctx, int fd, const struct phase *p, void *buf, uint32_t *lat,
		     uint64_t round, uint64_t *version)
{
	const struct config *c = ctx->cfg;
	uint64_t bs = c->io_bs, blocks = c->io_size / bs, seed = round * 7919 + 1;
	uint64_t ops = 0, t0 = now_ns(), until = t0 + (uint64_t)c->io_seconds * 1000000000ULL;
	size_t n = 0;
	char line[400];
	if (p->write)
		(*version)++;
	for (;;) {
		uint64_t blk = p->random ? splitmix64(seed + ops) % blocks : ops % blocks;
		uint64_t off = blk * bs;
		if (p->write)
			io_fill(buf, bs, off, *version);
		uint64_t a = now_ns();
		ssize_t r = p->write ? pwrite(fd, buf, bs, (off_t)off) : pread(fd, buf, bs, (off_t)off);
		uint64_t b = now_ns();
		if (r != (ssize_t)bs) {
			snprintf(line, sizeof(line), "{\"type\":\"error\",\"message\":\"io %s at %llu: %s\"}\n", p->name,
				 (unsigned long long)off, r < 0 ? strerror(errno) : "short");
			wl_send(ctx, line);
			return -1;
		}
		uint64_t us = (b - a) / 1000;
		if (n < MAX_SAMPLES)
			lat[n++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
		ops++;
		if (p->random ? b >= until : ops >= blocks)
			break;
	}
	if (p->write && !c->io_direct)
		fdatasync(fd);
	double s = (double)(now_ns() - t0) / 1e9;
	uint32_t p50 = io_percentile(lat, n, 50), p99 = io_percentile(lat, n, 99);
	snprintf(line, sizeof(line),
		 "{\"type\":\"io\",\"phase\":\"%s\",\"round\":%llu,\"bs\":%llu,\"direct\":%s,\"ops\":%llu,"
		 "\"bytes\":%llu,\"seconds\":%.6f,\"p50_us\":%u,\"p99_us\":%u}\n",
		 p->name, (unsigned long long)round, (unsigned long long)bs, c->io_direct ? "true" : "false",
		 (unsigned long long)ops, (unsigned long long)(ops * bs), s, p50, p99);
	wl_send(ctx, line);
	return 0;
}

int wl_io(struct wl_ctx *ctx)
{
	const struct config *c = ctx->cfg;
	if (c->io_files)
		return wl_files(ctx);
	char line[300];
	int flags = O_RDWR | O_CREAT | O_CLOEXEC | (c->io_direct ? O_DIRECT : 0);
	const char *target = c->io_target;
	int fd = open(target, flags, 0644);
	void *buf = NULL;
	uint32_t *lat = malloc(MAX_SAMPLES * sizeof(uint32_t));
	if (fd < 0 || !lat || posix_memalign(&buf, 4096, c->io_bs) != 0) {
		snprintf(line, sizeof(line), "{\"type\":\"error\",\"message\":\"io: cannot open %s: %s\"}\n", target,
			 strerror(errno));
		wl_send(ctx, line);
		return 1;
	}
	/* The target is written whole first, so reads read data, not holes; in 1 MiB
	 * writes whatever the phases' request size. */
	uint64_t version = 0;
	const uint64_t fill_bs = 1 << 20;
	void *fill = NULL;
	if (posix_memalign(&fill, 4096, fill_bs) != 0)
		return 1;
	/* io_keep: a target that is already long enough keeps its content (reads across a
	 * reboot read what the last boot left). */
	struct stat st;
	uint64_t have = 0;
	if (fstat(fd, &st) == 0)
		have = S_ISBLK(st.st_mode) ? UINT64_MAX : (uint64_t)st.st_size;
	uint64_t fill_to = c->io_keep && have >= c->io_size ? 0 : c->io_size;
	for (uint64_t off = 0; off < fill_to; off += fill_bs) {
		uint64_t n = c->io_size - off < fill_bs ? c->io_size - off : fill_bs;
		io_fill(fill, n, off, 0);
		if (pwrite(fd, fill, n, (off_t)off) != (ssize_t)n) {
			snprintf(line, sizeof(line), "{\"type\":\"error\",\"message\":\"io: cannot fill %s: %s\"}\n",
				 target, strerror(errno));
			wl_send(ctx, line);
			return 1;
		}
	}
	free(fill);
	fdatasync(fd);
	logmsg("io: %s %s, %llu MiB, bs %llu, %s", target, fill_to ? "filled" : "kept",
	       (unsigned long long)(c->io_size >> 20), (unsigned long long)c->io_bs, c->io_direct ? "O_DIRECT" : "buffered");
	wl_ready(ctx);
	if (c->io_delay_s)
		sleep(c->io_delay_s);
	for (uint64_t round = 1; c->io_rounds == 0 || round <= c->io_rounds; round++) {
		for (int i = 0; i < c->io_nphases; i++) {
			struct phase p;
			if (phase_of(c->io_phases[i], &p) < 0)
				continue;
			if (run_phase(ctx, fd, &p, buf, lat, round, &version) < 0)
				return 1;
		}
	}
	for (;;)
		pause();
}
