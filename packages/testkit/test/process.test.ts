import { afterEach, expect, test } from "bun:test";
import { createServer } from "node:net";
import { freePort, killAll, spawnProcess, waitFor, LOOPBACK } from "../src/index.ts";

afterEach(() => killAll());

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

test("waitForLog finds a line printed on stderr and on stdout, in arrival order", async () => {
  const p = spawnProcess("sh", ["-c", "echo one; echo two >&2; sleep 0.05; echo three"], { name: "sh" });
  expect(await p.waitForLog(/two/)).toBe("two");
  expect(await p.waitForLog(/^th/)).toBe("three");
  expect(await p.exited).toBe(0);
  expect(p.lines).toContain("one");
}, 30_000);

test("waitForLog rejects as soon as the process exits without the line", async () => {
  const p = spawnProcess("sh", ["-c", "echo bye; exit 3"], { name: "quitter" });
  await expect(p.waitForLog(/never/, { timeoutMs: 10_000 })).rejects.toThrow(/quitter exited \(3\).*\n?bye/s);
}, 30_000);

test("killAll ends a child and the grandchildren of its process group", async () => {
  const p = spawnProcess("sh", ["-c", "sleep 30 & echo child:$!; wait"], { name: "parent" });
  const line = await p.waitForLog(/^child:\d+/);
  const grandchild = Number(line.split(":")[1]);
  expect(alive(grandchild)).toBe(true);
  await killAll();
  expect(p.running).toBe(false);
  await waitFor(() => !alive(grandchild), { timeoutMs: 5000, message: "grandchild still alive" });
}, 30_000);

test("kill escalates to SIGKILL when SIGTERM is ignored", async () => {
  const p = spawnProcess("sh", ["-c", "trap '' TERM; echo ready; while true; do sleep 0.1; done"], { name: "stubborn" });
  await p.waitForLog(/ready/);
  await p.kill("SIGTERM", 200);
  expect(await p.exited).toBe("SIGKILL");
}, 30_000);

test("freePort returns a port that can be bound on the given loopback address", async () => {
  const port = await freePort(`${LOOPBACK}.5.1`);
  const srv = createServer();
  await new Promise<void>((resolve, reject) => srv.once("error", reject).listen(port, `${LOOPBACK}.5.1`, resolve));
  srv.close();
}, 30_000);

test("waitFor reports its message and the predicate's last error on timeout", async () => {
  await expect(
    waitFor(
      () => {
        throw new Error("not yet");
      },
      { timeoutMs: 50, message: "the thing" },
    ),
  ).rejects.toThrow("waitFor timed out after 50 ms (the thing): last error not yet");
  expect(await waitFor(async () => 42)).toBe(42);
}, 30_000);
