// bun test preload (root bunfig.toml): removes the run's tempDirs after its last test. `bun test` runs every
// file in one process but does not emit the process "exit" event (Bun 1.4), so the hook tempDir relies on
// in scripts never fires there; a root afterAll, registered in a preload, runs once at the end of the run.
import { afterAll } from "bun:test";
import { removeTempDirs } from "../src/temp-dir.ts";

afterAll(removeTempDirs);
