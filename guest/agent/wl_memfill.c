/* `memfill` workload: fills anonymous memory with a pattern the host can recompute
 * (page i, 64-bit word j -> splitmix64(i*512+j)) and keeps re-verifying it, one round a
 * second, reporting {"type":"memfill",...} after the fill and after every round. */
#include "agent.h"

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#define WORDS_PER_PAGE 512
#define PROGRESS_EVERY (64ULL << 20)
#define MARGIN_KIB (16 * 1024) /* left for the agent, the page cache and the kernel */

static void report(struct wl_ctx *ctx, uint64_t filled, uint64_t rounds, uint64_t errors)
{
	char line[160];
	snprintf(line, sizeof(line), "{\"type\":\"memfill\",\"filled_kib\":%llu,\"rounds\":%llu,\"errors\":%llu}\n",
		 (unsigned long long)(filled >> 10), (unsigned long long)rounds, (unsigned long long)errors);
	wl_send(ctx, line);
}

int wl_memfill(struct wl_ctx *ctx)
{
	uint64_t bytes = ctx->cfg->memfill_bytes & ~4095ULL;
	uint64_t pages = bytes / 4096, rounds = 0, errors = 0;
	char info[4096], line[200];
	uint64_t avail_kib;
	/* Refuse what cannot fit rather than be OOM-killed over and over. */
	if (read_small_file("/proc/meminfo", info, sizeof(info)) > 0 &&
	    parse_meminfo(info, "MemAvailable", &avail_kib) == 0 && (bytes >> 10) + MARGIN_KIB > avail_kib) {
		snprintf(line, sizeof(line),
			 "{\"type\":\"error\",\"message\":\"memfill: %llu MiB requested, %llu MiB available\"}\n",
			 (unsigned long long)(bytes >> 20), (unsigned long long)(avail_kib >> 10));
		wl_send(ctx, line);
		logmsg("memfill: %llu MiB requested, only %llu MiB available", (unsigned long long)(bytes >> 20),
		       (unsigned long long)(avail_kib >> 10));
		return 2;
	}
	uint64_t *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (mem == MAP_FAILED) {
		snprintf(line, sizeof(line), "{\"type\":\"error\",\"message\":\"memfill: cannot map %llu bytes\"}\n",
			 (unsigned long long)bytes);
		wl_send(ctx, line);
		return 1;
	}
	logmsg("memfill: filling %llu MiB", (unsigned long long)(bytes >> 20));
	for (uint64_t p = 0; p < pages; p++) {
		uint64_t *w = mem + p * WORDS_PER_PAGE;
		for (uint64_t j = 0; j < WORDS_PER_PAGE; j++)
			w[j] = splitmix64(p * WORDS_PER_PAGE + j);
		if (((p + 1) * 4096) % PROGRESS_EVERY == 0 && p + 1 < pages)
			report(ctx, (p + 1) * 4096, 0, 0);
	}
	report(ctx, bytes, 0, 0);
	logmsg("memfill: %llu MiB filled", (unsigned long long)(bytes >> 20));
	wl_ready(ctx);
	for (;;) {
		sleep(1);
		uint64_t bad = 0;
		for (uint64_t p = 0; p < pages; p++) {
			const uint64_t *w = mem + p * WORDS_PER_PAGE;
			for (uint64_t j = 0; j < WORDS_PER_PAGE; j++)
				if (w[j] != splitmix64(p * WORDS_PER_PAGE + j))
					bad++;
		}
		rounds++;
		errors += bad;
		if (bad)
			logmsg("memfill: round %llu found %llu bad words", (unsigned long long)rounds,
			       (unsigned long long)bad);
		report(ctx, bytes, rounds, errors);
	}
}
