/* The producers a consumer has verified: pids read from the control blocks it maps (segments of
 * our uid, mode 0600, written by their creator). A manifest's pid is trusted for taking a
 * process's descriptors (pidfd_getfd) only when it is one of these: a direct segment names the
 * producer of a buffer the engine already mapped, never any process it could trace. */
#ifndef WSYNC_COMMON_PEERS_H
#define WSYNC_COMMON_PEERS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define WSYNC_PEERS_MAX 64

typedef struct wsync_peers {
    pthread_mutex_t lock;
    int64_t pid[WSYNC_PEERS_MAX];
    uint32_t refs[WSYNC_PEERS_MAX];
} wsync_peers_t;

void wsync_peers_init(wsync_peers_t *p);
void wsync_peers_destroy(wsync_peers_t *p);
/* One more mapping of `pid`'s control block; 0, or -1 when WSYNC_PEERS_MAX pids are held. */
int wsync_peers_add(wsync_peers_t *p, int64_t pid);
/* One mapping fewer. */
void wsync_peers_drop(wsync_peers_t *p, int64_t pid);
/* 1 when pid > 0 is a verified producer. */
int wsync_peers_has(wsync_peers_t *p, int64_t pid);
/* "4711, 4712" (or "none") into buf, for an error message. */
void wsync_peers_show(wsync_peers_t *p, char *buf, size_t cap);

#endif
