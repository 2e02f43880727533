// A production tree (the image's: no AssemblyScript compiler, or NODE_ENV=production) loads the built
// modules and never compiles: with a module missing or built from other sources it fails at start with
// an error naming the build step. Each case copies this package to a temporary directory and loads the
// index in a child process, as the EPP does at start.
import { afterAll, describe, expect, test } from "bun:test";
import { appendFileSync, cpSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isBuildStale } from "../src/wasm-module.ts";

const packageDir = join(import.meta.dir, "..");
const roots: string[] = [];
afterAll(() => {
  for (const r of roots) rmSync(r, { recursive: true, force: true });
});

const PROBE = `
import { KvIndex } from "./src/index.ts";
import { JsonFieldScanner } from "./src/json.ts";
const index = KvIndex.create({ blockSize: 16 });
const fields = new JsonFieldScanner(["model"]).scan(new TextEncoder().encode('{"model":"m"}'));
console.log("loaded", index.stats().blocks, fields?.length);
`;

/** This package without node_modules/assemblyscript (unless `withCompiler`), its build/ copied as built. */
function productionTree(opts: { withCompiler?: boolean } = {}): string {
  const workspace = mkdtempSync(join(tmpdir(), "index-wasm-prod-"));
  roots.push(workspace);
  // The module compiles in one file of its sibling package, protocol, so the copy keeps it beside.
  const root = join(workspace, "index-wasm");
  for (const part of ["package.json", "src", "assembly", "build"]) cpSync(join(packageDir, part), join(root, part), { recursive: true });
  symlinkSync(join(packageDir, "..", "protocol"), join(workspace, "protocol"));
  mkdirSync(join(root, "node_modules", "@kv-epp"), { recursive: true });
  symlinkSync(join(packageDir, "..", "protocol"), join(root, "node_modules", "@kv-epp", "protocol"));
  if (opts.withCompiler) symlinkSync(join(packageDir, "node_modules", "assemblyscript"), join(root, "node_modules", "assemblyscript"));
  writeFileSync(join(root, "probe.ts"), PROBE);
  return root;
}

function load(root: string, env: Record<string, string> = {}) {
  const r = Bun.spawnSync([process.execPath, "probe.ts"], { cwd: root, env: { PATH: process.env.PATH ?? "", ...env }, stdout: "pipe", stderr: "pipe" });
  return { exitCode: r.exitCode, out: r.stdout.toString() + r.stderr.toString() };
}

/** Names and mtimes of build/: a compile would add temporaries or replace a module. */
function buildListing(root: string): string[] {
  const dir = join(root, "build");
  return readdirSync(dir).sort().map((f) => `${f} ${statSync(join(dir, f)).mtimeMs}`);
}

describe("a production tree", () => {
  test("the checkout's modules are built and current (the cases below copy them)", () => {
    expect(isBuildStale()).toBe(false);
  });

  test("without the compiler, starts from the modules present", () => {
    const root = productionTree();
    const r = load(root);
    expect(r.out).toContain("loaded 0 1");
    expect(r.exitCode).toBe(0);
  });

  test("without the compiler, a missing module is a startup error naming the build step, not a compile", () => {
    const root = productionTree();
    rmSync(join(root, "build", "json-scan.wasm"));
    const before = buildListing(root);
    const r = load(root);
    expect(r.exitCode).not.toBe(0);
    expect(r.out).toContain("json-scan.wasm missing");
    expect(r.out).toContain("bun run build:wasm");
    expect(r.out).toContain("the AssemblyScript compiler is not installed");
    expect(buildListing(root)).toEqual(before);
  });

  test("without the compiler, modules built from other sources are a startup error, not a compile", () => {
    const root = productionTree();
    appendFileSync(join(root, "assembly", "index.ts"), "\n// changed after the build\n");
    const before = buildListing(root);
    const r = load(root);
    expect(r.exitCode).not.toBe(0);
    expect(r.out).toContain("was not built from the current");
    expect(r.out).toContain("bun run build:wasm");
    expect(buildListing(root)).toEqual(before);
  });

  test("a copy that changes mtimes but not contents is still current", () => {
    const root = productionTree();
    const later = new Date(Date.now() + 60_000);
    for (const f of readdirSync(join(root, "assembly"))) Bun.spawnSync(["touch", "-d", later.toISOString(), join(root, "assembly", f)]);
    const r = load(root);
    expect(r.out).toContain("loaded 0 1");
    expect(r.exitCode).toBe(0);
  });

  test("with the compiler installed but NODE_ENV=production, a stale module is an error, not a compile", () => {
    const root = productionTree({ withCompiler: true });
    rmSync(join(root, "build", "index.wasm"));
    const before = buildListing(root);
    const r = load(root, { NODE_ENV: "production" });
    expect(r.exitCode).not.toBe(0);
    expect(r.out).toContain("index.wasm missing");
    expect(r.out).toContain("NODE_ENV=production");
    expect(r.out).toContain("bun run build:wasm");
    expect(buildListing(root)).toEqual(before);
  });
});
