/* `flood` workload: a hostile guest, for tests of what the host holds to a limit. One
 * process writes the serial console as fast as the UART takes it; another sends the
 * host agent messages as fast as the agent forwards them: `error` lines (each an event
 * on the host unless rate-limited) and `ready` lines announcing a new eviction ring
 * every time (each a record update and, unbounded, a ring reader). */
#include "agent.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <string.h>
#include <unistd.h>

static void flood_console(void)
{
	char line[200];
	int con = open("/dev/console", O_WRONLY | O_NOCTTY | O_CLOEXEC);
	if (con < 0)
		con = 2;
	for (uint64_t n = 0;; n++) {
		int len = snprintf(line, sizeof(line), "flood %020llu ", (unsigned long long)n);
		memset(line + len, 'x', sizeof(line) - 1 - (size_t)len);
		line[sizeof(line) - 1] = '\n';
		write_all(con, line, sizeof(line));
	}
}

int wl_flood(struct wl_ctx *ctx)
{
	char msg[4096];
	logmsg("flood: writing the console and the agent channel without pause");
	wl_ready(ctx);
	pid_t pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* not inherited across fork: set again */
		flood_console();
	}
	char filler[2048];
	memset(filler, 'e', sizeof(filler) - 1);
	filler[sizeof(filler) - 1] = '\0';
	for (uint64_t n = 0;; n++) {
		if (n % 2)
			snprintf(msg, sizeof(msg), "{\"type\":\"error\",\"message\":\"flood %llu %s\"}\n",
				 (unsigned long long)n, filler);
		else
			snprintf(msg, sizeof(msg),
				 "{\"type\":\"ready\",\"agent_version\":%d,\"kernel_release\":\"flood\","
				 "\"vmcoreinfo\":null,\"service_port\":null,"
				 "\"evict_ring\":{\"gpa\":%llu,\"bytes\":65536}}\n",
				 AGENT_VERSION, (unsigned long long)((16ULL << 20) + (n % 4096) * 4096));
		wl_send(ctx, msg);
		if (n % 64 == 63)
			usleep(1000); /* let the agent drain the pipe: lines it drops flood nothing */
	}
}
