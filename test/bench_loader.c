// bench_loader.c: loader throughput for 640x640 mosaic training batches from JPEG files, with
// and without cache=ram, for 1..4 workers. Writes a shapes dataset at 640 under /tmp first.
// Prints figures only (no pass/fail): images/s in total and per worker.
#define TESTING
#include "../yolo.c"

static double cpu_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int nimg = argc > 1 ? atoi(argv[1]) : 96;
    char dir[64] = "/tmp/bench_loader_XXXXXX", out[128], ntrain[32], yaml[160], cmd[200];
    if (!mkdtemp(dir)) die("mkdtemp failed");
    snprintf(out, sizeof out, "out=%s", dir);
    snprintf(ntrain, sizeof ntrain, "ntrain=%d", nimg);
    char *av[] = {"yolo", "shapes", out, ntrain, "nval=1", "imgsz=640", "seed=1", NULL};
    double t0 = now_sec();
    cmd_shapes(7, av);
    printf("wrote %d 640-px images in %.1f s (2 of 3 JPEG)\n", nimg, now_sec() - t0);
    snprintf(yaml, sizeof yaml, "%s/data.yaml", dir);
    DataConfig cfg;
    Dataset ds;
    char err[512];
    if (data_yaml_load(yaml, &cfg, err, sizeof err) != 0) die("%s", err);
    if (dataset_load(&cfg, 0, &ds) != 0) die("no images");
    int ncores = 1;
#ifdef _OPENMP
    ncores = omp_get_num_procs();
#endif
    printf("%d cores\n", ncores);
    for (int cache = 0; cache < 2; cache++)
        for (int w = 1; w <= 4; w *= 2) {
            LoaderConfig lc = {.batch = 16,
                               .imgsz = 640,
                               .workers = w,
                               .max_boxes = 100,
                               .train = 1,
                               .cache_ram = cache,
                               .seed = 0,
                               .aug = aug_defaults()};
            Loader *L = loader_open(&ds, &lc);
            loader_start_epoch(L, 0, 0); // warm-up epoch (page cache, scratch growth)
            while (loader_next(L)) {}
            double t = now_sec(), c0 = cpu_sec();
            int n = 0;
            loader_start_epoch(L, 1, 0);
            for (const Batch *b; (b = loader_next(L));) n += b->B;
            double dt = now_sec() - t, cpu = cpu_sec() - c0;
            printf("BENCH loader 640 mosaic cache=%s workers=%d: %.1f images/s (%.1f per worker), %.1f ms per batch of "
                   "16, "
                   "%.1f cores busy, %.1f ms CPU per image\n",
                   cache ? "ram" : "off", w, n / dt, n / dt / w, 1000 * dt / ((n + 15) / 16), cpu / dt, 1000 * cpu / n);
            loader_close(L);
        }
    LoaderConfig lv = {
            .batch = 32, .imgsz = 640, .workers = 2, .max_boxes = 100, .train = 0, .seed = 0, .aug = aug_defaults()};
    Loader *L = loader_open(&ds, &lv);
    loader_start_epoch(L, 0, 0);
    double t = now_sec();
    int n = 0;
    for (const Batch *b; (b = loader_next(L));) n += b->B;
    printf("BENCH loader 640 val rect workers=2: %.1f images/s\n", n / (now_sec() - t));
    loader_close(L);
    dataset_free(&ds);
    data_config_free(&cfg);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("could not remove %s\n", dir);
    return 0;
}
