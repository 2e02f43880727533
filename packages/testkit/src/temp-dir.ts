import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

// Directories whose files stay in use until the process ends (configs a test hands to an EPP, a bench's
// built generator), so the end of the process is when they are done with.
const dirs = new Set<string>();

/** A fresh directory in the system temp dir (`<prefix>XXXXXX`), removed with its contents when this process ends. */
export function tempDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  dirs.add(dir);
  return dir;
}

/** Removes every tempDir made so far: at process exit, and by the `bun test` preload (scripts/test-cleanup.ts). */
export function removeTempDirs(): void {
  for (const dir of dirs) {
    try {
      rmSync(dir, { recursive: true, force: true });
    } catch {
      // A child killed a moment ago may still be writing its log there; a leftover must not fail the run.
    }
  }
  dirs.clear();
}

process.on("exit", removeTempDirs);
