// Finds (and if needed builds) the compiled modules: the index (assembly/index.ts) and the JSON body
// scanner (assembly/json-module.ts), each its own .wasm. They are never committed: built from assembly/
// by `asc` at install (root postinstall), by the test preload, or here on first use when missing or
// older than their sources, so a fresh clone works whichever entry point runs first.
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";

const packageDir = join(import.meta.dir, "..");
const assemblyDir = join(packageDir, "assembly");
/** Compiled in from the floor package: the JSON dump's fragments (valid AssemblyScript and TypeScript). */
const sharedSources = [join(packageDir, "..", "protocol", "src", "dump-json.ts")];
export const wasmPath = join(packageDir, "build", "index.wasm");
export const jsonWasmPath = join(packageDir, "build", "json-scan.wasm");
const targets: [entry: string, out: string][] = [["index.ts", wasmPath], ["json-module.ts", jsonWasmPath]];

/** Compiler flags; --runtime minimal gives a TLSF heap (heap.free reuses space) without a GC we do not need. */
const ascFlags = ["-O3", "--runtime", "minimal", "--noAssert", "--converge"];

function newestSourceMtime(): number {
  let newest = 0;
  for (const f of readdirSync(assemblyDir)) newest = Math.max(newest, statSync(join(assemblyDir, f)).mtimeMs);
  for (const f of sharedSources) newest = Math.max(newest, statSync(f).mtimeMs);
  return newest;
}

export function isBuildStale(): boolean {
  const newest = newestSourceMtime();
  return targets.some(([, out]) => !existsSync(out) || statSync(out).mtimeMs < newest);
}

export function buildWasm(): void {
  mkdirSync(join(packageDir, "build"), { recursive: true });
  const asc = join(packageDir, "node_modules", "assemblyscript", "bin", "asc.js");
  for (const [entry, out] of targets) {
    // Compiled beside the target and renamed into place: a process starting meanwhile (a test, a sibling
    // EPP) reads either the old module or the new one, never a half-written file.
    const tmp = `${out}.${process.pid}.tmp`;
    const r = Bun.spawnSync([process.execPath, asc, join(assemblyDir, entry), ...ascFlags, "-o", tmp], {
      cwd: packageDir, stdout: "pipe", stderr: "pipe",
    });
    if (r.exitCode !== 0) {
      rmSync(tmp, { force: true });
      throw new Error(`asc failed on ${entry} (${r.exitCode}):\n${r.stdout.toString()}${r.stderr.toString()}`);
    }
    renameSync(tmp, out);
  }
}

const compiled = new Map<string, WebAssembly.Module>();

function compiledModule(path: string): WebAssembly.Module {
  let m = compiled.get(path);
  if (!m) {
    if (isBuildStale()) buildWasm();
    compiled.set(path, (m = new WebAssembly.Module(readFileSync(path))));
  }
  return m;
}

const imports = {
  env: {
    abort(_msg: number, _file: number, line: number, col: number): never {
      throw new Error(`index-wasm aborted at ${line}:${col}`);
    },
  },
};

/** A fresh instance of a compiled module (its own linear memory). */
export function instantiateAt<T>(path: string): T {
  return new WebAssembly.Instance(compiledModule(path), imports).exports as unknown as T;
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
  /** 1: reserved; 0: the host refused the memory (nothing changed). */
  reserveTables(residencies: number): number;
  tableRebuilds(): number;
};

export function instantiate(): IndexExports {
  return instantiateAt<IndexExports>(wasmPath);
}

/** What a module gives its wrapper for buffers in its linear memory. */
export type Buffers = { reserve(bytes: number): number; release(p: number, bytes: number): void };

/** A region of linear memory the wrapper reuses across calls, re-reserved when too small. */
export class ScratchRegion {
  ptr = 0;
  bytes = 0;
  constructor(private readonly ex: Buffers) {}
  ensure(bytes: number): number {
    if (bytes > this.bytes) {
      if (this.ptr) this.ex.release(this.ptr, this.bytes);
      this.bytes = Math.max(bytes, this.bytes * 2, 4096);
      this.ptr = this.ex.reserve(this.bytes);
    }
    return this.ptr;
  }
}
