// The environment an EPP process starts with. Bun, its allocator (mimalloc) and JavaScriptCore read it once, when the process starts,
// so whatever starts the EPP sets it: the image's `epp` entry point (deploy/Dockerfile), `bun run epp`
// (package.json, which the demo runs too), the benches and the tests that measure memory. Each keeps a value the
// caller set. runtime-env.test.ts checks the entry point and the script; main.ts logs the value it started with.
//
// MIMALLOC_PURGE_DELAY=-1: memory a pick frees is kept for the next pick instead of handed back to the system
// 100 ms after it is freed (Bun's default): a pick allocates and frees buffers and strings the size of its body,
// and handed back, each reuse faulted its pages in again. The measurements and the memory it costs are in the
// EPP's README ("Runtime environment").
//
// BUN_GC_TIMER_DISABLE=1: Bun's own GC timer (one per JS thread) collects on top of JavaScriptCore's pacing, which
// already collects as the heap grows; on the decision thread and each pool member it doubled the collections and
// their pauses, and a member paused mid-job pushed picks past their budget (same README section).
//
// BUN_JSC_useFTLJIT=0: JavaScriptCore's top tier (FTL) off, its DFG tier the highest. At steady state the FTL kept
// compiling (a JIT thread busy ~10% of a core at 500 chats/s) and its compilations held the collector's pauses; with
// the DFG alone the EPP spends less CPU a request and its pick tail is shorter, while a member's tight loops (the BPE
// on text it never saw) run up to 1.6x slower. JavaScriptCore reads its options once, for every thread of the process.
//
// BUN_JSC_percentCPUPerMBForEdenTimer=0.0001: JavaScriptCore's eden timer paced for a busy server. The timer collects
// the nursery after a delay of the last eden pause over a CPU share that grows with the megabytes allocated since
// (0.25% a MB by default): a thread that allocates ~100 MB/s, as the decision thread does copying bodies at 500
// chats/s, was collected every ~150 ms, each pause ~1.5 ms whatever the eden held (~40 KB survived). A twenty-fifth of
// the share leaves the collections to the heap's growth (about a third as many, each a little longer) and keeps the
// timer for a thread that goes quiet (it still collects within seconds). Measurements: the EPP's README.
export const EPP_RUNTIME_ENV: Readonly<Record<string, string>> = {
  MIMALLOC_PURGE_DELAY: "-1", BUN_GC_TIMER_DISABLE: "1", BUN_JSC_useFTLJIT: "0", BUN_JSC_percentCPUPerMBForEdenTimer: "0.0001",
};

/** EPP_RUNTIME_ENV, each value the caller's environment already sets kept (for a child's spawn). */
export function eppRuntimeEnv(env: Readonly<Record<string, string | undefined>> = process.env): Record<string, string> {
  return Object.fromEntries(Object.entries(EPP_RUNTIME_ENV).map(([k, v]) => [k, env[k] ?? v]));
}
