// Memory of another process as the kernel counts it (/proc/<pid>/status): what a container's limit sees,
// unlike the child's own view of its heap.
import { readFileSync } from "node:fs";

/** Resident set now (VmRSS) and its high-water mark (VmHWM), in bytes; undefined once the process is gone. */
export function processMemory(pid: number): { rss: number; peak: number } | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/status`, "utf8");
  } catch {
    return undefined;
  }
  const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(text)?.[1] ?? NaN) * 1024;
  const rss = kib("VmRSS");
  if (!Number.isFinite(rss)) return undefined; // a zombie has no memory lines
  return { rss, peak: kib("VmHWM") };
}
