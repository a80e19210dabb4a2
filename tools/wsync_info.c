/* wsync info PATH.so: what a plugin is and which members of its tables it provides. */
#include <stdio.h>
#include <string.h>

#include "wsync_cli.h"

#define WSYNC_INFO_OP(type, table, member)                                                         \
    printf("  %-20s %s\n", #member, WSYNC_HAS_OP(type, table, member) ? "present" : "absent")

static void wsync_info_consumer(const wsync_consumer_ops_t *c)
{
    printf("consumer table: struct_size %zu (this tool: %zu), abi_version %u\n", c->struct_size,
           sizeof(*c), c->abi_version);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, create);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, parse_manifest);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, manifest_free);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, open_handle);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, close_handle);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, copy_weights);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, record_consumed);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, hot_load_adapter);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, enqueue_host_fn);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, finalize);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, stream_create);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, stream_destroy);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, stream_synchronize);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, unload_adapter);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, mem_alloc);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, mem_free);
    WSYNC_INFO_OP(wsync_consumer_ops_t, c, mem_copy);
}

static void wsync_info_producer(const wsync_producer_ops_t *p)
{
    printf("producer table: struct_size %zu (this tool: %zu), abi_version %u\n", p->struct_size,
           sizeof(*p), p->abi_version);
    WSYNC_INFO_OP(wsync_producer_ops_t, p, create);
    WSYNC_INFO_OP(wsync_producer_ops_t, p, stage);
    WSYNC_INFO_OP(wsync_producer_ops_t, p, publish);
    WSYNC_INFO_OP(wsync_producer_ops_t, p, wait_consumed);
    WSYNC_INFO_OP(wsync_producer_ops_t, p, retire);
    WSYNC_INFO_OP(wsync_producer_ops_t, p, stream_create);
    WSYNC_INFO_OP(wsync_producer_ops_t, p, stream_destroy);
    WSYNC_INFO_OP(wsync_producer_ops_t, p, stream_synchronize);
    WSYNC_INFO_OP(wsync_producer_ops_t, p, read_back);
}

int wsync_cmd_info(int argc, char **argv)
{
    wsync_loader_t l;
    wsync_host_t host;

    if (argc != 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fprintf(argc == 2 ? stdout : stderr,
                "usage: wsync info PATH.so   (a path, or a bare name searched like the loader)\n");
        return argc == 2 ? 0 : 2;
    }
    wsync_cli_host(&host, "info");
    if (wsync_cli_load(&l, argv[1], &host) != 0)
        return 1;
    printf("plugin:         %s\n", l.path);
    printf("name:           %s\n", l.plugin->name ? l.plugin->name : "(none)");
    printf("version:        %s\n", l.plugin->version ? l.plugin->version : "(none)");
    printf("abi:            %u negotiated (this tool speaks %u..%u)\n", l.abi_version,
           WSYNC_ABI_VERSION_MIN, WSYNC_ABI_VERSION);
    printf("plugin table:   struct_size %zu (this tool: %zu), abi_version %u\n",
           l.plugin->struct_size, sizeof(*l.plugin), l.plugin->abi_version);
    wsync_info_consumer(l.plugin->consumer);
    wsync_info_producer(l.plugin->producer);
    wsync_loader_close(&l);
    return 0;
}
