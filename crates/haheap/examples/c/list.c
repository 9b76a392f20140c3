/* A linked list kept in a haheap heap, updated in transactions, from C.
 *
 * Usage: list [ENGINE [BACKUP [takeover]]]   ENGINE: auto (default), mprotect, uffd, scan, log
 *        BACKUP: tcp:HOST:PORT or unix:PATH of a running backup
 * Every update goes through haheap_write, so it works with every engine, "log" included.
 * With "takeover" the program does not build the list: it becomes the new primary from the
 * backup's replica and checks that the list a previous run committed is all there.
 * Exit status 0 when the list holds exactly what the committed transactions put there.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "haheap.h"

/* Heap layout: a root at offset 0, nodes from offset 64. Offsets, not pointers, so the
 * heap means the same thing at another address (a backup, a new primary). */
struct root { uint64_t head, next_free, count; };
struct node { uint64_t value, next; };
#define NODES 64

static int check(int rc, const char *what)
{
    if (rc != HAHEAP_OK) {
        fprintf(stderr, "list: %s: error %d: %s\n", what, rc, haheap_last_error());
        exit(1);
    }
    return rc;
}

static struct root read_root(HaHeap *h)
{
    struct root r;
    memcpy(&r, haheap_base(h), sizeof r);
    return r;
}

static void push(HaHeap *h, uint64_t value)
{
    struct root r = read_root(h);
    struct node n = { value, r.head };
    uint64_t at = r.next_free;
    check(haheap_write(h, at, (const uint8_t *)&n, sizeof n), "write node");
    r.head = at;
    r.next_free = at + sizeof n;
    r.count++;
    check(haheap_write(h, 0, (const uint8_t *)&r, sizeof r), "write root");
}

static uint64_t pop(HaHeap *h)
{
    struct root r = read_root(h);
    struct node n;
    memcpy(&n, haheap_base(h) + r.head, sizeof n);
    r.head = n.next;
    r.count--;
    check(haheap_write(h, 0, (const uint8_t *)&r, sizeof r), "write root");
    return n.value;
}

/* Walks the list; returns the number of nodes and their sum. */
static uint64_t walk(HaHeap *h, uint64_t *sum)
{
    const uint8_t *base = haheap_base(h);
    uint64_t n = 0, at = read_root(h).head;
    *sum = 0;
    while (at != 0 && n <= NODES) {
        struct node node;
        memcpy(&node, base + at, sizeof node);
        *sum += node.value;
        at = node.next;
        n++;
    }
    return n;
}

int main(int argc, char **argv)
{
    const char *engine = argc > 1 ? argv[1] : "auto";
    const char *backup = argc > 2 ? argv[2] : NULL;
    HaHeap *h = NULL;
    HaheapTxStats st;
    uint64_t sum, n, i;
    /* With a backup: if it dies and restarts, haheap_tend waits for it (up to 10 s)
     * instead of returning HAHEAP_ERR_IN_DOUBT at once. */
    uint32_t flags = backup ? HAHEAP_FLAG_BLOCK | (10u << HAHEAP_BLOCK_SECS_SHIFT) : 0;

    if (argc > 3 && strcmp(argv[3], "takeover") == 0) {
        check(haheap_takeover(engine, backup, flags, &h), "takeover");
        n = walk(h, &sum);
        printf("takeover: engine=%s, %" PRIu64 " nodes, sum %" PRIu64 "\n", haheap_engine_name(h), n, sum);
        if (n != 19 || sum != 210) {
            fprintf(stderr, "list: replica lost committed transactions\n");
            return 1;
        }
        check(haheap_tstart(h), "tstart"); /* the new primary carries on */
        push(h, 7);
        check(haheap_tend(h, &st), "tend");
        printf("takeover: continued at tx %" PRIu64 "\n", st.tx_id);
        check(haheap_destroy(h), "destroy");
        printf("takeover ok\n");
        return 0;
    }

    check(haheap_create(1 << 20, engine, backup, flags, &h), "create");
    printf("engine=%s (%s)\n", haheap_engine_name(h), haheap_engine_reason(h));

    check(haheap_tstart(h), "tstart");
    struct root init = { 0, 64, 0 };
    check(haheap_write(h, 0, (const uint8_t *)&init, sizeof init), "init");
    check(haheap_tend(h, &st), "tend");

    for (i = 1; i <= 20; i++) { /* 20 single-insert transactions */
        check(haheap_tstart(h), "tstart");
        push(h, i);
        check(haheap_tend(h, &st), "tend");
    }
    printf("last insert: tx %" PRIu64 ", %" PRIu64 " pages, %" PRIu64 " bytes shipped\n",
           st.tx_id, st.pages, st.bytes_shipped);

    check(haheap_tstart(h), "tstart"); /* one transaction: pop two, push one */
    uint64_t a = pop(h), b = pop(h);
    push(h, a + b);
    check(haheap_tend(h, &st), "tend");

    check(haheap_tstart(h), "tstart"); /* aborted: must leave no trace */
    push(h, 1000);
    pop(h);
    pop(h);
    check(haheap_abort(h), "abort");

    /* Misuse is refused with a code and a message, never a crash. */
    check(haheap_tstart(h), "tstart");
    if (haheap_tstart(h) != HAHEAP_ERR_NESTED) { fprintf(stderr, "nested tstart accepted\n"); return 1; }
    uint8_t x = 1;
    if (haheap_write(h, haheap_size(h), &x, 1) != HAHEAP_ERR_OUT_OF_BOUNDS) {
        fprintf(stderr, "out-of-bounds write accepted\n");
        return 1;
    }
    printf("refused as expected: %s\n", haheap_last_error());
    check(haheap_abort(h), "abort");
    if (haheap_tend(h, NULL) != HAHEAP_ERR_NO_TRANSACTION) { fprintf(stderr, "tend without tstart accepted\n"); return 1; }
    if (haheap_tstart(NULL) != HAHEAP_ERR_NULL) { fprintf(stderr, "null heap accepted\n"); return 1; }

    n = walk(h, &sum);
    printf("list: %" PRIu64 " nodes, sum %" PRIu64 "\n", n, sum);
    if (n != 19 || sum != 210 || read_root(h).count != 19) {
        fprintf(stderr, "list: wrong contents (want 19 nodes, sum 210)\n");
        return 1;
    }
    check(haheap_destroy(h), "destroy");
    printf("list ok\n");
    return 0;
}
