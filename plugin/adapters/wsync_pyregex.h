/* The subset of Python `re` syntax PEFT configs use (target_modules as a string, rank_pattern and
 * alpha_pattern keys), compiled to POSIX extended regular expressions (libc regcomp).
 *
 * Only whole-string matches are offered, where POSIX leftmost-longest and Python backtracking
 * accept exactly the same strings; lazy quantifiers therefore become greedy ones. Translated:
 * \d \w \s (and their upper-case complements outside brackets), escaped punctuation, (?:...).
 * Refused with a clear error: look-around, back-references, named groups, inline flags, \b, \A,
 * \Z and other escapes POSIX cannot express. */
#ifndef WSYNC_ADAPTERS_PYREGEX_H
#define WSYNC_ADAPTERS_PYREGEX_H

#include <regex.h>

#include "wsync_abi.h"

typedef struct wsync_pyregex {
    regex_t re;
    int compiled;
} wsync_pyregex_t;

/* Compile `pattern` so that wsync_pyregex_match succeeds when Python's
 * re.fullmatch(prefix_pattern + "(" + pattern + ")", s) would, where `prefix_pattern` is a regex
 * in the same subset (may be NULL or ""). `what` names the pattern's origin in messages. */
wsync_result_t wsync_pyregex_compile(wsync_pyregex_t *rx, const char *prefix_pattern,
                                     const char *pattern, const char *what, wsync_error_t *err);

/* 1 on a whole-string match, else 0. Thread safe (regexec on a compiled pattern). */
int wsync_pyregex_match(const wsync_pyregex_t *rx, const char *s);

void wsync_pyregex_free(wsync_pyregex_t *rx);

#endif
