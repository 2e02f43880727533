// The environment an EPP process starts with. Bun's allocator (mimalloc) reads it once, when the process starts,
// so whatever starts the EPP sets it: the image (deploy/Dockerfile's ENV), `bun run epp` (package.json, which the
// demo runs too), the benches (bench/generator.ts, epp.bench.ts, hostile-recovery.bench.ts). runtime-env.test.ts
// checks the image and the script.
//
// MIMALLOC_PURGE_DELAY=-1: memory a pick frees is kept for the next pick, not handed back to the system 100 ms
// after it is freed (Bun's default). A pick allocates and frees buffers and strings the size of its body (100-500
// KB for a chat); handed back, each reuse faulted its pages in again, and the allocator's purging thread ran
// beside. Measured: bench:pick's EPP CPU per request fell 35-50% (chats 2.13 -> 1.37 ms, agentic 8.8 -> 4.45 ms,
// token ids 1.08 -> 0.66 ms: two runs of the same commit, one with it), and by 30% in an A/B of two EPPs of one
// build at 500 chats/s, alternating rounds. The cost: resident memory stays at its high-water mark (after the same
// traffic 751 MB, against 533 MB, peak 666). Another value in the Deployment's env trades back.
export const EPP_RUNTIME_ENV: Readonly<Record<string, string>> = { MIMALLOC_PURGE_DELAY: "-1" };
