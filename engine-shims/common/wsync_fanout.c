/* The fan-out schedule and its simulation (wsync_fanout.h). */
#include <math.h>

#include "wsync_fanout.h"

int wsync_fanout_plan(const wsync_fanout_in_t *in, wsync_fanout_t *f)
{
    if (!(in->model_bytes > 0) || in->trainer_gpus == 0 || in->replicas == 0 || in->tp == 0 ||
        !(in->trainer_gbs > 0) || !(in->engine_gbs > 0) || !(in->chunk_bytes > 0))
        return -1;
    const double trainer_rate = in->trainer_gpus * in->trainer_gbs * 1e9; /* bytes/s, all out */
    const double replica_rate = in->tp * in->engine_gbs * 1e9;            /* bytes/s, one replica */
    const double share = in->model_bytes / in->tp;                        /* per engine GPU */
    double seeds = floor(trainer_rate / replica_rate);
    if (seeds < 1)
        seeds = 1;
    if (seeds > in->replicas)
        seeds = in->replicas;
    f->seeds = (uint32_t)seeds;
    f->chain_len = (in->replicas + f->seeds - 1) / f->seeds;
    f->chunks = (uint64_t)ceil(share / in->chunk_bytes);
    const double chunk = share / (double)f->chunks; /* equal chunks covering the share */
    /* a seed GPU pulls at its own rate, or its part of the trainer's when that is less */
    const double seed_gpu_rate = fmin(in->engine_gbs * 1e9, trainer_rate / (seeds * in->tp));
    f->seed_s = chunk / seed_gpu_rate;
    f->hop_s = chunk / (in->engine_gbs * 1e9);
    /* a pipelined chain: the seed takes chunks at seed_s each, every later replica one hop
     * behind its predecessor, never faster than a hop a chunk */
    const double per_chunk = fmax(f->seed_s, f->hop_s);
    f->time_s = f->seed_s + (double)(f->chunks - 1) * per_chunk + (f->chain_len - 1) * f->hop_s;
    const double t_trainer = in->model_bytes / trainer_rate;
    const double t_replica = share / (in->engine_gbs * 1e9);
    f->bound_s = fmax(t_trainer, t_replica);
    f->bound_why = t_trainer > t_replica ? "the trainer's links carry the model once"
                                         : "each replica GPU receives its share of the model";
    f->join_s = t_replica;
    return 0;
}

int64_t wsync_fanout_source(const wsync_fanout_t *f, uint32_t i)
{
    return i < f->seeds ? -1 : (int64_t)(i - f->seeds);
}
