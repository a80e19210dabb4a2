/* See wsync_model_opt.h. */
#include "wsync_model_opt.h"

#include <stdlib.h>

#include "wsync_dtype.h"

int wsync_model_option(wsync_model_config_t *m, int c, const char *arg)
{
    switch (c) {
    case 'l':
        m->layout = arg;
        return 1;
    case 'S':
        m->scale = (unsigned)strtoul(arg, NULL, 10);
        return 1;
    case 'L':
        m->layers = (unsigned)strtoul(arg, NULL, 10);
        return 1;
    case 'M':
        m->model_dir = arg;
        return 1;
    case 'D':
        m->dtype = wsync_dtype_from_name(arg); /* unknown: INVALID, the file's dtypes */
        return 1;
    default:
        return 0;
    }
}
