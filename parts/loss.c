// loss part: being written; inlined into yolo.c when done.
