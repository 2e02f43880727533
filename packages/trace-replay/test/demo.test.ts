// `bun run demo` end to end on 127.0.6.x: real mock-worker and EPP processes, the ext_proc load
// generator, the midway replica replacement; and Ctrl-C leaving nothing behind.
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import type { Subprocess } from "bun";

const REPO_ROOT = resolve(import.meta.dir, "../../..");
const SUBNET = "127.0.6";
const out = mkdtempSync(join(tmpdir(), "demo-"));
let demo: Subprocess<"ignore", "pipe", "pipe"> | undefined;

/** Processes whose command line names an address of the demo's subnet (its workers and replicas). */
function leftovers(): string[] {
  const ps = Bun.spawnSync(["ps", "-eo", "pid,args"], { stdout: "pipe" }).stdout.toString();
  return ps.split("\n").filter((l) => l.includes(`${SUBNET}.`) && /mock-worker|epp/.test(l) && !l.includes("ps -eo"));
}

async function readUntil(stream: ReadableStream<Uint8Array>, pattern: RegExp, sink: string[]): Promise<void> {
  const decoder = new TextDecoder();
  for await (const chunk of stream) {
    sink.push(decoder.decode(chunk));
    if (pattern.test(sink.join(""))) return;
  }
}

afterEach(async () => {
  // A failed test must not leave the demo (and through it, its children) running.
  if (demo && demo.exitCode === null) {
    demo.kill("SIGTERM");
    await demo.exited;
  }
  demo = undefined;
});
afterAll(() => rmSync(out, { recursive: true, force: true }));

describe("bun run demo", () => {
  test("50 requests through two EPP replicas, one replaced midway and recovered from the survivor", async () => {
    demo = Bun.spawn(["bun", "run", "demo", "--requests", "50", "--time-scale", "20", "--subnet", SUBNET, "--out", out], {
      cwd: REPO_ROOT,
      stdout: "pipe",
      stderr: "pipe",
    });
    const code = await demo.exited;
    const stdout = await new Response(demo.stdout).text();
    expect(code, `${stdout}\n${await new Response(demo.stderr).text()}`).toBe(0);
    expect(stdout).toMatch(/recovery: epp-c recovered \d+ events .* from http:\/\/127\.0\.6\.3:9093 in \d+ ms/);
    expect(stdout).toMatch(/requests\s+50 done \(50 ok, 0 routing errors, 0 worker errors\)/);
    expect(stdout).toContain("ext_proc :9002 full-duplex");
    // Each replica's own histogram, the killed one read before its SIGKILL.
    expect(stdout).toMatch(/EPP pick \(own metric\)\s+epp-a: p50 [\d.]+ ms, p99 [\d.]+ ms \(\d+ picks\); epp-b: p50 [\d.]+ ms, p99 [\d.]+ ms \(\d+ picks\); epp-c: p50 /);
    expect(stdout).toMatch(/send lag\s+p50 [\d.]+ ms, p99 [\d.]+ ms .*; \d+ bodies built late\)/);
    const report = /report: (\S+\.html)/.exec(stdout)?.[1];
    expect(report && existsSync(report)).toBe(true);
    expect(leftovers()).toEqual([]);
  }, 180_000);

  test("buffered ext_proc mode, no replacement: every request routed by the replicas' own count", async () => {
    demo = Bun.spawn(
      ["bun", "run", "demo", "--requests", "20", "--time-scale", "20", "--kill-at", "0", "--body-mode", "buffered", "--subnet", SUBNET, "--out", out],
      { cwd: REPO_ROOT, stdout: "pipe", stderr: "pipe" },
    );
    const code = await demo.exited;
    const stdout = await new Response(demo.stdout).text();
    expect(code, `${stdout}\n${await new Response(demo.stderr).text()}`).toBe(0);
    expect(stdout).toContain("ext_proc :9002 buffered");
    expect(stdout).toMatch(/requests\s+20 done \(20 ok, 0 routing errors, 0 worker errors\)/);
    // Nothing killed, so the replicas' histograms hold every decision the load generator saw.
    const counts = [...(/EPP pick \(own metric\)\s+(.*)/.exec(stdout)?.[1] ?? "").matchAll(/\((\d+) picks\)/g)].map((m) => Number(m[1]));
    expect(counts.reduce((a, b) => a + b, 0)).toBe(20);
    expect(leftovers()).toEqual([]);
  }, 180_000);

  test("SIGINT stops every child process", async () => {
    demo = Bun.spawn(["bun", "run", "demo", "--requests", "400", "--subnet", SUBNET, "--out", out], {
      cwd: REPO_ROOT,
      stdout: "pipe",
      stderr: "pipe",
    });
    const seen: string[] = [];
    await readUntil(demo.stdout, /EPP replicas ready/, seen);
    expect(leftovers().length).toBeGreaterThanOrEqual(6); // 4 workers + 2 replicas (and their `bun run` parents)
    // `bun run demo` is the parent of the demo process: signal the demo itself, as a terminal's Ctrl-C would.
    const demoPids = Bun.spawnSync(["ps", "-o", "pid=", "--ppid", String(demo.pid)], { stdout: "pipe" }).stdout.toString().trim().split(/\s+/);
    expect(demoPids.length).toBe(1);
    process.kill(Number(demoPids[0]), "SIGINT");
    // The test stopped reading the demo's stdout (a closed pipe): the demo must stop its children all the same.
    const code = await demo.exited;
    const left = leftovers();
    const output = `${seen.join("")}\n${await new Response(demo.stderr).text()}`;
    expect(left, output).toEqual([]);
    expect(code, output).toBe(130);
  }, 180_000);
});
