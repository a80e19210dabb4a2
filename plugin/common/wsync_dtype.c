/* Element types: sizes and wire names (PyTorch and safetensors spellings). */
#include "wsync_dtype.h"

#include <string.h>

typedef struct wsync_dtype_info {
    wsync_dtype_t dt;
    size_t size;
    const char *torch_name;
    const char *st_name;
} wsync_dtype_info_t;

static const wsync_dtype_info_t wsync_dtypes[] = {
    {WSYNC_DTYPE_BF16, 2, "bfloat16", "BF16"},
    {WSYNC_DTYPE_F16, 2, "float16", "F16"},
    {WSYNC_DTYPE_F32, 4, "float32", "F32"},
    {WSYNC_DTYPE_F64, 8, "float64", "F64"},
    {WSYNC_DTYPE_I8, 1, "int8", "I8"},
    {WSYNC_DTYPE_U8, 1, "uint8", "U8"},
    {WSYNC_DTYPE_I16, 2, "int16", "I16"},
    {WSYNC_DTYPE_I32, 4, "int32", "I32"},
    {WSYNC_DTYPE_I64, 8, "int64", "I64"},
    {WSYNC_DTYPE_BOOL, 1, "bool", "BOOL"},
    {WSYNC_DTYPE_F8_E4M3, 1, "float8_e4m3fn", "F8_E4M3"},
    {WSYNC_DTYPE_F8_E5M2, 1, "float8_e5m2", "F8_E5M2"},
};

#define WSYNC_N_DTYPES (sizeof(wsync_dtypes) / sizeof(wsync_dtypes[0]))

static const wsync_dtype_info_t *wsync_dtype_info(wsync_dtype_t dt)
{
    for (size_t i = 0; i < WSYNC_N_DTYPES; i++)
        if (wsync_dtypes[i].dt == dt)
            return &wsync_dtypes[i];
    return NULL;
}

size_t wsync_dtype_size(wsync_dtype_t dt)
{
    const wsync_dtype_info_t *info = wsync_dtype_info(dt);
    return info ? info->size : 0;
}

const char *wsync_dtype_name(wsync_dtype_t dt)
{
    const wsync_dtype_info_t *info = wsync_dtype_info(dt);
    return info ? info->torch_name : "invalid";
}

wsync_dtype_t wsync_dtype_from_name(const char *name)
{
    if (name == NULL)
        return WSYNC_DTYPE_INVALID;
    if (strncmp(name, "torch.", 6) == 0)
        name += 6;
    for (size_t i = 0; i < WSYNC_N_DTYPES; i++)
        if (strcmp(name, wsync_dtypes[i].torch_name) == 0 ||
            strcmp(name, wsync_dtypes[i].st_name) == 0)
            return wsync_dtypes[i].dt;
    return WSYNC_DTYPE_INVALID;
}

int wsync_tensor_nbytes(wsync_dtype_t dt, uint32_t ndim, const int64_t *shape, uint64_t *out)
{
    uint64_t n = wsync_dtype_size(dt);
    if (n == 0 || ndim > WSYNC_MAX_DIMS || (ndim > 0 && shape == NULL))
        return -1;
    for (uint32_t i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n))
            return -1;
    }
    *out = n;
    return 0;
}
