/* wsync plan --fanout: one weight version from a trainer to many engine replicas, on paper: the
 * lower bound, the schedule (who pulls what from whom) and its simulated time
 * (engine-shims/common/wsync_fanout.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wsync_fanout.h"
#include "wsync_plan_fanout.h"

static void fanout_usage(FILE *out)
{
    fprintf(out,
            "usage: wsync plan --fanout --model-bytes B --trainer-gpus T --replicas N\n"
            "                  --engine-tp K [--net-gbs G] [--engine-gbs G] [--chunk-mb C] "
            "[--json]\n"
            "  one version of a model of B bytes (as the engines hold it: FP8 is a byte a\n"
            "  parameter) from T trainer GPUs to N replicas of K GPUs; links in GB/s per GPU\n"
            "  (trainer out --net-gbs, default 50; engine in and out --engine-gbs, default the\n"
            "  same), chunks of C MB per engine GPU (default 256)\n");
}

static int fanout_parse(int argc, char **argv, wsync_fanout_in_t *in, int *json)
{
    *in = (wsync_fanout_in_t){.trainer_gbs = 50, .engine_gbs = 0, .chunk_bytes = 256e6};
    *json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        double x = v != NULL ? strtod(v, &end) : 0;
        const int num = v != NULL && end != v && *end == '\0';
        if (strcmp(a, "--fanout") == 0)
            continue;
        if (strcmp(a, "--json") == 0) {
            *json = 1;
            continue;
        }
        if (!num) {
            fprintf(stderr, "wsync plan --fanout: %s needs a number, got %s\n", a,
                    v != NULL ? v : "nothing");
            return -1;
        }
        if (strcmp(a, "--model-bytes") == 0)
            in->model_bytes = x;
        else if (strcmp(a, "--trainer-gpus") == 0)
            in->trainer_gpus = (uint32_t)x;
        else if (strcmp(a, "--replicas") == 0)
            in->replicas = (uint32_t)x;
        else if (strcmp(a, "--engine-tp") == 0)
            in->tp = (uint32_t)x;
        else if (strcmp(a, "--net-gbs") == 0)
            in->trainer_gbs = x;
        else if (strcmp(a, "--engine-gbs") == 0)
            in->engine_gbs = x;
        else if (strcmp(a, "--chunk-mb") == 0)
            in->chunk_bytes = x * 1e6;
        else {
            fprintf(stderr, "wsync plan --fanout: unknown option %s\n", a);
            return -1;
        }
        i++;
    }
    if (in->engine_gbs == 0)
        in->engine_gbs = in->trainer_gbs;
    return 0;
}

int wsync_plan_fanout(int argc, char **argv)
{
    wsync_fanout_in_t in;
    wsync_fanout_t f;
    int json;
    if (fanout_parse(argc, argv, &in, &json) != 0 || wsync_fanout_plan(&in, &f) != 0) {
        fanout_usage(stderr);
        return 2;
    }
    printf("model: %.1f GB; trainer: %u GPUs at %.0f GB/s out each; %u replicas of TP %u at %.0f "
           "GB/s per GPU\n",
           in.model_bytes / 1e9, in.trainer_gpus, in.trainer_gbs, in.replicas, in.tp,
           in.engine_gbs);
    printf("lower bound: %.3f s (%s)\n", f.bound_s, f.bound_why);
    printf("schedule: the trainer feeds %u replica(s) directly; the rest pull from a replica "
           "that holds the version, GPU r from GPU r, in %llu chunks of %.0f MB per GPU; %u "
           "replica(s) in the longest chain\n",
           f.seeds, (unsigned long long)f.chunks, in.model_bytes / in.tp / (double)f.chunks / 1e6,
           f.chain_len);
    const uint32_t show = in.replicas < 8 ? in.replicas : 8;
    for (uint32_t i = 0; i < show; i++) {
        const int64_t s = wsync_fanout_source(&f, i);
        if (s < 0)
            printf("  replica %u <- trainer: each of its %u GPUs reads its 1/%u of the model, "
                   "spread over the %u trainer GPUs\n",
                   i, in.tp, in.tp, in.trainer_gpus);
        else
            printf("  replica %u <- replica %lld, chunk by chunk, one chunk behind it\n", i,
                   (long long)s);
    }
    if (show < in.replicas)
        printf("  ... replica i <- %s for the other %u\n",
               f.seeds < in.replicas ? "replica i - seeds" : "trainer", in.replicas - show);
    printf("per chunk: %.1f ms from the trainer, %.1f ms replica to replica\n", f.seed_s * 1e3,
           f.hop_s * 1e3);
    printf("simulated time: %.3f s = %.3f x the bound\n", f.time_s, f.time_s / f.bound_s);
    printf("a replica joining later pulls the committed version from one that holds it: %.3f s, "
           "the trainer untouched\n",
           f.join_s);
    if (json)
        printf("{\"bound_s\":%.9g,\"time_s\":%.9g,\"seeds\":%u,\"chain_len\":%u,\"chunks\":%llu,"
               "\"join_s\":%.9g}\n",
               f.bound_s, f.time_s, f.seeds, f.chain_len, (unsigned long long)f.chunks, f.join_s);
    return 0;
}
