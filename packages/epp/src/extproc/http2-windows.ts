// HTTP/2 receive windows of the ext_proc server. Request bodies arrive as one gRPC message of
// 50-500 KB (a 12k-token prompt as token ids is ~75 KB), but HTTP/2 starts at 64 KiB per stream and
// per connection: a larger body waits for WINDOW_UPDATEs (a round trip through both event loops
// each), and concurrent uploads on one gateway connection share the 64 KiB. Envoy itself runs with
// 256 MiB/1 MiB windows. Measured with bench/large-body.ts (see the README's "Pick latency" section).

/** Per stream and per connection. */
export const EXT_PROC_WINDOW_BYTES = 16 * 1024 * 1024;
