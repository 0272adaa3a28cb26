// data part: being written; inlined into yolo.c when done.
static int cmd_shapes(int argc, char **argv) { (void)argc; (void)argv; die("shapes: not built yet"); return 1; }
static int cmd_augment(int argc, char **argv) { (void)argc; (void)argv; die("augment: not built yet"); return 1; }
