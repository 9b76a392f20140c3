/* The `io` workload's file-set mode (rebound.io_files=N): the microbenchmarks of the
 * exclusive hypervisor cache paper (ATC'07, sections 6.1-6.2) over N files
 * io_dir/f00000... Each request reads a whole file or, with probability io_write_ratio,
 * overwrites it with its next version, in buffered 64 KiB requests: the guest's page
 * cache and the host's cache under it both matter. Which file a request touches and
 * whether it writes depend only on (io_seed, the request's index) and the parameters,
 * so a run at another guest memory size replays the same sequence (miss-ratio curves
 * are validated that way). With io_churn, that share of the writes churn the set
 * instead (the host cache's correctness test): one 64 KiB chunk overwritten, buffered
 * or with O_DIRECT (the kernel drops the chunk's cached pages and the disk changes under
 * them, as a database's writes do), the file truncated at a chunk and written back from
 * there, or the file deleted and created anew, so blocks are freed, taken by other files
 * and rewritten while pages are evicted.
 * Every 1 KiB block carries a signature of (file, block, version) and every read checks
 * each block against the version last written to its chunk, which catches stale,
 * misplaced and garbage data alike. */
#include "agent.h"
#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FILES_CHUNK (64 * 1024) /* bytes per read or write request, as in the paper */
#define WORDS_PER_BLOCK (FILES_BLOCK / 8)
#define EARLY_REPORT 200 /* requests before the first, early report */

void files_fill_block(uint64_t *w, uint64_t file, uint64_t block, uint64_t version)
{
	uint64_t base = (file << 32) + block * WORDS_PER_BLOCK;
	w[0] = FILES_MAGIC << 48 | version;
	for (uint64_t j = 1; j < WORDS_PER_BLOCK; j++)
		w[j] = splitmix64(base + j) ^ version;
}

enum files_check files_check_block(const uint64_t *w, uint64_t file, uint64_t block, uint64_t version,
				   uint64_t *found)
{
	uint64_t base = (file << 32) + block * WORDS_PER_BLOCK;
	*found = w[0];
	if (w[0] >> 48 != FILES_MAGIC)
		return FC_GARBAGE;
	if ((w[0] & FILES_VERSION_MASK) != version)
		return FC_STALE;
	for (uint64_t j = 1; j < WORDS_PER_BLOCK; j++)
		if (w[j] != (splitmix64(base + j) ^ version))
			return FC_MISPLACED;
	return FC_OK;
}

const char *files_check_name(enum files_check c)
{
	switch (c) {
	case FC_OK: return "ok";
	case FC_STALE: return "stale version";
	case FC_MISPLACED: return "another block's content";
	case FC_GARBAGE: return "no signature";
	}
	return "?";
}

uint64_t files_draw(uint64_t seed, uint64_t n, unsigned k)
{
	return splitmix64(splitmix64(seed) ^ (n * 4 + k));
}

/* [0, 1) from the top 53 bits. */
static double unit(uint64_t r)
{
	return (double)(r >> 11) * 0x1p-53;
}

int files_sampler_init(struct files_sampler *s, const struct config *cfg)
{
	uint32_t n = cfg->io_files;
	memset(s, 0, sizeof(*s));
	s->pattern = cfg->io_pattern;
	s->n = n;
	s->seed = cfg->io_seed;
	s->write_ratio = cfg->io_write_ratio;
	s->churn = cfg->io_churn;
	if (n == 0)
		return -1;
	/* One seeded permutation: zipf's ranks land on files spread over the set (not the
	 * first ones, which share directory blocks and disk neighbourhood); class takes its
	 * hot files from its start. */
	s->perm = malloc(sizeof(*s->perm) * n);
	if (!s->perm)
		return -1;
	for (uint32_t i = 0; i < n; i++)
		s->perm[i] = i;
	for (uint32_t i = n - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(files_draw(s->seed, i, 3) % ((uint64_t)i + 1));
		uint32_t t = s->perm[i];
		s->perm[i] = s->perm[j];
		s->perm[j] = t;
	}
	if (s->pattern == FP_ZIPF) {
		s->cdf = malloc(sizeof(*s->cdf) * n);
		if (!s->cdf) {
			files_sampler_free(s);
			return -1;
		}
		double sum = 0;
		for (uint32_t i = 0; i < n; i++)
			s->cdf[i] = sum += pow((double)i + 1, -cfg->io_zipf);
		for (uint32_t i = 0; i < n; i++)
			s->cdf[i] /= sum;
		s->cdf[n - 1] = 1.0; /* rounding must not leave a u above the last step */
	}
	uint64_t hot = ((uint64_t)n * cfg->io_class_p + 50) / 100;
	s->hot = (uint32_t)(hot < 1 ? 1 : hot >= n && n > 1 ? n - 1 : hot);
	s->hot_share = cfg->io_class_q / 100.0;
	return 0;
}

void files_sampler_free(struct files_sampler *s)
{
	free(s->perm);
	free(s->cdf);
	s->perm = NULL;
	s->cdf = NULL;
}

/* The first rank whose cumulative probability exceeds u. */
static uint32_t zipf_rank(const struct files_sampler *s, double u)
{
	uint32_t lo = 0, hi = s->n - 1;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (s->cdf[mid] > u)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

uint32_t files_pick(const struct files_sampler *s, uint64_t n, int *write)
{
	uint64_t r = files_draw(s->seed, n, 0);
	uint32_t f;
	switch (s->pattern) {
	case FP_SEQ:
		f = (uint32_t)(n % s->n);
		break;
	case FP_RANDOM:
		f = (uint32_t)(r % s->n);
		break;
	case FP_CLASS:
		if (s->hot >= s->n || unit(files_draw(s->seed, n, 2)) < s->hot_share)
			f = s->perm[r % s->hot];
		else
			f = s->perm[s->hot + r % (s->n - s->hot)];
		break;
	default:
		f = s->perm[zipf_rank(s, unit(r))];
		break;
	}
	*write = unit(files_draw(s->seed, n, 1)) < s->write_ratio;
	return f;
}

/* Churn draws come from a second stream, so that io_churn leaves which files are read
 * and written as they are without it. */
#define CHURN_SEED 0x6368726e /* "chrn" */

enum files_op files_write_op(const struct files_sampler *s, uint64_t n)
{
	if (unit(files_draw(s->seed ^ CHURN_SEED, n, 0)) >= s->churn)
		return FO_REWRITE;
	return (enum files_op)(FO_CHUNK + files_draw(s->seed ^ CHURN_SEED, n, 1) % 4);
}

/* ---- the workload ---- */

struct files_run {
	struct wl_ctx *ctx;
	const struct config *c;
	uint64_t *version; /* per file and 64 KiB chunk: what its blocks must hold */
	uint64_t *latest; /* per file: its last version written (a chunk's is at most that) */
	uint64_t chunks; /* per file */
	uint64_t *buf; /* one request */
	unsigned char *vec; /* mincore */
	uint64_t requests, reads, writes, bytes_read, bytes_written, errors;
	uint64_t chunk_writes, direct_writes, truncates, deletes;
	char first_error[240];
	uint64_t t0_ns;
};

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

static void file_path(const struct config *c, uint32_t k, char *out, size_t cap)
{
	snprintf(out, cap, "%s/f%05u", c->io_dir, k);
}

/* Counts an error; the first is kept for the reports and logged. */
static void fail(struct files_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct files_run *r, const char *fmt, ...)
{
	if (r->errors++ == 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(r->first_error, sizeof(r->first_error), fmt, ap);
		va_end(ap);
		logmsg("files: first error: %s", r->first_error);
	}
}

/* pread or pwrite of exactly len bytes; returns len, or what was done before an error
 * (errno set) or the end of the file (errno 0). */
static size_t io_all(int fd, void *buf, size_t len, uint64_t off, int write)
{
	size_t done = 0;
	while (done < len) {
		ssize_t n = write ? pwrite(fd, (char *)buf + done, len - done, (off_t)(off + done))
				  : pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n == 0)
				errno = 0;
			break;
		}
		done += (size_t)n;
	}
	return done;
}

/* Writes chunks [from, to) of file k at version v (creating or truncating it first when
 * O_CREAT | O_TRUNC is in flags; O_DIRECT writes past the page cache) and records them;
 * returns the bytes written. */
static uint64_t write_chunks(struct files_run *r, uint32_t k, uint64_t v, uint64_t from, uint64_t to,
			     int flags)
{
	const uint64_t size = r->c->io_file_size;
	char path[96];
	uint64_t off = from * FILES_CHUNK, end = to * FILES_CHUNK < size ? to * FILES_CHUNK : size;
	file_path(r->c, k, path, sizeof(path));
	int fd = open(path, O_WRONLY | O_CLOEXEC | flags, 0644);
	if (fd < 0) {
		fail(r, "f%05u: cannot open for writing: %s", k, strerror(errno));
		return 0;
	}
	for (; off < end; off += FILES_CHUNK) {
		size_t len = end - off < FILES_CHUNK ? (size_t)(end - off) : FILES_CHUNK;
		for (size_t b = 0; b < len / FILES_BLOCK; b++)
			files_fill_block(r->buf + b * WORDS_PER_BLOCK, k, off / FILES_BLOCK + b, v);
		/* Expected from now on even if the write fails halfway: the reads that follow
		 * then count what the file really holds. */
		r->version[k * r->chunks + off / FILES_CHUNK] = v;
		if (io_all(fd, r->buf, len, off, 1) != len) {
			fail(r, "f%05u: write at %llu: %s", k, (unsigned long long)off,
			     errno ? strerror(errno) : "short");
			break;
		}
	}
	r->latest[k] = v;
	/* Durable before the version counts as written: a crash or a reboot must not leave
	 * the host's disk older than what the next boot expects. */
	if (off >= end && fdatasync(fd) < 0)
		fail(r, "f%05u: fdatasync: %s", k, strerror(errno));
	close(fd);
	return (off < end ? off : end) - from * FILES_CHUNK;
}

/* Writes file k whole at version v (creating or truncating it first when create). */
static uint64_t write_file(struct files_run *r, uint32_t k, uint64_t v, int create)
{
	return write_chunks(r, k, v, 0, r->chunks, create ? O_CREAT | O_TRUNC : 0);
}

/* One write request of kind op to file k, at the file's next version: the whole file,
 * one chunk (buffered or direct; r->buf is page-aligned and a chunk long, as O_DIRECT
 * wants), the file cut at a chunk boundary and written back from there, or the file
 * deleted and written anew (its blocks freed for other files to take, and others' taken). */
static uint64_t write_op(struct files_run *r, const struct files_sampler *s, uint64_t n, uint32_t k,
			 enum files_op op)
{
	uint64_t v = (r->latest[k] + 1) & FILES_VERSION_MASK;
	uint64_t at = files_draw(s->seed ^ CHURN_SEED, n, 2) % r->chunks;
	char path[96];
	file_path(r->c, k, path, sizeof(path));
	switch (op) {
	case FO_CHUNK:
		r->chunk_writes++;
		return write_chunks(r, k, v, at, at + 1, 0);
	case FO_DIRECT:
		/* O_DIRECT wants whole blocks: a short last chunk of an odd-sized file is
		 * written buffered. */
		if ((at + 1) * FILES_CHUNK > r->c->io_file_size && r->c->io_file_size % 4096) {
			r->chunk_writes++;
			return write_chunks(r, k, v, at, at + 1, 0);
		}
		r->direct_writes++;
		return write_chunks(r, k, v, at, at + 1, O_DIRECT);
	case FO_TRUNCATE:
		r->truncates++;
		if (truncate(path, (off_t)(at * FILES_CHUNK)) < 0)
			fail(r, "f%05u: truncate to %llu: %s", k, (unsigned long long)(at * FILES_CHUNK),
			     strerror(errno));
		return write_chunks(r, k, v, at, r->chunks, 0);
	case FO_DELETE:
		r->deletes++;
		if (unlink(path) < 0)
			fail(r, "f%05u: unlink: %s", k, strerror(errno));
		return write_file(r, k, v, 1);
	default:
		return write_file(r, k, v, 0);
	}
}

/* Reads file k whole and checks every block against its expected version. */
static uint64_t read_file(struct files_run *r, uint32_t k)
{
	const uint64_t size = r->c->io_file_size;
	char path[96];
	uint64_t off = 0;
	file_path(r->c, k, path, sizeof(path));
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fail(r, "f%05u: cannot open: %s", k, strerror(errno));
		return 0;
	}
	for (; off < size; off += FILES_CHUNK) {
		size_t len = size - off < FILES_CHUNK ? (size_t)(size - off) : FILES_CHUNK;
		if (io_all(fd, r->buf, len, off, 0) != len) {
			fail(r, "f%05u: read at %llu: %s", k, (unsigned long long)off,
			     errno ? strerror(errno) : "the file is shorter");
			break;
		}
		const uint64_t v = r->version[k * r->chunks + off / FILES_CHUNK];
		for (size_t b = 0; b < len / FILES_BLOCK; b++) {
			uint64_t found, blk = off / FILES_BLOCK + b;
			enum files_check ck = files_check_block(r->buf + b * WORDS_PER_BLOCK, k, blk, v, &found);
			if (ck != FC_OK)
				fail(r, "f%05u offset %llu: expected version word %016llx, found %016llx (%s)", k,
				     (unsigned long long)(blk * FILES_BLOCK),
				     (unsigned long long)(FILES_MAGIC << 48 | v), (unsigned long long)found,
				     files_check_name(ck));
		}
	}
	close(fd);
	return off < size ? off : size;
}

/* The version a file left by an earlier run holds: its first and last blocks must both
 * be this file's at one version. Returns 0, or -1 when the file must be rewritten. */
static int kept_version(struct files_run *r, uint32_t k, uint64_t *v)
{
	const uint64_t size = r->c->io_file_size, last = size / FILES_BLOCK - 1;
	uint64_t first_blk[WORDS_PER_BLOCK], last_blk[WORDS_PER_BLOCK], found;
	char path[96];
	file_path(r->c, k, path, sizeof(path));
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int ok = io_all(fd, first_blk, FILES_BLOCK, 0, 0) == FILES_BLOCK &&
		 io_all(fd, last_blk, FILES_BLOCK, last * FILES_BLOCK, 0) == FILES_BLOCK;
	close(fd);
	uint64_t ver = first_blk[0] & FILES_VERSION_MASK;
	if (!ok || files_check_block(first_blk, k, 0, ver, &found) != FC_OK ||
	    files_check_block(last_blk, k, last, ver, &found) != FC_OK)
		return -1;
	*v = ver;
	return 0;
}

static int mkdir_p(const char *dir)
{
	char tmp[sizeof(((struct config *)0)->io_dir)];
	snprintf(tmp, sizeof(tmp), "%s", dir);
	for (char *p = tmp + 1;; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		char c = *p;
		*p = '\0';
		if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
			return -1;
		if (c == '\0')
			return 0;
		*p = c;
	}
}

/* Page-cache KiB of the file set (mincore over read-only mappings: nothing is read). */
static uint64_t footprint_kib(struct files_run *r)
{
	const uint64_t size = r->c->io_file_size, page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t pages = 0;
	char path[96];
	for (uint32_t k = 0; k < r->c->io_files; k++) {
		file_path(r->c, k, path, sizeof(path));
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
		close(fd);
		if (m == MAP_FAILED)
			continue;
		if (mincore(m, size, r->vec) == 0)
			for (uint64_t i = 0; i < (size + page - 1) / page; i++)
				pages += r->vec[i] & 1;
		munmap(m, size);
	}
	return pages * (page / 1024);
}

static void report(struct files_run *r, uint64_t round)
{
	char line[1024], num[64], mem[4096];
	struct jbuf b;
	double s = (double)(now_ns() - r->t0_ns) / 1e9;
	uint64_t cached = 0, total = 0;
	uint64_t fp = footprint_kib(r);
	if (read_small_file("/proc/meminfo", mem, sizeof(mem)) > 0) {
		parse_meminfo(mem, "Cached", &cached);
		parse_meminfo(mem, "MemTotal", &total);
	}
	jb_init(&b, line, sizeof(line));
	jb_raw(&b, "{\"type\":\"files\",\"round\":");
	jb_u64(&b, round);
	jb_raw(&b, ",\"pattern\":");
	jb_str(&b, files_pattern_name(r->c->io_pattern));
	jb_raw(&b, ",\"requests\":");
	jb_u64(&b, r->requests);
	jb_raw(&b, ",\"reads\":");
	jb_u64(&b, r->reads);
	jb_raw(&b, ",\"writes\":");
	jb_u64(&b, r->writes);
	jb_raw(&b, ",\"chunk_writes\":");
	jb_u64(&b, r->chunk_writes);
	jb_raw(&b, ",\"direct_writes\":");
	jb_u64(&b, r->direct_writes);
	jb_raw(&b, ",\"truncates\":");
	jb_u64(&b, r->truncates);
	jb_raw(&b, ",\"deletes\":");
	jb_u64(&b, r->deletes);
	jb_raw(&b, ",\"bytes_read\":");
	jb_u64(&b, r->bytes_read);
	jb_raw(&b, ",\"bytes_written\":");
	jb_u64(&b, r->bytes_written);
	snprintf(num, sizeof(num), ",\"seconds\":%.6f", s);
	jb_raw(&b, num);
	jb_raw(&b, ",\"errors\":");
	jb_u64(&b, r->errors);
	jb_raw(&b, ",\"first_error\":");
	if (r->errors)
		jb_str(&b, r->first_error);
	else
		jb_raw(&b, "null");
	jb_raw(&b, ",\"footprint_kib\":");
	jb_u64(&b, fp);
	jb_raw(&b, ",\"cached_kib\":");
	jb_u64(&b, cached);
	jb_raw(&b, ",\"mem_total_kib\":");
	jb_u64(&b, total);
	if (jb_finish(&b) > 0)
		wl_send(r->ctx, line);
}

static int setup_error(struct wl_ctx *ctx, const char *what, const char *why)
{
	char line[300];
	struct jbuf b;
	char msg[200];
	snprintf(msg, sizeof(msg), "io files: %s: %s", what, why);
	jb_init(&b, line, sizeof(line));
	jb_raw(&b, "{\"type\":\"error\",\"message\":");
	jb_str(&b, msg);
	if (jb_finish(&b) > 0)
		wl_send(ctx, line);
	logmsg("%s", msg);
	return 1;
}

/* Creates what is missing or not as expected at version 0 and keeps the rest at the
 * version it holds. Returns 0, or -1 when a file cannot be written. */
static int prepare(struct files_run *r)
{
	const struct config *c = r->c;
	uint64_t created = 0, step = c->io_files / 10 ? c->io_files / 10 : 1;
	char path[96];
	for (uint32_t k = 0; k < c->io_files; k++) {
		struct stat st;
		uint64_t v;
		file_path(c, k, path, sizeof(path));
		if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == c->io_file_size &&
		    kept_version(r, k, &v) == 0) {
			for (uint64_t i = 0; i < r->chunks; i++)
				r->version[k * r->chunks + i] = v;
			r->latest[k] = v;
			continue;
		}
		if (write_file(r, k, 0, 1) != c->io_file_size)
			return -1;
		if (++created % step == 0)
			logmsg("files: created %llu files so far (at f%05u of %u)", (unsigned long long)created, k,
			       c->io_files);
	}
	logmsg("files: %u files of %llu KiB in %s: %llu created, %llu kept; pattern %s", c->io_files,
	       (unsigned long long)(c->io_file_size >> 10), c->io_dir, (unsigned long long)created,
	       (unsigned long long)(c->io_files - created), files_pattern_name(c->io_pattern));
	return 0;
}

int wl_files(struct wl_ctx *ctx)
{
	const struct config *c = ctx->cfg;
	struct files_run r;
	struct files_sampler s;
	void *buf = NULL;
	memset(&r, 0, sizeof(r));
	r.ctx = ctx;
	r.c = c;
	r.chunks = (c->io_file_size + FILES_CHUNK - 1) / FILES_CHUNK;
	r.version = calloc((size_t)c->io_files * r.chunks, sizeof(*r.version));
	r.latest = calloc(c->io_files, sizeof(*r.latest));
	r.vec = malloc(c->io_file_size / 4096 + 1);
	if (!r.version || !r.latest || !r.vec || posix_memalign(&buf, 4096, FILES_CHUNK) != 0 ||
	    files_sampler_init(&s, c) < 0)
		return setup_error(ctx, "setup", "out of memory");
	r.buf = buf;
	if (mkdir_p(c->io_dir) < 0)
		return setup_error(ctx, c->io_dir, strerror(errno));
	if (prepare(&r) < 0)
		return setup_error(ctx, "cannot write the file set", r.first_error);
	wl_ready(ctx);
	if (c->io_delay_s)
		sleep(c->io_delay_s);
	r.t0_ns = now_ns();
	uint64_t n = 0;
	for (uint64_t round = 1; c->io_rounds == 0 || round <= c->io_rounds; round++) {
		for (unsigned i = 0; i < c->io_requests; i++, n++) {
			int write;
			uint32_t k = files_pick(&s, n, &write);
			if (write) {
				r.bytes_written += write_op(&r, &s, n, k, files_write_op(&s, n));
				r.writes++;
			} else {
				r.bytes_read += read_file(&r, k);
				r.reads++;
			}
			r.requests++;
			if (n + 1 == EARLY_REPORT && c->io_requests > EARLY_REPORT)
				report(&r, round);
		}
		report(&r, round);
	}
	for (;;)
		pause();
}
