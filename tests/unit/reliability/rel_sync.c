/* One producer and one engine through the plugin tables (rel_harness.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rel_harness.h"
#include "wsync_digest.h"
#include "wsync_client.h"

#define REL_NAME_FMT "layers.%zu.weight"

void rel_producer_create(rel_producer_t *p, const rel_plugin_t *pl, size_t n, size_t bytes,
                         uint32_t timeout_ms)
{
    wsync_error_t err = rel_err();
    memset(p, 0, sizeof(*p));
    p->pl = pl;
    p->n = n;
    p->bytes = bytes;
    wsync_staging_config_t cfg = {
        .struct_size = sizeof(cfg),
        .bytes = (uint64_t)n * ((bytes + 255) / 256 * 256),
        .flags = WSYNC_STAGING_FIXED_LAYOUT,
        .timeout_ms = timeout_ms,
    };
    wsync_result_t r = pl->P->create(&cfg, &p->s, &err);
    if (r != WSYNC_OK)
        fail_msg("producer create: %s: %s", wsync_strerror(r), err.message);
    if (WSYNC_HAS_OP(wsync_producer_ops_t, pl->P, stream_create))
        assert_int_equal(pl->P->stream_create(p->s, &p->stream, &err), WSYNC_OK);
    p->src = calloc(n, sizeof(*p->src));
    assert_non_null(p->src);
    for (size_t i = 0; i < n; i++) {
        p->src[i] = malloc(bytes ? bytes : 1);
        assert_non_null(p->src[i]);
    }
}

wsync_result_t rel_producer_bucket(rel_producer_t *p, wsync_error_t *err)
{
    uint64_t g = p->generation + 1;
    wsync_stage_tensor_t *t = calloc(p->n, sizeof(*t));
    char(*names)[64] = calloc(p->n, sizeof(*names));
    assert_true(t != NULL && names != NULL);
    for (size_t i = 0; i < p->n; i++) {
        memset(p->src[i], rel_fill_byte(g, i), p->bytes);
        snprintf(names[i], sizeof(names[i]), REL_NAME_FMT, i);
        t[i].struct_size = sizeof(t[i]);
        t[i].name = names[i];
        t[i].dtype = WSYNC_DTYPE_U8;
        t[i].ndim = 1;
        t[i].shape[0] = (int64_t)p->bytes;
        t[i].src = p->src[i];
    }
    wsync_result_t r = p->pl->P->stage(p->s, p->stream, t, p->n, err);
    if (r == WSYNC_OK) {
        uint64_t got = 0;
        r = p->pl->P->publish(p->s, p->stream, 1, &p->manifest, &got, err);
        if (r == WSYNC_OK) {
            assert_int_equal(got, g);
            p->generation = got;
        }
    }
    free(names);
    free(t);
    return r;
}

void rel_producer_destroy(rel_producer_t *p, int retire)
{
    wsync_error_t err = rel_err();
    /* Without `retire` the caller already retired: the staging (and its streams) are gone. */
    if (retire && p->stream != NULL && WSYNC_HAS_OP(wsync_producer_ops_t, p->pl->P, stream_destroy))
        p->pl->P->stream_destroy(p->s, p->stream, &err);
    if (retire) {
        wsync_result_t r = p->pl->P->retire(p->s, &err);
        if (r != WSYNC_OK)
            fail_msg("retire: %s: %s", wsync_strerror(r), err.message);
    }
    for (size_t i = 0; i < p->n; i++)
        free(p->src[i]);
    free(p->src);
    memset(p, 0, sizeof(*p));
}

void rel_engine_create(rel_engine_t *e, const rel_plugin_t *pl, size_t n, size_t bytes,
                       uint32_t timeout_ms, uint8_t **params)
{
    wsync_error_t err = rel_err();
    memset(e, 0, sizeof(*e));
    e->pl = pl;
    e->n = n;
    e->bytes = bytes;
    wsync_consumer_config_t cfg = {.struct_size = sizeof(cfg), .timeout_ms = timeout_ms};
    wsync_result_t r = pl->C->create(&cfg, &e->c, &err);
    if (r != WSYNC_OK)
        fail_msg("consumer create: %s: %s", wsync_strerror(r), err.message);
    if (params != NULL) {
        e->param = params;
        return;
    }
    e->own_params = 1;
    e->param = calloc(n, sizeof(*e->param));
    assert_non_null(e->param);
    for (size_t i = 0; i < n; i++) {
        e->param[i] = calloc(1, bytes ? bytes : 1);
        assert_non_null(e->param[i]);
    }
}

void rel_engine_destroy(rel_engine_t *e)
{
    wsync_error_t err = rel_err();
    wsync_result_t r = e->pl->C->finalize(e->c, &err);
    if (r != WSYNC_OK)
        fail_msg("finalize: %s: %s", wsync_strerror(r), err.message);
    if (e->own_params) {
        for (size_t i = 0; i < e->n; i++)
            free(e->param[i]);
        free(e->param);
    }
    memset(e, 0, sizeof(*e));
}

wsync_copy_op_t *rel_engine_ops(rel_engine_t *e, const wsync_manifest_t *m)
{
    wsync_copy_op_t *ops = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*ops));
    assert_non_null(ops);
    for (size_t k = 0; k < m->n_tensors; k++) {
        const wsync_tensor_desc_t *t = &m->tensors[k];
        size_t i;
        assert_int_equal(sscanf(t->name, REL_NAME_FMT, &i), 1);
        assert_true(i < e->n);
        ops[k].src_offset = t->offset;
        ops[k].dst = e->param[i];
        ops[k].dst_extent = e->bytes;
        ops[k].rows = 1;
        ops[k].row_bytes = t->nbytes;
        ops[k].src_pitch = t->nbytes;
        ops[k].dst_pitch = t->nbytes;
        ops[k].digest = t->digest;
        ops[k].has_digest = t->has_digest;
    }
    return ops;
}

wsync_result_t rel_engine_sync(rel_engine_t *e, const char *json, wsync_error_t *err)
{
    const wsync_consumer_ops_t *C = e->pl->C;
    const wsync_manifest_t *m = NULL;
    wsync_handle_t *h = NULL;
    wsync_result_t r = C->parse_manifest(e->c, json, strlen(json), &m, err);
    if (r != WSYNC_OK)
        return r;
    r = C->open_handle(e->c, &m->buffer, &h, err);
    if (r == WSYNC_OK) {
        wsync_copy_op_t *ops = rel_engine_ops(e, m);
        r = C->copy_weights(e->c, h, NULL, m->generation, ops, m->n_tensors, WSYNC_COPY_VERIFY,
                            err);
        free(ops);
        if (r == WSYNC_OK)
            r = C->record_consumed(e->c, h, 1, err);
        wsync_result_t rc = C->close_handle(e->c, h, err);
        if (r == WSYNC_OK)
            r = rc;
    }
    C->manifest_free(e->c, m);
    return r;
}

int rel_engine_is_gen(const rel_engine_t *e, uint64_t g)
{
    for (size_t i = 0; i < e->n; i++)
        if (wsync64(e->param[i], e->bytes) != rel_digest_of_fill(rel_fill_byte(g, i), e->bytes))
            return 0;
    return 1;
}

void rel_engine_fill(rel_engine_t *e, uint64_t g)
{
    for (size_t i = 0; i < e->n; i++)
        memset(e->param[i], rel_fill_byte(g, i), e->bytes);
}
