/* wsync-engine: the reference engine worker, and `wsync-engine demo` (a trainer plus one engine
 * process per TP rank).
 *
 *   wsync-engine --engine sglang|vllm|lmdeploy --plugin PATH --layout dense|moe
 *                --tp-rank R --tp-size N --socket PATH [--scale S] [--layers L]
 *   wsync-engine demo --engine E --tp N [--layout L] [--plugin PATH] [--syncs K] [--scale S]
 *                [--layers L] [--bucket-mb M] [--packed] [--engine-plugin PATH]
 * (--engine-plugin: the engines' plugin when it differs from the trainer's, e.g. a missing one
 * to show the native-loader fallback.)
 *
 * The shim is chosen by --engine and the plugin is dlopened from --plugin at run time: switching
 * either needs no rebuild. Exit status 0 only when every sync verified on every rank. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wsync_model_opt.h"
#include "wsync_dtype.h"
#include "wsync_ref_engine.h"
#include "wsync_ref_lora_trainer.h"
#include "wsync_ref_trainer.h"
#include "wsync_wire.h"

typedef struct wsync_engine_args {
    const char *engine, *plugin, *engine_plugin, *socket;
    wsync_model_config_t model; /* scale 0: the layout's default */
    unsigned rank, size, syncs, bucket_mb;
    int packed, timeout_ms;
    int lora;           /* demo --lora: adapter-only sync */
    unsigned lora_rank; /* --lora-rank */
} wsync_engine_args_t;

static void wsync_engine_usage(void)
{
    fprintf(stderr,
            "usage: wsync-engine --engine sglang|vllm|lmdeploy --plugin PATH --layout dense|moe\n"
            "                    --tp-rank R --tp-size N --socket PATH [--scale S] [--layers L]\n"
            "       wsync-engine demo --engine E --tp N [--layout L] [--plugin PATH] [--syncs K]\n"
            "                    [--scale S] [--layers L] [--bucket-mb M] [--packed]\n"
            "                    [--engine-plugin PATH] [--lora [--lora-rank R]]\n");
}

static int wsync_engine_parse(int argc, char **argv, wsync_engine_args_t *a)
{
    static const struct option opts[] = {{"engine", required_argument, 0, 'e'},
                                         {"plugin", required_argument, 0, 'p'},
                                         WSYNC_MODEL_LONGOPTS,
                                         {"tp-rank", required_argument, 0, 'r'},
                                         {"tp-size", required_argument, 0, 'n'},
                                         {"tp", required_argument, 0, 'n'},
                                         {"socket", required_argument, 0, 's'},
                                         {"syncs", required_argument, 0, 'k'},
                                         {"bucket-mb", required_argument, 0, 'b'},
                                         {"packed", no_argument, 0, 'P'},
                                         {"timeout-ms", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {"engine-plugin", required_argument, 0, 'E'},
                                         {"verify", no_argument, 0, 'v'},
                                         {"no-verify", no_argument, 0, 'v'},
                                         {"lora", no_argument, 0, 'R'},
                                         {"lora-rank", required_argument, 0, 'K'},
                                         {0, 0, 0, 0}};
    int c;

    *a = (wsync_engine_args_t){.model = {.layout = "dense", .layers = 2},
                               .size = 1,
                               .syncs = 2,
                               .bucket_mb = 64,
                               .timeout_ms = 120000,
                               .lora_rank = 8};
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (wsync_model_option(&a->model, c, optarg))
            continue;
        switch (c) {
        case 'e':
            a->engine = optarg;
            break;
        case 'p':
            a->plugin = optarg;
            break;
        case 'r':
            a->rank = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 'n':
            a->size = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 's':
            a->socket = optarg;
            break;
        case 'k':
            a->syncs = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 'b':
            a->bucket_mb = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 'P':
            a->packed = 1;
            break;
        case 'E':
            a->engine_plugin = optarg;
            break;
        case 'v':
            break; /* `wsync demo` flags: every sync is verified here */
        case 'R':
            a->lora = 1;
            break;
        case 'K':
            a->lora_rank = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 't':
            a->timeout_ms = atoi(optarg);
            break;
        default:
            wsync_engine_usage();
            return -1;
        }
    }
    if (a->engine == NULL || a->size == 0 || a->rank >= a->size) {
        wsync_engine_usage();
        return -1;
    }
    /* Default scale: a few hundred MB; any scale keeps whole heads (model/wsync_model.h). */
    if (a->model.scale == 0)
        a->model.scale = strcmp(a->model.layout, "moe") == 0 ? 4 : 8;
    return 0;
}

static wsync_model_config_t wsync_engine_model(const wsync_engine_args_t *a)
{
    return a->model;
}

static int wsync_engine_serve(const wsync_engine_args_t *a)
{
    wsync_ref_engine_config_t cfg = {.engine = a->engine,
                                     .plugin = a->plugin,
                                     .model = wsync_engine_model(a),
                                     .rank = a->rank,
                                     .size = a->size,
                                     .timeout_ms = (uint32_t)a->timeout_ms};
    wsync_ref_engine_t e;
    char why[256];
    const char *native;
    int rc;

    if (a->socket == NULL) {
        wsync_engine_usage();
        return 2;
    }
    if (wsync_ref_engine_open(&e, &cfg, why, sizeof(why)) != 0) {
        fprintf(stderr, "wsync-engine: %s\n", why);
        return 1;
    }
    fprintf(stderr, "wsync-engine[%s rank %u/%u]: %zu engine parameters (%.1f MiB), loader: %s\n",
            a->engine, a->rank, a->size, e.layout.n, (double)e.layout.arena_bytes / (1 << 20),
            wsync_driver_native(e.driver, &native) ? "native fallback" : "wsync plugin");
    rc = wsync_ref_engine_serve(&e, a->socket, a->timeout_ms);
    wsync_ref_engine_close(&e);
    return rc;
}

/* ------------------------------------------------------------------ demo */

typedef struct wsync_demo_link {
    int fd[WSYNC_REF_MAX_RANKS];
    int timeout_ms;
} wsync_demo_link_t;

static int wsync_demo_send(void *user, uint32_t rank, const char *msg)
{
    wsync_demo_link_t *l = user;
    wsync_error_t err = {.struct_size = sizeof(err)};
    if (wsync_wire_send(l->fd[rank], msg, strlen(msg), &err) == WSYNC_OK)
        return 0;
    fprintf(stderr, "wsync demo: send to rank %u: %s\n", rank, err.message);
    return -1;
}

static char *wsync_demo_recv(void *user, uint32_t rank)
{
    wsync_demo_link_t *l = user;
    wsync_error_t err = {.struct_size = sizeof(err)};
    char *buf = NULL;
    size_t len;
    if (wsync_wire_recv(l->fd[rank], &buf, &len, l->timeout_ms, &err) == WSYNC_OK)
        return buf;
    fprintf(stderr, "wsync demo: reply from rank %u: %s\n", rank, err.message);
    return NULL;
}

/* One engine-level request to every rank; returns the replies or NULL. */
static json_t *wsync_demo_all(wsync_ref_trainer_t *t, const wsync_ref_transport_t *tr, json_t *msg)
{
    json_t *r = wsync_ref_trainer_exchange(t, tr, msg);
    json_decref(msg);
    return r;
}

static int wsync_demo_verify(wsync_ref_trainer_t *t, const wsync_ref_transport_t *tr,
                             const wsync_engine_args_t *a, unsigned k)
{
    json_t *rep = wsync_demo_all(
               t, tr, json_pack("{s:s, s:I}", "method", "wsync.verify", "version", (json_int_t)k)),
           *r;
    size_t i;
    int bad = rep == NULL;

    json_array_foreach(rep, i, r)
    {
        json_int_t ok = json_integer_value(json_object_get(r, "verified"));
        json_int_t total = json_integer_value(json_object_get(r, "total"));
        int good = json_is_true(json_object_get(r, "ok")) && ok == total && total > 0;
        printf("sync %u/%u [%s tp=%u rank %zu%s]: %s %lld/%lld engine parameters%s%s\n", k,
               a->syncs, a->engine, a->size, i,
               json_is_true(json_object_get(r, "native")) ? ", native loader" : "",
               good ? "verified" : "FAILED", (long long)ok, (long long)total,
               good ? "" : ", first mismatch: ",
               good ? "" : json_string_value(json_object_get(r, "mismatch")));
        bad |= !good;
    }
    fflush(stdout);
    json_decref(rep);
    return bad;
}

static double wsync_ref_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --lora: adapter-only syncs; the engine's adapter slot is read back and checked each time. */
static int wsync_demo_lora(const wsync_engine_args_t *a, wsync_ref_trainer_t *base,
                           const wsync_ref_transport_t *tr)
{
    wsync_ref_lora_trainer_config_t lc = {.engine = a->engine,
                                          .plugin = a->plugin,
                                          .model = wsync_engine_model(a),
                                          .rank = a->lora_rank,
                                          .timeout_ms = (uint32_t)a->timeout_ms};
    wsync_ref_lora_trainer_t t;
    char why[256];
    int bad = 0;

    if (wsync_ref_lora_trainer_open(&t, &lc, why, sizeof(why)) != 0) {
        fprintf(stderr, "wsync demo --lora: %s\n", why);
        wsync_ref_lora_trainer_close(&t);
        return 1;
    }
    printf("trainer: %s LoRA request format (%s), adapter rank %u on %zu modules, adapter bytes "
           "%llu; base model %.1f MiB stays in the engine\n",
           a->engine, t.staging != NULL ? "tensors over a retained export" : "PEFT directory",
           t.lora.rank, t.lora.n, (unsigned long long)t.lora.bytes,
           (double)t.model.payload_bytes / (1 << 20));
    for (unsigned k = 1; !bad && k <= a->syncs; k++) {
        uint64_t moved = 0;
        double t0 = wsync_ref_now();
        bad = wsync_ref_lora_trainer_sync(&t, "demo-policy", k, tr, &moved) != 0;
        double dt = wsync_ref_now() - t0;
        json_t *rep =
            bad ? NULL
                : wsync_demo_all(base, tr,
                                 json_pack("{s:s, s:s, s:I, s:I}", "method", "wsync.lora_verify",
                                           "lora_name", "demo-policy", "version", (json_int_t)k,
                                           "rank", (json_int_t)a->lora_rank));
        json_t *r = json_array_get(rep, 0);
        json_int_t ok = json_integer_value(json_object_get(r, "verified"));
        json_int_t total = json_integer_value(json_object_get(r, "total"));
        bad = bad || ok != total || total == 0;
        if (rep != NULL)
            printf("lora sync %u/%u [%s]: %8.2f ms, bytes moved %llu vs model bytes %llu, "
                   "verified %lld/%lld adapter tensors%s%s\n",
                   k, a->syncs, a->engine, dt * 1e3, (unsigned long long)moved,
                   (unsigned long long)t.model.payload_bytes, (long long)ok, (long long)total,
                   bad ? " FAILED, first mismatch " : "",
                   bad ? json_string_value(json_object_get(r, "mismatch")) : "");
        fflush(stdout);
        json_decref(rep);
    }
    /* Retire handshake: the engine closes its mapping before the export is freed. */
    json_decref(wsync_demo_all(base, tr, json_pack("{s:s}", "method", "wsync.release")));
    wsync_ref_lora_trainer_close(&t);
    return bad;
}

/* Connect to an engine rank, giving up early (with its exit status) when that rank's process
 * has already exited, instead of waiting out the whole timeout. */
static int wsync_demo_connect(const char *path, pid_t pid, uint32_t timeout_ms, wsync_error_t *err)
{
    for (uint32_t waited = 0;; waited += 200) {
        wsync_error_t e = {.struct_size = sizeof(e)};
        int fd = wsync_wire_connect(path, 200, &e);
        if (fd >= 0)
            return fd;
        int ws = 0;
        if (pid > 0 && waitpid(pid, &ws, WNOHANG) == pid) {
            snprintf(err->message, sizeof(err->message),
                     "the engine process (pid %d) exited with status %d before listening on %s; "
                     "its own message above says why",
                     (int)pid, WIFEXITED(ws) ? WEXITSTATUS(ws) : -1, path);
            err->code = WSYNC_ERR_PEER_GONE;
            return -1;
        }
        if (waited >= timeout_ms) {
            *err = e;
            return -1;
        }
    }
}

static int wsync_demo(const wsync_engine_args_t *a, const char *self)
{
    wsync_ref_trainer_config_t tc = {.engine = a->engine,
                                     .plugin = a->plugin,
                                     .model = wsync_engine_model(a),
                                     .ranks = a->size,
                                     .bucket_bytes = (uint64_t)a->bucket_mb << 20,
                                     .timeout_ms = (uint32_t)a->timeout_ms,
                                     .packed = a->packed};
    wsync_demo_link_t link = {.timeout_ms = a->timeout_ms};
    wsync_ref_transport_t tr = {wsync_demo_send, wsync_demo_recv, &link};
    char sockets[WSYNC_REF_MAX_RANKS][108], why[256], num[4][16];
    pid_t pids[WSYNC_REF_MAX_RANKS] = {0};
    wsync_ref_trainer_t t;
    int status = 0;

    if (a->lora && (a->size != 1 || strcmp(a->model.layout, "dense") != 0)) {
        fprintf(stderr, "wsync demo --lora: the reference engine has LoRA slots for the dense "
                        "layout at --tp 1 only\n");
        return 2;
    }
    if (a->size > WSYNC_REF_MAX_RANKS) {
        fprintf(stderr, "wsync demo: at most %d ranks\n", WSYNC_REF_MAX_RANKS);
        return 2;
    }
    for (unsigned r = 0; r < a->size; r++) {
        snprintf(sockets[r], sizeof(sockets[r]), "/tmp/wsync-demo-%d-%u.sock", (int)getpid(), r);
        snprintf(num[0], sizeof(num[0]), "%u", r);
        snprintf(num[1], sizeof(num[1]), "%u", a->size);
        snprintf(num[2], sizeof(num[2]), "%u", a->model.scale);
        snprintf(num[3], sizeof(num[3]), "%u", a->model.layers);
        pids[r] = fork();
        if (pids[r] == 0) {
            char *argv[24];
            int n = 0;
            argv[n++] = (char *)self;
            argv[n++] = "--engine", argv[n++] = (char *)a->engine;
            argv[n++] = "--layout", argv[n++] = (char *)a->model.layout;
            argv[n++] = "--tp-rank", argv[n++] = num[0];
            argv[n++] = "--tp-size", argv[n++] = num[1];
            argv[n++] = "--scale", argv[n++] = num[2];
            argv[n++] = "--layers", argv[n++] = num[3];
            argv[n++] = "--socket", argv[n++] = sockets[r];
            if (a->model.model_dir != NULL) /* the engine allocates from the same config.json */
                argv[n++] = "--model", argv[n++] = (char *)a->model.model_dir;
            if (a->model.dtype != WSYNC_DTYPE_INVALID)
                argv[n++] = "--dtype", argv[n++] = (char *)wsync_dtype_name(a->model.dtype);
            if (a->engine_plugin != NULL || a->plugin != NULL)
                argv[n++] = "--plugin",
                argv[n++] = (char *)(a->engine_plugin ? a->engine_plugin : a->plugin);
            argv[n] = NULL;
            execv(self, argv);
            perror("wsync demo: exec wsync-engine");
            _exit(127);
        }
    }
    if (wsync_ref_trainer_open(&t, &tc, why, sizeof(why)) != 0) {
        fprintf(stderr, "wsync demo: trainer: %s\n", why);
        status = 1;
    } else {
        if (!a->lora)
            printf("trainer: %s request format, plugin %s (%s), %zu HF tensors (%s, scale %u), "
                   "%zu buckets, %u engine processes (tp=%u)\n",
                   a->engine, t.loader.plugin->name, t.loader.path, t.model.n,
                   a->model.model_dir != NULL ? a->model.model_dir : a->model.layout,
                   a->model.scale, t.nbuckets, a->size, a->size);
        fflush(stdout);
        for (unsigned r = 0; r < a->size && status == 0; r++) {
            wsync_error_t err = {.struct_size = sizeof(err)};
            link.fd[r] = wsync_demo_connect(sockets[r], pids[r], (uint32_t)a->timeout_ms, &err);
            if (link.fd[r] < 0 && err.code == WSYNC_ERR_PEER_GONE)
                pids[r] = 0; /* already reaped */
            if (link.fd[r] < 0) {
                fprintf(stderr, "wsync demo: connect rank %u: %s\n", r, err.message);
                status = 1;
            }
        }
        for (unsigned k = 1; status == 0 && !a->lora && k <= a->syncs; k++)
            status = wsync_ref_trainer_sync(&t, k, &tr) || wsync_demo_verify(&t, &tr, a, k);
        if (status == 0 && a->lora)
            status = wsync_demo_lora(a, &t, &tr);
        if (status == 0) {
            /* Retire handshake: engines close their mappings, ack, then the staging goes. */
            json_t *rep = wsync_demo_all(&t, &tr, json_pack("{s:s}", "method", "wsync.release"));
            status = rep == NULL;
            json_decref(rep);
            json_decref(wsync_demo_all(&t, &tr, json_pack("{s:s}", "method", "wsync.shutdown")));
        }
        for (unsigned r = 0; r < a->size; r++)
            if (link.fd[r] > 0)
                close(link.fd[r]);
        wsync_ref_trainer_close(&t);
    }
    for (unsigned r = 0; r < a->size; r++) {
        int ws = 0;
        if (status != 0 && pids[r] > 0) /* never kill(0 or -1, ...) */
            kill(pids[r], SIGTERM);
        if (pids[r] > 0 && waitpid(pids[r], &ws, 0) == pids[r] &&
            !(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) && status == 0) {
            fprintf(stderr, "wsync demo: engine rank %u exited with status %d\n", r, ws);
            status = 1;
        }
    }
    printf("demo %s: %s\n", a->engine, status == 0 ? "all ranks verified" : "FAILED");
    return status;
}

int main(int argc, char **argv)
{
    wsync_engine_args_t a;
    char self[4096];
    ssize_t n;

    if (argc > 1 && strcmp(argv[1], "demo") == 0) {
        if (wsync_engine_parse(argc - 1, argv + 1, &a) != 0)
            return 2;
        n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (n <= 0)
            return 1;
        self[n] = '\0';
        return wsync_demo(&a, self);
    }
    if (wsync_engine_parse(argc, argv, &a) != 0)
        return 2;
    return wsync_engine_serve(&a);
}
