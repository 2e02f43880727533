import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { autogroupScheduling, Children } from "./children.ts";

const dir = mkdtempSync(join(tmpdir(), "demo-children-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The nice value in /proc/<pid>/stat (field 19). */
const niceOf = (stat: string) => Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[16]);


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

test.skipIf(!autogroupScheduling())("the client runs itself again in a session of its own at the stand-ins' nice, its output, exit code and signals passed through", async () => {
  const script = join(dir, "client.ts");
  writeFileSync(script, `
    import { readFileSync } from "node:fs";
    import { runAsStandIn } from ${JSON.stringify(join(import.meta.dir, "children.ts"))};
    const code = await runAsStandIn(Number(process.argv[2]));
    if (code !== undefined) process.exit(code);
    await Bun.sleep(300); // its parent sets its session's nice once it runs
    const stop = new Promise((resolve) => process.on("SIGTERM", resolve));
    console.log(JSON.stringify({ group: readFileSync("/proc/self/autogroup", "utf8").trim(), sid: Number(readFileSync("/proc/self/stat", "utf8").split(") ")[1]!.split(" ")[3]), pid: process.pid }));
    if (process.argv[3] === "wait") await stop;
    process.exit(3);
  `);
  const run = Bun.spawn([process.execPath, script, "7"], { stdout: "pipe" });
  const out = await new Response(run.stdout).text();
  expect(await run.exited).toBe(3);
  const child = JSON.parse(out.trim());
  expect(child.group).toMatch(/ nice 7$/);
  expect(child.sid).toBe(child.pid); // a session of its own
  expect(child.pid).not.toBe(run.pid);

  // A signal to the demo reaches the client it runs.
  const waiting = Bun.spawn([process.execPath, script, "7", "wait"], { stdout: "pipe" });
  const reader = waiting.stdout.getReader();
  await reader.read(); // its line: it is waiting
  waiting.kill("SIGTERM");
  expect(await waiting.exited).toBe(3);

  // At nice 0 it stays this process.
  const same = Bun.spawn([process.execPath, script, "0"], { stdout: "pipe" });
  expect(JSON.parse((await new Response(same.stdout).text()).trim()).pid).toBe(same.pid);
}, 30_000);
