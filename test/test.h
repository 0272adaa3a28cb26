// test.h: the tiny harness every test/test_*.c uses. Each check prints what it compared, the
// tolerance and the worst difference; the binary ends with "N passed, N failed".
#pragma once
static int t_passed, t_failed;

// check: record one result with a printed description.
static void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s  ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok) t_passed++; else t_failed++;
    fflush(stdout);
}
// check_close: |got - want| <= tol, printing both and the difference.
#define check_close(what, got, want, tol)                                                                              \
    do {                                                                                                               \
        double g_ = (got), w_ = (want), t_ = (tol);                                                                    \
        check(fabs(g_ - w_) <= t_, "%s: got %.9g want %.9g |diff| %.3g tol %.3g", what, g_, w_, fabs(g_ - w_), t_);    \
    } while (0)

static int test_summary(void) {
    printf("%d passed, %d failed\n", t_passed, t_failed);
    return t_failed ? 1 : 0;
}

// yolo_bin: the yolo command-line binary the tests start: YOLO_BIN (test/run.sh sets it: ./yolo,
// the sanitizer builds' yolo, the qemu wrapper of make test-arm64), else ./yolo.
static inline const char *yolo_bin(void) {
    const char *y = getenv("YOLO_BIN");
    return y && *y ? y : "./yolo";
}
// yolo_cmd: a shell command written "./yolo ARGS", with yolo_bin() in place of ./yolo (in buf)
static inline const char *yolo_cmd(const char *cmd, char *buf, size_t n) {
    if (strncmp(cmd, "./yolo ", 7)) return cmd;
    snprintf(buf, n, "%s %s", yolo_bin(), cmd + 7);
    return buf;
}
