/* Soak (docs/RELIABILITY.md, "Soak"): 10 000 full sync cycles of a small bucket between a
 * producer and an engine in this process, through the plugin tables: stage, publish, parse,
 * open_handle, copy (VERIFY), record_consumed, close_handle, wait_consumed. After a warm-up,
 * resident memory must stay flat (small tolerance), and the numbers of /dev/shm/wsync-*
 * mappings and of open file descriptors must not change at all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

/* Buffers cross the plugin and harness boundary (allocated there, freed here): real allocator. */
#undef malloc
#undef calloc
#undef realloc
#undef free

#include "rel_harness.h"
#include "wsync_client.h"

#define CYCLES 10000
#define SAMPLE_EVERY 1000
#define RSS_TOLERANCE_KB 1024

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REL_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define REL_ASAN 1
#endif

#ifdef REL_ASAN
/* ASan's quarantine holds freed blocks back by design and its allocator settles slowly, which
 * reads as growth here: a small quarantine, and the second half of the run as the baseline. Real
 * leaks are LeakSanitizer's to find in that build. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "quarantine_size_mb=2:thread_local_quarantine_size_kb=64";
}
#define WARMUP 5000
#else
#define WARMUP 1000
#endif

static rel_plugin_t plugin;

static void test_soak_flat(void **state)
{
    rel_producer_t p;
    rel_engine_t e;
    wsync_error_t err = rel_err();
    long rss_warm = 0, rss_max = 0, rss_start;
    int maps_warm = 0, fds_warm = 0;
    (void)state;

    rss_start = rel_rss_kb();
    int shm_before = rel_count_shm(getpid()); /* a reused pid may have left some */
    rel_producer_create(&p, &plugin, 4, 1024, 5000);
    rel_engine_create(&e, &plugin, 4, 1024, 5000, NULL);
    long t0 = rel_now_ms();
    for (uint64_t g = 1; g <= CYCLES; g++) {
        wsync_result_t r = rel_producer_bucket(&p, &err);
        if (r == WSYNC_OK)
            r = rel_engine_sync(&e, p.manifest, &err);
        if (r == WSYNC_OK)
            r = plugin.P->wait_consumed(p.s, p.stream, g, &err);
        if (r != WSYNC_OK)
            fail_msg("cycle %llu: %s: %s", (unsigned long long)g, wsync_strerror(r), err.message);
        if (g % SAMPLE_EVERY != 0)
            continue;
        assert_true(rel_engine_is_gen(&e, g));
        long rss = rel_rss_kb();
        int maps = rel_count_wsync_maps(), fds = rel_count_fds();
        if (g == WARMUP) {
            rss_warm = rss;
            maps_warm = maps;
            fds_warm = fds;
        } else if (g > WARMUP) {
            if (rss > rss_max)
                rss_max = rss;
            assert_int_equal(maps, maps_warm);
            assert_int_equal(fds, fds_warm);
        }
    }
    long ms = rel_now_ms() - t0;
    long rss_end = rel_rss_kb();
    print_message("soak: %d cycles in %ld ms; VmRSS start %ld kB, after warm-up %ld kB, max %ld "
                  "kB, end %ld kB (growth after warm-up %+ld kB); wsync mappings %d; fds %d\n",
                  CYCLES, ms, rss_start, rss_warm, rss_max, rss_end, rss_max - rss_warm, maps_warm,
                  fds_warm);
    assert_true(rss_max - rss_warm <= RSS_TOLERANCE_KB);
    /* The producer's segment and the engine's cached mapping: at most one mapping each side. */
    assert_true(maps_warm <= 4);

    rel_engine_destroy(&e);
    rel_producer_destroy(&p, 1);
    assert_int_equal(rel_count_wsync_maps(), 0);
    assert_int_equal(rel_count_shm(getpid()), shm_before);
}

int main(void)
{
    rel_plugin_load(&plugin);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_soak_flat),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
