/* wsync_nccl_api.h against NCCL's own nccl.h, where a copy is installed (built only then): the
 * values and layouts wsync declares for the run-time-loaded library match the header. The checks
 * are compile-time; the program only reports that it was built. */
#include <stdio.h>

#include <nccl.h>

#include "wsync_nccl_api.h"

_Static_assert(sizeof(ncclUniqueId) == sizeof(wsync_nccl_unique_id_t), "ncclUniqueId size");
_Static_assert(NCCL_UNIQUE_ID_BYTES == WSYNC_NCCL_UNIQUE_ID_BYTES, "NCCL_UNIQUE_ID_BYTES");
_Static_assert(sizeof(ncclComm_t) == sizeof(wsync_nccl_comm_t), "ncclComm_t is a pointer");
_Static_assert(sizeof(ncclResult_t) == sizeof(wsync_nccl_result_t), "ncclResult_t is an int");
_Static_assert(ncclSuccess == WSYNC_NCCL_SUCCESS, "ncclSuccess");
_Static_assert(ncclInProgress == WSYNC_NCCL_IN_PROGRESS, "ncclInProgress");
_Static_assert(ncclUint8 == WSYNC_NCCL_UINT8, "ncclUint8");
_Static_assert(sizeof(ncclDataType_t) == sizeof(int), "ncclDataType_t passed as int");

int main(void)
{
    printf("wsync_nccl_api.h matches nccl.h %d.%d.%d\n", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    return 0;
}
