/* Long double parsing, addition and "human" formatting with the same C library calls
 * Redis uses (strtold, snprintf "%.17Lf"), so results match Redis bit for bit on the
 * same platform. Called from Rust through ldouble-sys. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LD_CHARS_MAX 5120

/* Parses `len` bytes (NUL bytes included: a NUL inside ends the parse early and fails) as a
 * long double the way Redis's string2ld accepts it: no leading
 * space, nothing after the number, no overflow/underflow to infinity or zero, not NaN.
 * Returns 1 on success. */
static int parse_ld(const char *s, size_t len, long double *out) {
    char buf[LD_CHARS_MAX];
    char *end;
    long double v;
    if (len == 0 || len >= sizeof(buf)) return 0;
    memcpy(buf, s, len);
    buf[len] = '\0';
    errno = 0;
    v = strtold(buf, &end);
    if (isspace((unsigned char)buf[0]) || end != buf + len ||
        (errno == ERANGE && (v == HUGE_VALL || v == -HUGE_VALL || fpclassify(v) == FP_ZERO)) ||
        isnan(v))
        return 0;
    *out = v;
    return 1;
}

/* Formats `v` with 17 decimals, then drops trailing zeros (and a trailing point), as
 * Redis's ld2string in human mode. Returns the length, or -1 if it does not fit. */
static int format_ld(long double v, char *out, size_t cap) {
    int n;
    if (isinf(v)) {
        if (cap < 5) return -1;
        if (v > 0) { memcpy(out, "inf", 3); return 3; }
        memcpy(out, "-inf", 4); return 4;
    }
    n = snprintf(out, cap, "%.17Lf", v);
    if (n < 0 || (size_t)n + 1 > cap) return -1;
    if (strchr(out, '.') != NULL) {
        char *p = out + n - 1;
        while (*p == '0') { p--; n--; }
        if (*p == '.') n--;
    }
    if (n == 2 && out[0] == '-' && out[1] == '0') { out[0] = '0'; n = 1; }
    return n;
}

/* old (may be NULL: the key is missing, counts as 0) + incr, formatted into out.
 * Returns the length; -1: a value is not a valid float; -2: NaN or infinity; -3: the
 * result does not fit `cap`. */
int lavik_ld_incr(const char *old, size_t old_len, const char *incr, size_t incr_len,
                  char *out, size_t cap) {
    long double a = 0, b;
    int n;
    if (old != NULL && !parse_ld(old, old_len, &a)) return -1;
    if (!parse_ld(incr, incr_len, &b)) return -1;
    a += b;
    if (isnan(a) || isinf(a)) return -2;
    n = format_ld(a, out, cap);
    return n < 0 ? -3 : n;
}

/* 1: a valid finite long double; 0: valid but infinite; -1: not a valid float. */
int lavik_ld_check(const char *s, size_t len) {
    long double v;
    if (!parse_ld(s, len, &v)) return -1;
    return isinf(v) ? 0 : 1;
}
