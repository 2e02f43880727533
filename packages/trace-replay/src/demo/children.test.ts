import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Children } from "./children.ts";

const dir = mkdtempSync(join(tmpdir(), "demo-children-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The nice value in /proc/<pid>/stat (field 19). */
const niceOf = (stat: string) => Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[16]);

function autogroupScheduling(): boolean {
  try {
    return readFileSync("/proc/sys/kernel/sched_autogroup_enabled", "utf8").trim() === "1";
  } catch {
    return false;
  }
}

test.skipIf(process.platform !== "linux")("a stand-in runs at its nice value, and so does its session where sessions are scheduled as groups; the others at ours", async () => {
  // The child tells what the kernel says of it, once its parent has had time to set its session's nice.
  const script = join(dir, "priority.ts");
  writeFileSync(script, `
    import { readFileSync } from "node:fs";
    await Bun.sleep(300);
    const stat = readFileSync("/proc/self/stat", "utf8");
    let group = "";
    try { group = readFileSync("/proc/self/autogroup", "utf8").trim(); } catch {}
    console.log(JSON.stringify({ nice: Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[16]), group }));
  `);
  const children = new Children(dir);
  const run = async (name: string, nice: number): Promise<{ nice: number; group: string }> => {
    const lines: string[] = [];
    const child = children.start(name, [script], join(dir, `${name}.log`), { onLine: (line) => lines.push(line), nice });
    expect(await child.exited).toBe(0);
    return JSON.parse(lines.find((l) => l.startsWith("{"))!);
  };
  const [low, normal] = await Promise.all([run("stand-in", 7), run("epp", 0)]);
  const ours = niceOf(readFileSync("/proc/self/stat", "utf8"));
  // `nice -n` adds to the caller's value; the session's nice is set outright.
  expect(low.nice).toBe(Math.min(19, ours + 7));
  expect(normal.nice).toBe(ours);
  if (autogroupScheduling()) {
    expect(low.group).toMatch(/ nice 7$/);
    expect(normal.group).toMatch(/ nice 0$/);
  }
}, 30_000);
