/* wsync: the command-line tool. Dispatches to one file per subcommand. */
#include <stdio.h>
#include <string.h>

#include "wsync_cli.h"

static void wsync_usage(FILE *out)
{
    fprintf(out,
            "usage: wsync <command> [options]\n"
            "  info PATH.so            load a plugin, print its name, version, ABI and tables\n"
            "  demo [options]          trainer and engine processes syncing a synthetic model\n"
            "  bench [options]         copy throughput against memcpy baselines\n"
            "  inspect DIR [--engine E] the tensor plan of a Hugging Face model directory\n"
            "  plan CONFIG.json [...]  a resharding plan on paper: bytes per link, time bound\n"
            "Run 'wsync <command> --help' for the options of a command.\n"
            "Environment: WSYNC_PLUGIN (plugin to load), WSYNC_PLUGIN_DIR (where to look),\n"
            "WSYNC_LOG_LEVEL (error|warn|info|debug).\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        wsync_usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "info") == 0)
        return wsync_cmd_info(argc - 1, argv + 1);
    if (strcmp(argv[1], "demo") == 0)
        return wsync_cmd_demo(argc - 1, argv + 1);
    if (strcmp(argv[1], "bench") == 0)
        return wsync_cmd_bench(argc - 1, argv + 1);
    if (strcmp(argv[1], "inspect") == 0)
        return wsync_cmd_inspect(argc - 1, argv + 1);
    if (strcmp(argv[1], "plan") == 0)
        return wsync_cmd_plan(argc - 1, argv + 1);
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        wsync_usage(stdout);
        return 0;
    }
    fprintf(stderr, "wsync: unknown command '%s'\n", argv[1]);
    wsync_usage(stderr);
    return 2;
}
