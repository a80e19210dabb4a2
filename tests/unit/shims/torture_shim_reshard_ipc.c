/* Resharding through the CPU plugin, one process per rank: each trainer rank stages its segment
 * (its pieces of the synthetic MoE model, packed as wsync_reshard_trainer_layout places them) in
 * a shared-memory staging buffer of its own and publishes it; each engine rank, in its own
 * process, waits until every trainer rank has published, opens their buffers, plans itself
 * (wsync_reshard_plan) and copies each source's ops with copy_weights, then checks every engine
 * parameter against the reference engine. Trainer TP 1, 2, 4 x FSDP 1, 2 into SGLang TP 1, 2, 4
 * (and TP 2, 4 with EP = TP); and a trainer rank that dies before it publishes: every engine
 * rank reports it within the timeout and writes nothing. */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "wsync_loader.h"
#include "reshard_fixture.h"
#include "wsync_reshard.h"
#include "wsync_shim.h"

#define PLUGIN WSYNC_TEST_PLUGIN_DIR "/libwsync_cpu.so"
#define VERSION 5

/* Everything a rank process needs, built before the fork. */
typedef struct world {
    wsync_model_config_t cfg;
    wsync_model_t m;
    wsync_tensor_desc_t *td;
    wsync_reshard_trainer_t t;
    uint32_t n;
    wsync_reshard_piece_t *p;
    size_t np;
    uint64_t *seg;
    wsync_reshard_place_t *place;
    char dir[64];
} world_t;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void world_build(world_t *w, uint32_t tp, uint32_t fsdp)
{
    memset(w, 0, sizeof(*w));
    w->cfg = (wsync_model_config_t){.layout = "moe", .scale = 8, .layers = 2};
    char why[256];
    assert_int_equal(wsync_model_build(&w->m, &w->cfg, why, sizeof(why)), 0);
    w->td = model_descs(&w->m);
    assert_non_null(w->td);
    w->t = (wsync_reshard_trainer_t){.tp = tp, .fsdp = fsdp, .dp = 1, .pp = 1};
    w->n = tp * fsdp;
    w->seg = calloc(w->n, sizeof(*w->seg));
    w->place = calloc(w->n, sizeof(*w->place));
    wsync_error_t err = {.struct_size = sizeof(err)};
    assert_int_equal(wsync_reshard_trainer_layout(wsync_shim_find("sglang")->map, &w->t, w->td,
                                                  w->m.n, &w->p, &w->np, w->seg, &err),
                     WSYNC_OK);
    for (uint32_t r = 0; r < w->n; r++)
        w->place[r] = (wsync_reshard_place_t){.gpu = r, .node = 0};
    snprintf(w->dir, sizeof(w->dir), "/tmp/wsync-reshard-XXXXXX");
    assert_non_null(mkdtemp(w->dir));
}

static void world_free(world_t *w)
{
    char path[384];
    DIR *d = opendir(w->dir);
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof(path), "%s/%s", w->dir, e->d_name);
            unlink(path);
        }
    if (d != NULL)
        closedir(d);
    rmdir(w->dir);
    wsync_reshard_free(w->p);
    free(w->seg);
    free(w->place);
    model_descs_free(w->td);
    wsync_model_free(&w->m);
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Trainer rank r: stage the segment once per engine rank (a buffer has one reader: its
 * consumed generation is that reader's), publish, leave each manifest in the directory, wait for
 * the engines to finish, retire. Exit status 0, or what failed. */
static int trainer_main(const world_t *w, uint32_t r, uint32_t readers)
{
    wsync_loader_t l;
    wsync_error_t err = {.struct_size = sizeof(err)};
    if (wsync_loader_open(&l, PLUGIN, NULL, &err) != WSYNC_OK)
        return 10;
    const uint64_t bytes = w->seg[r] ? w->seg[r] : 1;
    unsigned char *seg = calloc(1, bytes);
    if (seg == NULL || segment_fill(&w->m, w->p, w->np, r, VERSION, seg) != 0)
        return 16;
    const wsync_producer_ops_t *pops = l.plugin->producer;
    wsync_staging_config_t sc = {.struct_size = sizeof(sc), .bytes = bytes, .timeout_ms = 20000};
    wsync_staging_t *s[8] = {0};
    const wsync_stage_tensor_t st = {.struct_size = sizeof(st),
                                     .name = "segment",
                                     .dtype = WSYNC_DTYPE_U8,
                                     .ndim = 1,
                                     .shape = {(int64_t)bytes},
                                     .src = seg};
    int rc = readers <= 8 ? 0 : 15;
    for (uint32_t e = 0; e < readers && rc == 0; e++) {
        const char *json = NULL;
        uint64_t gen = 0;
        if (pops->create(&sc, &s[e], &err) != WSYNC_OK ||
            pops->stage(s[e], NULL, &st, 1, &err) != WSYNC_OK ||
            pops->publish(s[e], NULL, 1, &json, &gen, &err) != WSYNC_OK) {
            rc = 11;
            break;
        }
        char path[128], tmp[136];
        snprintf(path, sizeof(path), "%s/trainer-%u-%u.json", w->dir, r, e);
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        if (f == NULL) {
            rc = 12;
            break;
        }
        fputs(json, f);
        fclose(f);
        rename(tmp, path); /* whole or not at all */
    }
    char path[128];
    snprintf(path, sizeof(path), "%s/done", w->dir);
    for (const double t0 = now_ms(); rc == 0 && !file_exists(path); usleep(2000))
        if (now_ms() - t0 > 60000)
            rc = 13;
    for (uint32_t e = 0; e < readers && e < 8; e++)
        if (s[e] != NULL && pops->retire(s[e], &err) != WSYNC_OK && rc == 0)
            rc = 14;
    free(seg);
    wsync_loader_close(&l);
    return rc;
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s != NULL && fread(s, 1, (size_t)n, f) == (size_t)n)
        s[n] = '\0';
    fclose(f);
    return s;
}

/* Engine rank i of size: 0 when every parameter equals the reference; 2 when a trainer rank
 * published nothing within timeout_ms and nothing was written; other codes: what failed. */
static int engine_main(const world_t *w, uint32_t i, uint32_t size, uint32_t ep, double timeout_ms)
{
    eng_t e;
    char path[128], why[256];
    if (engine_open(&e, "sglang", &w->cfg, i, size, ep, why, sizeof(why)) != 0)
        return 20;
    /* every source first: nothing is written unless every trainer rank published */
    char **text = calloc(w->n, sizeof(*text));
    const double t0 = now_ms();
    for (uint32_t r = 0; r < w->n; r++) {
        snprintf(path, sizeof(path), "%s/trainer-%u-%u.json", w->dir, r, i);
        while (!file_exists(path) && now_ms() - t0 < timeout_ms)
            usleep(2000);
        if ((text[r] = read_all(path)) == NULL) {
            fprintf(stderr, "engine rank %u/%u: trainer rank %u published nothing within %.0f ms\n",
                    i, size, r, timeout_ms);
            for (uint64_t b = 0; b < e.l.arena_bytes; b++)
                if (e.view.arena[b] != 0)
                    return 21;
            return 2;
        }
    }
    wsync_loader_t l;
    wsync_error_t err = {.struct_size = sizeof(err)};
    if (wsync_loader_open(&l, PLUGIN, NULL, &err) != WSYNC_OK)
        return 22;
    const wsync_consumer_ops_t *c = l.plugin->consumer;
    wsync_consumer_config_t cc = {.struct_size = sizeof(cc), .timeout_ms = 20000};
    struct wsync_consumer *con = NULL;
    if (c->create(&cc, &con, &err) != WSYNC_OK)
        return 23;
    const wsync_reshard_src_t src = {w->td, w->m.n, w->p, w->np, w->place, w->n};
    wsync_reshard_op_t *plan = NULL;
    size_t n = 0;
    if (wsync_reshard_plan(wsync_shim_find("sglang")->map, &e.ops,
                           (wsync_reshard_place_t){.gpu = i, .node = 0}, &src, &plan, &n,
                           &err) != WSYNC_OK)
        return 24;
    wsync_copy_op_t *mine = calloc(n ? n : 1, sizeof(*mine));
    int rc = 0;
    for (uint32_t r = 0; r < w->n && rc == 0; r++) {
        const wsync_manifest_t *m = NULL;
        struct wsync_handle *h = NULL;
        size_t k = 0;
        for (size_t q = 0; q < n; q++)
            if (plan[q].src_rank == r)
                mine[k++] = plan[q].op;
        if (c->parse_manifest(con, text[r], strlen(text[r]), &m, &err) != WSYNC_OK ||
            c->open_handle(con, &m->buffer, &h, &err) != WSYNC_OK ||
            c->copy_weights(con, h, NULL, m->generation, mine, k, 0, &err) != WSYNC_OK ||
            c->record_consumed(con, h, 1, &err) != WSYNC_OK) {
            fprintf(stderr, "engine rank %u/%u, trainer rank %u: %s\n", i, size, r, err.message);
            rc = 25;
        }
        if (h != NULL)
            c->close_handle(con, h, NULL);
        if (m != NULL)
            c->manifest_free(con, m);
    }
    unsigned char *want = malloc(1);
    for (size_t q = 0; q < e.l.n && rc == 0; q++) {
        const wsync_ref_param_t *p = &e.l.params[q];
        want = realloc(want, p->nbytes ? p->nbytes : 1);
        if (engine_expected(&e, p, VERSION, want) != 0)
            rc = 27;
        if (memcmp(e.view.arena + p->offset, want, p->nbytes) != 0) {
            fprintf(stderr, "engine rank %u/%u: %s differs from the reference\n", i, size, p->name);
            rc = 26;
        }
    }
    c->finalize(con, NULL);
    wsync_loader_close(&l);
    engine_close(&e);
    return rc;
}

/* The ranks of one run: trainer ranks (dead: the one that exits before publishing, or -1) and
 * engine ranks of SGLang at `size` with EP ep inside its TP group; the exit status each engine
 * rank must end with. */
static void run(uint32_t tp, uint32_t fsdp, uint32_t size, uint32_t ep, int dead, int want_engine)
{
    world_t w;
    world_build(&w, tp, fsdp);
    pid_t *pids = calloc(w.n + size, sizeof(*pids));
    for (uint32_t r = 0; r < w.n; r++)
        if ((pids[r] = fork()) == 0)
            _exit((int)r == dead ? 3 : trainer_main(&w, r, size));
    const double timeout = dead >= 0 ? 3000 : 60000;
    for (uint32_t i = 0; i < size; i++)
        if ((pids[w.n + i] = fork()) == 0)
            _exit(engine_main(&w, i, size, ep, timeout));
    const double t0 = now_ms();
    for (uint32_t i = 0; i < size; i++) {
        int st = 0;
        assert_int_equal(waitpid(pids[w.n + i], &st, 0), pids[w.n + i]);
        assert_true(WIFEXITED(st));
        if (WEXITSTATUS(st) != want_engine)
            fail_msg("engine rank %u/%u exited %d, want %d", i, size, WEXITSTATUS(st), want_engine);
    }
    if (dead >= 0) /* reported within the timeout (and its slack), not by hanging */
        assert_true(now_ms() - t0 < 3000 + 10000);
    char path[128];
    snprintf(path, sizeof(path), "%s/done", w.dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    for (uint32_t r = 0; r < w.n; r++) {
        int st = 0;
        assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), (int)r == dead ? 3 : 0);
    }
    free(pids);
    world_free(&w);
}

/* Every trainer TP in {1, 2, 4} x FSDP in {1, 2} into SGLang TP 1, 2, 4 without EP and TP 2, 4
 * with EP = TP (SGLang's EP: each engine rank its own experts). */
static void test_grid_into_tp_1_2_4_and_ep(void **state)
{
    (void)state;
    for (uint32_t tp = 1; tp <= 4; tp *= 2)
        for (uint32_t fsdp = 1; fsdp <= 2; fsdp++) {
            for (uint32_t size = 1; size <= 4; size *= 2)
                run(tp, fsdp, size, 1, -1, 0);
            run(tp, fsdp, 2, 2, -1, 0);
            run(tp, fsdp, 4, 4, -1, 0);
        }
}

static void test_trainer_rank_dies_before_publishing(void **state)
{
    (void)state;
    run(2, 2, 2, 1, 1, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid_into_tp_1_2_4_and_ep),
        cmocka_unit_test(test_trainer_rank_dies_before_publishing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
