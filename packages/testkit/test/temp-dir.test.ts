import { expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";

const REPO = join(import.meta.dir, "..", "..", "..");

/** Runs `args` with Bun from the repository root (its bunfig.toml applies) and returns the tempDir it printed. */
function tempDirOf(args: string[]): string {
  const r = Bun.spawnSync([process.execPath, ...args], { cwd: REPO, stdout: "pipe", stderr: "pipe" });
  const printed = /tempDir: (\S+)/.exec(r.stdout.toString())?.[1];
  expect({ printed: printed !== undefined, stderr: r.exitCode === 0 ? "" : r.stderr.toString() }).toEqual({ printed: true, stderr: "" });
  return printed!;
}

test("a tempDir and what it holds are gone at the end of the `bun test` run that made it", () => {
  const dir = tempDirOf(["test", "./packages/testkit/test/fixtures/temp-dir-user.ts"]);
  expect(dir).toMatch(/testkit-temp-dir-\w{6}$/);
  expect(existsSync(dir)).toBe(false);
});

test("a script's tempDir is gone after it ends with process.exit", () => {
  const dir = tempDirOf(["-e", `import { tempDir } from "./packages/testkit/src/index.ts";
    import { writeFileSync } from "node:fs";
    const dir = tempDir("testkit-temp-dir-");
    writeFileSync(dir + "/file", "x");
    console.log("tempDir: " + dir);
    process.exit();`]);
  expect(existsSync(dir)).toBe(false);
});
