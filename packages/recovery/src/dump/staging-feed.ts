import type { RouterEvent, WorkerRef } from "@kv-epp/protocol";
import type { DumpFormat, DumpSizes, DumpStaging } from "../types.ts";
import type { DumpBatch } from "./batch.ts";
import { BinaryDumpParser } from "./binary-parser.ts";
import { EventRunWriter } from "./event-run.ts";
import { DumpParser, type DumpParserLimits } from "./parser.ts";

// What the two body parsers deliver, turned into the staging's one interface (DumpStaging): `model` once
// before a model's first events, and every event, whether the body brought it as a run (binary), a typed
// batch or an object (JSON), inside a run of one worker rank.

/** A body parser as the dump client drives it. */
export type DumpBodyParser = {
  push(chunk: Uint8Array): void;
  end(): void;
  readonly bytes: number;
  readonly events: number;
  readonly skippedModels: number;
};

/** Wraps each call into the staging (the dump client tells the staging's errors apart from the wire's). */
type Guard = (call: () => void) => void;
const unguarded: Guard = (call) => call();

class StagingFeed {
  private readonly begun = new Set<string>();
  private readonly writer = new EventRunWriter();

  constructor(private readonly into: DumpStaging, private readonly guard: Guard) {}

  model(key: string, blockSize: number, sizes?: DumpSizes): void {
    if (this.begun.has(key)) return;
    this.begun.add(key);
    this.guard(() => this.into.model(key, blockSize, sizes));
  }

  run(key: string, blockSize: number, worker: WorkerRef, run: Uint8Array): void {
    this.model(key, blockSize);
    this.guard(() => this.into.events(key, worker, run));
  }

  event(key: string, blockSize: number, e: RouterEvent): void {
    this.writer.event(e);
    this.run(key, blockSize, e, this.writer.take());
  }

  /** A batch's events, one run per stretch of consecutive events of one rank. */
  batch(key: string, blockSize: number, b: DumpBatch): void {
    let worker: WorkerRef | undefined;
    for (let i = 0; i < b.count; i++) {
      const w = b.workers[i]!;
      if (worker !== undefined && w !== worker) this.run(key, blockSize, worker, this.writer.take());
      worker = w;
      this.writer.batchEvent(b, i);
    }
    if (worker !== undefined) this.run(key, blockSize, worker, this.writer.take());
  }
}

/** A parser of a `/dump` body in `format` that stages what it reads into `into`. */
export function dumpBodyParser(into: DumpStaging, format: DumpFormat, opts: { limits?: Partial<DumpParserLimits>; guard?: Guard } = {}): DumpBodyParser {
  const guard = opts.guard ?? unguarded;
  const feed = new StagingFeed(into, guard);
  const accepts = (key: string) => into.accepts(key);
  const cursors = (key: string, cs: NonNullable<Parameters<DumpStaging["extras"]>[1]["cursors"]>) => guard(() => into.extras(key, { cursors: cs }));
  const adapters = (key: string, names: string[]) => guard(() => into.extras(key, { adapters: names }));
  if (format === "binary") {
    return new BinaryDumpParser(
      {
        event: (key, blockSize, e) => feed.event(key, blockSize, e),
        events: (key, blockSize, w, run) => feed.run(key, blockSize, w, run),
        sizes: (key, blockSize, sizes) => feed.model(key, blockSize, sizes),
        cursors,
        adapters,
        acceptModel: accepts,
      },
      opts.limits,
    );
  }
  // The typed batches (measured: most of the receiver's cost when every event was an object).
  return new DumpParser((key, blockSize, e) => feed.event(key, blockSize, e), opts.limits, { sink: (key, blockSize, b) => feed.batch(key, blockSize, b) }, cursors, {
    acceptModel: accepts,
    adapters,
  });
}

/** Stages events given as objects (a model's events, in order): what a parser does with a body's. */
export function stageEvents(into: DumpStaging, key: string, blockSize: number, events: Iterable<RouterEvent>): void {
  const feed = new StagingFeed(into, unguarded);
  feed.model(key, blockSize);
  for (const e of events) feed.event(key, blockSize, e);
}
