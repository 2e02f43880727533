// The live status: a progress bar and a line of hit rate, picks per worker, p50/p99 pick latency.
import { ms, pct } from "../report/table.ts";
import type { DemoStats } from "./stats.ts";

export function statusLine(s: DemoStats, total: number): string {
  const width = 24;
  const filled = total > 0 ? Math.round((s.done / total) * width) : 0;
  const bar = `[${"#".repeat(filled)}${".".repeat(width - filled)}]`;
  const picks = s.workerIds.map((w) => `${w.replace(/^worker-/, "w")}:${s.picksByWorker.get(w) ?? 0}`).join(" ");
  const pick = s.pickMs.length > 0 ? `pick p50 ${ms(s.pickP(0.5))} ms p99 ${ms(s.pickP(0.99))} ms` : "pick -";
  return `${bar} ${s.done}/${total} done, ${s.sent} sent | hit ${pct(s.hitRate)} | picks ${picks} | ${pick}`;
}

/**
 * Writes to stdout, ignoring a closed one (EPIPE: the reader of a pipe went away). Thrown there, it
 * would unwind the demo past the orderly stop of its children.
 */
export function say(text: string): void {
  try {
    process.stdout.write(text);
  } catch {
    // Nobody is reading; the demo goes on and stops its children as usual.
  }
}

/** Redraws the status line in place on a terminal; elsewhere prints it every `plainEveryMs`. */
export function startProgress(render: () => string, plainEveryMs = 5000): { log(line: string): void; stop(): void } {
  const tty = process.stdout.isTTY === true;
  const draw = () => say(tty ? `\r\x1b[2K${render()}` : `${render()}\n`);
  const timer = setInterval(draw, tty ? 250 : plainEveryMs);
  return {
    /** prints a line above the status line */
    log(line) {
      say(tty ? `\r\x1b[2K${line}\n` : `${line}\n`);
      if (tty) draw();
    },
    stop() {
      clearInterval(timer);
      draw();
      if (tty) say("\n");
    },
  };
}
