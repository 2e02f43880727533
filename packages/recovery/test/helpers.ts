import { execFileSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import type { RouterEvent } from "@kv-epp/protocol";
import { tempDir, waitFor, LOOPBACK } from "@kv-epp/testkit";
import pino from "pino";
import { runEvents, type DumpModel, type DumpSource, type DumpStaging, type DumpTarget } from "../src/index.ts";

export const quietLogger = () => pino({ level: process.env.RECOVERY_TEST_LOG ?? "silent" });

/** A logger whose lines can be inspected (for the loud-log requirements). */
export function capturingLogger(): { logger: pino.Logger; lines: { level: number; msg: string; [k: string]: unknown }[] } {
  const lines: { level: number; msg: string }[] = [];
  const logger = pino({ level: "debug" }, { write: (s: string) => void lines.push(JSON.parse(s)) });
  return { logger, lines };
}

export type ModelDump = { key: string; blockSize: number; events: RouterEvent[] };

/** An in-memory index stand-in: per model key, the events applied, in order. */
export class MapIndex implements DumpSource, DumpTarget {
  readonly models_ = new Map<string, { blockSize: number; events: RouterEvent[] }>();
  commits = 0;
  aborts = 0;

  constructor(initial: ModelDump[] = []) {
    for (const m of initial) this.models_.set(m.key, { blockSize: m.blockSize, events: [...m.events] });
  }

  models(): Iterable<DumpModel> {
    return [...this.models_].map(([key, m]) => ({ key, blockSize: m.blockSize, events: m.events }));
  }

  /** Stages everything; events come back as objects numbered in arrival order (runs carry no event ids). */
  begin(): DumpStaging {
    const staged: ModelDump[] = [];
    let nextEventId = 0;
    return {
      accepts: () => true,
      model: (key, blockSize) => {
        if (!staged.some((s) => s.key === key)) staged.push({ key, blockSize, events: [] });
      },
      events: (key, worker, run) => {
        const events = runEvents(worker, run, nextEventId);
        nextEventId += events.length;
        staged.find((s) => s.key === key)!.events.push(...events);
      },
      extras: () => {},
      stagedBytes: () => 0,
      commit: () => {
        this.commits++;
        for (const s of staged) {
          const m = this.models_.get(s.key) ?? { blockSize: s.blockSize, events: [] };
          m.events.push(...s.events);
          this.models_.set(s.key, m);
        }
      },
      abort: () => void this.aborts++,
    };
  }

  snapshot(): ModelDump[] {
    return [...this.models_].map(([key, m]) => ({ key, blockSize: m.blockSize, events: m.events }));
  }

  get eventCount(): number {
    let n = 0;
    for (const m of this.models_.values()) n += m.events.length;
    return n;
  }
}

export function sampleIndex(workers = 2, chains = 3, blocksPerEvent = 4): MapIndex {
  const events: RouterEvent[] = [];
  let id = 0;
  for (let w = 0; w < workers; w++) {
    for (let c = 0; c < chains; c++) {
      let parent: bigint | null = null;
      const blocks = [];
      for (let b = 0; b < blocksPerEvent; b++) {
        const h = (BigInt(w) << 56n) | (BigInt(c) << 32n) | BigInt(b) | (1n << 63n);
        blocks.push({ blockHash: h, tokensHash: 0xffff_ffff_ffff_ffffn - h });
      }
      events.push({ workerId: `worker-${w}`, dpRank: c % 2, eventId: id++, parentHash: parent, blocks });
      parent = blocks.at(-1)!.blockHash;
    }
  }
  return new MapIndex([{ key: "Qwen/Qwen3-0.6B:default", blockSize: 16, events }]);
}

export async function readAll(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

import type { Peer, PeerDiscovery } from "../src/index.ts";

/** A discovery whose eligible set the test sets by hand (level-triggered, like the real ones). */
export class ManualDiscovery implements PeerDiscovery {
  readonly description = "manual test peers";
  private current: Peer[];
  private readonly cbs = new Set<() => void>();
  stopped = false;
  constructor(peers: Peer[] = []) {
    this.current = peers;
  }
  async start(): Promise<void> {}
  peers(): Peer[] {
    return this.current;
  }
  onChange(cb: () => void): () => void {
    this.cbs.add(cb);
    return () => this.cbs.delete(cb);
  }
  async stop(): Promise<void> {
    this.stopped = true;
  }
  set(peers: Peer[]): void {
    this.current = peers;
    for (const cb of [...this.cbs]) cb();
  }
}

export const peer = (url: string): Peer => ({ id: url, url });

/** Random numbers from a fixed list, in order (then repeating the last). */
export function scripted(values: number[]): () => number {
  let i = 0;
  return () => values[Math.min(i++, values.length - 1)]!;
}

/** An HTTP peer on loopback (recovery's 127.0.3.0/24, ephemeral port) with a programmable /dump. */
export function startPeer(handle: (req: Request) => Response | Promise<Response>): { peer: Peer; requests: () => number; stop: () => void } {
  let n = 0;
  const server = Bun.serve({
    hostname: `${LOOPBACK}.3.1`,
    port: 0,
    idleTimeout: 0,
    fetch: (req) => {
      n++;
      return handle(req);
    },
  });
  const url = `http://${LOOPBACK}.3.1:${server.port}`;
  return { peer: peer(url), requests: () => n, stop: () => void server.stop(true) };
}

/** A promise with its resolver outside, to hold a response until the test releases it. */
export function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((r) => (open = r));
  return { wait, open };
}

/** The testkit's waitFor, polling every 2 ms (short-lived recovery states are caught). */
export async function until(pred: () => boolean, what: string, ms = 10_000): Promise<void> {
  await waitFor(pred, { message: what, timeoutMs: ms, intervalMs: 2 });
}

/** The last release before cursor epochs (its dump code reads and writes cursors without them). */
export const BEFORE_EPOCHS = "b038d116fd94b9fae5cc5359684946cd281b0db7";

/**
 * This package's files as released at `commit` (from the repository's history), in a fresh directory, beside
 * the `@kv-epp/protocol` package of the same release (when it had one) for them to import:
 * `import(join(dir, "src/..."))` runs the code a peer of that release runs.
 */
export function fromHistory(commit: string, files: string[]): string {
  const dir = tempDir("recovery-release-");
  const git = (...args: string[]) => execFileSync("git", args, { cwd: import.meta.dir, encoding: "utf8" });
  const write = (path: string, text: string) => {
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, text);
  };
  for (const f of files) write(join(dir, f), git("show", `${commit}:packages/recovery/${f}`));
  for (const path of git("ls-tree", "-r", "--name-only", "--full-tree", commit, "packages/protocol/").split("\n").filter(Boolean))
    write(join(dir, "node_modules/@kv-epp/protocol", path.slice("packages/protocol/".length)), git("show", `${commit}:${path}`));
  return dir;
}
