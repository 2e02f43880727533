// bun test preload (root bunfig.toml): after the run's last test, kills the children a test left running and removes
// the run's tempDirs. `bun test` runs every file in one process but does not emit the process "exit" event (Bun 1.4),
// so the hooks process.ts and tempDir rely on in scripts never fire there; a root afterAll, registered in a
// preload, runs once at the end of the run.
import { afterAll } from "bun:test";
import { killLeftovers } from "../src/process.ts";
import { removeTempDirs } from "../src/temp-dir.ts";

afterAll(() => {
  killLeftovers();
  removeTempDirs();
});
