// The process's own cgroup: where its limits (CPU quota, memory) and their counters (throttling) are read.
import { readFileSync } from "node:fs";

/** Reads a cgroup file: its text, or null when it is absent (tests pass their own). */
export type ReadFile = (path: string) => string | null;

export const CGROUP_ROOT = "/sys/fs/cgroup";

/**
 * The directories that may bound the process for one controller, each list from its own group up to the mount
 * root: cgroup v2's unified tree, and v1's mount of that controller. A limit set on any of them applies.
 */
export interface CgroupDirs {
  v2: string[];
  v1: string[];
}

/**
 * `controller`'s directories for this process, from /proc/self/cgroup: v2's `0::<path>`, and the v1 line naming
 * the controller, under its mount's name (`cpu,cpuacct`) or the controller's own. A path is "/" where absent, and
 * inside a private cgroup namespace, whose root is its own. On a hybrid host v2's tree holds no controller files,
 * so a reader finding nothing there falls to v1.
 */
export function cgroupDirs(controller: string, read: ReadFile = readOrNull): CgroupDirs {
  let v2 = "/";
  let v1 = "/";
  let v1Mount = controller;
  for (const line of read("/proc/self/cgroup")?.split("\n") ?? []) {
    // A path may hold ':' itself: only the first two separate fields.
    const [, controllers, path] = line.match(/^\d+:([^:]*):(.*)$/) ?? [];
    if (controllers === undefined || path === undefined) continue;
    if (controllers === "") v2 = path;
    else if (controllers.split(",").includes(controller)) [v1, v1Mount] = [path, controllers];
  }
  // v1 mounts a co-mounted controller under the joined name, its own name often a link to it.
  const mounts = [...new Set([`${CGROUP_ROOT}/${v1Mount}`, `${CGROUP_ROOT}/${controller}`])];
  return { v2: ancestors(CGROUP_ROOT, v2), v1: mounts.flatMap((mount) => ancestors(mount, v1)) };
}

/** The smallest value `of` finds over `dirs`, and the directory that holds it (the deepest on a tie); null without one. */
export function tightest(dirs: string[], of: (dir: string) => number | null): { value: number; dir: string } | null {
  let best: { value: number; dir: string } | null = null;
  for (const dir of dirs) {
    const value = of(dir);
    if (value !== null && (best === null || value < best.value)) best = { value, dir };
  }
  return best;
}

/**
 * `root` joined with `path`, then each parent up to `root`. Where the mount is the process's own (a container
 * without a cgroup namespace sees its host path, its cgroup mounted at the root), the deeper directories are
 * absent and only the root is read.
 */
function ancestors(root: string, path: string): string[] {
  const parts = path.split("/").filter((p) => p !== "" && p !== "." && p !== "..");
  return parts.map((_, i) => `${root}/${parts.slice(0, parts.length - i).join("/")}`).concat(root);
}

export function readOrNull(path: string): string | null {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return null;
  }
}
