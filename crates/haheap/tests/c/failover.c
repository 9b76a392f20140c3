/*
 * Failover as a C program sees it, built with -std=c89 -pedantic against haheap.h.
 *
 *   failover ENGINE BACKUP primary    commits tx 1 and 2, prints "committed 2", waits for a
 *                                     line on stdin (meanwhile another primary takes over),
 *                                     then expects HAHEAP_ERR_FENCED from every call that
 *                                     would commit
 *   failover ENGINE BACKUP takeover   takes over, prints the replica's tx id, commits one
 *
 * Exits 0 when every call returned what the header promises, 1 otherwise.
 */
#include <stdio.h>
#include <string.h>

#include "haheap.h"

static int failed = 0;
/* The "log" engine sees only haheap_write; the page engines also see direct stores. */
static int direct = 1;

static void expect(const char *what, int got, int want)
{
    if (got != want) {
        printf("FAIL %s: %d, expected %d (%s)\n", what, got, want, haheap_last_error());
        failed = 1;
    }
}

/* Stores `byte` at `offset` in the open transaction. */
static void put(HaHeap *h, size_t offset, unsigned char byte)
{
    if (direct) {
        haheap_base(h)[offset] = byte;
    } else {
        expect("write", haheap_write(h, offset, &byte, 1), HAHEAP_OK);
    }
}

/* One transaction that stores `byte` at `offset`. */
static int store(HaHeap *h, size_t offset, unsigned char byte, HaheapTxStats *st)
{
    int rc = haheap_tstart(h);
    if (rc != HAHEAP_OK) {
        return rc;
    }
    put(h, offset, byte);
    return haheap_tend(h, st);
}

static int primary(const char *engine, const char *backup)
{
    HaHeap *h = NULL;
    HaheapTxStats st;
    char line[16];
    expect("create", haheap_create(1 << 16, engine, backup, 0, &h), HAHEAP_OK);
    if (h == NULL) {
        return 1;
    }
    expect("id before the first tx", (int)haheap_committed_tx_id(h), 0);
    expect("tx 1", store(h, 0, 1, &st), HAHEAP_OK);
    expect("tx 2", store(h, 4096, 2, &st), HAHEAP_OK);
    printf("committed %lu\n", (unsigned long)haheap_committed_tx_id(h));
    fflush(stdout);
    if (fgets(line, sizeof line, stdin) == NULL) {
        return 1;
    }
    /* The fence is learnt at the next commit; from then on it is final. */
    expect("tstart before the fence is known", haheap_tstart(h), HAHEAP_OK);
    put(h, 8, 3);
    expect("tend", haheap_tend(h, &st), HAHEAP_ERR_FENCED);
    printf("fenced: %s\n", haheap_last_error());
    expect("tend again", haheap_tend(h, &st), HAHEAP_ERR_FENCED);
    expect("tstart", haheap_tstart(h), HAHEAP_ERR_FENCED);
    expect("abort", haheap_abort(h), HAHEAP_ERR_FENCED);
    expect("flush", haheap_flush(h), HAHEAP_ERR_FENCED);
    expect("destroy", haheap_destroy(h), HAHEAP_OK);
    return failed;
}

static int takeover(const char *engine, const char *backup)
{
    HaHeap *h = NULL;
    HaheapTxStats st;
    unsigned long at;
    expect("takeover", haheap_takeover(engine, backup, 0, &h), HAHEAP_OK);
    if (h == NULL) {
        return 1;
    }
    at = (unsigned long)haheap_committed_tx_id(h);
    printf("took over at tx %lu\n", at);
    expect("tx 2's byte", haheap_base(h)[4096], 2);
    expect("next tx", store(h, 12288, 4, &st), HAHEAP_OK);
    expect("its id", (int)st.tx_id, (int)at + 1);
    printf("committed %lu\n", (unsigned long)haheap_committed_tx_id(h));
    expect("destroy", haheap_destroy(h), HAHEAP_OK);
    return failed;
}

int main(int argc, char **argv)
{
    direct = argc < 2 || strcmp(argv[1], "log") != 0;
    if (argc == 4 && strcmp(argv[3], "primary") == 0) {
        return primary(argv[1], argv[2]);
    }
    if (argc == 4 && strcmp(argv[3], "takeover") == 0) {
        return takeover(argv[1], argv[2]);
    }
    fprintf(stderr, "usage: failover ENGINE BACKUP primary|takeover\n");
    return 2;
}
