// test_train.c: the training run as a process, killed and resumed (issue 5). Runs ./yolo (built by
// `make`) on a tiny synthetic dataset in a temporary folder:
//   1. bit-identical resume: 2 epochs straight (A, and A2 to show the run itself is deterministic)
//      against 1 epoch, SIGKILL during epoch 2, resume=1 (B): last.safetensors byte for byte, every
//      last.ckpt tensor (model.*, ema.*, optim.*) value for value, the checkpoint metadata, results.csv.
//   2. SIGKILL during checkpoint writes (the moment weights/last.ckpt.tmp or last.safetensors.tmp
//      appears, plus a varied delay): the previous file still opens and validates, and resume=1
//      finishes with every epoch in results.csv (once each), last.safetensors equal to the final
//      checkpoint's EMA and best.safetensors present. At least one kill must land while a .tmp exists.
//   2b. a kill while the final epoch's last.safetensors is written (before or after its last.ckpt,
//      by the save order): resume=1 must still leave last.safetensors of the final epoch and
//      results.csv with both rows.
//   3. non-finite guard: lr0=1e30 SGD must end with exit code 0 or 1 (not a signal) and never write a
//      NaN/Inf into last.safetensors or last.ckpt.
//   4. batch=1 training (one validation batch per image, several rect shapes) finishes; and an
//      optimizer=auto run that picks SGD, resumed after the warmup, stays bit-identical.
// Environment: YOLO_BIN, the yolo binary to run (default ./yolo; make asan / make tsan give their
// sanitizer builds); TEST_TRAIN_SAMPLE, a comma list of the parts to run (1,2,2b,3,4; default all):
// under the sanitizers a training run is 5-20x slower, so they run a sample (see the Makefile).
#define TESTING
#include "../yolo.c"
#include "test.h"
#include <sys/wait.h>
#include <ftw.h>

static char g_root[256];          // mkdtemp folder holding everything
static char g_data[512];          // its data.yaml
static const char *g_common = "model=yolov8n imgsz=64 batch=8 workers=2 seed=1 exist_ok=1";
static const char *g_common1 =
        "model=yolov8n imgsz=64 batch=1 workers=2 seed=1 exist_ok=1";   // part 4 (./yolo takes the first of repeated
                                                                        // keys)

static const char *g_yolo = "./yolo";   // YOLO_BIN

// part_on: whether part p ("1", "2b", ...) is in TEST_TRAIN_SAMPLE (all parts when it is unset).
static int part_on(const char *p) {
    const char *s = getenv("TEST_TRAIN_SAMPLE");
    if (!s || !*s) return 1;
    size_t n = strlen(p);
    for (const char *q = s; q; q = strchr(q, ',') ? strchr(q, ',') + 1 : NULL)
        if (strncmp(q, p, n) == 0 && (q[n] == ',' || q[n] == 0)) return 1;
    return 0;
}

static double ms_since(double t0) { return (now_sec() - t0) * 1e3; }

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

// spawn: fork + execv ./yolo with the space-separated arguments of fmt (no spaces inside an argument:
// every path here is under the mkdtemp folder), stdout and stderr to log. Returns the pid.
static pid_t spawn(const char *log, const char *fmt, ...) {
    static char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)g_yolo;
    for (char *tok = strtok(line, " "); tok && n < 63; tok = strtok(NULL, " ")) argv[n++] = tok;
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) die("fork: %s", strerror(errno));
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); close(fd); }
        execv(g_yolo, argv);
        _exit(127);
    }
    return pid;
}

// run_wait: waitpid status of pid, as a short string for messages.
static int run_wait(pid_t pid, char *what, size_t n) {
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    if (WIFEXITED(st)) snprintf(what, n, "exit %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st)) snprintf(what, n, "signal %d", WTERMSIG(st));
    else snprintf(what, n, "status %d", st);
    return st;
}

// run: spawn and wait; the raw wait status.
static int run(const char *log, char *what, size_t n, const char *fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    return run_wait(spawn(log, "%s", line), what, n);
}

// show_log_tail: the last lines of a log, for a failed run.
static void show_log_tail(const char *log) {
    FILE *f = fopen(log, "r");
    if (!f) return;
    char buf[8192];
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    buf[k] = 0;
    fclose(f);
    const char *p = buf;
    if (k > 1500) p = buf + k - 1500;
    printf("----- %s (tail) -----\n%s\n-----\n", log, p);
}

static long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

static char *read_all(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { *len = -1; return NULL; }
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = xmalloc((size_t)*len + 1);
    if (fread(p, 1, (size_t)*len, f) != (size_t)*len) *len = -1;
    p[*len > 0 ? *len : 0] = 0;
    fclose(f);
    return p;
}

// csv_epochs: the epoch column of every data row of results.csv (-1: no file)
static int csv_epochs(const char *path, int *ep, int cap) {
    long len;
    char *s = read_all(path, &len);
    if (!s) return -1;
    int n = 0;
    char *save = NULL;
    strtok_r(s, "\n", &save);   // header
    for (char *ln = strtok_r(NULL, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save))
        if (n < cap) ep[n++] = atoi(ln);
    free(s);
    return n;
}

// csv_row: the data row for epoch e, its columns as doubles (time excluded: column 1); count or -1
static int csv_row(const char *path, int e, double *v, int cap) {
    long len;
    char *s = read_all(path, &len);
    if (!s) return -1;
    int n = -1;
    char *save = NULL;
    strtok_r(s, "\n", &save);
    for (char *ln = strtok_r(NULL, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save)) {
        if (atoi(ln) != e) continue;
        n = 0;
        int col = 0;
        for (char *p = ln; p; p = strchr(p, ','), p = p ? p + 1 : NULL, col++)
            if (col != 1 && n < cap) v[n++] = strtod(p, NULL);
    }
    free(s);
    return n;
}

// ckpt_epoch: metadata epoch of a checkpoint; -1 if it does not open
static int ckpt_epoch(const char *path) {
    SafeTensors st;
    char err[1024];
    if (st_open(path, &st, err, sizeof err)) return -1;
    const char *e = st_meta(&st, "epoch");
    int v = e ? atoi(e) : -1;
    st_close(&st);
    return v;
}

// file_id: inode and mtime of path folded together (0: absent); st_write's rename makes a new inode,
// so polling this is a cheap way to notice a new checkpoint before opening it
static uint64_t file_id(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) return 0;
    return (uint64_t)sb.st_ino * 1000003u ^ (uint64_t)sb.st_mtim.tv_nsec ^ (uint64_t)sb.st_size << 20;
}

// the state dict of yolov8n with the dataset's nc, for validating files by name and shape
static Model *g_model;
static StateDict *g_sd;
static void ref_model_init(int nc) {
    g_model = xcalloc(1, sizeof(Model));
    model_build(g_model, 'n', nc);
    g_model->params = xcalloc(g_model->nparams, sizeof(float));
    g_model->buffers = xcalloc(g_model->nbuffers, sizeof(float));
    g_sd = xcalloc(1, sizeof(StateDict));
    state_dict_build(g_sd, g_model, g_model->params, g_model->buffers);
}

// ckpt_validate: a resume checkpoint opens; it holds model.* and ema.* for exactly the float
// state-dict tensors (right element counts), optim.m of nparams, the seven progress metadata keys;
// every tensor in it (those and any other optim.* state) reads back finite. 0 or -1 with err set;
// *epoch gets the metadata epoch.
static int ckpt_validate(const char *path, int *epoch, char *err, size_t errlen) {
    SafeTensors st;
    if (st_open(path, &st, err, errlen)) return -1;
    int rc = -1, nsd = 0;
    float *buf = NULL;
    const char *pre[2] = {"model.", "ema."};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < g_sd->n; i++) {
            const ParamRef *r = &g_sd->ref[i];
            if (r->kind == PARAM_COUNT) continue;
            char nm[128];
            snprintf(nm, sizeof nm, "%s%s", pre[k], r->name + 6);
            const StEntry *e = st_find(&st, nm);
            if (!e || e->numel != param_numel(r)) {
                snprintf(err, errlen, "%s: '%s' missing or wrong size", path, nm);
                goto done;
            }
            nsd++;
        }
    const StEntry *om = st_find(&st, "optim.m");
    if (!om || (size_t)om->numel != g_model->nparams) {
        snprintf(err, errlen, "%s: optim.m missing or wrong size", path);
        goto done;
    }
    int64_t most = 0;
    for (int i = 0; i < st.n; i++) {
        const StEntry *e = &st.t[i];
        int sd = !strncmp(e->name, "model.", 6) || !strncmp(e->name, "ema.", 4);
        if (!sd && strncmp(e->name, "optim.", 6)) {
            snprintf(err, errlen, "%s: unexpected tensor '%s'", path, e->name);
            goto done;
        }
        if (e->numel > most) most = e->numel;
    }
    if (st.n - nsd < 1 || st.n - nsd > 8) {
        snprintf(err, errlen, "%s: %d tensors, %d of them model.*/ema.* (want %d)", path, st.n, nsd, nsd);
        goto done;
    }
    for (int i = 0; i < st.n; i++)   // a model.*/ema.* name outside the state dict shows up as a count mismatch
        if ((!strncmp(st.t[i].name, "model.", 6) || !strncmp(st.t[i].name, "ema.", 4)) && --nsd < 0) {
            snprintf(err, errlen, "%s: more model.*/ema.* tensors than the state dict has", path);
            goto done;
        }
    buf = xmalloc(sizeof(float) * (size_t)(most > 0 ? most : 1));
    for (int i = 0; i < st.n; i++) {
        const StEntry *e = &st.t[i];
        if (st_read_f32(&st, e, buf, err, errlen)) goto done;
        for (int64_t q = 0; q < e->numel; q++)
            if (!isfinite(buf[q])) {
                snprintf(err, errlen, "%s: '%s'[%" PRId64 "] = %g", path, e->name, q, buf[q]);
                goto done;
            }
    }
    const char *keys[] = {"epoch",        "opt_step",   "ema_updates",        "last_opt_step",
                          "best_fitness", "best_epoch", "num_batches_tracked"};
    for (int i = 0; i < 7; i++)
        if (!st_meta(&st, keys[i])) { snprintf(err, errlen, "%s: metadata '%s' missing", path, keys[i]); goto done; }
    *epoch = atoi(st_meta(&st, "epoch"));
    rc = 0;
done:
    free(buf);
    st_close(&st);
    return rc;
}

// weights_validate: last/best.safetensors loads into the model (shapes, names, all finite)
static int weights_validate(const char *path, char *err, size_t errlen) {
    return weights_load(path, g_sd->ref, g_sd->n, err, errlen);
}

// weights_match_ema: the weights file holds exactly the checkpoint's EMA (value for value) and its
// metadata epoch; 0, or -1 with err set. *epoch: the weights file's metadata epoch.
static int weights_match_ema(const char *wpath, const char *cpath, int *epoch, char *err, size_t errlen) {
    SafeTensors w, c;
    *epoch = -1;
    if (st_open(wpath, &w, err, errlen)) return -1;
    if (st_open(cpath, &c, err, errlen)) { st_close(&w); return -1; }
    const char *e = st_meta(&w, "epoch");
    *epoch = e ? atoi(e) : -1;
    const char *ce = st_meta(&c, "epoch");
    int rc = -1, ndiff = 0;
    float *x = xmalloc(sizeof(float) * g_model->nparams), *y = xmalloc(sizeof(float) * g_model->nparams);
    for (int i = 0; i < g_sd->n; i++) {
        const ParamRef *r = &g_sd->ref[i];
        if (r->kind == PARAM_COUNT) continue;
        char nm[128];
        snprintf(nm, sizeof nm, "ema.%s", r->name + 6);
        const StEntry *ew = st_find(&w, r->name), *ec = st_find(&c, nm);
        if (!ew || !ec || ew->numel != ec->numel || ew->numel != param_numel(r)) {
            snprintf(err, errlen, "'%s' / '%s' missing or of different sizes", r->name, nm);
            goto done;
        }
        if (st_read_f32(&w, ew, x, err, errlen) || st_read_f32(&c, ec, y, err, errlen)) goto done;
        ndiff += memcmp(x, y, sizeof(float) * (size_t)ew->numel) != 0;
    }
    if (ndiff || !ce || *epoch != atoi(ce)) {
        snprintf(err, errlen, "%d tensors differ from the checkpoint's ema.*; weights epoch %d, checkpoint epoch %s",
                 ndiff, *epoch, ce ? ce : "?");
        goto done;
    }
    rc = 0;
done:
    free(x); free(y);
    st_close(&w); st_close(&c);
    return rc;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

// ------------------------------------------------------------------------------------------
// 1. bit-identical resume
// ------------------------------------------------------------------------------------------

// compare_ckpt: every tensor of a against b by value (bit pattern); metadata keys equal.
static void compare_ckpt(const char *pa, const char *pb, const char *what) {
    SafeTensors a, b;
    char err[1024];
    if (st_open(pa, &a, err, sizeof err)) { check(0, "%s: open %s: %s", what, pa, err); return; }
    if (st_open(pb, &b, err, sizeof err)) { check(0, "%s: open %s: %s", what, pb, err); st_close(&a); return; }
    float *x = xmalloc(sizeof(float) * g_model->nparams), *y = xmalloc(sizeof(float) * g_model->nparams);
    int ndiff[3] = {0, 0, 0}, nt[3] = {0, 0, 0}, missing = 0;
    double maxd[3] = {0, 0, 0};
    const char *first[3] = {NULL, NULL, NULL};
    for (int i = 0; i < a.n; i++) {
        const StEntry *ea = &a.t[i], *eb = st_find(&b, ea->name);
        int g = !strncmp(ea->name, "model.", 6) ? 0 : !strncmp(ea->name, "ema.", 4) ? 1 : 2;
        nt[g]++;
        if (!eb || eb->numel != ea->numel || (size_t)ea->numel > g_model->nparams) { missing++; continue; }
        if (st_read_f32(&a, ea, x, err, sizeof err) || st_read_f32(&b, eb, y, err, sizeof err)) { missing++; continue; }
        if (memcmp(x, y, sizeof(float) * (size_t)ea->numel)) {
            if (!ndiff[g]++) first[g] = ea->name;
            for (int64_t q = 0; q < ea->numel; q++) maxd[g] = fmax(maxd[g], fabs((double)x[q] - y[q]));
        }
    }
    static const char *gname[3] = {"model.*", "ema.*", "optim.*"};
    for (int g = 0; g < 3; g++)
        check(nt[g] > 0 && ndiff[g] == 0,
              "%s: %s tensors bit-identical: %d of %d differ (first %s), max |diff| %.3g, tol 0", what, gname[g],
              ndiff[g], nt[g], first[g] ? first[g] : "-", maxd[g]);
    check(missing == 0 && a.n == b.n, "%s: same tensor set: %d vs %d tensors, %d missing or unreadable", what, a.n, b.n,
          missing);
    const char *keys[] = {"epoch",        "opt_step",   "ema_updates",        "last_opt_step",
                          "best_fitness", "best_epoch", "num_batches_tracked"};
    int same = 1;
    char msg[512] = "";
    size_t ml = 0;
    for (int i = 0; i < 7; i++) {
        const char *va = st_meta(&a, keys[i]), *vb = st_meta(&b, keys[i]);
        int eq = va && vb && !strcmp(va, vb);
        same &= eq;
        if (ml < sizeof msg)
            ml += (size_t)snprintf(msg + ml, sizeof msg - ml, " %s=%s%s%s", keys[i], va ? va : "?", eq ? "" : "/",
                                   eq ? "" : (vb ? vb : "?"));
    }
    check(same, "%s: checkpoint metadata equal:%s", what, msg);
    free(x); free(y);
    st_close(&a); st_close(&b);
}

static void compare_files(const char *pa, const char *pb, const char *what) {
    long la, lb;
    char *a = read_all(pa, &la), *b = read_all(pb, &lb);
    long first = -1;
    if (a && b)
        for (long i = 0; i < (la < lb ? la : lb); i++)
            if (a[i] != b[i]) { first = i; break; }
    check(a && b && la == lb && first < 0, "%s: byte for byte: %ld vs %ld bytes, first differing byte %ld", what, la,
          lb, first);
    free(a); free(b);
}

// compare_csv_row: one results.csv row of a and b (time excluded), printed to 5 significant digits
static void compare_csv_row(const char *pa, const char *pb, int e, const char *what) {
    double va[32], vb[32];
    int na = csv_row(pa, e, va, 32), nb = csv_row(pb, e, vb, 32);
    double worst = 0;
    for (int i = 0; i < na && i < nb; i++) worst = fmax(worst, fabs(va[i] - vb[i]) / fmax(fabs(vb[i]), 1e-12));
    check(na > 0 && na == nb && worst <= 1e-4,
          "%s: results.csv epoch %d row (without time): %d vs %d columns, worst rel diff "
          "%.3g, tol 1e-4 (5 printed digits)",
          what, e, na, nb, worst);
}

static void test_resume_identical(void) {
    double t0 = now_sec();
    char log[512], what[64], proj[512], da[600], db[600], da2[600], path[800], path2[800];
    snprintf(proj, sizeof proj, "%s/p1", g_root);
    snprintf(da, sizeof da, "%s/a", proj);
    snprintf(da2, sizeof da2, "%s/a2", proj);
    snprintf(db, sizeof db, "%s/b", proj);
    const char *names[2] = {"a", "a2"};
    for (int i = 0; i < 2; i++) {
        snprintf(log, sizeof log, "%s/%s.log", g_root, names[i]);
        double ti = now_sec();
        int st = run(log, what, sizeof what, "train data=%s %s epochs=2 project=%s name=%s", g_data, g_common, proj,
                     names[i]);
        printf("  straight run %s: %.0f ms\n", names[i], ms_since(ti));
        check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "resume: straight 2-epoch run %s finishes: %s", names[i], what);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) show_log_tail(log);
    }
    printf("  straight runs A, A2: %.0f ms\n", ms_since(t0));

    // B: stop after epoch 1 the hard way, while epoch 2 runs
    double t1 = now_sec();
    char csv[800], ckpt[800];
    snprintf(csv, sizeof csv, "%s/results.csv", db);
    snprintf(ckpt, sizeof ckpt, "%s/weights/last.ckpt", db);
    snprintf(log, sizeof log, "%s/b1.log", g_root);
    pid_t pid = spawn(log, "train data=%s %s epochs=2 project=%s name=b", g_data, g_common, proj);
    int killed = 0, ep[8], st = 0;
    uint64_t seen = 0;
    for (int it = 0; it < 300000; it++) {   // <= 60 s at 200 us
        if (waitpid(pid, &st, WNOHANG) == pid) break;
        uint64_t id = file_id(ckpt) ^ file_id(csv);
        if (id != seen) {   // either file changed: look inside
            seen = id;
            int n = csv_epochs(csv, ep, 8);
            if (n >= 1 && ep[0] == 1 && ckpt_epoch(ckpt) == 1) { kill(pid, SIGKILL); killed = 1; break; }
        }
        sleep_us(200);
    }
    if (killed) run_wait(pid, what, sizeof what);
    else snprintf(what, sizeof what, "ended by itself (%s)", WIFEXITED(st) ? "exit" : "signal");
    int n = csv_epochs(csv, ep, 8), ck = ckpt_epoch(ckpt);
    check(killed && ck == 1,
          "resume: run B killed during epoch 2 (%s): last.ckpt epoch %d (want 1), results.csv rows %d", what, ck, n);
    snprintf(log, sizeof log, "%s/b2.log", g_root);
    st = run(log, what, sizeof what, "train data=%s %s epochs=2 project=%s name=b resume=1", g_data, g_common, proj);
    check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "resume: B resumed for epoch 2 finishes: %s", what);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) show_log_tail(log);
    n = csv_epochs(csv, ep, 8);
    check(n == 2 && ep[0] == 1 && ep[1] == 2, "resume: B results.csv epochs: %d rows (%d, %d), want 1, 2", n,
          n > 0 ? ep[0] : -1, n > 1 ? ep[1] : -1);
    printf("  killed + resumed run B: %.0f ms\n", ms_since(t1));

    // determinism of training itself first (A vs A2), then resume (A vs B)
    snprintf(path, sizeof path, "%s/weights/last.safetensors", da);
    snprintf(path2, sizeof path2, "%s/weights/last.safetensors", da2);
    compare_files(path, path2, "straight A vs A2 last.safetensors");
    snprintf(path, sizeof path, "%s/weights/last.ckpt", da);
    snprintf(path2, sizeof path2, "%s/weights/last.ckpt", da2);
    compare_ckpt(path, path2, "straight A vs A2 last.ckpt");
    snprintf(path, sizeof path, "%s/weights/last.safetensors", da);
    snprintf(path2, sizeof path2, "%s/weights/last.safetensors", db);
    compare_files(path, path2, "A vs resumed B last.safetensors");
    snprintf(path, sizeof path, "%s/weights/last.ckpt", da);
    snprintf(path2, sizeof path2, "%s/weights/last.ckpt", db);
    compare_ckpt(path, path2, "A vs resumed B last.ckpt");
    snprintf(path, sizeof path, "%s/results.csv", da);
    snprintf(path2, sizeof path2, "%s/results.csv", db);
    compare_csv_row(path, path2, 1, "A vs B");
    compare_csv_row(path, path2, 2, "A vs B");
    char err[1024];
    snprintf(path, sizeof path, "%s/weights/last.safetensors", db);
    int rc = weights_validate(path, err, sizeof err);
    check(rc == 0, "resume: B last.safetensors loads with weights_load: %s", rc ? err : "ok");
    printf("  part 1 (bit-identical resume): %.0f ms\n", ms_since(t0));
}

// ------------------------------------------------------------------------------------------
// 2. SIGKILL during checkpoint writes
// ------------------------------------------------------------------------------------------

static void test_kill_mid_write(void) {
    double t0 = now_sec();
    enum { EPOCHS = 5 };
    char proj[512], dir[600], ckpt[800], ckpt_tmp[800], last[800], last_tmp[800], csv[800], log[512], what[64],
            err[1024];
    snprintf(proj, sizeof proj, "%s/p2", g_root);
    snprintf(dir, sizeof dir, "%s/k", proj);
    snprintf(ckpt, sizeof ckpt, "%s/weights/last.ckpt", dir);
    snprintf(ckpt_tmp, sizeof ckpt_tmp, "%s/weights/last.ckpt.tmp", dir);
    snprintf(last, sizeof last, "%s/weights/last.safetensors", dir);
    snprintf(last_tmp, sizeof last_tmp, "%s/weights/last.safetensors.tmp", dir);
    snprintf(csv, sizeof csv, "%s/results.csv", dir);
    // each attempt: which temporary file to wait for, how long to wait after it appears (us), and
    // whether to let the run commit one checkpoint first (so that kills reach later epochs whatever
    // order the files of one save are written in)
    static const struct { int ckpt; long delay_us; int skip; } plan[] = {
        {1, 0, 0}, {0, 0, 0}, {1, 2000, 1}, {0, 500, 1}, {1, 10000, 1}, {1, 30000, 0}, {0, 3000, 1}, {1, 1000, 1},
    };
    int nplan = (int)(sizeof plan / sizeof plan[0]), mid_write = 0, after_rename = 0, attempts = 0;
    for (int a = 0; a < nplan; a++) {
        int prev = ckpt_epoch(ckpt);   // -1: none yet (start fresh; resume needs a checkpoint)
        if (prev >= EPOCHS) break;
        unlink(ckpt_tmp);   // leftovers of the last kill, so that a new one means a new write
        unlink(last_tmp);
        const char *watch = plan[a].ckpt ? ckpt_tmp : last_tmp;
        snprintf(log, sizeof log, "%s/k%d.log", g_root, a);
        pid_t pid = spawn(log, "train data=%s %s epochs=%d project=%s name=k%s", g_data, g_common, EPOCHS, proj,
                          prev >= 0 ? " resume=1" : "");
        attempts++;
        int st = 0, killed = 0, armed_at = prev;   // the checkpoint epoch when the watch was armed
        long tmp_size = -1;
        uint64_t seen = file_id(ckpt);
        for (int it = 0, armed = !plan[a].skip; it < 300000;
             it++) {   // <= 60 s; a tight poll, so that the kill lands inside the write
            if (waitpid(pid, &st, WNOHANG) == pid) break;
            if (!armed) {
                uint64_t id = file_id(ckpt);
                int e = id != seen ? ckpt_epoch(ckpt) : prev;
                seen = id;
                if (e > prev) armed = 1, armed_at = e;
            } else if (access(watch, F_OK) == 0) {
                if (plan[a].delay_us) sleep_us(plan[a].delay_us);
                kill(pid, SIGKILL);
                killed = 1;
                break;
            }
            sleep_us(200);
        }
        if (!killed) {
            check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kill %d: run ended before a kill (%s exit %d)", a,
                  WIFEXITED(st) ? "normal" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            break;
        }
        run_wait(pid, what, sizeof what);
        tmp_size = file_size(watch);
        int mid = tmp_size >= 0;   // the .tmp outlives the process only if it died before the rename
        mid_write += mid, after_rename += !mid;
        int next = (armed_at >= 0 ? armed_at : 0) + 1;   // the epoch of the save the kill hit
        printf("  kill %d: %s %s, %s after %s appeared + %ld us: %s, .tmp %s (%ld bytes), checkpoint at start %d, when "
               "armed %d\n",
               a, what, prev >= 0 ? "resumed run" : "fresh run", plan[a].skip ? "one save let through" : "first save",
               plan[a].ckpt ? "last.ckpt.tmp" : "last.safetensors.tmp", plan[a].delay_us,
               mid ? "mid-write" : "after the rename", mid ? "left behind" : "gone", tmp_size, prev, armed_at);
        // the checkpoint on disk: absent only if no save ever finished, else it opens and validates
        int e = -1;
        if (access(ckpt, F_OK) == 0) {
            int rc = ckpt_validate(ckpt, &e, err, sizeof err);
            check(rc == 0, "kill %d: last.ckpt opens and validates (all tensors, finite, metadata): %s (epoch %d)", a,
                  rc ? err : "ok", e);
        }
        if (plan[a].ckpt)   // killed inside the write of epoch next's checkpoint, or just after its rename
            check(e == (mid ? armed_at : next), "kill %d: last.ckpt is epoch %d, want %d (-1: none) for a kill %s", a,
                  e, mid ? armed_at : next, mid ? "mid-write: the previous file stays" : "after the rename");
        else   // last.safetensors may be written before or after the checkpoint: either is consistent
            check(e == armed_at || e == next,
                  "kill %d: last.ckpt is epoch %d, want the one before (%d) or the one being saved (%d)", a, e,
                  armed_at, next);
        if (access(last, F_OK) == 0) {
            int rc = weights_validate(last, err, sizeof err);
            check(rc == 0, "kill %d: last.safetensors loads with weights_load: %s", a, rc ? err : "ok");
        }
    }
    check(mid_write >= 1, "kill: at least one SIGKILL landed while a .tmp file existed (mid-write): %d of %d attempts "
          "(%d after the rename)", mid_write, attempts, after_rename);

    // resume to the end, the last stale .tmp left in place on purpose
    double t1 = now_sec();
    snprintf(log, sizeof log, "%s/kfinal.log", g_root);
    int prev = ckpt_epoch(ckpt);
    int st = run(log, what, sizeof what, "train data=%s %s epochs=%d project=%s name=k%s", g_data, g_common, EPOCHS,
                 proj, prev >= 0 ? " resume=1" : "");
    check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kill: final resume=1 from epoch %d finishes: %s", prev, what);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) show_log_tail(log);
    int e = -1, rc = ckpt_validate(ckpt, &e, err, sizeof err);
    check(rc == 0 && e == EPOCHS, "kill: final last.ckpt validates with epoch %d (want %d): %s", e, EPOCHS,
          rc ? err : "ok");
    rc = weights_validate(last, err, sizeof err);
    check(rc == 0, "kill: final last.safetensors loads: %s", rc ? err : "ok");
    check(access(ckpt_tmp, F_OK) != 0, "kill: no last.ckpt.tmp left after the final run");
    int ep[32], n = csv_epochs(csv, ep, 32), seen[EPOCHS + 1] = {0}, dup = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        if (ep[i] < 1 || ep[i] > EPOCHS) bad++;
        else if (seen[ep[i]]++) dup++;
    }
    int all = 1;
    for (int k = 1; k <= EPOCHS; k++) all &= seen[k] > 0;
    char rows[160] = "";
    for (int i = 0, l = 0; i < n && l < 150; i++)
        l += snprintf(rows + l, sizeof rows - (size_t)l, "%s%d", i ? "," : "", ep[i]);
    check(all && !bad, "kill: final results.csv has every epoch 1..%d: rows [%s]", EPOCHS, rows);
    check(!dup && n == EPOCHS, "kill: final results.csv has each epoch once: %d rows, %d repeated", n, dup);
    int we = -1;
    rc = weights_match_ema(last, ckpt, &we, err, sizeof err);
    check(rc == 0 && we == EPOCHS, "kill: final last.safetensors is the final checkpoint's EMA, epoch %d (want %d): %s",
          we, EPOCHS, rc ? err : "ok");
    char best[800];
    snprintf(best, sizeof best, "%s/weights/best.safetensors", dir);
    rc = weights_validate(best, err, sizeof err);
    check(rc == 0, "kill: final best.safetensors exists and loads: %s", rc ? err : "ok");
    printf("  final resume: %.0f ms; part 2 (kills during checkpoint writes): %.0f ms\n", ms_since(t1), ms_since(t0));
}

// a kill while the final epoch's last.safetensors is being written: when the checkpoint is already
// in place resume=1 has no epoch left to run, yet must leave last.safetensors of the final epoch
static void test_kill_final_weights(void) {
    double t0 = now_sec();
    enum { EPOCHS = 2 };
    char proj[512], dir[600], ckpt[800], last[800], last_tmp[800], log[512], what[64], err[1024];
    snprintf(proj, sizeof proj, "%s/p2b", g_root);
    snprintf(dir, sizeof dir, "%s/f", proj);
    snprintf(ckpt, sizeof ckpt, "%s/weights/last.ckpt", dir);
    snprintf(last, sizeof last, "%s/weights/last.safetensors", dir);
    snprintf(last_tmp, sizeof last_tmp, "%s/weights/last.safetensors.tmp", dir);
    snprintf(log, sizeof log, "%s/f1.log", g_root);
    pid_t pid = spawn(log, "train data=%s %s epochs=%d project=%s name=f", g_data, g_common, EPOCHS, proj);
    int st = 0, killed = 0;
    for (int it = 0; it < 300000; it++) {   // <= 60 s
        if (waitpid(pid, &st, WNOHANG) == pid) break;
        // last.safetensors of epoch EPOCHS - 1 is in place and the next one is being written: the final save
        if (access(last_tmp, F_OK) == 0 && access(last, F_OK) == 0 && ckpt_epoch(last) == EPOCHS - 1) {
            kill(pid, SIGKILL);
            killed = 1;
            break;
        }
        sleep_us(200);
    }
    if (killed) run_wait(pid, what, sizeof what);
    else snprintf(what, sizeof what, "ended by itself");
    long tmp_size = file_size(last_tmp);
    int ce = ckpt_epoch(ckpt), we = -1;
    check(killed && tmp_size >= 0 && (ce == EPOCHS || ce == EPOCHS - 1),
          "final-epoch kill: %s while the final last.safetensors.tmp "
          "was written (%ld bytes); last.ckpt epoch %d (%d or %d, by the save order)",
          what, tmp_size, ce, EPOCHS - 1, EPOCHS);
    snprintf(log, sizeof log, "%s/f2.log", g_root);
    st = run(log, what, sizeof what, "train data=%s %s epochs=%d project=%s name=f resume=1", g_data, g_common, EPOCHS,
             proj);
    check(WIFEXITED(st) && WEXITSTATUS(st) == 0, "final-epoch kill: resume=1 exits cleanly: %s", what);
    int rc = weights_match_ema(last, ckpt, &we, err, sizeof err);
    check(rc == 0 && we == EPOCHS,
          "final-epoch kill: after resume=1, last.safetensors is the final checkpoint's EMA, epoch %d "
          "(want %d): %s",
          we, EPOCHS, rc ? err : "ok");
    char csv[800];
    snprintf(csv, sizeof csv, "%s/results.csv", dir);
    int ep[8], n = csv_epochs(csv, ep, 8);
    check(n == EPOCHS && ep[0] == 1 && ep[1] == 2, "final-epoch kill: results.csv rows 1, 2: %d rows (%d, %d)", n,
          n > 0 ? ep[0] : -1, n > 1 ? ep[1] : -1);
    printf("  part 2b (kill while the final last.safetensors is written): %.0f ms\n", ms_since(t0));
}

// ------------------------------------------------------------------------------------------
// 3. non-finite guard
// ------------------------------------------------------------------------------------------

static void test_nonfinite(void) {
    double t0 = now_sec();
    char proj[512], dir[600], path[800], log[512], what[64], err[1024];
    snprintf(proj, sizeof proj, "%s/p3", g_root);
    snprintf(dir, sizeof dir, "%s/nan", proj);
    snprintf(log, sizeof log, "%s/nan.log", g_root);
    int st = run(log, what, sizeof what, "train data=%s %s epochs=3 project=%s name=nan lr0=1e30 optimizer=SGD", g_data,
                 g_common, proj);
    int ok_exit = WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 1);
    check(ok_exit, "nan: lr0=1e30 SGD ends with exit 0 or 1, not a crash: %s", what);
    long len;
    char *out = read_all(log, &len);
    int said = out && (strstr(out, "non-finite") || strstr(out, "stopping"));
    check(said, "nan: the log names the non-finite values (\"non-finite\" / \"stopping\")");
    if (!ok_exit || !said) show_log_tail(log);
    free(out);
    snprintf(path, sizeof path, "%s/weights/last.safetensors", dir);
    if (access(path, F_OK) == 0) {
        int rc = weights_validate(path, err, sizeof err);
        check(rc == 0, "nan: last.safetensors has no NaN/Inf (weights_load): %s", rc ? err : "ok");
    } else {
        check(WIFEXITED(st) && WEXITSTATUS(st) == 1,
              "nan: no last.safetensors, allowed only when the run stopped (exit 1): %s", what);
    }
    snprintf(path, sizeof path, "%s/weights/best.safetensors", dir);
    if (access(path, F_OK) == 0) {
        int rc = weights_validate(path, err, sizeof err);
        check(rc == 0, "nan: best.safetensors has no NaN/Inf (weights_load): %s", rc ? err : "ok");
    }
    snprintf(path, sizeof path, "%s/weights/last.ckpt", dir);
    if (access(path, F_OK) == 0) {
        int e = -1, rc = ckpt_validate(path, &e, err, sizeof err);
        check(rc == 0, "nan: last.ckpt has no NaN/Inf: %s (epoch %d)", rc ? err : "ok", e);
    }
    printf("  part 3 (non-finite guard): %.0f ms\n", ms_since(t0));
}

// ------------------------------------------------------------------------------------------
// 4. batch=1 (one rect validation shape per image) and an auto-SGD run resumed after warmup
// ------------------------------------------------------------------------------------------

// run_until_ckpt: train NAME (resume=1 if asked) and SIGKILL it as soon as last.ckpt has epoch
// stop; the checkpoint epoch after the kill (or after the run ended by itself).
static int run_until_ckpt(const char *proj, const char *name, const char *args, int stop, int resume, char *what,
                          size_t wn) {
    char ckpt[800], log[600];
    snprintf(ckpt, sizeof ckpt, "%s/%s/weights/last.ckpt", proj, name);
    snprintf(log, sizeof log, "%s/%s.%d.log", g_root, name, stop);
    pid_t pid = spawn(log, "train data=%s %s %s project=%s name=%s%s", g_data, g_common1, args, proj, name,
                      resume ? " resume=1" : "");
    int st = 0, killed = 0;
    uint64_t seen = 0;
    for (int it = 0; it < 300000; it++) {   // <= 60 s
        if (waitpid(pid, &st, WNOHANG) == pid) break;
        uint64_t id = file_id(ckpt);
        if (id != seen && (seen = id, ckpt_epoch(ckpt) == stop)) { kill(pid, SIGKILL); killed = 1; break; }
        sleep_us(200);
    }
    if (killed) run_wait(pid, what, wn);
    else {
        snprintf(what, wn, "ended by itself (%s %d)", WIFEXITED(st) ? "exit" : "signal",
                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        show_log_tail(log);
    }
    return ckpt_epoch(ckpt);
}

static void test_batch1_sgd_resume(void) {
    double t0 = now_sec();
    char proj[512], log[512], what[64], pa[800], pb[800];
    snprintf(proj, sizeof proj, "%s/p4", g_root);
    // batch=1: every validation image is its own rect batch, of several shapes
    snprintf(log, sizeof log, "%s/b1.log", g_root);
    int st = run(log, what, sizeof what, "train data=%s %s epochs=1 project=%s name=v", g_data, g_common1, proj);
    check(WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "batch=1: one epoch with validation over several rect shapes finishes: %s", what);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) show_log_tail(log);
    printf("  part 4a (batch=1 validation): %.0f ms\n", ms_since(t0));

    // optimizer=auto picks SGD (momentum 0.9) for > 10000 iterations; warmup ramps the momentum to
    // momentum=0.937 and leaves it there. batch=1: 32 iterations an epoch, warmup over at iteration
    // 100 (epoch 4), optimizer steps at iterations 123 and 187 (epochs 4 and 6). A: straight to the
    // epoch-6 checkpoint; B: to epoch 4, then resumed (past the warmup) to epoch 6.
    double t1 = now_sec();
    const char *args = "epochs=10001";
    int ea = run_until_ckpt(proj, "sa", args, 6, 0, what, sizeof what);
    check(ea == 6, "auto-SGD: run A stopped at checkpoint epoch %d (want 6): %s", ea, what);
    int eb = run_until_ckpt(proj, "sb", args, 4, 0, what, sizeof what);
    check(eb == 4, "auto-SGD: run B stopped at checkpoint epoch %d (want 4): %s", eb, what);
    eb = run_until_ckpt(proj, "sb", args, 6, 1, what, sizeof what);
    check(eb == 6, "auto-SGD: run B resumed, stopped at checkpoint epoch %d (want 6): %s", eb, what);
    snprintf(pa, sizeof pa, "%s/sa/weights/last.ckpt", proj);
    snprintf(pb, sizeof pb, "%s/sb/weights/last.ckpt", proj);
    compare_ckpt(pa, pb, "auto-SGD A vs B resumed after warmup, last.ckpt epoch 6");
    printf("  part 4b (auto-SGD resumed after warmup): %.0f ms\n", ms_since(t1));
}

int main(void) {
    double t0 = now_sec();
    if (getenv("YOLO_BIN") && *getenv("YOLO_BIN")) g_yolo = getenv("YOLO_BIN");
    if (access(g_yolo, X_OK) != 0) {
        check(0, "%s exists (run `make` first, from the repo root)", g_yolo);
        return test_summary();
    }
    // the children sleep rather than spin at OpenMP barriers: same arithmetic, but on a shared
    // 2-core machine a spinning ./yolo next to other jobs runs 10-50x slower
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    snprintf(g_root, sizeof g_root, "/tmp/yolo_test_train.XXXXXX");
    if (!mkdtemp(g_root)) die("mkdtemp: %s", strerror(errno));
    char log[512], what[64];
    snprintf(log, sizeof log, "%s/shapes.log", g_root);
    int st = run(log, what, sizeof what, "shapes out=%s/data ntrain=32 nval=8 imgsz=64 seed=1", g_root);
    snprintf(g_data, sizeof g_data, "%s/data/data.yaml", g_root);
    check(WIFEXITED(st) && WEXITSTATUS(st) == 0 && access(g_data, F_OK) == 0, "shapes dataset written: %s", what);
    DataConfig dc;
    char err[1024];
    if (data_yaml_load(g_data, &dc, err, sizeof err)) die("%s", err);
    ref_model_init(dc.nc);

    printf("  yolo binary: %s; parts: %s\n", g_yolo,
           getenv("TEST_TRAIN_SAMPLE") && *getenv("TEST_TRAIN_SAMPLE") ? getenv("TEST_TRAIN_SAMPLE") : "all");
    if (part_on("1")) test_resume_identical();
    if (part_on("2")) test_kill_mid_write();
    if (part_on("2b")) test_kill_final_weights();
    if (part_on("3")) test_nonfinite();
    if (part_on("4")) test_batch1_sgd_resume();

    if (getenv("KEEP_TMP")) printf("  KEEP_TMP set: left %s\n", g_root);   // for looking at the logs
    else nftw(g_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    printf("  total: %.0f ms\n", ms_since(t0));
    return test_summary();
}
