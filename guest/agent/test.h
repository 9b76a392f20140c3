/* What the agent's unit tests share (test_agent.c, test_files.c). */
#ifndef REBOUND_TEST_H
#define REBOUND_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

extern int failures;

#define CHECK(cond)                                                                   \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
			failures++;                                                   \
		}                                                                     \
	} while (0)

/* A workload in a forked process and what it reported so far. */
struct node {
	pid_t pid;
	int fd; /* its reports (the agent's end of the workload pipe) */
	int port;
	char cmdline[512];
	char buf[16384];
	size_t len;
};

void node_kill(struct node *nd);
/* Waits up to timeout_ms for a line of the node's reports holding every one of the
 * NULL-terminated strings; copies it into out. Returns 1 if found. */
int node_wait(struct node *nd, int timeout_ms, char *out, size_t cap, ...);
/* The number after "key": in a JSON line; UINT64_MAX when absent. */
uint64_t json_num(const char *line, const char *key);

void test_files_config(void);
void test_files_samplers(void);
void test_files_signature(void);
void test_files_run(void);
void test_files_churn(void);

#endif
