// Finds (and if needed builds) the compiled index module. The .wasm is never committed: it is built
// from assembly/ by `asc` at install (root postinstall), by the test preload, or here on first use when
// it is missing or older than its sources, so a fresh clone works whichever entry point runs first.
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";

const packageDir = join(import.meta.dir, "..");
const assemblyDir = join(packageDir, "assembly");
export const wasmPath = join(packageDir, "build", "index.wasm");

/** Compiler flags; --runtime minimal gives a TLSF heap (heap.free reuses space) without a GC we do not need. */
const ascFlags = ["-O3", "--runtime", "minimal", "--noAssert", "--converge"];

function newestSourceMtime(): number {
  let newest = 0;
  for (const f of readdirSync(assemblyDir)) newest = Math.max(newest, statSync(join(assemblyDir, f)).mtimeMs);
  return newest;
}

export function isBuildStale(): boolean {
  return !existsSync(wasmPath) || statSync(wasmPath).mtimeMs < newestSourceMtime();
}

export function buildWasm(): void {
  mkdirSync(join(packageDir, "build"), { recursive: true });
  const asc = join(packageDir, "node_modules", "assemblyscript", "bin", "asc.js");
  // Compiled beside the target and renamed into place: a process starting meanwhile (a test, a sibling
  // EPP) reads either the old module or the new one, never a half-written file.
  const tmp = `${wasmPath}.${process.pid}.tmp`;
  const r = Bun.spawnSync([process.execPath, asc, join(assemblyDir, "index.ts"), ...ascFlags, "-o", tmp], {
    cwd: packageDir, stdout: "pipe", stderr: "pipe",
  });
  if (r.exitCode !== 0) {
    rmSync(tmp, { force: true });
    throw new Error(`asc failed (${r.exitCode}):\n${r.stdout.toString()}${r.stderr.toString()}`);
  }
  renameSync(tmp, wasmPath);
}

let compiled: WebAssembly.Module | undefined;

export function indexModule(): WebAssembly.Module {
  if (!compiled) {
    if (isBuildStale()) buildWasm();
    compiled = new WebAssembly.Module(readFileSync(wasmPath));
  }
  return compiled;
}

/** The raw exports of one module instance (one per KvIndex: each has its own linear memory). */
export type IndexExports = {
  memory: WebAssembly.Memory;
  applyBatch(p: number, words: number): number;
  batchEvents(): number;
  batchBlocks(): number;
  batchUnknown(): number;
  batchRejected(): number;
  lastRejectReason(): number;
  clearWorker(w: number): number;
  findMatches(q: number, n: number, out: number): number;
  treeSizes(): number;
  workerCapacity(): number;
  dumpWorker(w: number): number;
  dumpLength(): number;
  dumpJson(state: number, out: number, limit: number): number;
  dumpCacheRelease(): void;
  dumpBinary(rows: number, len: number, pos: number, out: number, limit: number): number;
  dumpBinaryEnd(): number;
  dumpBinaryNeed(): number;
  applyDump(p: number, words: number, slot: number): number;
  reserve(bytes: number): number;
  release(p: number, bytes: number): void;
  freeBytes(): number;
  blocks(): number;
  residencies(): number;
  rejectedTotal(): bigint;
  unknownTotal(): bigint;
  bytesInUse(): number;
  computeBlockHashes(tokens: number, nTokens: number, blockSize: number, seed: bigint, out: number): number;
  computeBlockHashesExtra(tokens: number, nBlocks: number, blockSize: number, seed: bigint, trailers: number, spans: number, scratch: number, out: number): void;
  hashBytes(p: number, len: number, seed: bigint): bigint;
  presize(blocks: number, residencies: number): void;
  jsonScan(p: number, len: number, keys: number, nKeys: number, info: number, out: number): number;
};

export function instantiate(): IndexExports {
  const imports = {
    env: {
      abort(_msg: number, _file: number, line: number, col: number): never {
        throw new Error(`index-wasm aborted at ${line}:${col}`);
      },
    },
  };
  return new WebAssembly.Instance(indexModule(), imports).exports as unknown as IndexExports;
}

/** A region of linear memory the wrapper reuses across calls, re-reserved when too small. */
export class ScratchRegion {
  ptr = 0;
  bytes = 0;
  constructor(private readonly ex: IndexExports) {}
  ensure(bytes: number): number {
    if (bytes > this.bytes) {
      if (this.ptr) this.ex.release(this.ptr, this.bytes);
      this.bytes = Math.max(bytes, this.bytes * 2, 4096);
      this.ptr = this.ex.reserve(this.bytes);
    }
    return this.ptr;
  }
}
