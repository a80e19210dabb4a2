/* Exit-time unlink of unretired staging segments (a destructor: runs at exit() and dlclose). */
#include "cpu_unlink.h"

#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

static pthread_mutex_t wsync_cpu_unlink_lock = PTHREAD_MUTEX_INITIALIZER;
static wsync_cpu_unlink_t *wsync_cpu_unlink_head;

void wsync_cpu_unlink_register(wsync_cpu_unlink_t *node, const char *name)
{
    snprintf(node->name, sizeof(node->name), "%s", name);
    node->pid = getpid();
    node->prev = NULL;
    pthread_mutex_lock(&wsync_cpu_unlink_lock);
    node->next = wsync_cpu_unlink_head;
    if (node->next != NULL)
        node->next->prev = node;
    wsync_cpu_unlink_head = node;
    pthread_mutex_unlock(&wsync_cpu_unlink_lock);
}

void wsync_cpu_unlink_unregister(wsync_cpu_unlink_t *node)
{
    pthread_mutex_lock(&wsync_cpu_unlink_lock);
    if (node->prev != NULL)
        node->prev->next = node->next;
    else if (wsync_cpu_unlink_head == node)
        wsync_cpu_unlink_head = node->next;
    if (node->next != NULL)
        node->next->prev = node->prev;
    node->prev = node->next = NULL;
    pthread_mutex_unlock(&wsync_cpu_unlink_lock);
}

__attribute__((destructor)) static void wsync_cpu_unlink_at_exit(void)
{
    pid_t self = getpid();

    pthread_mutex_lock(&wsync_cpu_unlink_lock);
    for (wsync_cpu_unlink_t *n = wsync_cpu_unlink_head; n != NULL; n = n->next)
        if (n->pid == self)
            shm_unlink(n->name);
    pthread_mutex_unlock(&wsync_cpu_unlink_lock);
}
