/* The verified producers of a consumer (see wsync_peers.h). */
#include "wsync_peers.h"

#include <stdio.h>
#include <string.h>

void wsync_peers_init(wsync_peers_t *p)
{
    memset(p, 0, sizeof(*p));
    pthread_mutex_init(&p->lock, NULL);
}

void wsync_peers_destroy(wsync_peers_t *p)
{
    pthread_mutex_destroy(&p->lock);
}

int wsync_peers_add(wsync_peers_t *p, int64_t pid)
{
    int rc = -1;
    pthread_mutex_lock(&p->lock);
    for (int pass = 0; pass < 2 && rc != 0; pass++)
        for (unsigned i = 0; i < WSYNC_PEERS_MAX; i++) {
            if (pass == 0 ? p->refs[i] != 0 && p->pid[i] == pid : p->refs[i] == 0) {
                p->pid[i] = pid;
                p->refs[i]++;
                rc = 0;
                break;
            }
        }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

void wsync_peers_drop(wsync_peers_t *p, int64_t pid)
{
    pthread_mutex_lock(&p->lock);
    for (unsigned i = 0; i < WSYNC_PEERS_MAX; i++)
        if (p->refs[i] != 0 && p->pid[i] == pid) {
            p->refs[i]--;
            break;
        }
    pthread_mutex_unlock(&p->lock);
}

int wsync_peers_has(wsync_peers_t *p, int64_t pid)
{
    int found = 0;
    pthread_mutex_lock(&p->lock);
    for (unsigned i = 0; i < WSYNC_PEERS_MAX && !found; i++)
        found = pid > 0 && p->refs[i] != 0 && p->pid[i] == pid;
    pthread_mutex_unlock(&p->lock);
    return found;
}

void wsync_peers_show(wsync_peers_t *p, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = '\0';
    pthread_mutex_lock(&p->lock);
    for (unsigned i = 0; i < WSYNC_PEERS_MAX && at + 1 < cap; i++)
        if (p->refs[i] != 0) {
            int n = snprintf(buf + at, cap - at, "%s%lld", at ? ", " : "", (long long)p->pid[i]);
            at += n > 0 ? (size_t)n : 0;
        }
    pthread_mutex_unlock(&p->lock);
    if (buf[0] == '\0')
        snprintf(buf, cap, "none");
}
