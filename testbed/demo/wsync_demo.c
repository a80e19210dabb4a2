/* wsync demo: option parsing and the two processes' supervision. The parent never loads the
 * plugin (a CUDA context must not cross fork); each child loads its own. */
#define _GNU_SOURCE
#include "wsync_demo.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wsync_cli.h"
#include "wsync_model_opt.h"

static void wsync_demo_usage(FILE *out)
{
    fprintf(
        out,
        "usage: wsync demo [--plugin PATH] [--layout dense|moe] [--syncs N] [--bucket-mb M]\n"
        "                  [--scale S] [--layers L] [--model DIR] [--verify|--no-verify]\n"
        "                  [--timeout-ms T]\n"
        "  --layout     dense (Qwen3-8B, 399 tensors) or moe (Qwen3-30B-A3B, 393 per layer)\n"
        "  --syncs      weight versions to push (default 3)\n"
        "  --bucket-mb  staging buffer size, reused for every bucket (default 64)\n"
        "  --scale      divide large dims by S (default 8: a few hundred MB)\n"
        "  --model      a Hugging Face model directory: push its checkpoint (config.json,\n"
        "               model.safetensors or shards) and verify every tensor against the file\n"
        "  --layers     layers (default: dense 36, moe 12)\n"
        "  --verify     copy with digest verification and read every tensor back (default)\n"
        "  --timeout-ms bound on every wait (default 30000)\n"
        "  --engine sglang|vllm|lmdeploy [--tp N] [--packed]: push through that engine's\n"
        "               request format and shim to N reference engine processes (wsync-engine)\n"
        "  --lora [--lora-rank R] [--lora-max-rank M]: adapter-only sync; the base weights\n"
        "               stay in the engine, a rank-R all-linear adapter (default 8) is refreshed\n"
        "               in place and hot-loaded into a slot of max rank M (default 64)\n");
}

static int wsync_demo_parse(int argc, char **argv, wsync_demo_options_t *o)
{
    static const struct option longopts[] = {{"plugin", required_argument, NULL, 'p'},
                                             WSYNC_MODEL_LONGOPTS,
                                             {"syncs", required_argument, NULL, 's'},
                                             {"bucket-mb", required_argument, NULL, 'b'},
                                             {"verify", no_argument, NULL, 'v'},
                                             {"no-verify", no_argument, NULL, 'n'},
                                             {"timeout-ms", required_argument, NULL, 't'},
                                             {"lora", no_argument, NULL, 'R'},
                                             {"lora-rank", required_argument, NULL, 'r'},
                                             {"lora-max-rank", required_argument, NULL, 'M'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    unsigned long mb = 64;
    int c;

    memset(o, 0, sizeof(*o));
    o->model.layout = "dense";
    o->model.scale = 8;
    o->syncs = 3;
    o->verify = 1;
    o->timeout_ms = 30000;
    o->lora_rank = 8;
    o->lora_max_rank = 64;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (wsync_model_option(&o->model, c, optarg))
            continue;
        switch (c) {
        case 'p':
            o->plugin = optarg;
            break;
        case 's':
            o->syncs = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 'b':
            mb = strtoul(optarg, NULL, 10);
            break;
        case 'v':
            o->verify = 1;
            break;
        case 'n':
            o->verify = 0;
            break;
        case 't':
            o->timeout_ms = (int)strtol(optarg, NULL, 10);
            break;
        case 'R':
            o->lora = 1;
            break;
        case 'r':
            o->lora_rank = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'M':
            o->lora_max_rank = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'h':
            wsync_demo_usage(stdout);
            return 1;
        default:
            wsync_demo_usage(stderr);
            return 2;
        }
    }
    if (optind != argc || o->syncs < 1 || mb < 1 || o->model.scale < 1 || o->timeout_ms < 1) {
        fprintf(stderr, "wsync demo: bad arguments (syncs, bucket-mb, scale, timeout-ms must be "
                        ">= 1; no positional arguments)\n");
        wsync_demo_usage(stderr);
        return 2;
    }
    if (o->lora && (o->lora_rank < 1 || o->lora_max_rank < o->lora_rank)) {
        fprintf(stderr, "wsync demo: --lora-rank must be >= 1 and <= --lora-max-rank\n");
        return 2;
    }
    if (strcmp(o->model.layout, "moe") == 0 && o->model.layers == 0)
        o->model.layers = 12;
    o->bucket_bytes = (uint64_t)mb << 20;
    return 0;
}

static pid_t wsync_demo_spawn(int (*fn)(const wsync_demo_options_t *),
                              const wsync_demo_options_t *o)
{
    pid_t pid;

    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        int rc = fn(o);
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    return pid;
}

/* Exit status of a finished child (signals are failures). */
static int wsync_demo_status(const char *who, int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    fprintf(stderr, "wsync demo: the %s process died with signal %d\n", who,
            WIFSIGNALED(status) ? WTERMSIG(status) : -1);
    return 1;
}

/* Wait for both; once one fails the other gets a few seconds to notice, then is killed. */
static int wsync_demo_supervise(pid_t engine, pid_t trainer, const wsync_demo_options_t *o)
{
    pid_t pids[2] = {engine, trainer};
    const char *names[2] = {"engine", "trainer"};
    int rcs[2] = {-1, -1};
    double limit = (double)o->timeout_ms / 1000.0 * (4.0 + 2.0 * o->syncs) + 60.0;
    double deadline = wsync_cli_now() + limit;

    while (rcs[0] < 0 || rcs[1] < 0) {
        for (int i = 0; i < 2; i++) {
            int status;
            if (rcs[i] >= 0 || waitpid(pids[i], &status, WNOHANG) != pids[i])
                continue;
            rcs[i] = wsync_demo_status(names[i], status);
            if (rcs[i] != 0) {
                /* The peer sees the closed socket at once; it has no reason to linger. */
                double grace = wsync_cli_now() + 3.0;
                if (grace < deadline)
                    deadline = grace;
            }
        }
        if (wsync_cli_now() > deadline) {
            for (int i = 0; i < 2; i++) {
                if (rcs[i] >= 0)
                    continue;
                fprintf(stderr,
                        "wsync demo: stopping the %s process (pid %d): it did not "
                        "finish in time\n",
                        names[i], (int)pids[i]);
                kill(pids[i], SIGKILL);
                waitpid(pids[i], NULL, 0);
                rcs[i] = 1;
            }
            break;
        }
        usleep(20000);
    }
    return rcs[0] != 0 || rcs[1] != 0;
}

/* --engine sglang|vllm|lmdeploy: the trainer speaks that engine's request format to one reference
 * engine process per TP rank (--tp N). That demo lives with the shims: run wsync-engine demo
 * (testbed/engine/) from this executable's directory with the same arguments. */
static int wsync_demo_exec_engine(int argc, char **argv)
{
    char tool[4200];

    if (wsync_cli_sibling(tool, sizeof(tool), "wsync-engine") != 0)
        return 1;
    wsync_cli_exec(tool, "demo", argc, argv);
    fprintf(stderr, "wsync demo: --engine needs %s: %s\n", tool, strerror(errno));
    return 1;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--engine") == 0 || strncmp(argv[i], "--engine=", 9) == 0)
            return wsync_demo_exec_engine(argc, argv);

    wsync_demo_options_t o;
    char dir[] = "/tmp/wsync-demo-XXXXXX";
    pid_t engine, trainer;
    int rc = wsync_demo_parse(argc, argv, &o);

    if (rc != 0)
        return rc == 1 ? 0 : rc;
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "wsync demo: mkdtemp %s failed: %s\n", dir, strerror(errno));
        return 1;
    }
    snprintf(o.socket_path, sizeof(o.socket_path), "%s/control.sock", dir);
    if (o.lora)
        printf("wsync demo: adapter-only (LoRA rank %u, slot max rank %u) on layout %s (scale %u), "
               "%u syncs\n",
               o.lora_rank, o.lora_max_rank, o.model.layout, o.model.scale, o.syncs);
    else if (o.model.model_dir != NULL)
        printf("wsync demo: model %s (its config.json and checkpoint), %u syncs, %llu MiB bucket, "
               "verify %s\n",
               o.model.model_dir, o.syncs, (unsigned long long)(o.bucket_bytes >> 20),
               o.verify ? "on" : "off");
    else
        printf("wsync demo: layout %s (scale %u), %u syncs, %llu MiB bucket, verify %s\n",
               o.model.layout, o.model.scale, o.syncs, (unsigned long long)(o.bucket_bytes >> 20),
               o.verify ? "on" : "off");

    engine = wsync_demo_spawn(o.lora ? wsync_demo_lora_engine : wsync_demo_engine, &o);
    if (engine < 0) {
        fprintf(stderr, "wsync demo: fork failed: %s\n", strerror(errno));
        rmdir(dir);
        return 1;
    }
    trainer = wsync_demo_spawn(o.lora ? wsync_demo_lora_trainer : wsync_demo_trainer, &o);
    if (trainer < 0) {
        fprintf(stderr, "wsync demo: fork failed: %s\n", strerror(errno));
        kill(engine, SIGKILL);
        waitpid(engine, NULL, 0);
        rc = 1;
    } else {
        rc = wsync_demo_supervise(engine, trainer, &o);
    }
    unlink(o.socket_path);
    rmdir(dir);
    printf("wsync demo: %s\n", rc == 0 ? "PASS" : "FAIL");
    return rc;
}
