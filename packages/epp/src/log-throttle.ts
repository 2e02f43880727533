// Warnings a peer can cause at will (each rejected message) logged at most once per interval per
// reason, with how many were left out since: a client sending garbage in a loop must not turn into a
// log flood. The metrics count every one.
import type { Logger } from "pino";

export function throttledWarn(log: Logger, msg: string, intervalMs = 10_000): (reason: string, fields?: Record<string, unknown>) => void {
  const last = new Map<string, { at: number; suppressed: number }>();
  return (reason, fields = {}) => {
    const now = Date.now();
    const s = last.get(reason);
    if (s && now - s.at < intervalMs) {
      s.suppressed++;
      return;
    }
    log.warn({ reason, ...fields, ...(s?.suppressed ? { suppressed: s.suppressed } : {}) }, msg);
    last.set(reason, { at: now, suppressed: 0 });
  };
}
