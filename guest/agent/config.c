/* Reads the rebound.* parameters from the kernel command line (see docs/agent-protocol.md).
 * Extension: rebound.workload may name several workloads separated by commas
 * ("web,kv,counter"); each runs in its own process. */
#include "agent.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MEMFILL (64ULL << 20)
#define DEFAULT_COUNTER_HZ 10
#define MAX_SIZE (1ULL << 40)
#define DEFAULT_PEER_PORT 7400
/* A word of the command line longer than this is refused, not cut: a cut rebound.peers
 * would silently lose peers. The kernel's own limit (x86) is 2048 bytes in all. */
#define WORD_MAX 1024

int parse_size(const char *s, uint64_t *out)
{
	uint64_t v = 0, mul = 1;
	const char *p = s;
	if (*p < '0' || *p > '9')
		return -1;
	while (*p >= '0' && *p <= '9') {
		unsigned d = (unsigned)(*p - '0');
		if (v > (MAX_SIZE - d) / 10)
			return -1;
		v = v * 10 + d;
		p++;
	}
	switch (*p) {
	case '\0': break;
	case 'k': case 'K': mul = 1ULL << 10; p++; break;
	case 'm': case 'M': mul = 1ULL << 20; p++; break;
	case 'g': case 'G': mul = 1ULL << 30; p++; break;
	default: return -1;
	}
	/* Accept an optional "iB"/"B" suffix: "64MiB", "64MB" both mean 64 << 20 here. */
	if (mul != 1 && (*p == 'i' || *p == 'I'))
		p++;
	if (mul != 1 && (*p == 'b' || *p == 'B'))
		p++;
	if (*p != '\0')
		return -1;
	if (v > MAX_SIZE / mul)
		return -1;
	*out = v * mul;
	return 0;
}

int parse_decimal(const char *s, double lo, double hi, double *out)
{
	int digits = 0, points = 0;
	for (const char *p = s; *p; p++) {
		if (*p >= '0' && *p <= '9')
			digits++;
		else if (*p == '.' && points++ == 0)
			continue;
		else
			return -1;
	}
	if (digits == 0 || digits > 20)
		return -1;
	double v = strtod(s, NULL);
	if (!(v >= lo && v <= hi))
		return -1;
	*out = v;
	return 0;
}

const char *files_pattern_name(int p)
{
	switch (p) {
	case FP_SEQ: return "seq";
	case FP_RANDOM: return "random";
	case FP_ZIPF: return "zipf";
	case FP_CLASS: return "class";
	}
	return "?";
}

const char *workload_name(enum workload_kind k)
{
	switch (k) {
	case WL_WEB: return "web";
	case WL_KV: return "kv";
	case WL_MEMFILL: return "memfill";
	case WL_COUNTER: return "counter";
	case WL_IO: return "io";
	case WL_PEER: return "peer";
	case WL_FLOOD: return "flood";
	}
	return "?";
}

static int parse_workloads(const char *v, struct config *cfg)
{
	char tmp[64];
	char *save = NULL;
	if (strlen(v) >= sizeof(tmp))
		return -1;
	strcpy(tmp, v);
	cfg->nworkloads = 0;
	if (strcmp(tmp, "none") == 0)
		return 0;
	for (char *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		enum workload_kind k;
		if (strcmp(tok, "web") == 0)
			k = WL_WEB;
		else if (strcmp(tok, "kv") == 0)
			k = WL_KV;
		else if (strcmp(tok, "memfill") == 0)
			k = WL_MEMFILL;
		else if (strcmp(tok, "counter") == 0)
			k = WL_COUNTER;
		else if (strcmp(tok, "io") == 0)
			k = WL_IO;
		else if (strcmp(tok, "peer") == 0)
			k = WL_PEER;
		else if (strcmp(tok, "flood") == 0)
			k = WL_FLOOD;
		else
			return -1;
		for (int i = 0; i < cfg->nworkloads; i++)
			if (cfg->workloads[i] == k)
				return -1;
		if (cfg->nworkloads == MAX_WORKLOADS)
			return -1;
		cfg->workloads[cfg->nworkloads++] = k;
	}
	return cfg->nworkloads ? 0 : -1;
}

static int parse_uint(const char *s, unsigned long lo, unsigned long hi, unsigned long *out)
{
	char *end;
	unsigned long v;
	if (*s < '0' || *s > '9')
		return -1;
	v = strtoul(s, &end, 10);
	if (*end != '\0' || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

#define DEFAULT_IO_PHASES "seqwrite,seqread,randread,randwrite"

/* "seqwrite,randread": the io workload's phases, in order. Returns 0 or -1. */
static int set_io_phases(struct config *cfg, const char *v)
{
	char tmp[128];
	char *save = NULL;
	int n = 0;
	if (strlen(v) >= sizeof(tmp))
		return -1;
	strcpy(tmp, v);
	for (char *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (strcmp(tok, "seqread") && strcmp(tok, "seqwrite") && strcmp(tok, "randread") &&
		    strcmp(tok, "randwrite"))
			return -1;
		if (n == IO_MAX_PHASES)
			return -1;
		snprintf(cfg->io_phases[n++], sizeof(cfg->io_phases[0]), "%s", tok);
	}
	if (n == 0)
		return -1;
	cfg->io_nphases = n;
	return 0;
}

/* Parses one dotted-quad IPv4 address of exactly len characters. */
static int parse_ipv4(const char *s, size_t len, uint32_t *ip)
{
	char tmp[16];
	struct in_addr a;
	if (len == 0 || len >= sizeof(tmp))
		return -1;
	memcpy(tmp, s, len);
	tmp[len] = '\0';
	if (inet_pton(AF_INET, tmp, &a) != 1) /* dotted decimal only: no "1.2", no octal */
		return -1;
	*ip = ntohl(a.s_addr);
	return 0;
}

static int parse_port(const char *s, size_t len, uint16_t *port)
{
	unsigned v = 0;
	if (len == 0 || len > 5)
		return -1;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (unsigned)(s[i] - '0');
	}
	if (v < 1 || v > 65535)
		return -1;
	*port = (uint16_t)v;
	return 0;
}

void peer_addr_str(const struct peer_addr *a, char *out, size_t cap)
{
	snprintf(out, cap, "%u.%u.%u.%u:%u", a->ip >> 24, (a->ip >> 16) & 255, (a->ip >> 8) & 255, a->ip & 255,
		 (unsigned)a->port);
}

int parse_peers(const char *v, struct peer_addr *out, int cap, char *why, size_t whylen)
{
	int n = 0;
	why[0] = '\0';
	if (*v == '\0')
		return 0; /* a pure server */
	for (const char *p = v;;) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		const char *colon = memchr(p, ':', len);
		struct peer_addr a;
		if (!colon || parse_ipv4(p, (size_t)(colon - p), &a.ip) < 0) {
			snprintf(why, whylen, "entry %d is not IPv4:PORT", n + 1);
			return -1;
		}
		if (parse_port(colon + 1, len - (size_t)(colon + 1 - p), &a.port) < 0) {
			snprintf(why, whylen, "entry %d: port not in 1-65535", n + 1);
			return -1;
		}
		for (int i = 0; i < n; i++)
			if (out[i].ip == a.ip && out[i].port == a.port) {
				snprintf(why, whylen, "entry %d repeats entry %d", n + 1, i + 1);
				return -1;
			}
		if (n == cap) {
			snprintf(why, whylen, "more than %d peers", cap);
			return -1;
		}
		out[n++] = a;
		if (!comma)
			return n;
		p = comma + 1;
	}
}

static void problem_why(char *err, size_t errlen, int *n, const char *param, const char *val, const char *why)
{
	if (*n == 0)
		snprintf(err, errlen, "bad kernel parameter %s=%.40s%s%s (using the default)", param, val,
			 why ? ": " : "", why ? why : "");
	(*n)++;
}

static void problem(char *err, size_t errlen, int *n, const char *param, const char *val)
{
	problem_why(err, errlen, n, param, val, NULL);
}

/* io_dir: /data/NAME[/NAME...], names of [A-Za-z0-9._-] that are not "." or "..": the
 * path goes into messages and must stay under the data disk. */
static int io_dir_ok(const char *v, size_t cap)
{
	size_t n = strlen(v);
	if (strncmp(v, "/data/", 6) != 0 || n == 6 || n >= cap || v[n - 1] == '/' || !path_segments_ok(v + 6))
		return 0;
	for (const char *p = v; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
		      *p == '.' || *p == '_' || *p == '-' || *p == '/'))
			return 0;
	return 1;
}

/* Decimal digits only, at most 2^64 - 1. */
static int parse_u64(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	if (*s == '\0')
		return -1;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		unsigned d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

/* "P:Q", both 1-99. */
static int parse_class(const char *v, unsigned *p, unsigned *q)
{
	char tmp[16];
	unsigned long a, b;
	const char *colon = strchr(v, ':');
	if (!colon || (size_t)(colon - v) >= sizeof(tmp))
		return -1;
	memcpy(tmp, v, (size_t)(colon - v));
	tmp[colon - v] = '\0';
	if (parse_uint(tmp, 1, 99, &a) < 0 || parse_uint(colon + 1, 1, 99, &b) < 0)
		return -1;
	*p = (unsigned)a;
	*q = (unsigned)b;
	return 0;
}

/* The io workload's file-set parameters; returns 1 when key was one of them. */
static int parse_files_key(const char *key, const char *val, struct config *cfg, char *err, size_t errlen,
			   int *problems)
{
	unsigned long u;
	uint64_t v;
	if (strcmp(key, "io_files") == 0) {
		if (parse_uint(val, 0, FILES_MAX, &u) < 0)
			problem_why(err, errlen, problems, "rebound.io_files", val, "not in 0-100000");
		else
			cfg->io_files = (unsigned)u;
	} else if (strcmp(key, "io_file_size") == 0) {
		if (parse_size(val, &v) < 0 || v < 4096 || v % 4096 || v > (1ULL << 30))
			problem_why(err, errlen, problems, "rebound.io_file_size", val, "not 4K-1G in whole 4 KiB");
		else
			cfg->io_file_size = v;
	} else if (strcmp(key, "io_dir") == 0) {
		if (!io_dir_ok(val, sizeof(cfg->io_dir)))
			problem_why(err, errlen, problems, "rebound.io_dir", val, "not a plain path under /data/");
		else
			snprintf(cfg->io_dir, sizeof(cfg->io_dir), "%s", val);
	} else if (strcmp(key, "io_pattern") == 0) {
		int p = -1;
		for (int i = FP_SEQ; i <= FP_CLASS; i++)
			if (strcmp(val, files_pattern_name(i)) == 0)
				p = i;
		if (p < 0)
			problem_why(err, errlen, problems, "rebound.io_pattern", val, "not seq, random, zipf or class");
		else
			cfg->io_pattern = p;
	} else if (strcmp(key, "io_zipf") == 0) {
		if (parse_decimal(val, 0, 10, &cfg->io_zipf) < 0)
			problem_why(err, errlen, problems, "rebound.io_zipf", val, "not in 0-10");
	} else if (strcmp(key, "io_class") == 0) {
		if (parse_class(val, &cfg->io_class_p, &cfg->io_class_q) < 0)
			problem_why(err, errlen, problems, "rebound.io_class", val, "not P:Q, both 1-99");
	} else if (strcmp(key, "io_seed") == 0) {
		if (parse_u64(val, &v) < 0)
			problem_why(err, errlen, problems, "rebound.io_seed", val, "not a 64-bit number");
		else
			cfg->io_seed = v;
	} else if (strcmp(key, "io_write_ratio") == 0) {
		if (parse_decimal(val, 0, 1, &cfg->io_write_ratio) < 0)
			problem_why(err, errlen, problems, "rebound.io_write_ratio", val, "not in 0-1");
	} else if (strcmp(key, "io_churn") == 0) {
		if (parse_decimal(val, 0, 1, &cfg->io_churn) < 0)
			problem_why(err, errlen, problems, "rebound.io_churn", val, "not in 0-1");
	} else if (strcmp(key, "io_requests") == 0) {
		if (parse_uint(val, 1, 100000000, &u) < 0)
			problem_why(err, errlen, problems, "rebound.io_requests", val, "not in 1-100000000");
		else
			cfg->io_requests = (unsigned)u;
	} else {
		return 0;
	}
	return 1;
}

/* The peer workload's parameters; returns 1 when key was one of them. */
static int parse_peer_key(const char *key, const char *val, struct config *cfg, char *err, size_t errlen,
			  int *problems)
{
	unsigned long u;
	char why[64];
	if (strcmp(key, "peers") == 0) {
		struct peer_addr tmp[PEER_MAX];
		int n = parse_peers(val, tmp, PEER_MAX, why, sizeof(why));
		if (n < 0) {
			cfg->npeers = 0;
			problem_why(err, errlen, problems, "rebound.peers", val, why);
		} else {
			memcpy(cfg->peers, tmp, sizeof(tmp[0]) * (size_t)n);
			cfg->npeers = n;
		}
	} else if (strcmp(key, "peer_port") == 0) {
		if (parse_uint(val, 1, 65535, &u) < 0)
			problem_why(err, errlen, problems, "rebound.peer_port", val, "not in 1-65535");
		else
			cfg->peer_port = (int)u;
	} else if (strcmp(key, "peer_hb_ms") == 0) {
		if (parse_uint(val, 10, 60000, &u) < 0)
			problem_why(err, errlen, problems, "rebound.peer_hb_ms", val, "not in 10-60000");
		else
			cfg->peer_hb_ms = (unsigned)u;
	} else if (strcmp(key, "peer_dead_ms") == 0) {
		if (parse_uint(val, 50, 600000, &u) < 0)
			problem_why(err, errlen, problems, "rebound.peer_dead_ms", val, "not in 50-600000");
		else
			cfg->peer_dead_ms = (unsigned)u;
	} else if (strcmp(key, "peer_req_ms") == 0) {
		if (parse_uint(val, 0, 60000, &u) < 0 || (u > 0 && u < 10))
			problem_why(err, errlen, problems, "rebound.peer_req_ms", val, "not 0 or 10-60000");
		else
			cfg->peer_req_ms = (unsigned)u;
	} else if (strcmp(key, "peer_req_bytes") == 0) {
		if (parse_uint(val, 0, PEER_REQ_BYTES_MAX, &u) < 0)
			problem_why(err, errlen, problems, "rebound.peer_req_bytes", val, "not in 0-65536");
		else
			cfg->peer_req_bytes = (unsigned)u;
	} else {
		return 0;
	}
	return 1;
}

int parse_cmdline(const char *cmdline, struct config *cfg, char *err, size_t errlen)
{
	char word[WORD_MAX];
	int problems = 0;
	const char *p = cmdline;
	memset(cfg, 0, sizeof(*cfg));
	strcpy(cfg->workload, "none");
	cfg->memfill_bytes = DEFAULT_MEMFILL;
	cfg->counter_hz = DEFAULT_COUNTER_HZ;
	set_io_phases(cfg, DEFAULT_IO_PHASES);
	strcpy(cfg->io_target, "/data/io.bin");
	cfg->io_size = 32ULL << 20;
	cfg->io_bs = 4096;
	cfg->io_direct = 1;
	cfg->io_seconds = 5;
	cfg->io_rounds = 1;
	cfg->io_file_size = 1ULL << 20;
	strcpy(cfg->io_dir, "/data/files");
	cfg->io_pattern = FP_ZIPF;
	cfg->io_zipf = 1.0;
	cfg->io_class_p = 10;
	cfg->io_class_q = 90;
	cfg->io_seed = 1;
	cfg->io_requests = 2000;
	cfg->peer_port = DEFAULT_PEER_PORT;
	cfg->peer_hb_ms = 200;
	cfg->peer_dead_ms = 1000;
	cfg->peer_req_ms = 100;
	cfg->peer_req_bytes = 1024;
	if (errlen)
		err[0] = '\0';

	while (*p) {
		size_t n = 0;
		while (*p == ' ' || *p == '\t' || *p == '\n')
			p++;
		if (!*p)
			break;
		while (*p && *p != ' ' && *p != '\t' && *p != '\n') {
			if (n + 1 < sizeof(word))
				word[n++] = *p;
			p++;
		}
		word[n] = '\0';
		char *eq = strchr(word, '=');
		if (!eq || strncmp(word, "rebound.", 8) != 0)
			continue;
		*eq = '\0';
		const char *key = word + 8, *val = eq + 1;
		unsigned long u;
		if (n + 1 == sizeof(word)) {
			problem_why(err, errlen, &problems, word, val, "too long");
		} else if (parse_peer_key(key, val, cfg, err, errlen, &problems) ||
			   parse_files_key(key, val, cfg, err, errlen, &problems)) {
			/* done */
		} else if (strcmp(key, "workload") == 0) {
			struct config tmp = *cfg;
			if (parse_workloads(val, &tmp) < 0) {
				problem(err, errlen, &problems, "rebound.workload", val);
			} else {
				*cfg = tmp;
				snprintf(cfg->workload, sizeof(cfg->workload), "%s", val);
			}
		} else if (strcmp(key, "memfill") == 0) {
			if (parse_size(val, &cfg->memfill_bytes) < 0 || cfg->memfill_bytes < 4096) {
				cfg->memfill_bytes = DEFAULT_MEMFILL;
				problem(err, errlen, &problems, "rebound.memfill", val);
			}
		} else if (strcmp(key, "counter_hz") == 0) {
			if (parse_uint(val, 1, 1000, &u) < 0)
				problem(err, errlen, &problems, "rebound.counter_hz", val);
			else
				cfg->counter_hz = (unsigned)u;
		} else if (strcmp(key, "watchdog_s") == 0) {
			if (parse_uint(val, 1, 600, &u) < 0)
				problem(err, errlen, &problems, "rebound.watchdog_s", val);
			else
				cfg->watchdog_s = (unsigned)u;
		} else if (strcmp(key, "disk_io") == 0) {
			if (parse_size(val, &cfg->disk_io_bytes) < 0) {
				cfg->disk_io_bytes = 0;
				problem(err, errlen, &problems, "rebound.disk_io", val);
			}
		} else if (strcmp(key, "io") == 0) {
			if (set_io_phases(cfg, val) < 0) {
				set_io_phases(cfg, DEFAULT_IO_PHASES);
				problem(err, errlen, &problems, "rebound.io", val);
			}
		} else if (strcmp(key, "io_target") == 0) {
			/* Under /data or a whole block device: nothing else of the guest's. */
			if ((strncmp(val, "/data/", 6) && strncmp(val, "/dev/vd", 7)) || strstr(val, "..") ||
			    strlen(val) >= sizeof(cfg->io_target))
				problem(err, errlen, &problems, "rebound.io_target", val);
			else
				snprintf(cfg->io_target, sizeof(cfg->io_target), "%s", val);
		} else if (strcmp(key, "io_size") == 0) {
			uint64_t v;
			if (parse_size(val, &v) < 0 || v < 4096 || v % 4096)
				problem(err, errlen, &problems, "rebound.io_size", val);
			else
				cfg->io_size = v;
		} else if (strcmp(key, "io_bs") == 0) {
			uint64_t v;
			if (parse_size(val, &v) < 0 || v < 512 || v % 512 || v > (4ULL << 20))
				problem(err, errlen, &problems, "rebound.io_bs", val);
			else
				cfg->io_bs = v;
		} else if (strcmp(key, "io_direct") == 0) {
			if (parse_uint(val, 0, 1, &u) < 0)
				problem(err, errlen, &problems, "rebound.io_direct", val);
			else
				cfg->io_direct = (int)u;
		} else if (strcmp(key, "io_delay_s") == 0) {
			if (parse_uint(val, 0, 3600, &u) < 0)
				problem(err, errlen, &problems, "rebound.io_delay_s", val);
			else
				cfg->io_delay_s = (unsigned)u;
		} else if (strcmp(key, "io_keep") == 0) {
			if (parse_uint(val, 0, 1, &u) < 0)
				problem(err, errlen, &problems, "rebound.io_keep", val);
			else
				cfg->io_keep = (int)u;
		} else if (strcmp(key, "io_seconds") == 0) {
			if (parse_uint(val, 1, 3600, &u) < 0)
				problem(err, errlen, &problems, "rebound.io_seconds", val);
			else
				cfg->io_seconds = (unsigned)u;
		} else if (strcmp(key, "io_rounds") == 0) {
			if (parse_uint(val, 0, 1000000, &u) < 0)
				problem(err, errlen, &problems, "rebound.io_rounds", val);
			else
				cfg->io_rounds = (unsigned)u;
		} else if (strcmp(key, "port") == 0) {
			if (parse_uint(val, 1, 65535, &u) < 0)
				problem(err, errlen, &problems, "rebound.port", val);
			else
				cfg->port_override = (int)u;
		}
	}
	return problems;
}

/* rebound.port applies to the first listening one of web and kv; the others keep their
 * defaults. peer listens on rebound.peer_port, which its peers also know. */
int workload_port(const struct config *cfg, enum workload_kind k)
{
	int first = 1;
	if (k == WL_PEER) {
		for (int i = 0; i < cfg->nworkloads; i++)
			if (cfg->workloads[i] == WL_PEER)
				return cfg->peer_port;
		return 0;
	}
	for (int i = 0; i < cfg->nworkloads; i++) {
		enum workload_kind w = cfg->workloads[i];
		if (w != WL_WEB && w != WL_KV)
			continue;
		if (w == k) {
			if (first && cfg->port_override)
				return cfg->port_override;
			return k == WL_WEB ? 8080 : 7070;
		}
		first = 0;
	}
	return 0;
}

int service_port(const struct config *cfg)
{
	for (int i = 0; i < cfg->nworkloads; i++)
		if (cfg->workloads[i] == WL_WEB || cfg->workloads[i] == WL_KV || cfg->workloads[i] == WL_PEER)
			return workload_port(cfg, cfg->workloads[i]);
	return 0;
}
