/* Unit tests of the io workload's file-set mode (wl_files.c): its configuration, the
 * samplers' distributions and determinism, the block signatures, and whole runs over a
 * temporary directory. */
#include "agent.h"
#include "test.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

void test_files_config(void)
{
	struct config cfg;
	char err[256];
	CHECK(parse_cmdline("rebound.workload=io", &cfg, err, sizeof(err)) == 0);
	CHECK(cfg.io_files == 0 && cfg.io_file_size == 1ULL << 20 && strcmp(cfg.io_dir, "/data/files") == 0);
	CHECK(cfg.io_pattern == FP_ZIPF && cfg.io_zipf == 1.0 && cfg.io_class_p == 10 && cfg.io_class_q == 90);
	CHECK(cfg.io_seed == 1 && cfg.io_write_ratio == 0 && cfg.io_requests == 2000);
	CHECK(parse_cmdline("rebound.io_files=500 rebound.io_file_size=4M rebound.io_dir=/data/set/a_1 "
			    "rebound.io_pattern=class rebound.io_zipf=0.8 rebound.io_class=20:80 "
			    "rebound.io_seed=18446744073709551615 rebound.io_write_ratio=0.5 rebound.io_requests=300",
			    &cfg, err, sizeof(err)) == 0);
	CHECK(cfg.io_files == 500 && cfg.io_file_size == 4ULL << 20 && strcmp(cfg.io_dir, "/data/set/a_1") == 0);
	CHECK(cfg.io_pattern == FP_CLASS && cfg.io_zipf == 0.8 && cfg.io_class_p == 20 && cfg.io_class_q == 80);
	CHECK(cfg.io_seed == UINT64_MAX && cfg.io_write_ratio == 0.5 && cfg.io_requests == 300);
	CHECK(parse_cmdline("rebound.io_pattern=seq rebound.io_write_ratio=1 rebound.io_zipf=0", &cfg, err,
			    sizeof(err)) == 0);
	CHECK(cfg.io_pattern == FP_SEQ && cfg.io_write_ratio == 1.0 && cfg.io_zipf == 0);
	/* Each bad value is reported, named, and replaced by the default. */
	static const char *bad[] = {
		"rebound.io_files=100001", "rebound.io_files=-1", "rebound.io_files=x",
		"rebound.io_file_size=1000", "rebound.io_file_size=6K", "rebound.io_file_size=2G",
		"rebound.io_dir=/etc", "rebound.io_dir=/data/../etc", "rebound.io_dir=/data/a//b",
		"rebound.io_dir=/data/a\"b", "rebound.io_dir=/data/", "rebound.io_dir=/data/a/", "rebound.io_pattern=zipfian",
		"rebound.io_zipf=-1", "rebound.io_zipf=1e3", "rebound.io_zipf=11", "rebound.io_zipf=nan",
		"rebound.io_zipf=1.2.3", "rebound.io_class=10", "rebound.io_class=0:90", "rebound.io_class=10:100",
		"rebound.io_class=10:90:5", "rebound.io_seed=18446744073709551616", "rebound.io_seed=0x10",
		"rebound.io_seed=", "rebound.io_write_ratio=1.5", "rebound.io_write_ratio=.", "rebound.io_requests=0",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char key[64];
		snprintf(key, sizeof(key), "%.*s", (int)(strchr(bad[i], '=') - bad[i]), bad[i]);
		int n = parse_cmdline(bad[i], &cfg, err, sizeof(err));
		if (n != 1 || !strstr(err, key))
			fprintf(stderr, "not refused: %s (%s)\n", bad[i], err);
		CHECK(n == 1 && strstr(err, key) != NULL);
		CHECK(cfg.io_files == 0 && cfg.io_file_size == 1ULL << 20 && strcmp(cfg.io_dir, "/data/files") == 0);
		CHECK(cfg.io_pattern == FP_ZIPF && cfg.io_zipf == 1.0 && cfg.io_class_p == 10 && cfg.io_class_q == 90);
		CHECK(cfg.io_seed == 1 && cfg.io_write_ratio == 0 && cfg.io_requests == 2000);
	}
}

static void files_cfg(struct config *cfg, int pattern, unsigned n, uint64_t seed, double wr)
{
	char err[256];
	parse_cmdline("", cfg, err, sizeof(err));
	cfg->io_files = n;
	cfg->io_pattern = pattern;
	cfg->io_seed = seed;
	cfg->io_write_ratio = wr;
}

void test_files_samplers(void)
{
	struct config cfg;
	struct files_sampler s, t;
	enum { N = 100, DRAWS = 200000 };
	static unsigned count[N];
	int w, writes = 0;
	/* zipf: rank 0 (a file the permutation chose) comes with probability 1/H(N, 1). */
	files_cfg(&cfg, FP_ZIPF, N, 1, 0.25);
	CHECK(files_sampler_init(&s, &cfg) == 0);
	int seen[N] = {0};
	for (unsigned i = 0; i < N; i++)
		seen[s.perm[i]]++;
	for (unsigned i = 0; i < N; i++)
		CHECK(seen[i] == 1);
	CHECK(s.perm[0] != 0 || s.perm[1] != 1); /* shuffled */
	memset(count, 0, sizeof(count));
	for (uint64_t n = 0; n < DRAWS; n++) {
		count[files_pick(&s, n, &w)]++;
		writes += w;
	}
	double h = 0;
	for (unsigned i = 1; i <= N; i++)
		h += 1.0 / i;
	double p0 = (double)count[s.perm[0]] / DRAWS, p1 = (double)count[s.perm[1]] / DRAWS;
	CHECK(p0 > 1 / h - 0.005 && p0 < 1 / h + 0.005);
	CHECK(p1 > 0.5 / h - 0.005 && p1 < 0.5 / h + 0.005);
	CHECK(count[s.perm[N - 1]] > 0 && count[s.perm[N - 1]] < count[s.perm[N / 2]]);
	CHECK(writes > DRAWS / 4 - 2000 && writes < DRAWS / 4 + 2000);
	/* The same seed gives the same sequence, another seed another. */
	CHECK(files_sampler_init(&t, &cfg) == 0);
	int same = 1;
	for (uint64_t n = 0; n < 1000; n++) {
		int w1, w2;
		same &= files_pick(&s, n, &w1) == files_pick(&t, n, &w2) && w1 == w2;
	}
	CHECK(same);
	files_sampler_free(&t);
	cfg.io_seed = 2;
	CHECK(files_sampler_init(&t, &cfg) == 0);
	int diff = 0;
	for (uint64_t n = 0; n < 1000; n++) {
		int w1, w2;
		diff += files_pick(&s, n, &w1) != files_pick(&t, n, &w2);
	}
	CHECK(diff > 500);
	CHECK(files_draw(1, 5, 0) == splitmix64(splitmix64(1) ^ 20));
	files_sampler_free(&t);
	files_sampler_free(&s);
	/* class 10:90: the 10 hot files get 90% of the requests, uniform within each class. */
	files_cfg(&cfg, FP_CLASS, N, 7, 0);
	CHECK(files_sampler_init(&s, &cfg) == 0 && s.hot == 10);
	memset(count, 0, sizeof(count));
	writes = 0;
	for (uint64_t n = 0; n < DRAWS; n++) {
		count[files_pick(&s, n, &w)]++;
		writes += w;
	}
	unsigned hot = 0, hmin = DRAWS, hmax = 0, cmin = DRAWS, cmax = 0;
	for (unsigned i = 0; i < N; i++) {
		unsigned c = count[s.perm[i]];
		if (i < 10) {
			hot += c;
			hmin = c < hmin ? c : hmin;
			hmax = c > hmax ? c : hmax;
		} else {
			cmin = c < cmin ? c : cmin;
			cmax = c > cmax ? c : cmax;
		}
	}
	CHECK(hot > DRAWS * 0.89 && hot < DRAWS * 0.91 && writes == 0);
	CHECK(hmin > DRAWS * 0.085 && hmax < DRAWS * 0.095); /* 9% each */
	CHECK(cmin > DRAWS * 0.0007 && cmax < DRAWS * 0.0016); /* 0.111% each */
	files_sampler_free(&s);
	/* seq: request n reads file n mod N, round after round. */
	files_cfg(&cfg, FP_SEQ, 7, 3, 0);
	CHECK(files_sampler_init(&s, &cfg) == 0);
	int order = 1;
	for (uint64_t n = 0; n < 30; n++)
		order &= files_pick(&s, n, &w) == n % 7 && !w;
	CHECK(order);
	files_sampler_free(&s);
	/* random: uniform. */
	files_cfg(&cfg, FP_RANDOM, N, 3, 1);
	CHECK(files_sampler_init(&s, &cfg) == 0);
	memset(count, 0, sizeof(count));
	writes = 0;
	for (uint64_t n = 0; n < DRAWS; n++) {
		count[files_pick(&s, n, &w)]++;
		writes += w;
	}
	unsigned lo = DRAWS, hi = 0;
	for (unsigned i = 0; i < N; i++) {
		lo = count[i] < lo ? count[i] : lo;
		hi = count[i] > hi ? count[i] : hi;
	}
	CHECK(lo > DRAWS / N * 0.9 && hi < DRAWS / N * 1.1 && writes == DRAWS);
	files_sampler_free(&s);
}

void test_files_signature(void)
{
	uint64_t b[128], found;
	files_fill_block(b, 17, 5, 3);
	CHECK(b[0] == 0x5242000000000003ULL && b[1] == (splitmix64((17ULL << 32) + 5 * 128 + 1) ^ 3));
	CHECK(b[127] == (splitmix64((17ULL << 32) + 5 * 128 + 127) ^ 3));
	CHECK(files_check_block(b, 17, 5, 3, &found) == FC_OK && found == b[0]);
	/* Stale: a whole, valid older version. */
	files_fill_block(b, 17, 5, 2);
	CHECK(files_check_block(b, 17, 5, 3, &found) == FC_STALE && found == 0x5242000000000002ULL);
	/* Another file's or another block's content at the right version. */
	files_fill_block(b, 18, 5, 3);
	CHECK(files_check_block(b, 17, 5, 3, &found) == FC_MISPLACED);
	files_fill_block(b, 17, 6, 3);
	CHECK(files_check_block(b, 17, 5, 3, &found) == FC_MISPLACED);
	files_fill_block(b, 17, 5, 3);
	b[64] ^= 1;
	CHECK(files_check_block(b, 17, 5, 3, &found) == FC_MISPLACED);
	/* Garbage and zeroes carry no signature. */
	for (int j = 0; j < 128; j++)
		b[j] = splitmix64((uint64_t)j);
	CHECK(files_check_block(b, 17, 5, 3, &found) == FC_GARBAGE);
	memset(b, 0, sizeof(b));
	CHECK(files_check_block(b, 17, 5, 0, &found) == FC_GARBAGE && found == 0);
}

/* Runs the file-set workload in a child over a temporary directory. */
static void files_start(struct node *nd, const struct config *cfg)
{
	int fds[2];
	CHECK(pipe2(fds, O_CLOEXEC) == 0);
	nd->pid = fork();
	if (nd->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(fds[0]);
		fcntl(fds[1], F_SETFL, O_NONBLOCK);
		struct wl_ctx ctx = { cfg, fds[1] };
		_exit(wl_files(&ctx));
	}
	close(fds[1]);
	nd->fd = fds[0];
	nd->len = 0;
}

/* Removes the n files of cfg's set, its directory and dir. */
static void remove_set(const struct config *cfg, uint32_t n, const char *dir)
{
	char path[128];
	for (uint32_t k = 0; k < n; k++) {
		snprintf(path, sizeof(path), "%s/f%05u", cfg->io_dir, k);
		unlink(path);
	}
	rmdir(cfg->io_dir);
	rmdir(dir);
}

void test_files_run(void)
{
	char dir[] = "/tmp/rebound-files-XXXXXX", line[1024], path[128];
	struct config cfg;
	struct node nd;
	CHECK(mkdtemp(dir) != NULL);
	files_cfg(&cfg, FP_ZIPF, 8, 1, 0.3);
	snprintf(cfg.io_dir, sizeof(cfg.io_dir), "%s/set", dir);
	cfg.io_file_size = 16384;
	cfg.io_requests = 60;
	cfg.io_rounds = 2;
	/* A wrong-size file and one of another file's content are rewritten at version 0. */
	mkdir(cfg.io_dir, 0755);
	snprintf(path, sizeof(path), "%s/f00001", cfg.io_dir);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0 && write(fd, "x", 1) == 1);
	close(fd);
	files_start(&nd, &cfg);
	CHECK(node_wait(&nd, 20000, line, sizeof(line), "READY", NULL));
	CHECK(node_wait(&nd, 20000, line, sizeof(line), "\"type\":\"files\"", "\"round\":2", NULL));
	CHECK(json_num(line, "errors") == 0 && strstr(line, "\"first_error\":null"));
	CHECK(json_num(line, "requests") == 120 && json_num(line, "writes") > 10 && json_num(line, "reads") > 50);
	CHECK(json_num(line, "footprint_kib") > 0 && json_num(line, "footprint_kib") <= 8 * 16);
	CHECK(json_num(line, "bytes_read") == json_num(line, "reads") * 16384);
	CHECK(json_num(line, "bytes_written") == json_num(line, "writes") * 16384);
	node_kill(&nd);
	/* A second run keeps the versions the first left (its reads check them), until
	 * one block of the most requested file goes back a version: stale data. */
	files_start(&nd, &cfg);
	CHECK(node_wait(&nd, 20000, line, sizeof(line), "\"round\":2", NULL));
	CHECK(json_num(line, "errors") == 0);
	node_kill(&nd);
	struct files_sampler s;
	CHECK(files_sampler_init(&s, &cfg) == 0);
	uint32_t top = s.perm[0];
	files_sampler_free(&s);
	uint64_t b[128], first[128], found;
	snprintf(path, sizeof(path), "%s/f%05u", cfg.io_dir, top);
	fd = open(path, O_RDWR);
	CHECK(fd >= 0 && pread(fd, first, sizeof(first), 0) == (ssize_t)sizeof(first));
	uint64_t v = first[0] & FILES_VERSION_MASK;
	CHECK(v > 0 && files_check_block(first, top, 0, v, &found) == FC_OK);
	files_fill_block(b, top, 7, v - 1);
	CHECK(pwrite(fd, b, sizeof(b), 7 * 1024) == (ssize_t)sizeof(b));
	close(fd);
	cfg.io_write_ratio = 0;
	cfg.io_rounds = 1;
	files_start(&nd, &cfg);
	CHECK(node_wait(&nd, 20000, line, sizeof(line), "\"round\":1", NULL));
	char want[64];
	snprintf(want, sizeof(want), "f%05u offset 7168", top);
	CHECK(json_num(line, "errors") > 0 && strstr(line, want) && strstr(line, "stale"));
	node_kill(&nd);
	remove_set(&cfg, 8, dir);
}

void test_files_churn(void)
{
	char dir[] = "/tmp/rebound-churn-XXXXXX", line[1024], err[256];
	struct config cfg;
	struct files_sampler s, t;
	struct node nd;
	/* io_churn parses in 0-1 and leaves which files are picked as they were. */
	CHECK(parse_cmdline("rebound.io_churn=0.25", &cfg, err, sizeof(err)) == 0 && cfg.io_churn == 0.25);
	CHECK(parse_cmdline("rebound.io_churn=1.5", &cfg, err, sizeof(err)) == 1 && strstr(err, "io_churn"));
	files_cfg(&cfg, FP_ZIPF, 50, 3, 0.5);
	CHECK(files_sampler_init(&s, &cfg) == 0);
	cfg.io_churn = 0.3;
	CHECK(files_sampler_init(&t, &cfg) == 0);
	unsigned kinds[5] = {0}, n0 = 0;
	for (uint64_t n = 0; n < 30000; n++) {
		int w1, w2;
		CHECK(files_pick(&s, n, &w1) == files_pick(&t, n, &w2) && w1 == w2);
		n0 += files_write_op(&s, n) == FO_REWRITE;
		kinds[files_write_op(&t, n)]++;
	}
	CHECK(n0 == 30000);
	CHECK(kinds[FO_REWRITE] > 20000 && kinds[FO_REWRITE] < 22000);
	for (int k = FO_CHUNK; k <= FO_DELETE; k++)
		CHECK(kinds[k] > 2000 && kinds[k] < 2500);
	files_sampler_free(&s);
	files_sampler_free(&t);
	/* A run that churns: every read still checks, chunk by chunk. */
	CHECK(mkdtemp(dir) != NULL);
	files_cfg(&cfg, FP_RANDOM, 6, 5, 0.6);
	cfg.io_churn = 1;
	snprintf(cfg.io_dir, sizeof(cfg.io_dir), "%s/set", dir);
	cfg.io_file_size = 256 * 1024;
	cfg.io_requests = 150;
	files_start(&nd, &cfg);
	CHECK(node_wait(&nd, 20000, line, sizeof(line), "READY", NULL));
	CHECK(node_wait(&nd, 20000, line, sizeof(line), "\"type\":\"files\"", "\"round\":1", NULL));
	CHECK(json_num(line, "errors") == 0 && strstr(line, "\"first_error\":null"));
	CHECK(json_num(line, "chunk_writes") > 5 && json_num(line, "direct_writes") > 5 &&
	      json_num(line, "truncates") > 5 && json_num(line, "deletes") > 5);
	CHECK(json_num(line, "chunk_writes") + json_num(line, "direct_writes") + json_num(line, "truncates") +
		      json_num(line, "deletes") ==
	      json_num(line, "writes"));
	node_kill(&nd);
	remove_set(&cfg, 6, dir);
}
