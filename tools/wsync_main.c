/* wsync: the command-line tool. Its own commands are one file each; any other command C is the
 * program wsync-C in the directory of this executable (as git runs git-C), so the product CLI
 * links nothing of the test bed or the benchmarks that provide demo, plan and bench. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

/* `wsync C args...` as `wsync-C args...` from this executable's directory. */
static int wsync_run_program(int argc, char **argv)
{
    char name[128], path[PATH_MAX + 160];

    if ((size_t)snprintf(name, sizeof(name), "wsync-%s", argv[1]) >= sizeof(name) ||
        wsync_cli_sibling(path, sizeof(path), name) != 0) {
        fprintf(stderr, "wsync: unknown command '%s'\n", argv[1]);
        return 2;
    }
    if (access(path, X_OK) != 0) {
        fprintf(stderr, "wsync: unknown command '%s' (no program %s)\n", argv[1], path);
        wsync_usage(stderr);
        return 2;
    }
    wsync_cli_exec(path, NULL, argc - 1, argv + 1);
    fprintf(stderr, "wsync: running %s failed: %s\n", path, strerror(errno));
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        wsync_usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "info") == 0)
        return wsync_cmd_info(argc - 1, argv + 1);
    if (strcmp(argv[1], "inspect") == 0)
        return wsync_cmd_inspect(argc - 1, argv + 1);
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        wsync_usage(stdout);
        return 0;
    }
    if (argv[1][0] != '-' && strchr(argv[1], '/') == NULL)
        return wsync_run_program(argc, argv);
    fprintf(stderr, "wsync: unknown command '%s'\n", argv[1]);
    wsync_usage(stderr);
    return 2;
}
