/* Unit tests for the agent's parsers, run on the host by `make check` (with ASan/UBSan):
 * the JSON command reader against malformed and hostile lines, sizes, the kernel command
 * line, web paths, the kv protocol and the /sys and /proc formats. */
#include "agent.h"
#include "json.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;

#define CHECK(cond)                                                                   \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
			failures++;                                                   \
		}                                                                     \
	} while (0)

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

int main(void)
{
	test_warm();
	test_prefetch();
	test_io();
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
