/* A published manifest's plan forms (docs/DESIGN.md, "Plan once, replay"): the manifest that
 * records its plan and the replay that names it. The text is the canonical one the producer
 * emits (wsync_manifest_emit): its root members head first, then "segments" (direct mode), then
 * "tensors", last. The members are found by a scan of the root object outside strings. */
#include "wsync_manifest.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "wsync_digest.h"
#include "wsync_error.h"
#include "wsync_text.h"

/* Where the root member `key` (its leading comma) starts in text[0, len), or len when it has none.
 */
static size_t wsync_root_member(const char *text, size_t len, const char *key)
{
    const size_t klen = strlen(key);
    int in_string = 0, depth = 0;
    for (size_t i = 0; i < len; i++) {
        const char ch = text[i];
        if (in_string) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_string = 0;
        } else if (ch == '"') {
            in_string = 1;
        } else if (ch == '{' || ch == '[') {
            depth++;
        } else if (ch == '}' || ch == ']') {
            depth--;
        } else if (ch == ',' && depth == 1 && i + 1 + klen <= len &&
                   memcmp(text + i + 1, key, klen) == 0) {
            return i;
        }
    }
    return len;
}

wsync_result_t wsync_manifest_plan_forms(const char *text, size_t len,
                                         char id[WSYNC_PLAN_ID_MAX + 1], char **full, char **replay,
                                         wsync_error_t *err)
{
    static const char head1[] = "{\"wsync\":1,";
    const size_t h1 = sizeof(head1) - 1;
    *full = *replay = NULL;
    id[0] = '\0';
    if (text == NULL || len < h1 || memcmp(text, head1, h1) != 0 || text[len - 1] != '}')
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "plan: not a manifest as publish returns it (it starts \"%.12s\")",
                          text != NULL ? text : "");
    const size_t tensors_at = wsync_root_member(text, len, "\"tensors\":");
    const size_t segments_at = wsync_root_member(text, tensors_at, "\"segments\":");
    if (tensors_at == len)
        return WSYNC_FAIL(err, WSYNC_ERR_INVALID_ARGUMENT,
                          "plan: the manifest has no \"tensors\" member last");
    if (wsync_root_member(text, segments_at, "\"digests\":") < segments_at)
        return WSYNC_FAIL(err, WSYNC_ERR_NOT_SUPPORTED,
                          "plan: a manifest with digests carries each sync's own; send it in full");
    const size_t tail_at = segments_at < tensors_at ? segments_at : tensors_at;
    snprintf(id, WSYNC_PLAN_ID_MAX + 1, "%016" PRIx64 "-%zu",
             wsync64(text + tail_at, len - tail_at), len - tail_at);
    wsync_text_t f = {0}, r = {0};
    wsync_text_put(&f, text, tail_at);
    wsync_text_put(&f, ",\"plan\":\"", 9);
    wsync_text_put(&f, id, strlen(id));
    wsync_text_put(&f, "\"", 1);
    wsync_text_put(&f, text + tail_at, len - tail_at);
    wsync_text_put(&r, "{\"wsync\":2,", h1);
    wsync_text_put(&r, text + h1, tail_at - h1);
    wsync_text_put(&r, ",\"replay\":\"", 11);
    wsync_text_put(&r, id, strlen(id));
    wsync_text_put(&r, "\"", 1);
    wsync_text_put(&r, text + tail_at, tensors_at - tail_at); /* the segments, if any */
    wsync_text_put(&r, ",\"tensors\":[]}", 14);
    if (f.bad || r.bad) {
        free(f.p);
        free(r.p);
        return WSYNC_FAIL(err, WSYNC_ERR_OUT_OF_MEMORY, "plan: no memory for %zu bytes", len);
    }
    *full = f.p;
    *replay = r.p;
    return WSYNC_OK;
}
