// The package must work under Node too (node:net only, no Bun APIs): bundle it for Node and
// run publisher → listener and libzmq → SubSocket in a Node process.
import { afterAll, expect, test } from "bun:test";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const PKG = join(import.meta.dir, "..");
const dir = mkdtempSync(join(tmpdir(), "kv-events-node-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("under Node, our publisher feeds our listener and a libzmq PUB feeds our SUB", async () => {
  const bundle = join(dir, "kv-events.cjs");
  const built = await Bun.build({ entrypoints: [join(PKG, "src/index.ts")], target: "node", format: "cjs" });
  expect(built.success).toBe(true);
  await Bun.write(bundle, built.outputs[0]!);
  const run = spawnSync("node", [join(PKG, "test/node-runtime.cjs"), bundle], { cwd: PKG, timeout: 30_000, encoding: "utf8" });
  const out = JSON.parse(run.stdout.trim().split("\n").at(-1) ?? "{}");
  expect(out.error).toBeUndefined();
  expect(out.listener).toEqual({ kind: "batch", hash: (2n ** 64n - 1n).toString(), connected: true });
  expect(out.libzmq).toEqual([Buffer.from("hello").toString("hex"), Buffer.alloc(300, 1).toString("hex")]);
});
