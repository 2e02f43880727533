import { DUMP_BINARY_CONTENT_TYPE, DUMP_CONTENT_TYPE, DUMP_PATH } from "@kv-epp/protocol";
import type { DumpFormat, DumpTarget, Peer } from "../types.ts";
import { gcPacer } from "./gc-pacer.ts";
import { DumpFormatError, type DumpParserLimits, DumpTooLargeError } from "./parser.ts";
import { dumpBodyParser } from "./staging-feed.ts";

// The dump client of one attempt (docs/CONTRACTS.md §8 rules 3, 6): GET <peer>/dump, stream the body through the
// parser into a fresh staging area, commit only when the whole body was valid. Progress, not total time, is
// bounded: no headers or no body bytes for `timeoutMs` fails the attempt, so a large dump from a healthy
// peer may take as long as it needs while a stalled peer cannot hold recovery. A peer that keeps sending a
// byte just inside that timeout is caught by the rate floor instead: every window of the body must bring
// at least `minRate.bytesPerSec`. What the attempt stages is bounded by `budgetBytes` (the peer decides
// the dump's size, this replica's memory limit does not move).

export type DumpFailureReason = "status" | "timeout" | "trickle" | "budget" | "network" | "malformed" | "apply";

export class DumpFetchError extends Error {
  constructor(readonly reason: DumpFailureReason, message: string, readonly status?: number) {
    super(message);
    this.name = "DumpFetchError";
  }
}

export type FetchDumpOptions = {
  peer: Peer;
  target: DumpTarget;
  timeoutMs: number;
  token?: string;
  limits?: Partial<DumpParserLimits>;
  /** Fails the attempt once the staging holds more than this (DumpStaging.stagedBytes); default: no bound. */
  budgetBytes?: number;
  /** Fails the attempt when a window of the body brings fewer than bytesPerSec * windowMs / 1000 bytes. */
  minRate?: MinRate;
  /** Aborts the attempt (shutdown); the staging is aborted as for any failure. */
  signal?: AbortSignal;
  /**
   * "binary" (default): asks for the binary body, JSON accepted (a peer that only speaks JSON answers
   * with it); "json": asks for JSON only, as a client from before the binary body did.
   */
  format?: DumpFormat;
};

/** The Accept header of a dump request: the binary body preferred, JSON still taken. */
export function dumpAccept(format: DumpFormat): string {
  return format === "binary" ? `${DUMP_BINARY_CONTENT_TYPE}, ${DUMP_CONTENT_TYPE};q=0.5` : DUMP_CONTENT_TYPE;
}

export type MinRate = { bytesPerSec: number; windowMs: number };

/** 64 KiB/s over 10 s windows: a real dump streams at tens of MiB/s, a trickling peer is far below. */
export const DEFAULT_MIN_RATE: MinRate = { bytesPerSec: 64 * 1024, windowMs: 10_000 };

export type DumpFetchResult = { events: number; bytes: number; ms: number; skippedModels: number; format: DumpFormat };

export function dumpUrl(peer: Peer): string {
  return peer.url.replace(/\/+$/, "") + DUMP_PATH;
}

export function authHeaders(token: string | undefined): Record<string, string> {
  return token ? { authorization: `Bearer ${token}` } : {};
}

/**
 * A watchdog over one attempt: `guard(p)` settles like `p`, or rejects once `progress()` has not been called
 * for `timeoutMs`, or, once `startRate()` was called, when a window of `minRate.windowMs` brought fewer bytes
 * than the floor. Each guard is its own short-lived promise: racing every read against one long-lived
 * "stalled" promise would pile a reaction (holding that read's chunk) onto it per read, retaining the whole
 * body until the end (measured: ~60 MiB on the 1M-residency bench).
 */
function watchdog(timeoutMs: number, minRate: MinRate | undefined, onStall: () => void) {
  let last = performance.now();
  let timer: ReturnType<typeof setTimeout> | undefined;
  let rateTimer: ReturnType<typeof setInterval> | undefined;
  let windowBytes = 0;
  let stalled: DumpFetchError | null = null;
  let rejectCurrent: ((e: Error) => void) | null = null;
  const fail = (e: DumpFetchError) => {
    if (stalled) return;
    stalled = e;
    rejectCurrent?.(stalled);
    onStall();
  };
  // One timer re-armed lazily for the remaining time, instead of a clearTimeout/setTimeout pair per chunk.
  const check = () => {
    const idle = performance.now() - last;
    if (idle < timeoutMs) {
      timer = setTimeout(check, timeoutMs - idle);
      return;
    }
    fail(new DumpFetchError("timeout", `no progress for ${timeoutMs} ms`));
  };
  timer = setTimeout(check, timeoutMs);
  return {
    guard<T>(p: Promise<T>): Promise<T> {
      if (stalled) return Promise.reject(stalled);
      return new Promise<T>((resolve, reject) => {
        rejectCurrent = reject;
        p.then(resolve, reject).finally(() => {
          if (rejectCurrent === reject) rejectCurrent = null;
        });
      });
    },
    progress: (bytes = 0) => {
      last = performance.now();
      windowBytes += bytes;
    },
    /** Starts the rate windows (at the headers: the body is what must flow). */
    startRate: () => {
      if (!minRate || minRate.bytesPerSec <= 0 || minRate.windowMs <= 0) return;
      const floor = Math.ceil((minRate.bytesPerSec * minRate.windowMs) / 1000);
      rateTimer = setInterval(() => {
        if (windowBytes < floor)
          fail(new DumpFetchError("trickle", `body below the minimum rate: ${windowBytes} bytes in ${minRate.windowMs} ms (at least ${floor} needed, ${minRate.bytesPerSec} B/s)`));
        windowBytes = 0;
      }, minRate.windowMs);
    },
    stop: () => {
      clearTimeout(timer);
      clearInterval(rateTimer);
    },
  };
}

export async function fetchDump(opts: FetchDumpOptions): Promise<DumpFetchResult> {
  const started = performance.now();
  const abort = new AbortController();
  const onOuterAbort = () => abort.abort(opts.signal?.reason);
  opts.signal?.addEventListener("abort", onOuterAbort, { once: true });
  const dog = watchdog(opts.timeoutMs, opts.minRate, () => abort.abort(new Error("stalled")));
  let staging: ReturnType<DumpTarget["begin"]> | null = null;
  let reader: { cancel(): Promise<void> } | null = null;
  try {
    const res = await dog.guard(fetch(dumpUrl(opts.peer), { headers: { accept: dumpAccept(opts.format ?? "binary"), ...authHeaders(opts.token) }, signal: abort.signal }));
    dog.progress();
    dog.startRate();
    if (res.status !== 200) {
      await res.body?.cancel().catch(() => {});
      throw new DumpFetchError("status", `peer answered HTTP ${res.status}`, res.status);
    }
    if (res.body === null) throw new DumpFetchError("malformed", "empty response body");
    staging = opts.target.begin();
    const into = staging;
    // The content type decides, not what we asked: a peer from before the binary body answers JSON.
    const format: DumpFormat = (res.headers.get("content-type") ?? "").split(";")[0]!.trim() === DUMP_BINARY_CONTENT_TYPE ? "binary" : "json";
    const parser = dumpBodyParser(into, format, { limits: opts.limits, guard: guardApply });
    const budget = opts.budgetBytes;
    const body = res.body.getReader();
    reader = body;
    const pace = gcPacer();
    for (;;) {
      const r = await dog.guard(body.read());
      // Shutdown wins over a body that never ends (a read may still resolve after the abort).
      opts.signal?.throwIfAborted();
      if (r.done) break;
      dog.progress(r.value.length);
      parser.push(r.value);
      if (budget !== undefined) {
        const held = into.stagedBytes();
        if (held > budget) throw new DumpFetchError("budget", `the dump needs more than this replica's recovery budget of ${budget} bytes (${held} staged after ${parser.bytes} bytes of body)`);
      }
      pace(r.value.length);
    }
    parser.end();
    guardApply(() => into.commit());
    staging = null;
    return { events: parser.events, bytes: parser.bytes, ms: Math.round(performance.now() - started), skippedModels: parser.skippedModels, format };
  } catch (err) {
    throw classify(err, opts.signal);
  } finally {
    dog.stop();
    opts.signal?.removeEventListener("abort", onOuterAbort);
    if (staging !== null) {
      try {
        staging.abort();
      } catch {
        // the attempt already failed; the staging's own error adds nothing the caller can act on
      }
    }
    if (reader !== null) reader.cancel().catch(() => {});
    abort.abort();
  }
}

function classify(err: unknown, signal: AbortSignal | undefined): Error {
  if (err instanceof DumpFetchError) return err;
  // A body past maxBytes is the same failure as staging past the budget: more than this replica takes.
  if (err instanceof DumpTooLargeError) return new DumpFetchError("budget", err.message);
  if (err instanceof DumpFormatError) return new DumpFetchError("malformed", err.message);
  if (signal?.aborted) return err instanceof Error ? err : new Error(String(err));
  return new DumpFetchError("network", err instanceof Error ? err.message : String(err));
}

/** Errors thrown by the staging come from the index, not the wire: keep them distinct in logs. */
function guardApply(f: () => void): void {
  try {
    f();
  } catch (err) {
    throw new DumpFetchError("apply", `applying the dump failed: ${err instanceof Error ? err.message : String(err)}`);
  }
}
