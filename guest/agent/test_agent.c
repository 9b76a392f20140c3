/* Unit tests for the agent's parsers, run on the host by `make check` (with ASan/UBSan):
 * the JSON command reader against malformed and hostile lines, sizes, the kernel command
 * line, web paths, the kv protocol and the /sys and /proc formats. */
#include "agent.h"
#include "json.h"
#include "test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int failures;

static int parse(const char *s, struct host_cmd *c, char *err)
{
	/* Copy into an exact-size heap buffer so ASan catches any read past the line. */
	size_t n = strlen(s);
	char *buf = malloc(n ? n : 1);
	memcpy(buf, s, n);
	int rc = json_parse_cmd(buf, n, c, err, 128);
	free(buf);
	return rc;
}

static void test_json_valid(void)
{
	struct host_cmd c;
	char err[128];
	CHECK(parse("{\"cmd\":\"hello\"}", &c, err) == 0 && c.has_cmd && strcmp(c.cmd, "hello") == 0);
	CHECK(parse(" { \"cmd\" : \"marker\" , \"id\" : 18446744073709551615 , \"value_hex\" : \"00ff\" } ", &c, err) == 0);
	CHECK(c.has_id && c.id == UINT64_MAX && c.has_value_hex && strcmp(c.value_hex, "00ff") == 0);
	/* Unknown keys of any shape are skipped. */
	CHECK(parse("{\"x\":[1,2,{\"a\":null}],\"y\":true,\"z\":-1.5e3,\"cmd\":\"crash\"}", &c, err) == 0);
	CHECK(strcmp(c.cmd, "crash") == 0 && !c.has_id);
	CHECK(parse("{\"cmd\":\"he\\u006clo\"}", &c, err) == 0 && strcmp(c.cmd, "hello") == 0);
	CHECK(parse("{\"cmd\":\"\\ud83d\\ude00\"}", &c, err) == 0 && strcmp(c.cmd, "\xf0\x9f\x98\x80") == 0);
	CHECK(parse("{}", &c, err) == 0 && !c.has_cmd);
	char longkey[300];
	snprintf(longkey, sizeof(longkey), "{\"%0200d\":1,\"cmd\":\"hello\"}", 0);
	CHECK(parse(longkey, &c, err) == 0 && strcmp(c.cmd, "hello") == 0);
}

static void test_json_malformed(void)
{
	static const char *bad[] = {
		"", " ", "[]", "\"cmd\"", "null", "{", "{\"cmd\"", "{\"cmd\":", "{\"cmd\":\"hel",
		"{\"cmd\":\"hello\"", "{\"cmd\":\"hello\",}", "{\"cmd\":\"hello\"}}", "{\"cmd\":\"hello\"} x",
		"{\"cmd\":hello}", "{'cmd':'hello'}", "{\"cmd\":\"a\\x\"}", "{\"cmd\":\"a\\u12\"}",
		"{\"cmd\":\"\\ud800\"}", "{\"cmd\":\"\\udc00\"}", "{\"cmd\":\"\\u0000\"}", "{\"cmd\":\"a\tb\"}",
		"{\"cmd\":1}", "{\"cmd\":\"a\",\"cmd\":\"b\"}", "{\"id\":1.5}", "{\"id\":-3}", "{\"id\":1e3}",
		"{\"id\":18446744073709551616}", "{\"id\":01}", "{\"id\":\"7\"}", "{\"id\":1,\"id\":2}",
		"{\"value_hex\":5}", "{\"x\":tru}", "{\"x\":nul}", "{\"x\":[1,]}", "{\"x\":[1 2]}",
		"{\"x\":{\"a\"}}", "{\"x\":-}", "{\"x\":1.}", "{\"x\":1e}", "{\"x\" 1}", "{,}", "{\"a\":1,,}",
	};
	struct host_cmd c;
	char err[128];
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = parse(bad[i], &c, err);
		if (rc == 0)
			fprintf(stderr, "accepted malformed line: %s\n", bad[i]);
		CHECK(rc < 0 && err[0] != '\0');
	}
	/* A NUL byte inside the line is not JSON. */
	char withnul[] = "{\"cmd\":\"he\0lo\"}";
	CHECK(json_parse_cmd(withnul, sizeof(withnul) - 1, &c, err, sizeof(err)) < 0);
	/* Deep nesting is refused, not recursed into. */
	char deep[4096];
	size_t n = 0;
	n += (size_t)snprintf(deep, sizeof(deep), "{\"x\":");
	for (int i = 0; i < 1000; i++)
		deep[n++] = '[';
	deep[n] = '\0';
	CHECK(parse(deep, &c, err) < 0 && strstr(err, "nesting") != NULL);
	/* Oversized fields. */
	char big[2 * MARKER_MAX_BYTES + 64];
	n = (size_t)snprintf(big, sizeof(big), "{\"value_hex\":\"");
	for (int i = 0; i < 2 * MARKER_MAX_BYTES + 2; i++)
		big[n++] = 'a';
	strcpy(big + n, "\"}");
	CHECK(parse(big, &c, err) < 0 && strstr(err, "too long") != NULL);
	CHECK(parse("{\"cmd\":\"0123456789012345678901234567890123456789\"}", &c, err) < 0);
	/* Every prefix of a valid command is rejected without reading beyond it. */
	const char *full = "{\"cmd\":\"marker\",\"id\":7,\"value_hex\":\"dead\",\"x\":[true,{\"y\":\"\\u00e9\"}]}";
	for (size_t cut = 0; cut < strlen(full); cut++) {
		char pre[128];
		memcpy(pre, full, cut);
		pre[cut] = '\0';
		CHECK(parse(pre, &c, err) < 0);
	}
	CHECK(parse(full, &c, err) == 0);
}

/* Mutations of valid commands and random bytes: the reader must never crash or read out of
 * bounds (ASan), and whatever it accepts must be a well-formed result. */
static void test_json_fuzz(void)
{
	static const char *seeds[] = {
		"{\"cmd\":\"marker\",\"id\":7,\"value_hex\":\"dead\",\"x\":[true,{\"y\":\"\\u00e9\"}]}",
		"{\"cmd\":\"hello\"}", "{\"a\":[[[[1.5e-3]]]],\"cmd\":\"crash\"}",
	};
	uint64_t rng = 12345;
	struct host_cmd c;
	char err[128];
	for (int iter = 0; iter < 200000; iter++) {
		char buf[256];
		size_t n;
		rng = splitmix64(rng);
		if (iter % 4 == 0) {
			n = rng % sizeof(buf);
			for (size_t i = 0; i < n; i++)
				buf[i] = (char)(splitmix64(rng + i) & 0xff);
		} else {
			const char *seed = seeds[rng % 3];
			n = strlen(seed);
			memcpy(buf, seed, n);
			for (int k = 0; k < 1 + (int)(rng >> 60); k++) {
				uint64_t r = splitmix64(rng + (uint64_t)k);
				if (n == 0)
					break;
				size_t pos = (size_t)(r % n);
				switch ((r >> 32) % 3) {
				case 0: /* change a byte */
					buf[pos] = (char)(r >> 40);
					break;
				case 1: /* cut */
					n = pos;
					break;
				default: /* insert a structural character */
					if (n + 1 < sizeof(buf)) {
						memmove(buf + pos + 1, buf + pos, n - pos);
						buf[pos] = "{}[]\",:\\"[(r >> 40) % 9];
						n++;
					}
				}
			}
		}
		char *exact = malloc(n ? n : 1);
		memcpy(exact, buf, n);
		if (json_parse_cmd(exact, n, &c, err, sizeof(err)) == 0) {
			CHECK(!c.has_cmd || strlen(c.cmd) <= CMD_NAME_MAX);
			CHECK(!c.has_value_hex || strlen(c.value_hex) <= 2 * MARKER_MAX_BYTES);
		} else {
			CHECK(err[0] != '\0');
		}
		free(exact);
	}
}

static void test_json_writer(void)
{
	char buf[64];
	struct jbuf b;
	jb_init(&b, buf, sizeof(buf));
	jb_raw(&b, "{\"m\":");
	jb_str(&b, "a\"b\\c\n\x01\xc3");
	CHECK(jb_finish(&b) > 0);
	CHECK(strcmp(buf, "{\"m\":\"a\\\"b\\\\c\\n\\u0001\\u00c3\"}\n") == 0);
	char small[8];
	jb_init(&b, small, sizeof(small));
	jb_raw(&b, "{\"long\":");
	CHECK(jb_finish(&b) == -1);
}

static void test_sizes_and_cmdline(void)
{
	uint64_t v;
	CHECK(parse_size("64M", &v) == 0 && v == 64ULL << 20);
	CHECK(parse_size("1G", &v) == 0 && v == 1ULL << 30);
	CHECK(parse_size("4096", &v) == 0 && v == 4096);
	CHECK(parse_size("2MiB", &v) == 0 && v == 2ULL << 20);
	CHECK(parse_size("1024G", &v) == 0 && v == 1ULL << 40);
	static const char *bad[] = { "", "M", "-1", "1.5G", "64MM", "64T", "1025G", "99999999999999999999", "64 M", "0x10" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK(parse_size(bad[i], &v) < 0);

	struct config cfg;
	char err[160];
	CHECK(parse_cmdline("console=ttyS0 quiet\n", &cfg, err, sizeof(err)) == 0);
	CHECK(cfg.nworkloads == 0 && strcmp(cfg.workload, "none") == 0 && cfg.memfill_bytes == 64ULL << 20 && cfg.counter_hz == 10);
	CHECK(service_port(&cfg) == 0);
	CHECK(parse_cmdline("a rebound.workload=kv rebound.port=9000 rebound.memfill=1G rebound.counter_hz=50 b\n", &cfg, err, sizeof(err)) == 0);
	CHECK(cfg.nworkloads == 1 && cfg.workloads[0] == WL_KV && service_port(&cfg) == 9000);
	CHECK(cfg.memfill_bytes == 1ULL << 30 && cfg.counter_hz == 50 && cfg.disk_io_bytes == 0);
	CHECK(parse_cmdline("rebound.workload=flood", &cfg, err, sizeof(err)) == 0);
	CHECK(cfg.nworkloads == 1 && cfg.workloads[0] == WL_FLOOD && service_port(&cfg) == 0);
	CHECK(parse_cmdline("rebound.workload=web rebound.disk_io=200M", &cfg, err, sizeof(err)) == 0);
	CHECK(cfg.disk_io_bytes == 200ULL << 20);
	CHECK(parse_cmdline("rebound.workload=web rebound.disk_io=lots", &cfg, err, sizeof(err)) == 1);
	CHECK(cfg.disk_io_bytes == 0 && strstr(err, "rebound.disk_io") != NULL);
	CHECK(parse_cmdline("rebound.workload=web,kv,counter", &cfg, err, sizeof(err)) == 0);
	CHECK(cfg.nworkloads == 3 && workload_port(&cfg, WL_WEB) == 8080 && workload_port(&cfg, WL_KV) == 7070);
	CHECK(parse_cmdline("rebound.workload=kv,web rebound.port=1234", &cfg, err, sizeof(err)) == 0);
	CHECK(workload_port(&cfg, WL_KV) == 1234 && workload_port(&cfg, WL_WEB) == 8080);
	/* Bad values are reported and fall back to defaults. */
	CHECK(parse_cmdline("rebound.watchdog_s=3", &cfg, err, sizeof(err)) == 0);
	CHECK(cfg.watchdog_s == 3);
	CHECK(parse_cmdline("rebound.watchdog_s=0 rebound.watchdog_s=601", &cfg, err, sizeof(err)) == 2);
	CHECK(cfg.watchdog_s == 0);
	CHECK(parse_cmdline("rebound.workload=bitcoin rebound.memfill=lots rebound.port=70000 rebound.counter_hz=0", &cfg, err, sizeof(err)) == 4);
	CHECK(strstr(err, "rebound.workload=bitcoin") != NULL);
	CHECK(cfg.nworkloads == 0 && cfg.memfill_bytes == 64ULL << 20 && cfg.port_override == 0 && cfg.counter_hz == 10);
	CHECK(parse_cmdline("rebound.workload=web,web", &cfg, err, sizeof(err)) == 1);
	CHECK(parse_cmdline("rebound.workload=web,kv,memfill,counter,web", &cfg, err, sizeof(err)) == 1);
	CHECK(parse_cmdline("rebound.workload=,", &cfg, err, sizeof(err)) == 1);
	char huge[2000];
	memset(huge, 'x', sizeof(huge) - 1);
	memcpy(huge, "rebound.workload=", 17);
	huge[sizeof(huge) - 1] = '\0';
	CHECK(parse_cmdline(huge, &cfg, err, sizeof(err)) == 1);
}

static void test_web_paths(void)
{
	char p[256];
	CHECK(web_target_to_path("/", p, sizeof(p)) == 0 && strcmp(p, "index.html") == 0);
	CHECK(web_target_to_path("/a/b.txt?x=1", p, sizeof(p)) == 0 && strcmp(p, "a/b.txt") == 0);
	CHECK(web_target_to_path("/dir/", p, sizeof(p)) == 0 && strcmp(p, "dir/index.html") == 0);
	CHECK(web_target_to_path("/h%65llo", p, sizeof(p)) == 0 && strcmp(p, "hello") == 0);
	static const char *bad[] = { "", "x", "/..", "/../etc/passwd", "/a/../../b", "/%2e%2e/x", "/a/%2E%2E",
				     "/a//b", "/./a", "/a%00b", "/a%zz", "/a%2", "/a\\b", "http://x/" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK(web_target_to_path(bad[i], p, sizeof(p)) < 0);
	char longt[600];
	memset(longt, 'a', sizeof(longt) - 1);
	longt[0] = '/';
	longt[sizeof(longt) - 1] = '\0';
	CHECK(web_target_to_path(longt, p, sizeof(p)) < 0);
}

static void kv(const char *in, const char *want)
{
	char line[256], out[512];
	snprintf(line, sizeof(line), "%s", in);
	kv_exec(line, out, sizeof(out));
	if (strcmp(out, want) != 0)
		fprintf(stderr, "kv %s: got %s", in, out);
	CHECK(strcmp(out, want) == 0);
}

static void test_kv(void)
{
	kv("COUNT", "COUNT 0\n");
	kv("GET a", "NOTFOUND\n");
	kv("SET a 1", "OK\n");
	kv("SET a one two", "OK\n");
	kv("GET a", "VALUE one two\n");
	kv("SET b ", "OK\n");
	kv("GET b", "VALUE \n");
	kv("COUNT", "COUNT 2\n");
	kv("DEL a", "OK\n");
	kv("DEL a", "NOTFOUND\n");
	kv("COUNT", "COUNT 1\n");
	static const char *bad[] = { "", "SET", "SET a", "SET  x", "GET", "GET a b", "DEL", "COUNT x", "get a", "FLUSH" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		kv(bad[i], "ERR usage: SET k v | GET k | DEL k | COUNT\n");
	/* Past several doublings of the table: every key still found, deletes too. */
	char in[64], want[64];
	for (int i = 0; i < 20000; i++) {
		snprintf(in, sizeof(in), "SET k%d v%d", i, i);
		kv(in, "OK\n");
	}
	for (int i = 0; i < 20000; i += 7) {
		snprintf(in, sizeof(in), "GET k%d", i);
		snprintf(want, sizeof(want), "VALUE v%d\n", i);
		kv(in, want);
	}
	for (int i = 0; i < 20000; i += 2) {
		snprintf(in, sizeof(in), "DEL k%d", i);
		kv(in, "OK\n");
	}
	kv("COUNT", "COUNT 10001\n");
	kv("GET k2", "NOTFOUND\n");
	kv("GET k19999", "VALUE v19999\n");
}

static void test_proc_formats(void)
{
	uint64_t a, s;
	CHECK(parse_vmcoreinfo("18e1000 1024\n", &a, &s) == 0 && a == 0x18e1000 && s == 0x1024);
	CHECK(parse_vmcoreinfo("", &a, &s) < 0);
	CHECK(parse_vmcoreinfo("18e1000", &a, &s) < 0);
	CHECK(parse_vmcoreinfo("zz 10", &a, &s) < 0);
	CHECK(parse_vmcoreinfo("10 0", &a, &s) < 0);
	CHECK(parse_vmcoreinfo("10 -5", &a, &s) < 0);
	CHECK(parse_vmcoreinfo("10 10 extra", &a, &s) < 0);
	CHECK(parse_vmcoreinfo("10 ffffffff", &a, &s) < 0);
	CHECK(parse_param_u64("123145302310912\n", &a) == 0 && a == 123145302310912ULL);
	CHECK(parse_param_u64("0\n", &a) == 0 && a == 0);
	CHECK(parse_param_u64("", &a) < 0);
	CHECK(parse_param_u64("-1\n", &a) < 0);
	CHECK(parse_param_u64("12 x", &a) < 0);
	CHECK(parse_param_u64("0x10", &a) < 0);
	const char *mi = "MemTotal:         210740 kB\nMemFree: 1 kB\nMemAvailable:     180000 kB\n";
	CHECK(parse_meminfo(mi, "MemTotal", &a) == 0 && a == 210740);
	CHECK(parse_meminfo(mi, "MemAvailable", &a) == 0 && a == 180000);
	CHECK(parse_meminfo(mi, "Mem", &a) < 0);
	CHECK(parse_meminfo("MemFree: 1 kB\n", "MemTotal", &a) < 0);
	CHECK(parse_meminfo("XMemTotal: 5 kB\n", "MemTotal", &a) < 0);
	CHECK(parse_meminfo("MemTotal: lots\n", "MemTotal", &a) < 0);
	CHECK(parse_meminfo("MemTotal:", "MemTotal", &a) < 0);
	CHECK(parse_meminfo("", "MemTotal", &a) < 0);
	unsigned char out[4];
	size_t n;
	CHECK(hex_decode("deadBEEF", out, sizeof(out), &n) == 0 && n == 4 && out[0] == 0xde && out[3] == 0xef);
	CHECK(hex_decode("abc", out, sizeof(out), &n) < 0);
	CHECK(hex_decode("zz", out, sizeof(out), &n) < 0);
	CHECK(hex_decode("0011223344", out, sizeof(out), &n) < 0);
}

static void test_counter(void)
{
	/* The definition the host recomputes (crates/image/tests/common): tick 1 on the
	 * initial buffer. */
	static uint64_t w[1u << 17];
	for (uint32_t i = 0; i < (1u << 17); i++)
		w[i] = splitmix64(i);
	CHECK(splitmix64(0) == 0xe220a8397b1dcdafULL);
	uint64_t before = counter_checksum(w, 1u << 17);
	counter_step(w, 1);
	CHECK(counter_checksum(w, 1u << 17) != before);
}

static void test_io(void)
{
	struct config cfg;
	char err[256];
	CHECK(parse_cmdline("rebound.workload=io", &cfg, err, sizeof(err)) == 0);
	CHECK(cfg.nworkloads == 1 && cfg.workloads[0] == WL_IO && cfg.io_nphases == 4);
	CHECK(cfg.io_bs == 4096 && cfg.io_size == 32ULL << 20 && cfg.io_direct == 1 && cfg.io_rounds == 1);
	CHECK(parse_cmdline("rebound.workload=io rebound.io=randread,seqwrite rebound.io_bs=64K rebound.io_direct=0 "
			    "rebound.io_size=8M rebound.io_seconds=2 rebound.io_rounds=0",
			    &cfg, err, sizeof(err)) == 0);
	CHECK(cfg.io_nphases == 2 && strcmp(cfg.io_phases[0], "randread") == 0 && strcmp(cfg.io_phases[1], "seqwrite") == 0);
	CHECK(cfg.io_bs == 65536 && cfg.io_direct == 0 && cfg.io_size == 8ULL << 20 && cfg.io_seconds == 2 &&
	      cfg.io_rounds == 0);
	/* Bad values are reported and replaced by the defaults. */
	CHECK(parse_cmdline("rebound.workload=io rebound.io=sideways rebound.io_bs=100", &cfg, err, sizeof(err)) == 2);
	CHECK(cfg.io_nphases == 4 && cfg.io_bs == 4096 && strstr(err, "rebound.io") != NULL);
	CHECK(strcmp(cfg.io_target, "/data/io.bin") == 0);
	CHECK(parse_cmdline("rebound.io_target=/dev/vdb", &cfg, err, sizeof(err)) == 0 && strcmp(cfg.io_target, "/dev/vdb") == 0);
	CHECK(parse_cmdline("rebound.io_target=/etc/passwd", &cfg, err, sizeof(err)) == 1);
	CHECK(parse_cmdline("rebound.io_target=/data/../etc/x", &cfg, err, sizeof(err)) == 1);
	/* The pattern: word j of the block at offset o is splitmix64(o/8 + j) ^ version. */
	uint64_t b[512];
	io_fill(b, sizeof(b), 8192, 3);
	CHECK(b[0] == (splitmix64(1024) ^ 3) && b[511] == (splitmix64(1024 + 511) ^ 3));
	uint32_t v[] = {5, 1, 4, 2, 3, 100, 6, 7, 8, 9};
	CHECK(io_percentile(v, 10, 50) == 5 && io_percentile(v, 10, 99) == 100);
	CHECK(io_percentile(v, 0, 50) == 0);
}

static void test_warm(void)
{
	uint64_t r[4][2];
	const char *rest;
	CHECK(warm_parse_ranges("0+3,10+1 web/a b.bin", &rest, r, 4) == 2);
	CHECK(r[0][0] == 0 && r[0][1] == 3 && r[1][0] == 10 && r[1][1] == 1 && strcmp(rest, "web/a b.bin") == 0);
	/* Malformed: no path, zero count, overflow, junk, too many ranges. */
	CHECK(warm_parse_ranges("0+3", &rest, r, 4) < 0);
	CHECK(warm_parse_ranges("0+0 a", &rest, r, 4) < 0);
	CHECK(warm_parse_ranges("18446744073709551615+2 a", &rest, r, 4) < 0);
	CHECK(warm_parse_ranges("1-2 a", &rest, r, 4) < 0);
	CHECK(warm_parse_ranges("+2 a", &rest, r, 4) < 0);
	CHECK(warm_parse_ranges("1+1,2+1,3+1,4+1,5+1 a", &rest, r, 4) < 0);
	CHECK(warm_path_ok("web/f1.bin") && warm_path_ok("a"));
	CHECK(!warm_path_ok("") && !warm_path_ok("/etc/passwd") && !warm_path_ok("../x"));
	CHECK(!warm_path_ok("a/../../x") && !warm_path_ok("a//b") && !warm_path_ok("./a"));
	struct host_cmd c;
	char err[160];
	CHECK(parse("{\"cmd\":\"prefetch\",\"id\":3,\"last\":1,\"files\":\"0+1 a\\n\"}", &c, err) == 0);
	CHECK(c.has_last && c.last == 1 && c.has_files && strcmp(c.files, "0+1 a\n") == 0);
	CHECK(parse("{\"cmd\":\"prefetch\",\"last\":2}", &c, err) < 0);
	CHECK(parse("{\"cmd\":\"prefetch\",\"files\":7}", &c, err) < 0);
}

/* The read-back over real files: listed pages of files that exist are read (ranges
 * past a file's end are clipped), bad lines and missing or escaping paths are not. */
static void test_prefetch(void)
{
	char dir[] = "/tmp/rebound-agent-test-XXXXXX", path[160], list[160];
	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/f", dir);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	static char page[4096];
	for (int i = 0; i < 10; i++)
		CHECK(write(fd, page, sizeof(page)) == (ssize_t)sizeof(page));
	close(fd);
	snprintf(list, sizeof(list), "%s/list", dir);
	FILE *f = fopen(list, "w");
	fputs("0+3,5+2 f\n9+5 f\nbad line\n0+1 nope\n0+1 ../f\n", f);
	fclose(f);
	struct warm_counts n;
	warm_prefetch_at(dir, list, &n);
	CHECK(n.files == 2 && n.missing == 1 && n.skipped == 2);
	CHECK(n.pages == 3 + 2 + 1 && n.bytes == n.pages * 4096);
	warm_prefetch_at(dir, "/nonexistent/list", &n);
	CHECK(n.files == 0 && n.pages == 0);
	unlink(path);
	unlink(list);
	rmdir(dir);
}

static void test_peer_config(void)
{
	struct config cfg;
	char err[200], why[64];
	struct peer_addr pa[PEER_MAX];
	CHECK(parse_cmdline("rebound.workload=peer", &cfg, err, sizeof(err)) == 0);
	CHECK(cfg.nworkloads == 1 && cfg.workloads[0] == WL_PEER && cfg.peer_port == 7400 && cfg.npeers == 0);
	CHECK(cfg.peer_hb_ms == 200 && cfg.peer_dead_ms == 1000 && cfg.peer_req_ms == 100 && cfg.peer_req_bytes == 1024);
	CHECK(service_port(&cfg) == 7400 && workload_port(&cfg, WL_PEER) == 7400);
	CHECK(parse_cmdline("rebound.workload=peer,kv rebound.port=9000 rebound.peer_port=7500 "
			    "rebound.peers=10.77.0.11:7400,10.77.0.12:7401 rebound.peer_hb_ms=50 rebound.peer_dead_ms=300 "
			    "rebound.peer_req_ms=0 rebound.peer_req_bytes=0",
			    &cfg, err, sizeof(err)) == 0);
	CHECK(service_port(&cfg) == 7500 && workload_port(&cfg, WL_KV) == 9000);
	CHECK(cfg.npeers == 2 && cfg.peers[0].ip == 0x0a4d000b && cfg.peers[0].port == 7400 && cfg.peers[1].port == 7401);
	CHECK(cfg.peer_hb_ms == 50 && cfg.peer_dead_ms == 300 && cfg.peer_req_ms == 0 && cfg.peer_req_bytes == 0);
	char name[24];
	peer_addr_str(&cfg.peers[1], name, sizeof(name));
	CHECK(strcmp(name, "10.77.0.12:7401") == 0);
	CHECK(parse_cmdline("rebound.peers=", &cfg, err, sizeof(err)) == 0 && cfg.npeers == 0);

	/* Refused with a reason, and the workload runs without peers. */
	CHECK(parse_cmdline("rebound.workload=peer rebound.peers=garbage", &cfg, err, sizeof(err)) == 1);
	CHECK(cfg.npeers == 0 && strstr(err, "rebound.peers=garbage: entry 1 is not IPv4:PORT") != NULL);
	CHECK(parse_cmdline("rebound.peers=10.0.0.1:7400,10.0.0.2:0", &cfg, err, sizeof(err)) == 1);
	CHECK(cfg.npeers == 0 && strstr(err, "entry 2: port not in 1-65535") != NULL);
	CHECK(parse_cmdline("rebound.peer_port=0 rebound.peer_port=65536 rebound.peer_hb_ms=1 rebound.peer_dead_ms=x "
			    "rebound.peer_req_ms=5 rebound.peer_req_bytes=65537",
			    &cfg, err, sizeof(err)) == 6);
	CHECK(strstr(err, "rebound.peer_port=0: not in 1-65535") != NULL);
	CHECK(cfg.peer_port == 7400 && cfg.peer_hb_ms == 200 && cfg.peer_dead_ms == 1000 && cfg.peer_req_ms == 100 &&
	      cfg.peer_req_bytes == 1024);
	static const char *bad[] = { "garbage", "1.2.3.4", "1.2.3.4:", ":80", "1.2.3:80", "1.2.3.4.5:80", "256.1.1.1:80",
				     "01.2.3.4:80x", "1.2.3.4:99999", "1.2.3.4:-1", "1.2.3.4:80,", ",1.2.3.4:80",
				     "1.2.3.4:80,,1.2.3.5:80", "1.2.3.4:80,1.2.3.4:80", "1.2.3.4 :80", "[::1]:80" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int n = parse_peers(bad[i], pa, PEER_MAX, why, sizeof(why));
		if (n >= 0)
			fprintf(stderr, "accepted peers %s\n", bad[i]);
		CHECK(n < 0 && why[0] != '\0');
	}
	CHECK(parse_peers("1.2.3.4:80,1.2.3.4:81", pa, PEER_MAX, why, sizeof(why)) == 2);
	CHECK(parse_peers("1.2.3.4:80,1.2.3.4:81,1.2.3.4:82", pa, 2, why, sizeof(why)) < 0 && strstr(why, "more than 2"));
	/* Too many peers on the command line: 17 entries, refused whole. */
	char line[1024];
	size_t n = (size_t)snprintf(line, sizeof(line), "rebound.peers=");
	for (int i = 0; i <= PEER_MAX; i++)
		n += (size_t)snprintf(line + n, sizeof(line) - n, "%s10.77.0.%d:7400", i ? "," : "", i + 1);
	CHECK(parse_cmdline(line, &cfg, err, sizeof(err)) == 1 && cfg.npeers == 0 && strstr(err, "more than 16 peers"));
	/* 16 of the longest form fit in one word (the old 256-byte word would have cut them). */
	n = (size_t)snprintf(line, sizeof(line), "rebound.peers=");
	for (int i = 0; i < PEER_MAX; i++)
		n += (size_t)snprintf(line + n, sizeof(line) - n, "%s255.255.255.%d:65535", i ? "," : "", 200 + i);
	CHECK(parse_cmdline(line, &cfg, err, sizeof(err)) == 0 && cfg.npeers == PEER_MAX);
	/* A word longer than the parser's buffer is refused, not cut. */
	char huge[1500];
	memset(huge, '1', sizeof(huge) - 1);
	memcpy(huge, "rebound.peers=", 14);
	huge[sizeof(huge) - 1] = '\0';
	CHECK(parse_cmdline(huge, &cfg, err, sizeof(err)) == 1 && cfg.npeers == 0 && strstr(err, "too long"));
}

static void peer_reply(const char *in, const char *want)
{
	char out[256];
	CHECK(peer_exec(in, strlen(in), out, sizeof(out)) == 0);
	if (strcmp(out, want) != 0)
		fprintf(stderr, "peer %s: got %s", in, out);
	CHECK(strcmp(out, want) == 0);
}

static void test_peer_protocol(void)
{
	char out[256], want[64];
	peer_reply("HB 0", "HBACK 0\n");
	peer_reply("HB 18446744073709551615", "HBACK 18446744073709551615\n");
	snprintf(want, sizeof(want), "REP 7 %016llx\n", (unsigned long long)peer_checksum("abc", 3));
	peer_reply("REQ 7 abc", want);
	CHECK(peer_checksum("abc", 3) == 0xe71fa2190541574bULL); /* FNV-1a 64 of "abc" */
	snprintf(want, sizeof(want), "REP 8 %016llx\n", (unsigned long long)peer_checksum("", 0));
	peer_reply("REQ 8 ", want);
	static const char *bad[] = { "", "HB", "HB ", "HB x", "HB 1 2", "HB 18446744073709551616", "REQ", "REQ 1",
				     "REQ x y", "hb 1", "HBACK 1", "STAT", "QUERY" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		peer_reply(bad[i], "ERR usage: HB n | REQ id payload | QUERY id | STATS\n");
	CHECK(peer_exec("STATS", 5, out, sizeof(out)) < 0 && peer_exec("QUERY 1", 7, out, sizeof(out)) < 0);

	const char *snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n"
			   "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens RetransSegs InErrs\n"
			   "Tcp: 1 200 120000 -1 42 1234 0\n"
			   "Udp: InDatagrams RetransSegs\nUdp: 5 6\n";
	uint64_t v;
	CHECK(snmp_counter(snmp, "Tcp", "RetransSegs", &v) == 0 && v == 1234);
	CHECK(snmp_counter(snmp, "Udp", "RetransSegs", &v) == 0 && v == 6);
	CHECK(snmp_counter(snmp, "Tcp", "InErrs", &v) == 0 && v == 0);
	CHECK(snmp_counter(snmp, "Tcp", "MaxConn", &v) < 0); /* -1 is no counter */
	CHECK(snmp_counter(snmp, "Tcp", "Retrans", &v) < 0);
	CHECK(snmp_counter(snmp, "Icmp", "InMsgs", &v) < 0);
	CHECK(snmp_counter("Tcp: A RetransSegs\n", "Tcp", "RetransSegs", &v) < 0);
	CHECK(snmp_counter("Tcp: A RetransSegs\nTcp: 1\n", "Tcp", "RetransSegs", &v) < 0);
	CHECK(snmp_counter("Tcp: RetransSegs A\nTcp: 9 1", "Tcp", "RetransSegs", &v) == 0 && v == 9);
	char real[8192];
	if (read_small_file("/proc/net/snmp", real, sizeof(real)) > 0)
		CHECK(snmp_counter(real, "Tcp", "RetransSegs", &v) == 0);
}

/* ---- the peer workload's loop, in forked processes on 127.0.0.1 ---- */

static uint64_t test_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static void node_start(struct node *nd)
{
	int fds[2];
	CHECK(pipe2(fds, O_CLOEXEC) == 0);
	pid_t parent = getpid();
	nd->pid = fork();
	if (nd->pid == 0) {
		static struct config cfg;
		char err[200];
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		signal(SIGPIPE, SIG_IGN);
		close(fds[0]);
		fcntl(fds[1], F_SETFL, O_NONBLOCK);
		if (parse_cmdline(nd->cmdline, &cfg, err, sizeof(err)) != 0) {
			fprintf(stderr, "node: %s\n", err);
			_exit(2);
		}
		struct wl_ctx ctx = { &cfg, fds[1] };
		_exit(wl_peer(&ctx));
	}
	close(fds[1]);
	nd->fd = fds[0];
	nd->len = 0;
}

void node_kill(struct node *nd)
{
	if (nd->pid <= 0)
		return;
	kill(nd->pid, SIGKILL);
	waitpid(nd->pid, NULL, 0);
	close(nd->fd);
	nd->pid = 0;
}

int node_wait(struct node *nd, int timeout_ms, char *out, size_t cap, ...)
{
	uint64_t until = test_ms() + (uint64_t)timeout_ms;
	for (;;) {
		char *nl;
		while ((nl = memchr(nd->buf, '\n', nd->len))) {
			*nl = '\0';
			int all = 1;
			va_list ap;
			va_start(ap, cap);
			for (const char *s; (s = va_arg(ap, const char *));)
				all &= strstr(nd->buf, s) != NULL;
			va_end(ap);
			if (all) {
				size_t l = strlen(nd->buf) < cap - 1 ? strlen(nd->buf) : cap - 1;
				memcpy(out, nd->buf, l);
				out[l] = '\0';
			}
			size_t used = (size_t)(nl + 1 - nd->buf);
			memmove(nd->buf, nl + 1, nd->len - used);
			nd->len -= used;
			if (all)
				return 1;
		}
		uint64_t now = test_ms();
		if (now >= until)
			return 0;
		struct pollfd p = { nd->fd, POLLIN, 0 };
		if (poll(&p, 1, (int)(until - now)) <= 0)
			continue;
		ssize_t n = read(nd->fd, nd->buf + nd->len, sizeof(nd->buf) - 1 - nd->len);
		if (n <= 0)
			return 0;
		nd->len += (size_t)n;
	}
}

uint64_t json_num(const char *line, const char *key)
{
	char k[64];
	snprintf(k, sizeof(k), "\"%s\":", key);
	const char *p = strstr(line, k);
	return p ? strtoull(p + strlen(k), NULL, 10) : UINT64_MAX;
}

/* Sends one line to a node's port and returns its one-line answer in out. */
static int ask(int port, const char *line, char *out, size_t cap)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct timeval tv = { 3, 0 };
	size_t len = 0;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || write_all(fd, line, strlen(line)) < 0) {
		close(fd);
		return -1;
	}
	out[0] = '\0';
	while (len + 1 < cap && !memchr(out, '\n', len)) {
		ssize_t n = read(fd, out + len, cap - 1 - len);
		if (n <= 0)
			break;
		len += (size_t)n;
		out[len] = '\0';
	}
	close(fd);
	return memchr(out, '\n', len) ? 0 : -1;
}

/* Three nodes all-to-all with fast timers (heartbeat 50 ms, dead after 400 ms). */
static void test_peer_cluster(void)
{
	struct node nd[4];
	char line[4096], want[64], name[3][32];
	int base = 20000 + (int)(getpid() % 15000) * 3;
	memset(nd, 0, sizeof(nd));
	for (int i = 0; i < 3; i++) {
		nd[i].port = base + i;
		snprintf(name[i], sizeof(name[i]), "\"127.0.0.1:%d\"", nd[i].port);
	}
	for (int i = 0; i < 3; i++) {
		snprintf(nd[i].cmdline, sizeof(nd[i].cmdline),
			 "rebound.workload=peer rebound.peer_port=%d rebound.peers=127.0.0.1:%d,127.0.0.1:%d "
			 "rebound.peer_hb_ms=50 rebound.peer_dead_ms=400 rebound.peer_req_ms=50 rebound.peer_req_bytes=700",
			 nd[i].port, nd[(i + 1) % 3].port, nd[(i + 2) % 3].port);
		node_start(&nd[i]);
	}
	for (int i = 0; i < 3; i++)
		CHECK(node_wait(&nd[i], 3000, line, sizeof(line), "READY", NULL));

	/* Steady state: everyone connected, requests answered, nobody dead. */
	for (int i = 0; i < 3; i++) {
		int ok = node_wait(&nd[i], 3000, line, sizeof(line), "\"type\":\"peer\"", "\"connected\":2", "\"dead\":[]", NULL);
		if (ok)
			ok = node_wait(&nd[i], 1500, line, sizeof(line), "\"type\":\"peer\"", NULL);
		CHECK(ok);
		if (!ok)
			continue;
		CHECK(json_num(line, "peers") == 2 && json_num(line, "connected") == 2 && strstr(line, "\"dead\":[]"));
		CHECK(json_num(line, "req_answered") > 10 && json_num(line, "req_bad") == 0);
		CHECK(json_num(line, "hb_acked") > 10 && json_num(line, "declared_dead") == 0);
		CHECK(json_num(line, "rtt_max_us") < 1000000 && json_num(line, "retrans_segs") != UINT64_MAX);
	}

	/* A host client's QUERY fans out to both peers; STATS; the peer protocol itself. */
	CHECK(ask(nd[0].port, "QUERY q1\n", line, sizeof(line)) == 0 && strncmp(line, "RESULT q1 2 ", 12) == 0);
	CHECK(ask(nd[0].port, "STATS\n", line, sizeof(line)) == 0 && strncmp(line, "{\"type\":\"peer\",\"peers\":2,", 25) == 0);
	CHECK(ask(nd[1].port, "HB 41\n", line, sizeof(line)) == 0 && strcmp(line, "HBACK 41\n") == 0);
	CHECK(ask(nd[1].port, "hello\n", line, sizeof(line)) == 0 && strncmp(line, "ERR usage", 9) == 0);
	CHECK(ask(nd[1].port, "QUERY \n", line, sizeof(line)) == 0 && strncmp(line, "ERR usage", 9) == 0);

	/* Stop node 2 (as a paused VM: its kernel keeps the connections): the others declare it
	 * dead but keep their connections; it comes back alive when continued, and it does not
	 * take its own pause for its peers' silence. */
	kill(nd[2].pid, SIGSTOP);
	for (int i = 0; i < 2; i++) {
		int ok = node_wait(&nd[i], 3000, line, sizeof(line), "\"type\":\"peer_event\"", "\"event\":\"dead\"", NULL);
		CHECK(ok && strstr(line, name[2] + 1));
		uint64_t silent = json_num(line, "silent_ms");
		CHECK(silent >= 400 && silent < 1000);
		snprintf(want, sizeof(want), "\"dead\":[%s]", name[2]);
		CHECK(node_wait(&nd[i], 1500, line, sizeof(line), "\"type\":\"peer\"", want, NULL));
		CHECK(json_num(line, "declared_dead") == 1 && json_num(line, "connected") == 2);
		/* The heartbeats sent after it last spoke time out a little later. */
		CHECK(node_wait(&nd[i], 1500, line, sizeof(line), "\"type\":\"peer\"", want, NULL));
		CHECK(json_num(line, "hb_timeouts") >= 1);
	}
	usleep(300 * 1000); /* stopped well over peer_dead_ms in all */
	kill(nd[2].pid, SIGCONT);
	for (int i = 0; i < 2; i++) {
		CHECK(node_wait(&nd[i], 2000, line, sizeof(line), "\"type\":\"peer_event\"", "\"event\":\"alive\"", name[2] + 1, NULL));
		CHECK(json_num(line, "silent_ms") >= 1000);
	}
	/* Its first report after the pause (reports are not sent while stopped). */
	CHECK(node_wait(&nd[2], 3000, line, sizeof(line), "\"type\":\"peer\"", NULL));
	CHECK(node_wait(&nd[2], 1500, line, sizeof(line), "\"type\":\"peer\"", NULL));
	CHECK(json_num(line, "declared_dead") == 0 && strstr(line, "\"dead\":[]") && json_num(line, "connected") == 2);

	/* Kill node 2: the others declare it dead about peer_dead_ms after they last heard it. */
	node_kill(&nd[2]);
	uint64_t t0 = test_ms();
	for (int i = 0; i < 2; i++) {
		int ok = node_wait(&nd[i], 3000, line, sizeof(line), "\"type\":\"peer_event\"", "\"event\":\"dead\"", NULL);
		CHECK(ok && strstr(line, name[2] + 1));
		if (i == 0)
			CHECK(test_ms() - t0 < 1500);
		uint64_t silent = json_num(line, "silent_ms");
		CHECK(silent >= 400 && silent < 1000);
		/* ... and the report that follows says so. */
		snprintf(want, sizeof(want), "\"dead\":[%s]", name[2]);
		CHECK(node_wait(&nd[i], 1500, line, sizeof(line), "\"type\":\"peer\"", want, NULL));
		CHECK(json_num(line, "declared_dead") == 2 && json_num(line, "connected") == 1);
	}
	CHECK(ask(nd[0].port, "QUERY q2\n", line, sizeof(line)) == 0 && strncmp(line, "RESULT q2 1 ", 12) == 0);

	/* Restart it: alive again once it answers (reconnect backoff is at most 1 s). */
	node_start(&nd[2]);
	CHECK(node_wait(&nd[2], 3000, line, sizeof(line), "READY", NULL));
	for (int i = 0; i < 2; i++) {
		CHECK(node_wait(&nd[i], 3000, line, sizeof(line), "\"type\":\"peer_event\"", "\"event\":\"alive\"", name[2] + 1, NULL));
		CHECK(node_wait(&nd[i], 1500, line, sizeof(line), "\"type\":\"peer\"", "\"dead\":[]", NULL));
		CHECK(json_num(line, "connected") == 2);
	}
	CHECK(node_wait(&nd[2], 3000, line, sizeof(line), "\"type\":\"peer\"", "\"connected\":2", NULL));
	CHECK(ask(nd[2].port, "QUERY q3\n", line, sizeof(line)) == 0 && strncmp(line, "RESULT q3 2 ", 12) == 0);

	/* A pure server (no peers) answers a QUERY at once. */
	nd[3].port = base + 3;
	snprintf(nd[3].cmdline, sizeof(nd[3].cmdline), "rebound.workload=peer rebound.peer_port=%d rebound.peers=", nd[3].port);
	node_start(&nd[3]);
	CHECK(node_wait(&nd[3], 3000, line, sizeof(line), "READY", NULL));
	CHECK(ask(nd[3].port, "QUERY solo\n", line, sizeof(line)) == 0 && strcmp(line, "RESULT solo 0 0\n") == 0);
	for (int i = 0; i < 4; i++)
		node_kill(&nd[i]);
}

int main(void)
{
	test_peer_config();
	test_peer_protocol();
	test_peer_cluster();
	test_warm();
	test_prefetch();
	test_io();
	test_files_config();
	test_files_samplers();
	test_files_signature();
	test_files_run();
	test_files_churn();
	test_json_valid();
	test_json_malformed();
	test_json_fuzz();
	test_json_writer();
	test_sizes_and_cmdline();
	test_web_paths();
	test_kv();
	test_proc_formats();
	test_counter();
	if (failures) {
		fprintf(stderr, "%d check(s) failed\n", failures);
		return 1;
	}
	printf("agent unit tests passed\n");
	return 0;
}
