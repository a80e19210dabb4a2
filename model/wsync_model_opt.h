/* The synthetic model's command-line options, shared by every program that builds one (wsync
 * demo, wsync bench, wsync-engine): --layout L, --scale S, --layers N and --model DIR (a Hugging
 * Face model directory: its config and checkpoint) with --dtype T (the dtype the model holds
 * its floats in: bfloat16 for an f32 checkpoint), as getopt_long entries returning 'l', 'S', 'L',
 * 'M' and 'D'. Include <getopt.h> before this header to use the table macro. */
#ifndef WSYNC_MODEL_OPT_H
#define WSYNC_MODEL_OPT_H

#include "wsync_model.h"

/* Entries for a `struct option` table (no terminator). */
#define WSYNC_MODEL_LONGOPTS                                                                       \
    {"layout", required_argument, NULL, 'l'}, {"scale", required_argument, NULL, 'S'},             \
        {"layers", required_argument, NULL, 'L'}, {"model", required_argument, NULL, 'M'},         \
    {                                                                                              \
        "dtype", required_argument, NULL, 'D'                                                      \
    }

/* Apply getopt_long's option `c` with argument `arg` (borrowed: layout points into it) to m.
 * 1 when `c` is one of the model options, 0 (m untouched) otherwise. Numbers are parsed with
 * strtoul; range checks are the caller's. */
int wsync_model_option(wsync_model_config_t *m, int c, const char *arg);

#endif
