// Finds the compiled modules: the index (assembly/index.ts) and the JSON body scanner
// (assembly/json-module.ts), each its own .wasm, never committed. They are built from assembly/ by `asc`
// (root postinstall, `bun run build:wasm`, `bun run test`, the bun test preload, the image's build stage),
// which also writes build/sources.sha256: the digest of the sources and flags they were built from. A
// module is current when that digest matches the sources now; a digest, not mtimes, because copying a
// tree (into an image, a checkout) changes mtimes and not contents.
//
// Loading builds a missing or stale module only in a development tree. In production it never compiles:
// production is NODE_ENV=production (the image sets it) or a tree without the compiler (assemblyscript
// is a devDependency, absent from `bun install --production`); there a missing or stale module is a
// startup error that names the build step.
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";

const packageDir = join(import.meta.dir, "..");
const assemblyDir = join(packageDir, "assembly");
/** Compiled in from the floor package: the JSON dump's fragments (valid AssemblyScript and TypeScript). */
const sharedSources = [join(packageDir, "..", "protocol", "src", "dump-json.ts")];
const buildDir = join(packageDir, "build");
export const wasmPath = join(buildDir, "index.wasm");
export const jsonWasmPath = join(buildDir, "json-scan.wasm");
const stampPath = join(buildDir, "sources.sha256");
const targets: [entry: string, out: string][] = [["index.ts", wasmPath], ["json-module.ts", jsonWasmPath]];
const ascPath = join(packageDir, "node_modules", "assemblyscript", "bin", "asc.js");
export const BUILD_COMMAND = "bun run build:wasm";

/** Compiler flags; --runtime minimal gives a TLSF heap (heap.free reuses space) without a GC we do not need. */
const ascFlags = ["-O3", "--runtime", "minimal", "--noAssert", "--converge"];

/** Digest of what the modules are built from: the flags and every source file (name and content). */
function sourcesDigest(): string {
  const h = createHash("sha256").update(ascFlags.join(" "));
  for (const f of readdirSync(assemblyDir).sort()) h.update(`\0${f}\0`).update(readFileSync(join(assemblyDir, f)));
  for (const f of sharedSources) h.update(`\0${relative(packageDir, f)}\0`).update(readFileSync(f));
  return h.digest("hex");
}

/** Why the built modules cannot be used as they are, or undefined when they are current. */
export function staleReason(): string | undefined {
  const missing = targets.filter(([, out]) => !existsSync(out)).map(([, out]) => out);
  if (missing.length) return `${missing.join(", ")} missing`;
  const stamp = existsSync(stampPath) ? readFileSync(stampPath, "utf8").trim() : "";
  if (stamp !== sourcesDigest()) return `${buildDir} was not built from the current ${assemblyDir} (${stamp ? "digest differs" : "no sources.sha256"})`;
  return undefined;
}

export function isBuildStale(): boolean {
  return staleReason() !== undefined;
}

/** Where loading may compile: a development tree (compiler installed, not NODE_ENV=production). */
function mayBuildOnLoad(): boolean {
  return process.env.NODE_ENV !== "production" && existsSync(ascPath);
}

export function buildWasm(): void {
  if (!existsSync(ascPath)) throw new Error(`index-wasm: the AssemblyScript compiler is not installed (${ascPath}); run a full \`bun install\` (it is a devDependency)`);
  mkdirSync(buildDir, { recursive: true });
  const digest = sourcesDigest();
  for (const [entry, out] of targets) {
    // Compiled beside the target and renamed into place: a process starting meanwhile (a test, a sibling
    // EPP) reads either the old module or the new one, never a half-written file.
    const tmp = `${out}.${process.pid}.tmp`;
    const r = Bun.spawnSync([process.execPath, ascPath, join(assemblyDir, entry), ...ascFlags, "-o", tmp], {
      cwd: packageDir, stdout: "pipe", stderr: "pipe",
    });
    if (r.exitCode !== 0) {
      rmSync(tmp, { force: true });
      throw new Error(`asc failed on ${entry} (${r.exitCode}):\n${r.stdout.toString()}${r.stderr.toString()}`);
    }
    renameSync(tmp, out);
  }
  // Written last: an interrupted build leaves the old stamp, which no longer matches, so it is redone.
  writeFileSync(`${stampPath}.${process.pid}.tmp`, `${digest}\n`);
  renameSync(`${stampPath}.${process.pid}.tmp`, stampPath);
}

/** Builds what is missing or stale where that is allowed; otherwise fails with what to run. */
function ensureBuilt(): void {
  const why = staleReason();
  if (why === undefined) return;
  if (!mayBuildOnLoad()) {
    const where = process.env.NODE_ENV === "production" ? "NODE_ENV=production" : "the AssemblyScript compiler is not installed";
    throw new Error(`index-wasm: ${why}; this tree does not compile at start (${where}): build the modules with \`${BUILD_COMMAND}\` (the image's build stage runs it) and ship build/ with them`);
  }
  buildWasm();
}

const compiled = new Map<string, WebAssembly.Module>();

function compiledModule(path: string): WebAssembly.Module {
  let m = compiled.get(path);
  if (!m) {
    if (compiled.size === 0) ensureBuilt();
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
