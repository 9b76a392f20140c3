/* `counter` workload: ticks at rebound.counter_hz. Each tick mutates a 1 MiB buffer and
 * prints the buffer's checksum, so a restored guest that continues with the right
 * sequence and checksum proves its memory came back intact.
 *   buffer word i starts as splitmix64(i);
 *   tick n (from 1): word (n * 7919) % 131072 ^= splitmix64(n);
 *   checksum = sum over i of word[i] * (2i + 1), modulo 2^64. */
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define WORDS (1u << 17)

uint64_t counter_checksum(const uint64_t *w, size_t n)
{
	uint64_t sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += w[i] * (2 * (uint64_t)i + 1);
	return sum;
}

void counter_step(uint64_t *w, uint64_t seq)
{
	w[(seq * 7919) % WORDS] ^= splitmix64(seq);
}

int wl_counter(struct wl_ctx *ctx)
{
	uint64_t *w = malloc(WORDS * sizeof(uint64_t));
	int con = open("/dev/console", O_WRONLY | O_NOCTTY | O_CLOEXEC);
	unsigned hz = ctx->cfg->counter_hz;
	struct timespec next;
	if (!w)
		return 1;
	if (con < 0)
		con = 2;
	for (uint32_t i = 0; i < WORDS; i++)
		w[i] = splitmix64(i);
	logmsg("counter: ticking at %u Hz", hz);
	wl_ready(ctx);
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (uint64_t seq = 1;; seq++) {
		char line[96], msg[128];
		uint64_t step = 1000000000ULL / hz;
		next.tv_nsec += (long)(step % 1000000000ULL);
		next.tv_sec += (time_t)(step / 1000000000ULL);
		if (next.tv_nsec >= 1000000000L) {
			next.tv_nsec -= 1000000000L;
			next.tv_sec++;
		}
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR)
			;
		counter_step(w, seq);
		uint64_t sum = counter_checksum(w, WORDS);
		int n = snprintf(line, sizeof(line), "counter seq=%llu checksum=%016llx\n",
				 (unsigned long long)seq, (unsigned long long)sum);
		write_all(con, line, (size_t)n);
		snprintf(msg, sizeof(msg), "{\"type\":\"counter\",\"seq\":%llu,\"checksum\":\"%016llx\"}\n",
			 (unsigned long long)seq, (unsigned long long)sum);
		wl_send(ctx, msg);
		/* After a long stop (paused VM) continue from now instead of bursting. */
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec > next.tv_sec + 1)
			next = now;
	}
}
