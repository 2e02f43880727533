// `bun run demo` end to end on this run's loopback range (LOOPBACK.6.x): real mock-worker, EPP and gateway processes, chat traffic
// tokenized with the real Qwen3 tokenizer (token ids as the option), the midway replica replacement;
// and Ctrl-C leaving nothing behind.
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readlinkSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import type { Subprocess } from "bun";
import { LOOPBACK } from "@kv-epp/testkit";
import { chromiumPath, noteMissingBrowser, openReport, reportProblems } from "./report-browser.ts";

noteMissingBrowser("demo.test.ts");
const REPO_ROOT = resolve(import.meta.dir, "../../..");
const SUBNET = `${LOOPBACK}.6`;
const out = mkdtempSync(join(tmpdir(), "demo-"));
let demo: Subprocess<"ignore", "pipe", "pipe"> | undefined;

/** The network namespace of a process (tests run in a private one; other runs on the machine may use the same addresses). */
function netNamespace(pid: string | number): string | undefined {
  try {
    return readlinkSync(`/proc/${pid}/ns/net`);
  } catch {
    return undefined; // gone meanwhile
  }
}

/** The working directory of a process (undefined once it is gone). */
function cwdOf(pid: string): string | undefined {
  try {
    return readlinkSync(`/proc/${pid}/cwd`);
  } catch {
    return undefined;
  }
}

/**
 * Processes of this network namespace, started in this checkout (the demo starts its children there;
 * another checkout's tests on the same machine may use the same subnet), whose command line names an
 * address of the demo's subnet (its workers, replicas and gateway).
 */
function leftovers(): string[] {
  const ps = Bun.spawnSync(["ps", "-eo", "pid,args"], { stdout: "pipe" }).stdout.toString();
  const ours = netNamespace("self");
  return ps
    .split("\n")
    .filter((l) => l.includes(`${SUBNET}.`) && /mock-worker|epp|gateway/.test(l) && !l.includes("ps -eo"))
    .filter((l) => {
      const pid = l.trim().split(/\s+/)[0]!;
      return netNamespace(pid) === ours && cwdOf(pid) === REPO_ROOT;
    });
}

async function readUntil(stream: ReadableStream<Uint8Array>, pattern: RegExp, sink: string[]): Promise<void> {
  const decoder = new TextDecoder();
  for await (const chunk of stream) {
    sink.push(decoder.decode(chunk));
    if (pattern.test(sink.join(""))) return;
  }
}

/**
 * The live routing quality each replica reported, checked against what the load generator saw: every
 * response it routed came back through its ext_proc stream (one observed TTFT each when the body streams, its load released
 * after a response body), and it scored every one whose usage carried cached-token details.
 */
function expectRoutingQuality(stdout: string, routedTotal: number, bodyMode: "full-duplex" | "buffered" = "full-duplex"): void {
  // A buffered response body reaches ext_proc whole at its end: no first chunk to time.
  const timed = bodyMode === "full-duplex";
  const row = /routing quality \(EPPs\)\s+(.*)/.exec(stdout)?.[1] ?? "";
  const replicas = [...row.matchAll(/(epp-\w): (\d+) routed, (\d+) scored \((\d+) reported no cached-token details\), mean error \S+(?: tokens)?, (\d+) mispredicted, (\d+) TTFTs observed, (\d+) released without a response body/g)];
  expect(replicas.length, row).toBeGreaterThanOrEqual(2);
  let scoredTotal = 0;
  let routedSum = 0;
  for (const [, name, routed, scored, noDetails, mispredicted, ttfts, unreleased] of replicas.map((m) => m.map(String))) {
    const [r, sc, nd] = [Number(routed), Number(scored), Number(noDetails)];
    expect(Number(ttfts), `${name}: ${row}`).toBe(timed ? r : 0);
    expect(Number(unreleased), `${name}: ${row}`).toBe(0);
    expect(sc, `${name}: ${row}`).toBeLessThanOrEqual(r);
    expect(sc, `${name}: ${row}`).toBeGreaterThanOrEqual(r - nd);
    expect(Number(mispredicted)).toBeLessThanOrEqual(sc);
    scoredTotal += sc;
    routedSum += r;
  }
  expect(routedSum).toBe(routedTotal);
  expect(scoredTotal).toBeGreaterThan(0);
  expect(stdout).toMatch(/predicted vs reported\s+EPPs predicted \d+ cached tokens, workers reported \d+, over the \d+ responses/);
  expect(stdout).toMatch(timed ? /TTFT per worker\s+worker-0: EPP p50 [\d.]+ ms \(\d+\), client p50 [\d.]+ ms/ : /TTFT per worker\s+worker-0: EPP -, client p50 [\d.]+ ms/);
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

// The limits leave room for a 2-core machine under a CPU hog (the first test took 160 s there, 60-120 s idle).
const DEMO_LIMIT_MS = 360_000;

describe("bun run demo", () => {
  test("50 chat requests through the gateway and two EPP replicas, one replaced midway and recovered from the survivor", async () => {
    demo = Bun.spawn(["bun", "run", "demo", "--requests", "50", "--time-scale", "4", "--subnet", SUBNET, "--out", out], {
      cwd: REPO_ROOT,
      stdout: "pipe",
      stderr: "pipe",
    });
    const code = await demo.exited;
    const stdout = await new Response(demo.stdout).text();
    expect(code, `${stdout}\n${await new Response(demo.stderr).text()}`).toBe(0);
    expect(stdout).toMatch(new RegExp(`recovery: epp-c recovered \\d+ events .* from http://${SUBNET.replaceAll(".", "\\.")}\\.3:9093 in \\d+ ms`));
    expect(stdout).toMatch(/requests\s+50 done \(50 ok, 0 routing errors, 0 worker errors\)/);
    expect(stdout).toContain("ext_proc :9002 full-duplex");
    expect(stdout).toContain("requests: /v1/chat/completions, text tokenized with Qwen3");
    // Each replica's own histograms, the killed one read before its SIGKILL: its picks, the share over 20 ms, and
    // what they waited for (a pool member, the event loop).
    const waits = String.raw`\(\d+ picks, [\d.]+% over 20 ms; waiting for a pool member p99 (?:> )?[\d.]+ ms, event-loop lag p99 (?:> )?[\d.]+ ms\)`;
    expect(stdout).toMatch(new RegExp(String.raw`EPP pick \(own metric\)\s+epp-a: p50 (?:> )?[\d.]+ ms, p99 (?:> )?[\d.]+ ms ${waits}; epp-b: p50 (?:> )?[\d.]+ ms, p99 (?:> )?[\d.]+ ms ${waits}; epp-c: p50 `));
    // What the EPPs predicted beside what the workers reported (how close depends on how busy the run was).
    expect(stdout).toMatch(/hit rate per request\s+EPP predicted [\d.]+% .*; workers reported [\d.]+%/);
    // The workers tokenized the chats as the EPPs do: the EPP finds the last request's blocks, hashed from its
    // own tokens, all on the worker that cached them from its tokens.
    const check = /tokenization check\s+epp-\w's \/select .*: (worker-\d), which served it, holds (\d+) of its (\d+) blocks/.exec(stdout);
    expect(check, stdout).not.toBeNull();
    expect(Number(check![3])).toBeGreaterThan(0);
    expect(Number(check![2])).toBe(Number(check![3]));
    // The responses went back through the replicas (the killed one drained first): their quality metrics moved.
    expectRoutingQuality(stdout, 50);
    expect(stdout).toMatch(/epp-a drained after [\d.]+ s/);
    expect(stdout).toMatch(/send lag\s+p50 [\d.]+ ms, p99 [\d.]+ ms .*; \d+ bodies built late\)/);
    // The three figures that matter come first, the first two beside the same requests routed today's ways (simulated).
    const summary = stdout.slice(stdout.lastIndexOf("\nsummary\n") + 9).split("\n").map((l) => l.trim());
    expect(summary.slice(0, 3).map((l) => l.split(/\s{2,}/)[0])).toEqual(["prefix-cache hit rate", "TTFT", "pick latency"]);
    expect(summary[0]).toMatch(/^prefix-cache hit rate\s+[\d.]+% live .*; simulated on the same 50 requests: round-robin [\d.]+%, approx-prefix \(GAIE-style\) [\d.]+%, kv-epp [\d.]+%$/);
    expect(summary[1]).toMatch(/^TTFT\s+p50 [\d.]+ ms, p99 [\d.]+ ms live .*; simulated on the same 50 requests: round-robin p50 [\d.]+ ms, p99 [\d.]+ ms, approx-prefix \(GAIE-style\) p50 /);
    const report = /report: (\S+\.html)/.exec(stdout)?.[1];
    expect(report && existsSync(report)).toBe(true);
    expect(leftovers()).toEqual([]);
    if (!chromiumPath) return;
    expect(stdout).toContain(report!.replace(/\.html$/, ".png"));
    // Opened as a reader would: no console error, every series named in a legend drew.
    const seen = await openReport(report!);
    expect(reportProblems(seen)).toEqual([]);
    // The comparison: each way of routing has its bars in both panels (hit rate; TTFT p50 and p99).
    const compare = seen.charts.find((c) => c.id === "chart-compare");
    expect(compare?.series.map((x) => x.name)).toEqual(["round-robin, simulated", "approx-prefix (GAIE-style), simulated", "kv-epp, simulated", "kv-epp, live run"]);
    for (const x of compare!.series) expect([x.name, x.perGrid.length, x.perGrid.every((n) => n > 0)]).toEqual([x.name, 2, true]);
  }, DEMO_LIMIT_MS);

  test("token-id prompts, buffered ext_proc mode, no replacement: every request routed by the replicas' own count", async () => {
    demo = Bun.spawn(
      ["bun", "run", "demo", "--requests", "20", "--time-scale", "20", "--kill-at", "0", "--prompt", "tokens", "--body-mode", "buffered", "--subnet", SUBNET, "--out", out],
      { cwd: REPO_ROOT, stdout: "pipe", stderr: "pipe" },
    );
    const code = await demo.exited;
    const stdout = await new Response(demo.stdout).text();
    expect(code, `${stdout}\n${await new Response(demo.stderr).text()}`).toBe(0);
    expect(stdout).toContain("ext_proc :9002 buffered");
    expect(stdout).toContain("requests: /v1/completions, token ids");
    expect(stdout).toMatch(/requests\s+20 done \(20 ok, 0 routing errors, 0 worker errors\)/);
    // Nothing killed, so the replicas' histograms hold every decision the load generator saw.
    const counts = [...(/EPP pick \(own metric\)\s+(.*)/.exec(stdout)?.[1] ?? "").matchAll(/\((\d+) picks[,)]/g)].map((m) => Number(m[1]));
    expect(counts.reduce((a, b) => a + b, 0)).toBe(20);
    // Buffered: each response went to the replica whole, and was scored from it all the same.
    expectRoutingQuality(stdout, 20, "buffered");
    expect(leftovers()).toEqual([]);
  }, DEMO_LIMIT_MS);

  test("SIGINT stops every child process", async () => {
    demo = Bun.spawn(["bun", "run", "demo", "--requests", "400", "--subnet", SUBNET, "--out", out], {
      cwd: REPO_ROOT,
      stdout: "pipe",
      stderr: "pipe",
    });
    const seen: string[] = [];
    await readUntil(demo.stdout, /gateway up/, seen);
    expect(leftovers().length).toBeGreaterThanOrEqual(7); // 4 workers, 2 replicas, the gateway (and their `bun run` parents)
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
  }, DEMO_LIMIT_MS);
});
